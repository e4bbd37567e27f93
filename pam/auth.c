/* auth: which flows run, in which order, for each mode (auth.h). */

#define _GNU_SOURCE

#include "auth.h"
#include "activation.h"
#include "buffer.h"
#include "conversation.h"
#include "finger.h"
#include "online.h"
#include "passcode.h"
#include "step.h"

/* Asks for the name (after walk-up identify gave up, or when a mode needs one) and makes it
 * PAM_USER; *name then points at PAM's copy. */
static int ask_name(const struct login *l, const char **name) {
    _cleanup_free_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_NAME);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    /* The daemon lowercases names; PAM_USER must be the name it will answer for. */
    for (char *p = answer; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    if (!*answer)
        return PAM_AUTH_ERR;
    if (!login_name_is_valid(answer))
        return PAM_USER_UNKNOWN;
    r = pam_set_item(l->pamh, PAM_USER, answer);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    *name = string_item(l->pamh, PAM_USER);
    return *name ? PAM_SUCCESS : PAM_SERVICE_ERR;
}

int authenticate(const struct login *l) {
    enum mode mode = l->options.mode;
    const char *user = NULL;
    int r = pam_get_item(l->pamh, PAM_USER, (const void **)&user);
    if (r != PAM_SUCCESS)
        return log_ret(l, PAM_SERVICE_ERR, LOG_ERR, "Cannot read PAM_USER: %s",
                       pam_strerror(l->pamh, r));
    if (user && !*user)
        user = NULL;
    if (user && !login_name_is_valid(user)) {
        /* Not a name the daemon could manage: let the next module decide, without asking. */
        log_debug(l, "Not a kioskauth name: %s", user);
        return PAM_USER_UNKNOWN;
    }
    if (mode == MODE_ACTIVATE)
        return activate(l, user, NULL);

    bool given = user != NULL;
    bool finger_done = false;
    if (!user) {
        if (mode == MODE_AUTO || mode == MODE_IDENTIFY) {
            struct step s = identify(l);
            finger_done = s.finger_done;
            /* Recognised, but their offline window has ended: they sign in online as themselves. */
            if (s.next == NEXT_ONLINE && mode == MODE_AUTO && s.name[0])
                return sign_in_again(l, s.name, NULL);
            if (s.next != NEXT_ASK_NAME || mode == MODE_IDENTIFY)
                return s.ret;
        }
        if (l->options.activation) {
            r = offer_activation(l);
            if (r != PAM_IGNORE)
                return r;
        }
        r = ask_name(l, &user);
        if (r != PAM_SUCCESS)
            return r;
    }

    if (mode != MODE_PASSCODE && !finger_done) {
        struct step s = verify_finger(l, user);
        if (s.next == NEXT_ACTIVATE) {
            /* A finger-only conversation has no keyboard for the code. */
            if (mode == MODE_IDENTIFY) {
                complain(l, not_active_message("pending_activation"));
                return s.ret;
            }
            return activate_pending(l, user);
        }
        /* Only a conversation with a keyboard goes on to the passcode or an online login. */
        if (mode == MODE_AUTO && s.next == NEXT_ONLINE)
            return sign_in_again(l, user, NULL);
        if (mode == MODE_AUTO && s.next == NEXT_FIRST_LOGIN)
            return first_login(l, user, given);
        if (s.next != NEXT_PASSCODE || mode != MODE_AUTO)
            return s.ret;
    }
    return verify_passcode(l, user, given);
}
