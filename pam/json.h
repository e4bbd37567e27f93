/* JSON: the writer for requests (strings are escaped, bytes that are not UTF-8 replaced) and a
 * strict reader, just enough for the daemon's replies. Numbers keep their integer part (every
 * number in the API is an integer). */

#ifndef KIOSKAUTH_PAM_JSON_H
#define KIOSKAUTH_PAM_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer.h"

/* Length of the valid UTF-8 sequence starting at s (1-4), or 0 when there is none; *out (when
 * not NULL) is its code point. */
size_t utf8_decode(const unsigned char *s, uint32_t *out);

/* Writes s as a JSON string: quotes, backslashes and control characters escaped, bytes that are
 * not UTF-8 replaced by U+FFFD. */
void json_string(struct buffer *b, const char *s);
void json_unsigned(struct buffer *b, unsigned long long v);

enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
};

struct json {
    enum json_type type;
    long long number;
    char *string;
    size_t count;       /* array items or object members */
    char **keys;        /* object member names */
    struct json *items; /* array items or object values */
};

void json_free(struct json *v);
/* Parses exactly `length` bytes of text (nothing may follow the value); on failure *v is empty. */
bool json_parse(const char *text, size_t length, struct json *v);
/* An object's member, or NULL (also when `object` is NULL or not an object). */
const struct json *json_get(const struct json *object, const char *key);
const char *json_get_string(const struct json *object, const char *key);
bool json_get_bool(const struct json *object, const char *key);
bool json_get_integer(const struct json *object, const char *key, long long *out);

#endif
