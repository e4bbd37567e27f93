/*
 * Checks the module's hand-written JSON writer and reader, linked with the ASan/UBSan build of
 * the module's internal library (asan/libkioskauth-pam.a): `make json-check`.
 *
 * - replies shaped like the daemon's parse, and their fields read back;
 * - every string the writer produces (all bytes 1-255, escapes, invalid UTF-8) parses back to
 *   the same text, or to U+FFFD where the input was not UTF-8;
 * - every prefix of a reply, and many random mutations of replies, are refused or parsed
 *   without a memory error (the sanitizers abort on one);
 * - display names cleaned for the environment: no control characters, whole characters only.
 */

#define _GNU_SOURCE

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conversation.h"
#include "json.h"
#include "login.h"
#include "person.h"

#define CHECK(condition)                                                                           \
    do {                                                                                           \
        if (!(condition)) {                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition);          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static const char *const replies[] = {
    "{\"parameters\":{\"progress\":{\"state\":\"touch\",\"hint\":\"Touch the fingerprint "
    "reader\"}},\"continues\":true}",
    "{\"parameters\":{\"person\":{\"name\":\"sarah\",\"displayName\":\"Sarah \\u00c5berg "
    "\\ud83d\\ude00\",\"roles\":[\"caregiver\",\"family\"],\"uid\":null,\"fingers\":[],"
    "\"passcodeFailures\":0,\"hasPasscode\":true},\"ticket\":\"abc\",\"ticketExpiresIn\":120}}",
    "{\"error\":\"io.kioskauth.WrongPasscode\",\"parameters\":{\"failures\":3,\"until\":\"2026-"
    "01-02T03:04:05Z\",\"retryAfterSeconds\":6e1}}",
    "{\"error\":\"io.kioskauth.NoReader\"}",
    " { \"error\" : \"org.varlink.service.MethodNotFound\" , \"parameters\" : { \"method\" : "
    "\"x\\\"y\\\\z\\/\\b\\f\\n\\r\\t\" } } ",
    "{\"parameters\":{\"n\":-12.5e-1,\"big\":123456789012345678901234567890,\"t\":true,"
    "\"f\":false,\"z\":null,\"a\":[[[]],{},\"\"]}}",
};

static void check_replies(void) {
    struct json v;
    CHECK(json_parse(replies[0], strlen(replies[0]), &v));
    CHECK(json_get_bool(&v, "continues"));
    CHECK(strcmp(json_get_string(json_get(json_get(&v, "parameters"), "progress"), "hint"),
                 "Touch the fingerprint reader") == 0);
    json_free(&v);

    CHECK(json_parse(replies[1], strlen(replies[1]), &v));
    const struct json *person = json_get(json_get(&v, "parameters"), "person");
    CHECK(strcmp(json_get_string(person, "displayName"), "Sarah \xc3\x85"
                                                         "berg \xf0\x9f\x98\x80") == 0);
    CHECK(json_get_bool(person, "hasPasscode"));
    CHECK(json_get(person, "uid")->type == JSON_NULL);
    json_free(&v);

    CHECK(json_parse(replies[2], strlen(replies[2]), &v));
    long long seconds = 0;
    CHECK(json_get_integer(json_get(&v, "parameters"), "retryAfterSeconds", &seconds));
    CHECK(seconds == 60);
    json_free(&v);

    CHECK(json_parse(replies[4], strlen(replies[4]), &v));
    CHECK(strcmp(json_get_string(json_get(&v, "parameters"), "method"), "x\"y\\z/\b\f\n\r\t") == 0);
    json_free(&v);

    CHECK(json_parse(replies[5], strlen(replies[5]), &v));
    CHECK(json_get_integer(json_get(&v, "parameters"), "n", &seconds) && seconds == -1);
    CHECK(json_get_integer(json_get(&v, "parameters"), "big", &seconds) && seconds == LLONG_MAX);
    json_free(&v);

    static const char *const invalid[] = {
        "",
        "{",
        "{\"a\":}",
        "{\"a\" 1}",
        "[1,]",
        "{\"a\":1,}",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "\"\\udc00x\"",
        "\"\x01\"",
        "01",
        "1.",
        "-",
        "tru",
        "{} {}",
        "\"\\x\"",
        "\"\\u12\"",
        "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]",
    };
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
        CHECK(!json_parse(invalid[i], strlen(invalid[i]), &v));
        CHECK(v.type == JSON_NULL && v.count == 0 && !v.string);
    }
}

