/* A growing byte buffer whose old and final contents are wiped (buffer.h). */

#define _GNU_SOURCE

#include "buffer.h"

void buffer_erase(struct buffer *b) {
    if (b->data) {
        explicit_bzero(b->data, b->capacity);
        free(b->data);
    }
    *b = (struct buffer){0};
}

bool buffer_reserve(struct buffer *b, size_t extra) {
    if (b->failed)
        return false;
    if (extra > MAX_REPLY_SIZE || b->length + extra + 1 > 2 * MAX_REPLY_SIZE) {
        b->failed = true;
        return false;
    }
    size_t need = b->length + extra + 1;
    if (need <= b->capacity)
        return true;
    size_t capacity = b->capacity ? b->capacity : 512;
    while (capacity < need)
        capacity *= 2;
    /* Not realloc(): it could leave a copy of a secret behind in freed memory. */
    char *data = malloc(capacity);
    if (!data) {
        b->failed = true;
        return false;
    }
    if (b->data) {
        memcpy(data, b->data, b->length + 1);
        explicit_bzero(b->data, b->capacity);
        free(b->data);
    }
    b->data = data;
    b->capacity = capacity;
    return true;
}

void buffer_append(struct buffer *b, const void *bytes, size_t n) {
    if (!buffer_reserve(b, n))
        return;
    memcpy(b->data + b->length, bytes, n);
    b->length += n;
    b->data[b->length] = '\0';
}

void buffer_puts(struct buffer *b, const char *s) { buffer_append(b, s, strlen(s)); }
