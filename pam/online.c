/* Online login with the identity provider (docs/design.md, §2.3): a person's first login at this
 * terminal, the fallback of an identity-provider person without a passcode, and the way back in
 * when their offline window has ended. The daemon talks to the provider (LoginWithPassword, or
 * StartDeviceLogin with idp_login=device) and answers with the person, created at their first
 * login, a ticket bound to this connection, and whether to offer fingerprint enrolment; the
 * offer, the enrolment and a decline (SetBiometricOffer) use that ticket on the same connection,
 * in the same conversation, as activation does. The password is wiped as soon as it is sent. */

#define _GNU_SOURCE

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "conversation.h"
#include "enrol.h"
#include "handover.h"
#include "online.h"
#include "person.h"
#include "step.h"

/* The daemon's own limits for an online login (RFC 5321's path limit; a generous password cap). */
#define MAX_EMAIL_LENGTH 254
#define MAX_PASSWORD_LENGTH 1024
/* An online login waits for the identity provider, which the daemon bounds by its
 * RequestTimeoutSec (default 10 s) per request, and a first login may need three (discovery,
 * token, keys). */
#define ONLINE_LOGIN_TIMEOUT_MSEC 45000
/* A device login waits while the person signs in on their phone: as long as the code is valid,
 * but never longer than this, and a little longer than the daemon so that it says why it ended. */
#define MAX_DEVICE_LOGIN_SEC 900
#define DEVICE_LOGIN_GRACE_MSEC 5000

/* Whether a name could be an email address: something@domain.tld, one '@'. */
static bool looks_like_email(const char *name) {
    const char *at = strchr(name, '@');
    return at && at != name && !strchr(at + 1, '@') && strchr(at + 1, '.') &&
           at[strlen(at) - 1] != '.' && at[1] != '.';
}

/* The provider cannot be reached: what still works, said plainly. */
static const char *idp_unavailable_message(const struct login *l) {
    return l->person && l->person->online_only ? MESSAGE_IDP_UNAVAILABLE_ONLINE_ONLY
                                               : MESSAGE_IDP_UNAVAILABLE;
}

/* What the person is told when the daemon did not log them in, and the PAM code. */
static int online_login_refused(const struct login *l, const struct reply *reply) {
    const char *reason = json_get_string(reply->parameters, "reason");
    const char *field = json_get_string(reply->parameters, "field");
    if (!reason)
        reason = "no reason given";
    if (is_error(reply, "WrongCredentials")) {
        complain(l, MESSAGE_WRONG_CREDENTIALS);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "NotAdmitted") || is_error(reply, "UnknownRole")) {
        complain(l, is_error(reply, "NotAdmitted") ? MESSAGE_NOT_ADMITTED : MESSAGE_UNKNOWN_ROLE);
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "Online login refused: %s: %s", reply->error,
                       reason);
    }
    if (is_error(reply, "DeviceLoginDenied")) {
        complain(l, MESSAGE_DEVICE_DENIED);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "DeviceLoginExpired")) {
        complain(l, MESSAGE_DEVICE_EXPIRED);
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "InvalidInput")) {
        complain(l, field && strcmp(field, "email") == 0 ? MESSAGE_NOT_AN_EMAIL
                                                         : MESSAGE_WRONG_CREDENTIALS);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "IdentityProviderUnavailable")) {
        complain(l, idp_unavailable_message(l));
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_WARNING,
                       "The identity provider is unavailable: %s", reason);
    }
    if (is_error(reply, "IdentityProviderRefused") ||
        is_error(reply, "IdentityProviderNotConfigured")) {
        complain(l, MESSAGE_IDP_BROKEN);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_ERR, "Online login failed: %s: %s",
                       reply->error, reason);
    }
    if (is_error(reply, "OnlineLoginPaused")) {
        long long seconds = 0;
        if (json_get_integer(reply->parameters, "retryAfterSeconds", &seconds) && seconds > 0)
            say_wait(l, MESSAGE_LOGIN_PAUSED, seconds);
        else
            complain(l, MESSAGE_LOGIN_PAUSED " Try again later.");
        return PAM_MAXTRIES;
    }
    if (is_error(reply, "OnlineLoginNotAllowed")) {
        complain(l, MESSAGE_ONLINE_NOT_HERE);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s", reason);
    }
    if (is_error(reply, "PermissionDenied"))
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s", reason);
    return unexpected(l, "Online login", reply).ret;
}

/* LoginWithPassword on `c`: asks for the email address (unless known) and the password. Returns
 * PAM_SUCCESS with the daemon's final reply in `reply`, or the PAM code to return. */