/* Every byte through the writer and back. */
static void check_writer(void) {
    char input[512];
    size_t n = 0;
    for (int c = 1; c < 256; c++)
        input[n++] = (char)c;
    input[n] = '\0';
    struct buffer b = {0};
    json_string(&b, input);
    CHECK(!b.failed);
    struct json v;
    CHECK(json_parse(b.data, b.length, &v));
    CHECK(v.type == JSON_STRING);
    /* 1-127 come back as they were; 128-255 alone are not UTF-8: each is U+FFFD. */
    CHECK(memcmp(v.string, input, 127) == 0);
    for (size_t i = 0; i < 128; i++)
        CHECK(memcmp(v.string + 127 + 3 * i, "\xef\xbf\xbd", 3) == 0);
    CHECK(strlen(v.string) == 127 + 3 * 128);
    json_free(&v);
    buffer_erase(&b);

    const char *utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \"quoted\" back\\slash";
    json_string(&b, utf8);
    CHECK(json_parse(b.data, b.length, &v) && strcmp(v.string, utf8) == 0);
    json_free(&v);
    buffer_erase(&b);

    /* Overlong, surrogate and out-of-range sequences are not UTF-8. */
    const char *bad[] = {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_string(&b, bad[i]);
        CHECK(json_parse(b.data, b.length, &v) && !strstr(v.string, bad[i]));
        json_free(&v);
        buffer_erase(&b);
    }
}

static uint32_t next_random(uint32_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

/* Prefixes and random mutations: refused or parsed, never a memory error. Each input is copied
 * into a buffer of exactly its size, so a read past the end is caught. */
static void check_mutations(unsigned rounds) {
    uint32_t state = 0x9e3779b9;
    static const char alphabet[] = "{}[]\":,\\u0dD8eE.-+ tfn1\x01\xff";
    unsigned parsed = 0;
    for (size_t r = 0; r < sizeof(replies) / sizeof(replies[0]); r++) {
        size_t length = strlen(replies[r]);
        for (size_t cut = 0; cut <= length; cut++) {
            char *copy = malloc(cut ? cut : 1);
            memcpy(copy, replies[r], cut);
            struct json v;
            parsed += json_parse(copy, cut, &v);
            json_free(&v);
            free(copy);
        }
        for (unsigned i = 0; i < rounds; i++) {
            char *copy = malloc(length);
            memcpy(copy, replies[r], length);
            unsigned edits = 1 + next_random(&state) % 4;
            for (unsigned e = 0; e < edits; e++)
                copy[next_random(&state) % length] =
                    alphabet[next_random(&state) % (sizeof(alphabet) - 1)];
            struct json v;
            parsed += json_parse(copy, length, &v);
            json_free(&v);
            free(copy);
        }
    }
    printf("mutations: %u inputs parsed\n", parsed);
}

/* Each input is copied into a buffer of exactly its size, and the output goes into one of
 * exactly the given size, so a read or write past either end is caught. */
static void check_display_name(const char *in, size_t size, const char *expected) {
    char *copy = strdup(in);
    char *out = malloc(size);
    CHECK(copy && out);
    clean_display_name(copy, out, size);
    if (strcmp(out, expected) != 0) {
        fprintf(stderr, "display name %s: got \"%s\", expected \"%s\"\n", in, out, expected);
        exit(1);
    }
    free(out);
    free(copy);
}

static void check_display_names(void) {
    check_display_name("Sarah Lee", 64, "Sarah Lee");
    check_display_name("", 1, "");
    check_display_name("a\nb\r\tc\x1b[31md\x7f", 64, "a b  c [31md ");
    /* C1 controls (NEL, CSI) and the Unicode line and paragraph separators. */
    check_display_name("a\xc2\x85\xc2\x9b"
                       "b\xe2\x80\xa8\xe2\x80\xa9",
                       64, "a  b  ");
    /* Not UTF-8: each byte becomes '?'. */
    check_display_name("x\xff\xc0\xafy\xe2\x82", 64, "x???y??");
    /* Cut at a character boundary: \u00c5 is two bytes, \u20ac three. */
    check_display_name("\xc3\x85\xc3\x85", 4, "\xc3\x85");
    check_display_name("ab\xe2\x82\xac", 5, "ab");
    check_display_name("ab\xe2\x82\xac", 6, "ab\xe2\x82\xac");
    CHECK(role_is_valid("caregiver") && !role_is_valid("") && !role_is_valid("Care") &&
          !role_is_valid("a\nb") && !role_is_valid("abcdefghijklmnopqrstuvwxyzabcdefg"));
}

int main(int argc, char **argv) {
    unsigned rounds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 20000;
    check_replies();
    check_writer();
    check_mutations(rounds);
    CHECK(login_name_is_valid("sarah") && login_name_is_valid("a.b_c-d@e+f") &&
          !login_name_is_valid("Sarah") && !login_name_is_valid(".x") && !login_name_is_valid("") &&
          !login_name_is_valid("s r"));
    CHECK(seconds_until("1970-01-01T00:00:00Z") == 1 && seconds_until("yesterday") == -1);
    check_display_names();
    puts("json-check: ok");
    return 0;
}
