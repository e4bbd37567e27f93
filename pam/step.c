/* The replies every flow reads the same way (step.h). */

#define _GNU_SOURCE

#include <string.h>

#include "conversation.h"
#include "step.h"

bool is_pending(const char *state) { return state && strcmp(state, "pending_activation") == 0; }

const char *not_active_message(const char *state) {
    if (state && strcmp(state, "suspended") == 0)
        return "Your account is suspended.";
    if (state && strcmp(state, "pending_activation") == 0)
        return "Your account is not activated yet.";
    return "Your account may not log in now.";
}

struct step unexpected(const struct login *l, const char *method, const struct reply *reply) {
    const struct json *p = reply->parameters;
    const char *reason = json_get_string(p, "reason");
    /* The person is not bound to the Unix account PAM_USER names (the daemon audited it). */
    if (is_error(reply, "AccountNotAllowed")) {
        complain(l, MESSAGE_NOT_THIS_ACCOUNT);
        pam_syslog(l->pamh, LOG_NOTICE, "%s refused: %s", method, reason ? reason : "-");
        return (struct step){PAM_AUTH_ERR, NEXT_NONE};
    }
    pam_syslog(l->pamh, LOG_WARNING, "%s failed: %s%s%s", method, reply->error, reason ? ": " : "",
               reason ? reason : "");
    return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
}

bool must_sign_in_online(const struct reply *reply) {
    return is_error(reply, "OfflineWindowExpired") || is_error(reply, "OnlineLoginRequired");
}

/* An identity-provider person whose offline window has ended, or whose local unlock is suspended
 * until they sign in online: the daemon's one line, then (where the conversation has a keyboard)
 * the online login. */
struct step sign_in_required(const struct login *l, const struct reply *reply) {
    const char *message = json_get_string(reply->parameters, "message");
    const char *name = json_get_string(reply->parameters, "name");
    struct step s = {PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, ""};
    complain(l, message ? message : "Sign in online.");
    if (l->person)
        l->person->online_only = true;
    if (name && login_name_is_valid(name))
        memcpy(s.name, name, strlen(name) + 1);
    log_debug(l, "%s: %s", reply->error, name ? name : "-");
    return s;
}
