/* account, and what auth leaves in the handle for it (account.h). */

#define _GNU_SOURCE

#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "conversation.h"
#include "person.h"
#include "step.h"

/* pam_set_data key: this module authenticated someone in this handle (fail closed in account). */
#define DATA_AUTHENTICATED "pam_kioskauth.authenticated"

/* Remembers in the handle that this module authenticated someone, so that account fails
 * closed. If it cannot be remembered, the authentication does not count. */
int remember_authentication(const struct login *l) {
    const char *user = string_item(l->pamh, PAM_USER);
    char *copy = user ? strdup(user) : NULL;
    if (!copy)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
    int r = pam_set_data(l->pamh, DATA_AUTHENTICATED, copy, free_data);
    if (r != PAM_SUCCESS) {
        free(copy);
        return log_ret(l, r, LOG_ERR, "Cannot remember the authentication: %s",
                       pam_strerror(l->pamh, r));
    }
    return PAM_SUCCESS;
}

/* Whether this module authenticated someone in this handle (by its last auth). */
bool authenticated_in(pam_handle_t *pamh) {
    const void *mark = NULL;
    return pam_get_data(pamh, DATA_AUTHENTICATED, &mark) == PAM_SUCCESS && mark;
}

/* Whether PAM_USER is someone else than the person this module's last auth authenticated. */
bool user_changed_since_auth(pam_handle_t *pamh) {
    const void *mark = NULL;
    const char *user = string_item(pamh, PAM_USER);
    if (pam_get_data(pamh, DATA_AUTHENTICATED, &mark) != PAM_SUCCESS || !mark)
        return false;
    return !user || strcmp(user, mark) != 0;
}

/* Forgets an earlier auth's success: a new auth starts with nobody authenticated. */
void forget_authentication(pam_handle_t *pamh) {
    const void *mark = NULL;
    if (pam_get_data(pamh, DATA_AUTHENTICATED, &mark) == PAM_SUCCESS && mark)
        (void)pam_set_data(pamh, DATA_AUTHENTICATED, NULL, NULL);
}

int get_person(const struct login *l, const char *name, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.GetPerson\",\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, "}}");
    return ask(l, &request, reply);
}

/* CheckAccount: may the person log in now, and their record. */
int account_status(const struct login *l, const char *name, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CheckAccount\",\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    return ask(l, &request, reply);
}

/* Whether the person may log in now. People the daemon does not manage are the next module's
 * business, unless this module authenticated them in this handle: then every doubt refuses. */
int check_account(const struct login *l, bool authenticated_here) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (authenticated_here && user_changed_since_auth(l->pamh))
        return log_ret(l, PAM_PERM_DENIED, LOG_ERR, "PAM_USER changed after authentication");
    if (!user || !login_name_is_valid(user)) {
        if (authenticated_here)
            return log_ret(l, PAM_PERM_DENIED, LOG_ERR, "PAM_USER changed after authentication");
        return PAM_USER_UNKNOWN;
    }
    _cleanup_reply_ struct reply reply = {0};
    if (account_status(l, user, &reply) < 0) {
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, MESSAGE_UNAVAILABLE);
        return log_ret(l, PAM_PERM_DENIED, LOG_ERR,
                       "Cannot ask kioskauthd whether %s may log in; refusing", user);
    }
    if (!reply.error) {
        const struct json *p = reply.parameters;
        if (json_get_bool(p, "allowed")) {
            struct person_info who = {0};
            struct login copy = *l;
            copy.person = &who;
            note_person(&copy, json_get(p, "person"));
            return check_binding(l, &who) == PAM_SUCCESS ? PAM_SUCCESS : PAM_PERM_DENIED;
        }
        const char *reason = json_get_string(p, "reason");
        const char *state = json_get_string(json_get(p, "person"), "state");
        complain(l, reason ? reason : not_active_message(state));
        /* Suspended is an account an admin switched off (as an expired one is); anything else,
         * not activated yet or outside a window, is a refusal for now. */
        int r = state && strcmp(state, "suspended") == 0 ? PAM_ACCT_EXPIRED : PAM_PERM_DENIED;
        return log_ret(l, r, LOG_NOTICE, "%s may not log in: %s", user,
                       reason ? reason : (state ? state : "no reason given"));
    }
    if (is_error(&reply, "NoSuchPerson")) {
        if (!authenticated_here)
            return PAM_USER_UNKNOWN;
        complain(l, "Your account was removed from this terminal.");
        return log_ret(l, PAM_PERM_DENIED, LOG_NOTICE, "%s was removed after authenticating", user);
    }
    unexpected(l, "CheckAccount", &reply);
    if (!authenticated_here)
        return PAM_IGNORE;
    complain(l, MESSAGE_UNAVAILABLE);
    return PAM_PERM_DENIED;
}
