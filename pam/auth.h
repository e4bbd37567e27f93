/* auth: the conversation as the mode asks for it (auth.c). */

#ifndef KIOSKAUTH_PAM_AUTH_H
#define KIOSKAUTH_PAM_AUTH_H

#include "login.h"

/* Finger (identify with no user, verify with one), the name, the passcode, first use or an
 * online login, as the mode and the daemon's answers lead; PAM_USER is the person on success. */
int authenticate(const struct login *l);

#endif
