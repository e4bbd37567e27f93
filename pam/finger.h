/* Fingerprint scans: walk-up identify (no user) and 1:1 verify (a named person). */

#ifndef KIOSKAUTH_PAM_FINGER_H
#define KIOSKAUTH_PAM_FINGER_H

#include <stdbool.h>

#include "login.h"
#include "step.h"
#include "varlink.h"

/* Walk-up unlock: on a match, and only then, PAM_USER becomes the person recognised. */
struct step identify(const struct login *l);
/* 1:1 match of the named person's finger. */
struct step verify_finger(const struct login *l, const char *name);

/* Errors that end a scan without a verdict on the finger: a name or the passcode can go on. */
bool is_reader_trouble(const struct reply *reply);
/* What the person is told when the scan ended without a verdict on the finger. */
void say_reader_trouble(const struct login *l, const struct reply *reply);
/* A touch the reader could not use (ScanRetry): the reader's hint. */
void say_retry(const struct login *l, const struct reply *reply);
/* Walk-up identify paused after unknown fingers: for how long, and what works meanwhile. */
void say_identify_paused(const struct login *l, const struct reply *reply);

#endif
