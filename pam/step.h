/* The flows' common vocabulary: what a step leaves to do next, and the replies every flow reads
 * the same way (a person not active, a sign-in required online, an error nobody expected). */

#ifndef KIOSKAUTH_PAM_STEP_H
#define KIOSKAUTH_PAM_STEP_H

#include <stdbool.h>

#include "login.h"
#include "varlink.h"

/* What a step leaves to do: nothing more (return `ret`), ask for the name, ask for the
 * passcode, activate a person who has not activated yet, sign an identity-provider person in
 * online (`name`, when the step found out who), or a first online login for a name the daemon
 * does not know. `ret` is what to return when the mode allows no next step. */
enum next { NEXT_NONE, NEXT_ASK_NAME, NEXT_PASSCODE, NEXT_ACTIVATE, NEXT_ONLINE, NEXT_FIRST_LOGIN };
struct step {
    int ret;
    enum next next;
    char name[MAX_NAME_LENGTH + 1];
    /* NEXT_ONLINE: say "Please sign in..." once the daemon allows the online login. */
    bool say_sign_in;
    /* NEXT_ASK_NAME: the finger is done with (out of tries, or identify paused); after the name
     * comes the passcode, not another touch. */
    bool finger_done;
};

bool is_pending(const char *state);
/* What a person who may not log in now (suspended, not activated yet, ...) is told. */
const char *not_active_message(const char *state);
/* Logs an error no flow expected; PAM_AUTHINFO_UNAVAIL (PAM_AUTH_ERR for AccountNotAllowed). */
struct step unexpected(const struct login *l, const char *method, const struct reply *reply);
/* OfflineWindowExpired or OnlineLoginRequired. */
bool must_sign_in_online(const struct reply *reply);
/* Says the daemon's line and returns NEXT_ONLINE, naming the person when the reply does. */
struct step sign_in_required(const struct login *l, const struct reply *reply);

#endif
