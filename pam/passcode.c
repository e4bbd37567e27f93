/* The passcode (passcode.h). */

#define _GNU_SOURCE

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "account.h"
#include "activation.h"
#include "conversation.h"
#include "enrol.h"
#include "handover.h"
#include "online.h"
#include "passcode.h"
#include "person.h"
#include "step.h"
#include "varlink.h"

/* Turns a VerifyPasscode error into what the person is told and the PAM code; *retry says
 * whether another attempt may follow. */
static int passcode_refused(const struct login *l, const struct reply *reply, bool *retry) {
    const struct json *p = reply->parameters;
    long long seconds = 0;
    *retry = false;
    if (is_error(reply, "WrongPasscode")) {
        if (json_get_integer(p, "retryAfterSeconds", &seconds) && seconds > 0) {
            say_wait(l, "Wrong passcode. Too many attempts.", seconds);
            return PAM_MAXTRIES;
        }
        complain(l, MESSAGE_WRONG_PASSCODE);
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "PasscodeLocked")) {
        if (json_get_bool(p, "hardLocked") || !json_get_integer(p, "retryAfterSeconds", &seconds))
            complain(l, MESSAGE_HARD_LOCKED);
        else
            say_wait(l, "Too many wrong passcodes.", seconds);
        return PAM_MAXTRIES;
    }
    if (is_error(reply, "PasscodeNotAllowed")) {
        const char *reason = json_get_string(p, "reason");
        char text[MAX_MESSAGE_LENGTH];
        pam_syslog(l->pamh, LOG_NOTICE, "Passcode refused by kioskauthd: %s",
                   reason ? reason : "no reason given");
        snprintf(text, sizeof(text), "Passcode not accepted: %s.", reason ? reason : "not allowed");
        complain(l, text);
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "NoPasscode")) {
        complain(l, "No passcode is set for you.");
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "Busy")) {
        /* Not checked and not counted: the person may simply type it again. */
        complain(l, "The terminal is busy. Please try again.");
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    if (is_error(reply, "PersonNotActive")) {
        complain(l, not_active_message(json_get_string(p, "state")));
        return PAM_AUTH_ERR;
    }
    return unexpected(l, "VerifyPasscode", reply).ret;
}

void passcode_request(struct buffer *request, const struct login *l, const char *name,
                      const char *passcode) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.VerifyPasscode\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"context\":");
    json_context(request, l);
    buffer_puts(request, "}}");
}

/* The person's record, to check before asking anything: GetPerson as root (an admin), else
 * CheckAccount, which authenticators such as a kiosk app may call (GetPerson would be refused,
 * and audited as refused, every time). Negative when the daemon cannot be asked. */
static int look_up(const struct login *l, const char *name, struct reply *reply) {
    if (geteuid() == 0)
        return get_person(l, name, reply);
    return account_status(l, name, reply);
}

bool is_identity_provider_person(const struct json *person) {
    const char *origin = json_get_string(person, "origin");
    return origin && strcmp(origin, "idp") == 0;
}

/* Before asking for a passcode, asks the daemon whether one could be accepted at all, so that
 * nobody types a passcode that is refused unread: locked, none set, not active, unknown. Returns
 * NEXT_PASSCODE to go on and ask; NEXT_ACTIVATE for a person who has not activated yet;
 * NEXT_ONLINE for an identity-provider person without a passcode, or whose passcode is
 * hard-locked (which an online login lifts); NEXT_FIRST_LOGIN for a name the daemon does not
 * know; NEXT_NONE with the PAM code otherwise. A caller that may not read the person just asks.
 * (The person's email address is not taken from this record: only CheckOnlineLogin gives it, to
 * a context that may sign them in.) */
