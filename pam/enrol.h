/* What a first use and an online login share: the connection and ticket they earned, and the
 * fingerprint enrolment they offer on it. */

#ifndef KIOSKAUTH_PAM_ENROL_H
#define KIOSKAUTH_PAM_ENROL_H

#include <stdbool.h>
#include <stdint.h>

#include "json.h"
#include "login.h"
#include "varlink.h"

struct activation {
    struct connection c;
    char *code;   /* as typed, until the passcode is set: CheckActivationCode again for a ticket */
    char *ticket; /* for CompleteActivation, then for EnrollFinger */
    char *passcode; /* the new passcode, until enrolment: VerifyPasscode again for a ticket */
    char name[MAX_NAME_LENGTH + 1];
    char display_name[MAX_DISPLAY_NAME_LENGTH + 1];
    char *welcome;
    char *role_description;
    bool offer_fingerprint;
    /* When the authentication's ticket expires (now_msec(), CLOCK_MONOTONIC; 0: not known). An
     * offer answered later is not acted on: whoever answers may not be who authenticated. */
    uint64_t ticket_deadline;
};
#define ACTIVATION_INIT                                                                            \
    { .c = CONNECTION_INIT }

void activation_clear(struct activation *a);
#define _cleanup_activation_ __attribute__((cleanup(activation_clear)))
/* Records when the ticket of a reply expires, from its ticketExpiresIn. */
void note_ticket_lifetime(struct activation *a, const struct json *parameters);
/* Replaces *slot (wiped) with a copy of value; false when there is none. */
bool replace_string(char **slot, const char *value);
/* Whether a call failed because the connection or its ticket went away while the person typed. */
bool connection_lost(int r, const struct reply *reply);

/* Offers fingerprint login and enrols a finger if the person wants it. */
int offer_enrolment(const struct login *l, struct activation *a);
/* After a passcode unlock whose VerifyPasscode reply (`parameters`) set offerFingerprint: offers
 * enrolment with that reply's ticket, on `c` (taken over), then keeps the connection and ticket
 * for the session. A conversation that fails at the offer fails the login (PAM_CONV_ERR). */
int offer_enrolment_after_passcode(const struct login *l, struct connection *c, const char *name,
                                   const char *passcode, const struct json *parameters);
/* The most enrolment stages a progress report is shown with (readers take a handful). */
#define MAX_ENROL_STAGES 100
/* Shows one enrolment progress report as the person's next step. */
void show_enrol_progress(const struct login *l, const struct json *progress);

#endif
