/* First use: one-time activation of a person an admin provisioned. In one conversation the
 * person enters their activation code, chooses a passcode, may enrol a finger, and is logged in.
 * Everything runs on one connection because the daemon binds its tickets to the connection; if
 * the daemon closes it while the person is typing (its idle timeout, the ticket's lifetime), a
 * fresh ticket is fetched with what the person already typed, so nobody is asked twice. */

#define _GNU_SOURCE

#include <stdio.h>
#include <string.h>

#include "activation.h"
#include "conversation.h"
#include "enrol.h"
#include "handover.h"
#include "person.h"
#include "step.h"

/* An activation code is XXXX-XXXX; anything much longer is not one and is not sent. */
#define MAX_CODE_LENGTH 64

/* Checks a->code on a fresh connection; on success a->ticket and a->name are set. `name` is the
 * person the code must belong to, when known. Shows the daemon's own message for each refusal;
 * *retry says whether another code may be tried. */
static int check_code(const struct login *l, struct activation *a, const char *name, bool *retry) {
    *retry = false;
    connection_close(&a->c);
    if (connection_open(l, &a->c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request,
                "{\"method\":\"io.kioskauth.CheckActivationCode\",\"parameters\":{\"code\":");
    json_string(&request, a->code);
    if (name) {
        buffer_puts(&request, ",\"name\":");
        json_string(&request, name);
    }
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, &a->c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;

    const struct json *p = reply.parameters;
    if (!reply.error) {
        const char *person = reply_person_name(&reply);
        const char *ticket = json_get_string(p, "ticket");
        if (!person || !ticket || (name && strcmp(person, name) != 0))
            return unexpected(l, "CheckActivationCode", &(struct reply){.error = "malformed reply"})
                .ret;
        memcpy(a->name, person, strlen(person) + 1);
        const char *display_name = json_get_string(json_get(p, "person"), "displayName");
        clean_display_name(display_name && *display_name ? display_name : person, a->display_name,
                           sizeof(a->display_name));
        if (!replace_string(&a->ticket, ticket))
            return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
        return PAM_SUCCESS;
    }
    const char *message = json_get_string(p, "message");
    if (is_error(&reply, "ActivationCodeWrong") || is_error(&reply, "ActivationCodeExpired") ||
        is_error(&reply, "ActivationCodeUsed") || is_error(&reply, "ActivationCodeRevoked")) {
        complain(l, message ? message : MESSAGE_CODE_WRONG);
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(&reply, "ActivationPaused")) {
        complain(l, message ? message : "Too many wrong codes on this terminal. Try again later.");
        return PAM_MAXTRIES;
    }
    if (is_error(&reply, "AlreadyActive")) {
        complain(l, MESSAGE_ALREADY_ACTIVE);
        return PAM_AUTH_ERR;
    }
    if (is_error(&reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    if (is_error(&reply, "PermissionDenied")) {
        const char *reason = json_get_string(p, "reason");
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Activation refused by kioskauthd: %s",
                       reason ? reason : "no reason given");
    }
    return unexpected(l, "CheckActivationCode", &reply).ret;
}

/* Asks for the activation code (first_code: already typed at the offer) until the daemon takes
 * one, at most max_tries times. */
static int enter_code(const struct login *l, struct activation *a, const char *name,
                      const char *first_code) {
    for (unsigned attempt = 1;; attempt++) {
        if (attempt == 1 && first_code) {
            if (!replace_string(&a->code, first_code))
                return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
        } else {
            erase_and_free(a->code);
            a->code = NULL;
            int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &a->code, "%s", PROMPT_ACTIVATION_CODE);
            if (r != PAM_SUCCESS || !a->code)
                return PAM_CONV_ERR;
        }
        if (!a->code[0])
            return PAM_AUTH_ERR;
        bool retry = true;
        int r = PAM_AUTH_ERR;
        if (strlen(a->code) > MAX_CODE_LENGTH)
            complain(l, MESSAGE_CODE_WRONG);
        else
            r = check_code(l, a, name, &retry);
        if (r == PAM_SUCCESS || !retry)
            return r;
        if (attempt >= l->options.max_tries)
            return PAM_MAXTRIES;
    }
}

static void complete_request(struct buffer *request, const char *ticket, const char *passcode,
                             const char *confirmation) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.CompleteActivation\",\"parameters\":{"
                         "\"ticket\":");
    json_string(request, ticket);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"confirmation\":");
    json_string(request, confirmation);
    buffer_puts(request, "}}");
}

/* The person chooses a passcode (twice); a weak one is refused with the daemon's reason and
 * asked for again. On success the person is active and the code used up. */
