/* Sessions registered with the daemon (session.c). */

#ifndef KIOSKAUTH_PAM_SESSION_H
#define KIOSKAUTH_PAM_SESSION_H

#include <stdbool.h>

#include "login.h"

int open_session(const struct login *l, bool authenticated_here);
int close_session(const struct login *l);

#endif
