/* The ticketed connection of a first use or an online login, and the fingerprint enrolment
 * offered on it (enrol.h). */

#define _GNU_SOURCE

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conversation.h"
#include "enrol.h"
#include "handover.h"
#include "passcode.h"
#include "step.h"

/* The daemon's fixed enrolment hint for a reader that cannot identify (io.kioskauth.varlink). */
#define HINT_DUPLICATES_NOT_CHECKED                                                                \
    "this reader cannot check whether the finger is already enrolled"

/* Records when the ticket of `reply` expires, from its ticketExpiresIn. */
void note_ticket_lifetime(struct activation *a, const struct json *parameters) {
    long long seconds = 0;
    if (json_get_integer(parameters, "ticketExpiresIn", &seconds) && seconds >= 0 &&
        seconds <= 24 * 3600)
        a->ticket_deadline = now_msec() + (uint64_t)seconds * 1000;
    else
        a->ticket_deadline = now_msec();
}

void activation_clear(struct activation *a) {
    connection_close(&a->c);
    erase_and_free(a->code);
    erase_and_free(a->ticket);
    erase_and_free(a->passcode);
    free(a->welcome);
    free(a->role_description);
    *a = (struct activation)ACTIVATION_INIT;
}

bool replace_string(char **slot, const char *value) {
    erase_and_free(*slot);
    *slot = value ? strdup(value) : NULL;
    return *slot != NULL;
}

/* Whether a call failed because the connection or its ticket went away while the person typed:
 * then a fresh ticket is fetched and the call made once more. */
bool connection_lost(int r, const struct reply *reply) {
    return r < 0 || is_error(reply, "TicketInvalid") || is_error(reply, "IdleTimeout");
}

/* A fresh self-service ticket on a fresh connection, from the passcode just chosen (only while
 * the first ticket would still be valid: offer_enrolment checks). After an online login there is
 * no passcode to ask with, and the enrolment is not made without a ticket, even as root: it must
 * stay bound to the authentication that offered it. */
static int fresh_ticket(const struct login *l, struct activation *a) {
    connection_close(&a->c);
    if (!a->passcode)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                       "No fresh ticket for enrolment after an online login");
    if (connection_open(l, &a->c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    passcode_request(&request, l, a->name, a->passcode);
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, &a->c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (reply.error)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "No fresh ticket for enrolment: %s",
                       reply.error);
    if (!replace_string(&a->ticket, json_get_string(reply.parameters, "ticket")))
        return PAM_AUTH_ERR;
    return PAM_SUCCESS;
}