static int choose_passcode(const struct login *l, struct activation *a) {
    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        _cleanup_erase_ char *confirmation = NULL;
        int r = ask_secret(l, PROMPT_CHOOSE_PASSCODE, &passcode);
        if (r == PAM_SUCCESS)
            r = ask_secret(l, PROMPT_CONFIRM_PASSCODE, &confirmation);
        if (r != PAM_SUCCESS)
            return r;

        _cleanup_reply_ struct reply reply = {0};
        for (bool again = true;; again = false) {
            _cleanup_buffer_ struct buffer request = {0};
            complete_request(&request, a->ticket, passcode, confirmation);
            r = exchange(l, &a->c, &request, &reply);
            if (!again || !connection_lost(r, &reply))
                break;
            log_debug(l, "Activation ticket lost; checking the code again");
            bool retry;
            r = check_code(l, a, a->name, &retry);
            if (r != PAM_SUCCESS)
                return r;
        }
        if (r < 0)
            return PAM_AUTHINFO_UNAVAIL;
        const struct json *p = reply.parameters;
        if (!reply.error) {
            const char *person = reply_person_name(&reply);
            const char *ticket = json_get_string(p, "ticket");
            if (!person || strcmp(person, a->name) != 0)
                return unexpected(l, "CompleteActivation",
                                  &(struct reply){.error = "malformed reply"})
                    .ret;
            note_person(l, json_get(p, "person"));
            a->offer_fingerprint = json_get_bool(p, "offerFingerprint") && ticket;
            /* Out of memory here costs a message or the enrolment, not the login. */
            (void)replace_string(&a->welcome, json_get_string(p, "welcome"));
            (void)replace_string(&a->role_description, json_get_string(p, "roleDescription"));
            (void)replace_string(&a->ticket, ticket);
            note_ticket_lifetime(a, p);
            /* Kept until enrolment, for a fresh ticket; the code is spent. */
            a->passcode = passcode;
            passcode = NULL;
            erase_and_free(a->code);
            a->code = NULL;
            log_debug(l, "Activated %s", a->name);
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "WeakPasscode")) {
            const char *message = json_get_string(p, "message");
            complain(l, message ? message : "That passcode is too easy to guess.");
            continue;
        }
        if (is_error(&reply, "ActivationCodeRevoked") || is_error(&reply, "ActivationCodeUsed") ||
            is_error(&reply, "ActivationCodeExpired")) {
            const char *message = json_get_string(p, "message");
            complain(l, message ? message : MESSAGE_CODE_WRONG);
            return PAM_AUTH_ERR;
        }
        if (is_error(&reply, "TicketInvalid")) {
            complain(l, "Activation could not be finished. Please start again.");
            return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "CompleteActivation: ticket refused");
        }
        return unexpected(l, "CompleteActivation", &reply).ret;
    }
    return PAM_MAXTRIES;
}

/* The whole first use. `name`: the person, when known (the code must then be theirs);
 * `first_code`: a code already typed at the offer, or NULL to ask. On success PAM_USER is the
 * person. */
int activate(const struct login *l, const char *name, const char *first_code) {
    /* The daemon refuses activation over remote sessions; nobody is asked for a code there. */
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "No activation over a remote session");
    _cleanup_activation_ struct activation a = ACTIVATION_INIT;
    int r = enter_code(l, &a, name, first_code);
    if (r != PAM_SUCCESS)
        return r;
    char hello[MAX_MESSAGE_LENGTH];
    snprintf(hello, sizeof(hello), "Code accepted. Hello, %s.", a.display_name);
    inform(l, hello);
    r = choose_passcode(l, &a);
    if (r != PAM_SUCCESS)
        return r;
    if (a.offer_fingerprint) {
        r = offer_enrolment(l, &a);
        if (r != PAM_SUCCESS)
            return r;
    }
    if (a.welcome && *a.welcome)
        inform(l, a.welcome);
    if (a.role_description && *a.role_description)
        inform(l, a.role_description);
    r = pam_set_item(l->pamh, PAM_USER, a.name);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    keep_for_session(l, &a.c, a.ticket, a.name);
    return PAM_SUCCESS;
}

/* A person found by name who has not activated yet. */
int activate_pending(const struct login *l, const char *name) {
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "No activation over a remote session");
    inform(l, MESSAGE_NOT_SET_UP);
    return activate(l, name, NULL);
}

/* With the activation option and nobody known yet: the code first, Enter for the name.
 * PAM_IGNORE when skipped. */
int offer_activation(const struct login *l) {
    if (l->remote)
        return PAM_IGNORE;
    _cleanup_erase_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_ACTIVATION_OFFER);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    if (!answer[0])
        return PAM_IGNORE;
    return activate(l, NULL, answer);
}
