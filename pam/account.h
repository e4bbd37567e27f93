/* account: may the person log in now (CheckAccount), and what auth leaves in the handle so that
 * account and open_session fail closed for a person this module authenticated. */

#ifndef KIOSKAUTH_PAM_ACCOUNT_H
#define KIOSKAUTH_PAM_ACCOUNT_H

#include <stdbool.h>

#include "login.h"
#include "varlink.h"

/* Whether the person may log in now (pam_sm_acct_mgmt). */
int check_account(const struct login *l, bool authenticated_here);

/* GetPerson: the person's record (an administrator's call). */
int get_person(const struct login *l, const char *name, struct reply *reply);
/* CheckAccount: may the person log in now, and their record. */
int account_status(const struct login *l, const char *name, struct reply *reply);

/* Remembers in the handle that this module authenticated PAM_USER; if it cannot, the
 * authentication does not count. */
int remember_authentication(const struct login *l);
/* Whether this module authenticated someone in this handle (by its last auth). */
bool authenticated_in(pam_handle_t *pamh);
/* Whether PAM_USER is someone else than the person this module's last auth authenticated. */
bool user_changed_since_auth(pam_handle_t *pamh);
/* Forgets an earlier auth's success. */
void forget_authentication(pam_handle_t *pamh);

#endif
