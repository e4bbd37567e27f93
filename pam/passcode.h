/* The passcode: checked before it is asked for, verified (auth), and changed (chauthtok). */

#ifndef KIOSKAUTH_PAM_PASSCODE_H
#define KIOSKAUTH_PAM_PASSCODE_H

#include <stdbool.h>

#include "buffer.h"
#include "json.h"
#include "login.h"

/* The passcode, or what the precheck says comes instead (first use, an online login). `given`:
 * whether the application named the person (see first_login). */
int verify_passcode(const struct login *l, const char *name, bool given);
/* chauthtok: the current passcode, then the new one twice. */
int change_passcode(const struct login *l, const char *name);
/* chauthtok's preliminary pass: whether the daemon manages this person. */
int check_passcode_change(const struct login *l, const char *name);

/* A VerifyPasscode request (a fresh ticket after a first use uses one too). */
void passcode_request(struct buffer *request, const struct login *l, const char *name,
                      const char *passcode);
/* Whether the person record is of a person from the identity provider. */
bool is_identity_provider_person(const struct json *person);

#endif