static struct step passcode_precheck(const struct login *l, const char *name) {
    _cleanup_reply_ struct reply reply = {0};
    if (look_up(l, name, &reply) < 0)
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
    if (is_error(&reply, "NoSuchPerson"))
        return (struct step){PAM_USER_UNKNOWN, NEXT_FIRST_LOGIN};
    if (reply.error)
        return (struct step){PAM_SUCCESS, NEXT_PASSCODE};
    const struct json *p = json_get(reply.parameters, "person");
    const char *state = json_get_string(p, "state");
    const char *locked_until = json_get_string(p, "passcodeLockedUntil");
    bool online = is_identity_provider_person(p);
    if (is_pending(state))
        return (struct step){PAM_AUTH_ERR, NEXT_ACTIVATE};
    /* An identity-provider person whose local unlock is suspended until they sign in online (the
     * provider refused their token): the online login is what lifts it, not a dead end. */
    if (online && json_get_string(p, "suspendedReason")) {
        if (l->remote)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        complain(l, MESSAGE_SIGN_IN_ONLINE);
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, ""};
    }
    if (!state || strcmp(state, "active") != 0) {
        complain(l, not_active_message(state));
        return (struct step){PAM_AUTH_ERR, NEXT_NONE};
    }
    if (!json_get_bool(p, "hasPasscode")) {
        /* (No online login over a remote session: see sign_in_online.) */
        if (online && l->remote)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (online)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, "", true};
        complain(l, "No passcode is set for you.");
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
    }
    if (json_get_bool(p, "passcodeHardLocked")) {
        complain(l, MESSAGE_HARD_LOCKED);
        return (struct step){PAM_MAXTRIES, online ? NEXT_ONLINE : NEXT_NONE};
    }
    if (locked_until) {
        long long seconds = seconds_until(locked_until);
        if (seconds > 0)
            say_wait(l, "Too many wrong passcodes.", seconds);
        else
            complain(l, "Too many wrong passcodes. Try again later.");
        return (struct step){PAM_MAXTRIES, NEXT_NONE};
    }
    return (struct step){PAM_SUCCESS, NEXT_PASSCODE};
}

/* The passcode, or what the precheck says comes instead. `given`: whether the application named
 * the person (see first_login). */
int verify_passcode(const struct login *l, const char *name, bool given) {
    struct step s = passcode_precheck(l, name);
    switch (s.next) {
    case NEXT_PASSCODE:
        break;
    case NEXT_ACTIVATE:
        return activate_pending(l, name);
    case NEXT_ONLINE:
        return sign_in_again(l, name, s.say_sign_in ? MESSAGE_SIGN_IN : NULL);
    case NEXT_FIRST_LOGIN:
        return first_login(l, name, given);
    default:
        return s.ret;
    }
    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        int r = ask_secret(l, PROMPT_PASSCODE, &passcode);
        if (r != PAM_SUCCESS)
            return r;
        _cleanup_buffer_ struct buffer request = {0};
        passcode_request(&request, l, name, passcode);
        _cleanup_connection_ struct connection c = CONNECTION_INIT;
        _cleanup_reply_ struct reply reply = {0};
        if (connection_open(l, &c) < 0 || exchange(l, &c, &request, &reply) < 0)
            return PAM_AUTHINFO_UNAVAIL;
        if (!reply.error) {
            const char *matched = reply_person_name(&reply);
            if (!matched || strcmp(matched, name) != 0)
                return unexpected(l, "VerifyPasscode", &(struct reply){.error = "malformed reply"})
                    .ret;
            note_person(l, json_get(reply.parameters, "person"));
            log_debug(l, "Passcode verified for %s", name);
            /* A fleet person with no finger on this terminal's reader: asked once (the daemon
             * decides, and records that it asked). */
            if (json_get_bool(reply.parameters, "offerFingerprint") &&
                json_get_string(reply.parameters, "ticket"))
                return offer_enrolment_after_passcode(l, &c, name, passcode, reply.parameters);
            keep_for_session(l, &c, json_get_string(reply.parameters, "ticket"), name);
            return PAM_SUCCESS;
        }
        if (must_sign_in_online(&reply)) {
            sign_in_required(l, &reply);
            return sign_in_again(l, name, NULL);
        }
        bool retry;
        r = passcode_refused(l, &reply, &retry);
        if (!retry)
            return r;
    }
    return PAM_MAXTRIES;
}

