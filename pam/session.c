/* Sessions: open_session registers the session with the daemon (OpenSession with the caller's
 * context), so that its idle timeout, overnight cut-off, maximum age, locks and step-up apply;
 * close_session ends it (CloseSession). The session id is kept in the handle for close_session
 * (never taken from the environment, which the application or a user's pam_env file could set)
 * and exported as KIOSKAUTH_SESSION, so that a kiosk app can report activity, lock the session
 * and ask for step-up. After this module's auth, the session opens with the authentication's
 * ticket (handover.c). */

#define _GNU_SOURCE

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "conversation.h"
#include "handover.h"
#include "person.h"
#include "session.h"
#include "step.h"

/* pam_set_data key: the id of the session open_session registered, for close_session. */
#define DATA_SESSION "pam_kioskauth.session"
/* Exported by open_session: the session a kiosk app reports activity, locks and step-up for. */
#define ENV_SESSION "KIOSKAUTH_SESSION"
/* A session id is the daemon's 32 hex digits; anything else is not put in the environment. */
#define MAX_SESSION_ID_LENGTH 64

static bool session_id_is_valid(const char *id) {
    size_t n = strnlen(id, MAX_SESSION_ID_LENGTH + 1);
    if (n == 0 || n > MAX_SESSION_ID_LENGTH)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}

static void open_session_request(struct buffer *request, const struct login *l, const char *name,
                                 const char *ticket) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.OpenSession\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"context\":");
    json_context(request, l);
    if (ticket) {
        buffer_puts(request, ",\"ticket\":");
        json_string(request, ticket);
    }
    buffer_puts(request, "}}");
}

/* CloseSession. A session that already ended (idle, overnight, a security logout) is no error. */
static int end_session(const struct login *l, const char *id) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CloseSession\",\"parameters\":{\"id\":");
    json_string(&request, id);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (ask(l, &request, &reply) < 0)
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "Cannot end session %.8s with kioskauthd", id);
    if (!reply.error || is_error(&reply, "NoSuchSession") || is_error(&reply, "SessionEnded")) {
        log_debug(l, "Session %.8s ended%s%s", id, reply.error ? " already: " : "",
                  reply.error ? reply.error : "");
        return PAM_SUCCESS;
    }
    unexpected(l, "CloseSession", &reply);
    return PAM_SESSION_ERR;
}

/* The session this module registered in this handle, or NULL. */
static const char *registered_session(pam_handle_t *pamh) {
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_SESSION, &data) != PAM_SUCCESS)
        return NULL;
    return data;
}

static void forget_session(pam_handle_t *pamh) {
    if (registered_session(pamh))
        (void)pam_set_data(pamh, DATA_SESSION, NULL, NULL);
    if (pam_getenv(pamh, ENV_SESSION))
        (void)pam_putenv(pamh, ENV_SESSION);
}

/* Keeps the id for close_session and exports it; if either fails, the session is ended at once
 * rather than left open with nobody able to end it. */
static int remember_session(const struct login *l, const char *id) {
    char *copy = strdup(id);
    int r = copy ? pam_set_data(l->pamh, DATA_SESSION, copy, free_data) : PAM_BUF_ERR;
    if (r != PAM_SUCCESS)
        free(copy);
    if (r == PAM_SUCCESS)
        r = put_variable(l, ENV_SESSION, id);
    if (r != PAM_SUCCESS) {
        (void)end_session(l, id);
        forget_session(l->pamh);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "Cannot keep session %.8s: %s", id,
                       pam_strerror(l->pamh, r));
    }
    return PAM_SUCCESS;
}

/* Why the daemon would not open the session, in one line for the person; PAM_SESSION_ERR, or
 * PAM_IGNORE for someone it does not know whom another module authenticated. */