static int password_login(const struct login *l, struct connection *c, const char *email,
                          struct reply *reply) {
    _cleanup_free_ char *typed = NULL;
    char prompt[MAX_MESSAGE_LENGTH];
    if (email) {
        char clean[MAX_EMAIL_LENGTH + 1];
        sanitise(email, clean, sizeof(clean));
        snprintf(prompt, sizeof(prompt), "Password for %s: ", clean);
    } else {
        int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &typed, "%s", PROMPT_EMAIL);
        if (r != PAM_SUCCESS || !typed)
            return PAM_CONV_ERR;
        if (!typed[0])
            return PAM_AUTH_ERR;
        if (strlen(typed) > MAX_EMAIL_LENGTH || !strchr(typed, '@')) {
            complain(l, MESSAGE_NOT_AN_EMAIL);
            return PAM_AUTH_ERR;
        }
        email = typed;
        snprintf(prompt, sizeof(prompt), "%s", PROMPT_PASSWORD);
    }
    _cleanup_erase_ char *password = NULL;
    int r = ask_secret_within(l, prompt, MAX_PASSWORD_LENGTH, &password);
    if (r != PAM_SUCCESS)
        return r;
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request,
                "{\"method\":\"io.kioskauth.LoginWithPassword\",\"parameters\":{\"email\":");
    json_string(&request, email);
    buffer_puts(&request, ",\"password\":");
    json_string(&request, password);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    /* Interruptible: Ctrl-C while the provider is slow ends the wait, and closing the connection
     * cancels the call in the daemon. */
    r = exchange_within(l, c, &request, reply, ONLINE_LOGIN_TIMEOUT_MSEC, true);
    if (r == -EINTR) {
        log_debug(l, "Online login interrupted by a signal");
        return PAM_AUTH_ERR;
    }
    if (r < 0) {
        complain(l, idp_unavailable_message(l));
        return PAM_AUTHINFO_UNAVAIL;
    }
    return PAM_SUCCESS;
}

/* StartDeviceLogin on `c` (RFC 8628, for providers that refuse the password grant): shows the
 * code and where to type it, then waits while the person signs in on their phone, as long as
 * the code is valid (at most MAX_DEVICE_LOGIN_SEC); a signal (Ctrl-C) ends the wait, and closing
 * the connection ends the daemon's polling. Returns as password_login does. */
static int device_login(const struct login *l, struct connection *c, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.StartDeviceLogin\",\"more\":true,"
                          "\"parameters\":{\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    if (request.failed)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
    uint64_t deadline = now_msec() + ONLINE_LOGIN_TIMEOUT_MSEC;
    int r = connection_send(c, &request, deadline);
    for (;;) {
        if (r >= 0)
            r = connection_receive(c, deadline, true, reply);
        if (r == -EINTR) {
            log_debug(l, "Device login interrupted by a signal");
            return PAM_AUTH_ERR;
        }
        if (r == -ETIMEDOUT) {
            complain(l, MESSAGE_DEVICE_EXPIRED);
            return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Device login: no answer in time");
        }
        if (r < 0) {
            complain(l, idp_unavailable_message(l));
            return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_WARNING, "kioskauthd did not answer: %s",
                           strerror(-r));
        }
        if (!reply->continues)
            return PAM_SUCCESS;
        const struct json *prompt = json_get(reply->parameters, "prompt");
        const char *code = json_get_string(prompt, "userCode");
        const char *uri = json_get_string(prompt, "verificationUri");
        long long seconds = 0;
        if (!code || !uri)
            continue;
        if (!json_get_integer(prompt, "expiresIn", &seconds) || seconds <= 0 ||
            seconds > MAX_DEVICE_LOGIN_SEC)
            seconds = MAX_DEVICE_LOGIN_SEC;
        char text[MAX_MESSAGE_LENGTH];
        long long minutes = (seconds + 59) / 60;
        snprintf(text, sizeof(text),
                 "To sign in, open %s on your phone and enter the code %s within %lld minute%s.",
                 uri, code, minutes, minutes == 1 ? "" : "s");
        instruct(l, text);
        deadline = now_msec() + (uint64_t)seconds * 1000 + DEVICE_LOGIN_GRACE_MSEC;
    }
}

/* The online login itself. `email`: the address to sign in with, or NULL to ask for it.
 * `expected`: the person who must be signed in (the one PAM_USER names), or NULL for a first
 * login whose name the module asked for itself: then the daemon's name for the person becomes
 * PAM_USER. On success PAM_USER is the person, and the connection and ticket are kept for the
 * session. */
