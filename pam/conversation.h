/* The conversation: what the person is shown (instructions even with PAM_SILENT, information
 * and complaints not), waits said in words, and secrets asked for. */

#ifndef KIOSKAUTH_PAM_CONVERSATION_H
#define KIOSKAUTH_PAM_CONVERSATION_H

#include <stddef.h>

#include "login.h"
#include "messages.h"

#define MAX_MESSAGE_LENGTH 512
#define MAX_PASSCODE_LENGTH 128
/* The longest wait a message names (a day); a reply's larger figure is shown as this. */
#define MAX_WAIT_SHOWN_SEC (24LL * 3600)

/* Text from the daemon is shown to the person: control characters (terminal escapes) become '?'. */
void sanitise(const char *in, char *out, size_t size);
/* An instruction the person needs (touch the reader): shown even with PAM_SILENT. */
void instruct(const struct login *l, const char *text);
/* Information and complaints: left out with PAM_SILENT. */
void inform(const struct login *l, const char *text);
void complain(const struct login *l, const char *text);
/* "<what> Try again in N seconds/minutes." as a complaint. */
void say_wait(const struct login *l, const char *what, long long seconds);
/* Seconds from now until an RFC 3339 UTC time as the daemon writes it, or -1. */
long long seconds_until(const char *timestamp);

/* Asks for a secret of at most max_length bytes; returns PAM_SUCCESS with *answer set,
 * PAM_CONV_ERR (not logged: the application reports its own conversation failures), or
 * PAM_AUTH_ERR for an empty or over-long answer, which is not sent as an attempt. */
int ask_secret_within(const struct login *l, const char *prompt, size_t max_length, char **answer);
/* A passcode, or a secret as short (an activation step's). */
int ask_secret(const struct login *l, const char *prompt, char **answer);

#endif
