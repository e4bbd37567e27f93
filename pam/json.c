/* The JSON writer and reader (json.h). */

#define _GNU_SOURCE

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define MAX_JSON_DEPTH 16

/* Writer. */

size_t utf8_decode(const unsigned char *s, uint32_t *out) {
    unsigned char c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
        if (out)
            *out = c;
        return 1;
    }
    if ((c & 0xe0) == 0xc0) {
        n = 2;
        cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3;
        cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    if (out)
        *out = cp;
    return n;
}

void json_string(struct buffer *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    buffer_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_decode(p, NULL);
        if (n == 0) {
            buffer_puts(b, "\\ufffd");
            p++;
            continue;
        }
        if (*p == '"' || *p == '\\') {
            char escaped[2] = {'\\', (char)*p};
            buffer_append(b, escaped, sizeof(escaped));
        } else if (*p < 0x20 || *p == 0x7f) {
            char escaped[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 0xf]};
            buffer_append(b, escaped, sizeof(escaped));
            explicit_bzero(escaped, sizeof(escaped));
        } else {
            buffer_append(b, p, n);
        }
        p += n;
    }
    buffer_puts(b, "\"");
}

void json_unsigned(struct buffer *b, unsigned long long v) {
    char digits[24];
    int n = snprintf(digits, sizeof(digits), "%llu", v);
    buffer_append(b, digits, (size_t)n);
}

/* Reader. */

void json_free(struct json *v) {
    for (size_t i = 0; i < v->count; i++) {
        if (v->keys)
            free(v->keys[i]);
        if (v->items)
            json_free(&v->items[i]);
    }
    free(v->keys);
    free(v->items);
    erase_and_free(v->string);
    *v = (struct json){0};
}

struct parser {
    const char *p;
    const char *end;
};

static void skip_space(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool parse_hex4(struct parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4)
        return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(ps->p[i]);
        if (h < 0)
            return false;
        v = (v << 4) | (uint32_t)h;
    }
    ps->p += 4;
    *out = v;
    return true;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses a string at ps->p (on its opening quote). The decoded text is never longer than its
 * encoding, so one allocation of that size suffices. */
static bool parse_string(struct parser *ps, char **out) {
    const char *start = ++ps->p;
    const char *close = start;
    while (close < ps->end && *close != '"') {
        if (*close == '\\')
            close++;
        close++;
    }
    if (close >= ps->end)
        return false;
    char *s = malloc((size_t)(close - start) + 1);
    if (!s)
        return false;
    size_t n = 0;
    while (ps->p < close) {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20)
            goto fail;
        if (c != '\\') {
            s[n++] = (char)c;
            continue;
        }
        char e = *ps->p++;
        switch (e) {
        case '"':
        case '\\':
        case '/':
            s[n++] = e;
            break;
        case 'b':
            s[n++] = '\b';
            break;
        case 'f':
            s[n++] = '\f';
            break;
        case 'n':
            s[n++] = '\n';
            break;
        case 'r':
            s[n++] = '\r';
            break;
        case 't':
            s[n++] = '\t';
            break;
        case 'u': {
            uint32_t cp, low;
            if (!parse_hex4(ps, &cp))
                goto fail;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (close - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    goto fail;
                ps->p += 2;
                if (!parse_hex4(ps, &low) || low < 0xdc00 || low > 0xdfff)
                    goto fail;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            } else if ((cp >= 0xdc00 && cp <= 0xdfff) || cp == 0) {
                goto fail;
            }
            n += utf8_encode(cp, s + n);
            break;
        }
        default:
            goto fail;
        }
        if (ps->p > close)
            goto fail;
    }
    s[n] = '\0';
    ps->p = close + 1;
    *out = s;
    return true;
fail:
    explicit_bzero(s, (size_t)(close - start) + 1);
    free(s);
    return false;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Parsed by hand rather than with strtod(), which follows the calling program's locale. */
