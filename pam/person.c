/* The person in the environment (person.h). */

#define _GNU_SOURCE

#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <security/pam_modutil.h>

#include "conversation.h"
#include "person.h"

/* Roles are the daemon's enum (caregiver, coordinator, family): lowercase words. */
bool role_is_valid(const char *role) {
    size_t n = strnlen(role, MAX_ROLE_LENGTH + 1);
    if (n == 0 || n > MAX_ROLE_LENGTH)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((role[i] >= 'a' && role[i] <= 'z') || role[i] == '_' || role[i] == '-'))
            return false;
    return true;
}

/* Copies a display name for the environment: whole UTF-8 characters only, at most size - 1
 * bytes; control characters (C0, DEL, C1) and line or paragraph separators become spaces, bytes
 * that are not UTF-8 become '?'. The result holds no newline and no terminal escape. */
void clean_display_name(const char *in, char *out, size_t size) {
    size_t length = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p;) {
        uint32_t cp = 0;
        size_t advance = utf8_decode(p, &cp);
        const char *copy = (const char *)p;
        size_t n = advance;
        if (advance == 0) {
            copy = "?";
            n = advance = 1;
        } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) {
            copy = " ";
            n = 1;
        }
        if (length + n >= size)
            break;
        memcpy(out + length, copy, n);
        length += n;
        p += advance;
    }
    out[length] = '\0';
}

/* Notes whom an auth step authenticated, from the person record the daemon returned. */
void note_person(const struct login *l, const struct json *person) {
    struct person_info *who = l->person;
    if (!who)
        return;
    *who = (struct person_info){.known = true};
    long long uid;
    if (json_get_integer(person, "uid", &uid) && uid >= 0 && uid < (long long)UINT32_MAX) {
        who->bound = true;
        who->uid = (uid_t)uid;
    }
    const char *role = json_get_string(person, "primaryRole");
    const char *display_name = json_get_string(person, "displayName");
    const char *name = json_get_string(person, "name");
    if (role && role_is_valid(role))
        memcpy(who->role, role, strlen(role) + 1);
    else
        pam_syslog(l->pamh, LOG_WARNING, "No valid primary role for %s",
                   name && login_name_is_valid(name) ? name : "the person");
    clean_display_name(display_name && *display_name ? display_name : (name ? name : ""),
                       who->display_name, sizeof(who->display_name));
}

int put_variable(const struct login *l, const char *variable, const char *value) {
    char entry[sizeof(ENV_DISPLAY_NAME) + 1 + MAX_DISPLAY_NAME_LENGTH + 1];
    snprintf(entry, sizeof(entry), "%s=%s", variable, value);
    int r = pam_putenv(l->pamh, entry);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set %s: %s", variable, pam_strerror(l->pamh, r));
    return PAM_SUCCESS;
}

/* After a successful auth: KIOSKAUTH_ROLE and KIOSKAUTH_DISPLAY_NAME for the application (and,
 * through pam_getenvlist(), the session it starts). */
int export_person(const struct login *l) {
    const struct person_info *who = l->person;
    if (!who || !who->known)
        return log_ret(l, PAM_SERVICE_ERR, LOG_ERR, "Authenticated, but the person is not known");
    int r = PAM_SUCCESS;
    if (who->role[0])
        r = put_variable(l, ENV_ROLE, who->role);
    if (r == PAM_SUCCESS && who->display_name[0])
        r = put_variable(l, ENV_DISPLAY_NAME, who->display_name);
    return r;
}

/* Before auth: nothing this module exported for an earlier attempt on this handle survives. */
void clear_person(pam_handle_t *pamh) {
    /* (libpam logs an error for deleting a variable that is not set.) */
    if (pam_getenv(pamh, ENV_ROLE))
        (void)pam_putenv(pamh, ENV_ROLE);
    if (pam_getenv(pamh, ENV_DISPLAY_NAME))
        (void)pam_putenv(pamh, ENV_DISPLAY_NAME);
}

/* A person becomes a Unix account only by binding: when PAM_USER names a Unix account, the
 * person authenticated must be bound to exactly its uid. A PAM_USER that is no Unix account (an
 * application's own identity) is not a Unix login. The daemon refuses the same (and audits it);
 * this is the module's own check before it returns success. */
int check_binding(const struct login *l, const struct person_info *who) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (!user)
        return log_ret(l, PAM_AUTH_ERR, LOG_ERR, "Authenticated, but PAM_USER is not set");
    uid_t account_uid;
    if (!unix_account(l, user, &account_uid))
        return PAM_SUCCESS;
    if (who && who->known && who->bound && who->uid == account_uid)
        return PAM_SUCCESS;
    complain(l, MESSAGE_NOT_THIS_ACCOUNT);
    if (who && who->known && who->bound)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                       "%s: the person is bound to uid %u, the account is uid %u; refusing", user,
                       (unsigned)who->uid, (unsigned)account_uid);
    return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                   "%s: the person is bound to no Unix account; refusing", user);
}
