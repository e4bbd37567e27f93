/* The person an auth step authenticated: noted from the daemon's record, exported to the
 * environment after a successful auth, and checked against the Unix account PAM_USER names. */

#ifndef KIOSKAUTH_PAM_PERSON_H
#define KIOSKAUTH_PAM_PERSON_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"
#include "login.h"

/* Exported with pam_putenv() after a successful auth, so applications can choose what to show. */
#define ENV_ROLE "KIOSKAUTH_ROLE"
#define ENV_DISPLAY_NAME "KIOSKAUTH_DISPLAY_NAME"

/* Roles are the daemon's enum (caregiver, coordinator, family): lowercase words. */
bool role_is_valid(const char *role);
/* Copies a display name for the environment: whole UTF-8 characters only, at most size - 1
 * bytes; control characters and line separators become spaces, bytes that are not UTF-8 '?'. */
void clean_display_name(const char *in, char *out, size_t size);
/* Notes whom an auth step authenticated (in l->person, when set). */
void note_person(const struct login *l, const struct json *person);
/* pam_putenv("VARIABLE=value"), logged when it fails. */
int put_variable(const struct login *l, const char *variable, const char *value);
int export_person(const struct login *l);
void clear_person(pam_handle_t *pamh);
/* The person authenticated must be bound to the Unix account PAM_USER names, if it names one. */
int check_binding(const struct login *l, const struct person_info *who);

#endif