static int sign_in_online(const struct login *l, const char *email, const char *expected) {
    /* No online login over a remote session: nobody there can enrol a finger, and the terminal
     * must not become a way to try an organisation's passwords from afar. */
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "No online login over a remote session");
    _cleanup_activation_ struct activation a = ACTIVATION_INIT;
    if (connection_open(l, &a.c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_reply_ struct reply reply = {0};
    int r = l->options.device_login ? device_login(l, &a.c, &reply)
                                    : password_login(l, &a.c, email, &reply);
    if (r != PAM_SUCCESS)
        return r;
    if (reply.error)
        return online_login_refused(l, &reply);

    const struct json *p = reply.parameters;
    const struct json *person = json_get(p, "person");
    const char *name = reply_person_name(&reply);
    if (!name)
        return unexpected(l, "Online login", &(struct reply){.error = "malformed reply"}).ret;
    if (expected && strcmp(name, expected) != 0) {
        complain(l, MESSAGE_OTHER_PERSON);
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "Online login as %s, not %s; refusing", name,
                       expected);
    }
    memcpy(a.name, name, strlen(name) + 1);
    const char *display_name = json_get_string(person, "displayName");
    clean_display_name(display_name && *display_name ? display_name : name, a.display_name,
                       sizeof(a.display_name));
    note_person(l, person);
    /* Out of memory here costs the enrolment offer, not the login. */
    (void)replace_string(&a.ticket, json_get_string(p, "ticket"));
    note_ticket_lifetime(&a, p);
    char welcome[MAX_MESSAGE_LENGTH];
    if (json_get_bool(p, "created"))
        snprintf(welcome, sizeof(welcome), "Welcome, %s", a.display_name);
    else
        snprintf(welcome, sizeof(welcome), "Welcome back, %s", a.display_name);
    inform(l, welcome);
    log_debug(l, "Online login of %s%s", name, json_get_bool(p, "created") ? " (created)" : "");
    if (json_get_bool(p, "offerFingerprint") && a.ticket) {
        r = offer_enrolment(l, &a);
        if (r != PAM_SUCCESS)
            return r;
    }
    r = pam_set_item(l->pamh, PAM_USER, a.name);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    keep_for_session(l, &a.c, a.ticket, a.name);
    return PAM_SUCCESS;
}

/* Asks the daemon whether an online login for `name` may happen in this context (the service,
 * the invoking user, a remote session, the terminal's throttle), without contacting the
 * provider; on PAM_SUCCESS `email` holds the address recorded for the person (empty when none).
 * Nothing about the person is shown before the daemon allows it. A refusal is logged, and the
 * person told in one line; a daemon without an identity provider is PAM_USER_UNKNOWN. */
static int may_sign_in_online(const struct login *l, const char *name, char *email, size_t size) {
    email[0] = '\0';
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "No online login over a remote session");
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CheckOnlineLogin\",\"parameters\":{");
    if (name) {
        buffer_puts(&request, "\"name\":");
        json_string(&request, name);
        buffer_puts(&request, ",");
    }
    buffer_puts(&request, "\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (ask(l, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (!reply.error) {
        const char *value = json_get_string(reply.parameters, "email");
        if (value && *value && strlen(value) < size && strlen(value) <= MAX_EMAIL_LENGTH)
            memcpy(email, value, strlen(value) + 1);
        return PAM_SUCCESS;
    }
    const char *reason = json_get_string(reply.parameters, "reason");
    long long seconds = 0;
    if (is_error(&reply, "IdentityProviderNotConfigured"))
        return PAM_USER_UNKNOWN;
    if (is_error(&reply, "OnlineLoginPaused")) {
        if (json_get_integer(reply.parameters, "retryAfterSeconds", &seconds) && seconds > 0)
            say_wait(l, MESSAGE_LOGIN_PAUSED, seconds);
        else
            complain(l, MESSAGE_LOGIN_PAUSED " Try again later.");
        return log_ret(l, PAM_MAXTRIES, LOG_NOTICE, "Online login paused on this terminal");
    }
    if (is_error(&reply, "OnlineLoginNotAllowed")) {
        complain(l, MESSAGE_ONLINE_NOT_HERE);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "Online login refused by kioskauthd: %s",
                       reason ? reason : "no reason given");
    }
    if (is_error(&reply, "PermissionDenied"))
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s",
                       reason ? reason : "no reason given");
    return unexpected(l, "CheckOnlineLogin", &reply).ret;
}

/* An identity-provider person the daemon knows signs in online, with the email address their
 * record holds (asked for when the daemon gives none), once the daemon allows an online login
 * here; `intro` is shown first. */
int sign_in_again(const struct login *l, const char *name, const char *intro) {
    char email[MAX_EMAIL_LENGTH + 1];
    int r = may_sign_in_online(l, name, email, sizeof(email));
    if (r != PAM_SUCCESS)
        return r == PAM_USER_UNKNOWN ? PAM_AUTHINFO_UNAVAIL : r;
    if (intro)
        inform(l, intro);
    return sign_in_online(l, email[0] ? email : NULL, name);
}

/* A name the daemon does not know: someone's first login at this terminal, when the name is an
 * email address, an identity provider is configured and the daemon allows an online login here
 * (CheckOnlineLogin); otherwise nobody the daemon manages, and the next module decides. `given`:
 * whether the application named the person; then the login must be theirs, or PAM_USER would change
 * under it; a name the module asked for itself is replaced by the daemon's. */
int first_login(const struct login *l, const char *name, bool given) {
    if (!looks_like_email(name) || l->remote)
        return PAM_USER_UNKNOWN;
    char email[MAX_EMAIL_LENGTH + 1];
    int r = may_sign_in_online(l, name, email, sizeof(email));
    if (r != PAM_SUCCESS)
        return r;
    log_debug(l, "%s is not known here yet: first online login", name);
    return sign_in_online(l, name, given ? name : NULL);
}
