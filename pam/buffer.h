/* The bottom floor: a growing byte buffer whose contents are wiped, and cleanup helpers for
 * memory that held a secret. */

#ifndef KIOSKAUTH_PAM_BUFFER_H
#define KIOSKAUTH_PAM_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The largest message the daemon may send; a buffer never grows past twice that. */
#define MAX_REPLY_SIZE (256 * 1024)

static inline void freep(void *p) { free(*(void **)p); }
#define _cleanup_free_ __attribute__((cleanup(freep)))

/* For strings that held a secret: the passcode as typed, a ticket. */
static inline void erase_and_free(char *s) {
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}
static inline void erase_and_freep(char **s) { erase_and_free(*s); }
#define _cleanup_erase_ __attribute__((cleanup(erase_and_freep)))

#define STARTS_WITH(s, prefix) (strncmp((s), (prefix), strlen(prefix)) == 0)

/* A growing byte buffer whose old and final contents are wiped: requests carry passcodes and
 * replies carry tickets. After an allocation failure every append is a no-op and `failed` stays
 * set. The data is always NUL-terminated. */
struct buffer {
    char *data;
    size_t length;
    size_t capacity;
    bool failed;
};

void buffer_erase(struct buffer *b);
#define _cleanup_buffer_ __attribute__((cleanup(buffer_erase)))

/* Makes room for `extra` more bytes (and the NUL); false, with `failed` set, when it cannot. */
bool buffer_reserve(struct buffer *b, size_t extra);
void buffer_append(struct buffer *b, const void *bytes, size_t n);
void buffer_puts(struct buffer *b, const char *s);

#endif