static bool is_yes(const char *answer) {
    static const char *const yes[] = {"y", "yes", "Y", "YES", "Yes"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (strcmp(answer, yes[i]) == 0)
            return true;
    return false;
}

/* Shows one enrolment progress report as the person's next step. */
void show_enrol_progress(const struct login *l, const struct json *progress) {
    const char *state = json_get_string(progress, "state");
    const char *hint = json_get_string(progress, "hint");
    long long stage = 0, stages = 0;
    char text[MAX_MESSAGE_LENGTH];
    json_get_integer(progress, "stage", &stage);
    json_get_integer(progress, "stages", &stages);
    if (!state)
        return;
    if (strcmp(state, "duplicate-check") == 0) {
        /* Only the identify touch needs the person; a reader that cannot check says so to the
         * log, not to them. */
        if (hint && strcmp(hint, HINT_DUPLICATES_NOT_CHECKED) == 0) {
            log_debug(l, "Enrolment: %s", hint);
            return;
        }
        snprintf(text, sizeof(text), "%s…", hint ? hint : "Touch the reader");
    } else if (strcmp(state, "touch") == 0 || strcmp(state, "stage") == 0) {
        if (stages <= 0 || stages > MAX_ENROL_STAGES || stage < 0 || stage >= stages)
            return;
        snprintf(text, sizeof(text), "Touch the reader (stage %lld of %lld)…", stage + 1, stages);
    } else if (strcmp(state, "retry") == 0) {
        /* A daemon's numbers, never trusted to fit arithmetic (stage + 1 overflowed). */
        if (stage < 0 || stage >= MAX_ENROL_STAGES || stages > MAX_ENROL_STAGES)
            return;
        snprintf(text, sizeof(text), "%s. Touch the reader (stage %lld of %lld)…",
                 hint ? hint : "Try again", stage + 1, stages > 0 ? stages : stage + 1);
    } else {
        return;
    }
    if (text[0] >= 'a' && text[0] <= 'z')
        text[0] = (char)(text[0] - 'a' + 'A');
    instruct(l, text);
}

/* One EnrollFinger call on a->c, showing its progress. Returns PAM_SUCCESS when a finger was
 * enrolled; PAM_IGNORE, saying nothing, when the call never started because the connection or
 * its ticket was gone; PAM_AUTH_ERR when enrolment did not finish (the person was told why, or
 * ended it with a signal). */
static int enrol_once(const struct login *l, struct activation *a) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.EnrollFinger\",\"more\":true,"
                          "\"parameters\":{\"name\":");
    json_string(&request, a->name);
    if (a->ticket) {
        buffer_puts(&request, ",\"ticket\":");
        json_string(&request, a->ticket);
    }
    buffer_puts(&request, "}}");
    if (request.failed)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");

    /* Each touch gets the whole timeout=, as a scan does. */
    uint64_t deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
    int r = a->c.fd < 0 ? -ENOTCONN : connection_send(&a->c, &request, deadline);
    bool started = false;
    for (;;) {
        _cleanup_reply_ struct reply reply = {0};
        if (r >= 0)
            r = connection_receive(&a->c, deadline, true, &reply);
        if (!started && connection_lost(r, &reply))
            return PAM_IGNORE;
        if (r == -EINTR) {
            log_debug(l, "Enrolment interrupted by a signal");
            return PAM_AUTH_ERR;
        }
        if (r == -ETIMEDOUT) {
            complain(l, "No finger was touched in time.");
            return PAM_AUTH_ERR;
        }
        if (r < 0) {
            complain(l, MESSAGE_NOT_ENROLLED);
            return log_ret(l, PAM_AUTH_ERR, LOG_WARNING, "kioskauthd did not answer: %s",
                           strerror(-r));
        }
        started = true;
        if (reply.continues) {
            show_enrol_progress(l, json_get(reply.parameters, "progress"));
            deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
            continue;
        }
        if (!reply.error) {
            /* The enrolment used the ticket up and hands its authentication on in a new one
             * (no fresher), which is what the session hand-over needs. A reply without one
             * leaves the ticket as it was. */
            const char *next = json_get_string(reply.parameters, "ticket");
            if (next)
                (void)replace_string(&a->ticket, next);
            inform(l, MESSAGE_ENROLLED);
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "FingerAlreadyEnrolled"))
            complain(l, "That finger is already enrolled.");
        else if (is_error(&reply, "ScanTimeout"))
            complain(l, "No finger was touched in time.");
        else if (is_error(&reply, "ScanRetry") || is_error(&reply, "ReaderUnavailable") ||
                 is_error(&reply, "ReaderRemoved") || is_error(&reply, "NoReader") ||
                 is_error(&reply, "ReaderFull") || is_error(&reply, "ScanCancelled"))
            complain(l, MESSAGE_NOT_ENROLLED);
        else {
            complain(l, MESSAGE_NOT_ENROLLED);
            unexpected(l, "EnrollFinger", &reply);
        }
        log_debug(l, "EnrollFinger: %s", reply.error);
        return PAM_AUTH_ERR;
    }
}

/* Remembers a declined offer, so it is not made again until someone turns it back on
 * (kioskauthctl user set NAME --biometric-offer on). If the connection or its ticket went while
 * the person read the offer, it is asked again on a fresh connection without a ticket, which only
 * an administrator (root) may do. Best effort: the login goes on anyway. */
