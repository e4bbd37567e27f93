/* The conversation with the person (conversation.h). */

#define _GNU_SOURCE

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "conversation.h"

/* Text from the daemon is shown to the person: control characters (terminal escapes) become '?'. */
void sanitise(const char *in, char *out, size_t size) {
    size_t i = 0;
    for (; in[i] && i + 1 < size; i++)
        out[i] = ((unsigned char)in[i] < 0x20 || in[i] == 0x7f) ? '?' : in[i];
    out[i] = '\0';
}

/* An instruction the person needs (touch the reader): shown even with PAM_SILENT. */
void instruct(const struct login *l, const char *text) {
    char clean[MAX_MESSAGE_LENGTH];
    sanitise(text, clean, sizeof(clean));
    (void)pam_info(l->pamh, "%s", clean);
}

/* Information and complaints: left out with PAM_SILENT. A failed conversation here changes
 * nothing, so its result is ignored. */
void inform(const struct login *l, const char *text) {
    if (!(l->flags & PAM_SILENT))
        instruct(l, text);
}

void complain(const struct login *l, const char *text) {
    char clean[MAX_MESSAGE_LENGTH];
    if (l->flags & PAM_SILENT)
        return;
    sanitise(text, clean, sizeof(clean));
    (void)pam_error(l->pamh, "%s", clean);
}

void say_wait(const struct login *l, const char *what, long long seconds) {
    char text[MAX_MESSAGE_LENGTH];
    if (seconds > MAX_WAIT_SHOWN_SEC)
        seconds = MAX_WAIT_SHOWN_SEC;
    long long minutes = (seconds + 59) / 60;
    if (seconds < 60)
        snprintf(text, sizeof(text), "%s Try again in %lld second%s.", what, seconds,
                 seconds == 1 ? "" : "s");
    else
        snprintf(text, sizeof(text), "%s Try again in %lld minute%s.", what, minutes,
                 minutes == 1 ? "" : "s");
    complain(l, text);
}

/* Seconds from now until an RFC 3339 UTC time as the daemon writes it ("2026-01-02T03:04:05Z"),
 * or -1 when it cannot be read. Only for telling the person how long to wait. */
long long seconds_until(const char *timestamp) {
    struct tm tm = {0};
    char zone = 0;
    if (sscanf(timestamp, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &zone) != 7 ||
        zone != 'Z')
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t until = timegm(&tm);
    time_t now = time(NULL);
    if (until == (time_t)-1)
        return -1;
    return until > now ? (long long)(until - now) : 1;
}

/* Asks for a secret of at most max_length bytes; returns PAM_SUCCESS with *answer set,
 * PAM_CONV_ERR (not logged: the application reports its own conversation failures), or
 * PAM_AUTH_ERR for an empty or over-long answer, which is not sent as an attempt. */
int ask_secret_within(const struct login *l, const char *prompt, size_t max_length, char **answer) {
    *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_OFF, answer, "%s", prompt);
    if (r != PAM_SUCCESS || !*answer) {
        erase_and_free(*answer);
        *answer = NULL;
        return PAM_CONV_ERR;
    }
    if (!**answer || strlen(*answer) > max_length) {
        erase_and_free(*answer);
        *answer = NULL;
        return PAM_AUTH_ERR;
    }
    return PAM_SUCCESS;
}

/* A passcode, or a secret as short (an activation step's). */
int ask_secret(const struct login *l, const char *prompt, char **answer) {
    return ask_secret_within(l, prompt, MAX_PASSCODE_LENGTH, answer);
}
