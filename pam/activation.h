/* First use: one-time activation of a person an admin provisioned. */

#ifndef KIOSKAUTH_PAM_ACTIVATION_H
#define KIOSKAUTH_PAM_ACTIVATION_H

#include "login.h"

/* The whole first use. `name`: the person, when known (the code must then be theirs);
 * `first_code`: a code already typed at the offer, or NULL to ask. */
int activate(const struct login *l, const char *name, const char *first_code);
/* A person found by name who has not activated yet. */
int activate_pending(const struct login *l, const char *name);
/* With the activation option and nobody known yet: the code first, Enter for the name.
 * PAM_IGNORE when skipped. */
int offer_activation(const struct login *l);

#endif