static int session_refused(const struct login *l, const char *user, const struct reply *reply,
                           bool authenticated_here) {
    const struct json *p = reply->parameters;
    const char *message = json_get_string(p, "message");
    const char *reason = json_get_string(p, "reason");
    char text[MAX_MESSAGE_LENGTH];
    if (is_error(reply, "NoSuchPerson")) {
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, "Your account was removed from this terminal.");
    } else if (must_sign_in_online(reply)) {
        complain(l, message ? message : "Sign in online.");
    } else if (is_error(reply, "PersonNotActive")) {
        complain(l, not_active_message(json_get_string(p, "state")));
    } else if (is_error(reply, "InvalidInput") && message) {
        snprintf(text, sizeof(text), "Cannot open a session: %s.", message);
        complain(l, text);
    } else if (is_error(reply, "PermissionDenied")) {
        complain(l, MESSAGE_UNAVAILABLE);
    } else {
        complain(l, MESSAGE_UNAVAILABLE);
        unexpected(l, "OpenSession", reply);
    }
    return log_ret(l, PAM_SESSION_ERR, LOG_NOTICE, "No session for %s: %s%s%s", user, reply->error,
                   reason || message ? ": " : "", reason ? reason : (message ? message : ""));
}

int open_session(const struct login *l, bool authenticated_here) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (authenticated_here && user_changed_since_auth(l->pamh)) {
        forget_handover(l->pamh);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "PAM_USER changed after authentication");
    }
    if (!user || !login_name_is_valid(user)) {
        forget_handover(l->pamh);
        if (authenticated_here)
            return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "PAM_USER changed after authentication");
        return PAM_IGNORE;
    }
    /* A second open_session on one handle replaces the first session rather than leaking it. */
    const char *earlier = registered_session(l->pamh);
    if (earlier && end_session(l, earlier) == PAM_SUCCESS)
        forget_session(l->pamh);

    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    _cleanup_erase_ char *ticket = NULL;
    _cleanup_reply_ struct reply reply = {0};
    int r = -ENOTCONN;
    take_handover(l, user, &c, &ticket);
    if (ticket) {
        /* Only when the ticketed call surely registered nothing (it could not be sent, or the
         * daemon answered that the ticket or the connection is gone) is it made again without
         * the ticket; after a call that may have reached the daemon, a second one could register
         * a second session. */
        _cleanup_buffer_ struct buffer request = {0};
        open_session_request(&request, l, user, ticket);
        uint64_t deadline = now_msec() + CALL_TIMEOUT_MSEC;
        r = request.failed ? -ENOMEM : connection_send(&c, &request, deadline);
        if (r >= 0) {
            r = connection_receive(&c, deadline, false, &reply);
            if (r < 0) {
                if (!authenticated_here)
                    return PAM_IGNORE;
                complain(l, MESSAGE_UNAVAILABLE);
                return log_ret(l, PAM_SESSION_ERR, LOG_ERR,
                               "kioskauthd did not answer OpenSession for %s: %s", user,
                               strerror(-r));
            }
            if (is_error(&reply, "TicketInvalid") || is_error(&reply, "IdleTimeout"))
                r = -ENOTCONN;
        }
        if (r < 0) {
            log_debug(l, "The authentication's ticket is gone; opening the session without it");
            reply_clear(&reply);
        }
    }
    if (r < 0) {
        _cleanup_buffer_ struct buffer request = {0};
        open_session_request(&request, l, user, NULL);
        r = ask(l, &request, &reply);
    }
    if (r < 0) {
        /* Fail closed: a person this module let in gets no session the daemon does not know. */
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, MESSAGE_UNAVAILABLE);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR,
                       "Cannot register the session of %s with kioskauthd; refusing", user);
    }
    if (reply.error)
        return session_refused(l, user, &reply, authenticated_here);
    const struct json *session = json_get(reply.parameters, "session");
    const char *id = json_get_string(session, "id");
    if (!id || !session_id_is_valid(id)) {
        unexpected(l, "OpenSession", &(struct reply){.error = "malformed reply"});
        return PAM_SESSION_ERR;
    }
    log_debug(l, "Session %.8s opened for %s%s", id, user,
              json_get_string(session, "lastAuthenticationAt") ? ", authenticated" : "");
    return remember_session(l, id);
}

int close_session(const struct login *l) {
    const char *registered = registered_session(l->pamh);
    if (!registered)
        return PAM_IGNORE;
    char id[MAX_SESSION_ID_LENGTH + 1];
    snprintf(id, sizeof(id), "%s", registered);
    int r = end_session(l, id);
    if (r == PAM_SUCCESS)
        forget_session(l->pamh);
    return r;
}