static bool parse_number(struct parser *ps, long long *out) {
    const char *p = ps->p;
    bool negative = false;
    long long v = 0;
    if (p < ps->end && *p == '-') {
        negative = true;
        p++;
    }
    if (p >= ps->end || !is_digit(*p))
        return false;
    if (*p == '0') {
        p++;
    } else {
        for (; p < ps->end && is_digit(*p); p++)
            v = v > (LLONG_MAX - 9) / 10 ? LLONG_MAX : v * 10 + (*p - '0');
    }
    if (p < ps->end && *p == '.') {
        p++;
        if (p >= ps->end || !is_digit(*p))
            return false;
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        p++;
        bool negative_exponent = false;
        if (p < ps->end && (*p == '+' || *p == '-'))
            negative_exponent = *p++ == '-';
        if (p >= ps->end || !is_digit(*p))
            return false;
        int exponent = 0;
        for (; p < ps->end && is_digit(*p); p++)
            exponent = exponent > 100 ? exponent : exponent * 10 + (*p - '0');
        for (int i = 0; i < exponent && v != 0; i++)
            v = negative_exponent ? v / 10 : (v > LLONG_MAX / 10 ? LLONG_MAX : v * 10);
    }
    ps->p = p;
    *out = negative ? -v : v;
    return true;
}

static bool parse_literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return false;
    ps->p += n;
    return true;
}

static bool parse_value(struct parser *ps, struct json *v, unsigned depth);

/* Parses an array or an object at ps->p (on its opening bracket). */
static bool parse_container(struct parser *ps, struct json *v, unsigned depth) {
    bool object = *ps->p == '{';
    char close = object ? '}' : ']';
    size_t capacity = 0;
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        if (v->count == capacity) {
            size_t grown = capacity ? capacity * 2 : 8;
            struct json *items = calloc(grown, sizeof(*items));
            char **keys = object ? calloc(grown, sizeof(*keys)) : NULL;
            if (!items || (object && !keys)) {
                free(items);
                free(keys);
                return false;
            }
            if (v->count) {
                memcpy(items, v->items, v->count * sizeof(*items));
                if (object)
                    memcpy(keys, v->keys, v->count * sizeof(*keys));
            }
            free(v->items);
            free(v->keys);
            v->items = items;
            v->keys = keys;
            capacity = grown;
        }
        skip_space(ps);
        /* Counted before parsing, so that a half-parsed member is freed with the rest. */
        v->count++;
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"' || !parse_string(ps, &v->keys[v->count - 1]))
                return false;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return false;
            ps->p++;
        }
        if (!parse_value(ps, &v->items[v->count - 1], depth + 1))
            return false;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return true;
        }
        return false;
    }
}

static bool parse_value(struct parser *ps, struct json *v, unsigned depth) {
    if (depth > MAX_JSON_DEPTH)
        return false;
    skip_space(ps);
    if (ps->p >= ps->end)
        return false;
    switch (*ps->p) {
    case '{':
    case '[':
        return parse_container(ps, v, depth);
    case '"':
        v->type = JSON_STRING;
        return parse_string(ps, &v->string);
    case 't':
        v->type = JSON_TRUE;
        return parse_literal(ps, "true");
    case 'f':
        v->type = JSON_FALSE;
        return parse_literal(ps, "false");
    case 'n':
        v->type = JSON_NULL;
        return parse_literal(ps, "null");
    default:
        v->type = JSON_NUMBER;
        return parse_number(ps, &v->number);
    }
}

bool json_parse(const char *text, size_t length, struct json *v) {
    struct parser ps = {.p = text, .end = text + length};
    *v = (struct json){0};
    if (parse_value(&ps, v, 0)) {
        skip_space(&ps);
        if (ps.p == ps.end)
            return true;
    }
    json_free(v);
    return false;
}

const struct json *json_get(const struct json *object, const char *key) {
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0)
            return &object->items[i];
    return NULL;
}

const char *json_get_string(const struct json *object, const char *key) {
    const struct json *v = json_get(object, key);
    return v && v->type == JSON_STRING ? v->string : NULL;
}

bool json_get_bool(const struct json *object, const char *key) {
    const struct json *v = json_get(object, key);
    return v && v->type == JSON_TRUE;
}

bool json_get_integer(const struct json *object, const char *key, long long *out) {
    const struct json *v = json_get(object, key);
    if (!v || v->type != JSON_NUMBER)
        return false;
    *out = v->number;
    return true;
}
