/* Online login with the identity provider (online.c). */

#ifndef KIOSKAUTH_PAM_ONLINE_H
#define KIOSKAUTH_PAM_ONLINE_H

#include <stdbool.h>

#include "login.h"

/* An identity-provider person the daemon knows signs in online; `intro` is shown first. */
int sign_in_again(const struct login *l, const char *name, const char *intro);
/* A name the daemon does not know: someone's first login at this terminal, when it may be.
 * `given`: whether the application named the person. */
int first_login(const struct login *l, const char *name, bool given);

#endif