static void remember_decline(const struct login *l, struct activation *a) {
    for (bool again = true;; again = false) {
        _cleanup_buffer_ struct buffer request = {0};
        buffer_puts(&request,
                    "{\"method\":\"io.kioskauth.SetBiometricOffer\",\"parameters\":{\"name\":");
        json_string(&request, a->name);
        buffer_puts(&request, ",\"enabled\":false");
        if (a->ticket) {
            buffer_puts(&request, ",\"ticket\":");
            json_string(&request, a->ticket);
        }
        buffer_puts(&request, "}}");
        _cleanup_reply_ struct reply reply = {0};
        int r = a->c.fd < 0 ? -ENOTCONN : exchange(l, &a->c, &request, &reply);
        if (r >= 0 && !reply.error)
            return;
        if (!again || !connection_lost(r, &reply)) {
            log_debug(l, "Could not remember the declined offer: %s",
                      r < 0 ? strerror(-r) : reply.error);
            return;
        }
        erase_and_free(a->ticket);
        a->ticket = NULL;
        connection_close(&a->c);
        if (connection_open(l, &a->c) < 0)
            return;
    }
}

int offer_enrolment_after_passcode(const struct login *l, struct connection *c, const char *name,
                                   const char *passcode, const struct json *parameters) {
    _cleanup_activation_ struct activation a = ACTIVATION_INIT;
    a.c = *c;
    *c = (struct connection)CONNECTION_INIT;
    if (strlen(name) > MAX_NAME_LENGTH)
        return PAM_SUCCESS;
    memcpy(a.name, name, strlen(name) + 1);
    /* Out of memory here costs the enrolment offer (and the session's ticket), not the login. */
    if (!replace_string(&a.ticket, json_get_string(parameters, "ticket")) ||
        !replace_string(&a.passcode, passcode)) {
        keep_for_session(l, &a.c, a.ticket, a.name);
        return PAM_SUCCESS;
    }
    note_ticket_lifetime(&a, parameters);
    inform(l, MESSAGE_NO_FINGER_HERE);
    int r = offer_enrolment(l, &a);
    if (r != PAM_SUCCESS)
        return r;
    keep_for_session(l, &a.c, a.ticket, a.name);
    return PAM_SUCCESS;
}

/* Offers fingerprint login and enrols a finger if the person wants it. Declining, or an
 * enrolment that does not finish, still logs the person in: they are active already. */
int offer_enrolment(const struct login *l, struct activation *a) {
    _cleanup_free_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_ENABLE_FINGERPRINT);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    if (!is_yes(answer)) {
        log_debug(l, "Fingerprint enrolment declined by %s", a->name);
        remember_decline(l, a);
        inform(l, MESSAGE_ENROL_LATER);
        return PAM_SUCCESS;
    }
    /* Answered after the authentication's ticket expired (an abandoned screen): whoever answers
     * now may be someone else, so nothing is enrolled, and nothing is renewed silently. */
    if (a->ticket_deadline && now_msec() >= a->ticket_deadline) {
        pam_syslog(l->pamh, LOG_NOTICE, "Enrolment offer for %s answered too late; not enrolling",
                   a->name);
        inform(l, MESSAGE_ENROL_LATER);
        return PAM_SUCCESS;
    }
    r = enrol_once(l, a);
    if (r == PAM_IGNORE) {
        log_debug(l, "Enrolment ticket lost; asking for a fresh one");
        r = fresh_ticket(l, a);
        if (r == PAM_SUCCESS)
            r = enrol_once(l, a);
        else
            complain(l, MESSAGE_NOT_ENROLLED);
        if (r == PAM_IGNORE)
            complain(l, MESSAGE_NOT_ENROLLED);
    }
    if (r != PAM_SUCCESS)
        inform(l, MESSAGE_ENROL_LATER);
    return PAM_SUCCESS;
}