/* Checks the current passcode on `c` (opened here if closed) and keeps the ticket it returns:
 * a person changes their own passcode with a ticket bound to this connection. */
static int verify_for_change(const struct login *l, struct connection *c, const char *name,
                             const char *passcode, char **ticket) {
    erase_and_free(*ticket);
    *ticket = NULL;
    connection_close(c);
    if (connection_open(l, c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    passcode_request(&request, l, name, passcode);
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (reply.error) {
        bool retry;
        int r = passcode_refused(l, &reply, &retry);
        return r == PAM_AUTH_ERR ? PAM_PERM_DENIED : r;
    }
    const char *t = json_get_string(reply.parameters, "ticket");
    if (!t)
        return unexpected(l, "VerifyPasscode", &(struct reply){.error = "no ticket"}).ret;
    *ticket = strdup(t);
    return *ticket ? PAM_SUCCESS : log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
}

static void set_passcode_request(struct buffer *request, const char *name, const char *passcode,
                                 const char *confirmation, const char *ticket) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.SetPasscode\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"confirmation\":");
    json_string(request, confirmation);
    buffer_puts(request, ",\"ticket\":");
    json_string(request, ticket);
    buffer_puts(request, "}}");
}

int change_passcode(const struct login *l, const char *name) {
    _cleanup_erase_ char *old = NULL;
    _cleanup_erase_ char *ticket = NULL;
    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    int r = ask_secret(l, PROMPT_OLD_PASSCODE, &old);
    if (r != PAM_SUCCESS)
        return r == PAM_CONV_ERR ? r : PAM_AUTHTOK_ERR;
    r = verify_for_change(l, &c, name, old, &ticket);
    if (r != PAM_SUCCESS)
        return r;

    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        _cleanup_erase_ char *confirmation = NULL;
        r = ask_secret(l, PROMPT_NEW_PASSCODE, &passcode);
        if (r == PAM_SUCCESS)
            r = ask_secret(l, PROMPT_RETYPE_PASSCODE, &confirmation);
        if (r != PAM_SUCCESS)
            return r == PAM_CONV_ERR ? r : PAM_AUTHTOK_ERR;

        /* The daemon closes idle connections and a ticket is used once: while the person was
         * typing, either may have gone. Then the current passcode is checked again for a fresh
         * ticket, once. */
        _cleanup_reply_ struct reply reply = {0};
        for (bool again = true;; again = false) {
            _cleanup_buffer_ struct buffer request = {0};
            set_passcode_request(&request, name, passcode, confirmation, ticket);
            r = exchange(l, &c, &request, &reply);
            if (!again ||
                (r >= 0 && !is_error(&reply, "TicketInvalid") && !is_error(&reply, "IdleTimeout")))
                break;
            r = verify_for_change(l, &c, name, old, &ticket);
            if (r != PAM_SUCCESS)
                return r;
        }
        if (r < 0)
            return PAM_AUTHTOK_ERR;
        if (!reply.error) {
            inform(l, "Passcode changed.");
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "WeakPasscode")) {
            const char *message = json_get_string(reply.parameters, "message");
            complain(l, message ? message : "That passcode is too easy to guess.");
            continue;
        }
        if (is_error(&reply, "NoSuchPerson"))
            return PAM_USER_UNKNOWN;
        if (is_error(&reply, "PermissionDenied") || is_error(&reply, "TicketInvalid")) {
            complain(l, "You may not change this passcode here.");
            return log_ret(l, PAM_PERM_DENIED, LOG_NOTICE, "SetPasscode refused for %s: %s", name,
                           reply.error);
        }
        unexpected(l, "SetPasscode", &reply);
        return PAM_AUTHTOK_ERR;
    }
    return PAM_AUTHTOK_ERR;
}

/* The preliminary pass only checks that the daemon manages this person. */
int check_passcode_change(const struct login *l, const char *name) {
    _cleanup_reply_ struct reply reply = {0};
    if (get_person(l, name, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (!reply.error)
        return PAM_SUCCESS;
    if (is_error(&reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    return unexpected(l, "GetPerson", &reply).ret;
}
