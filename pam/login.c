/* The login being served (login.h): its context, logging, and what the daemon is told about
 * the caller. */

#define _GNU_SOURCE

#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <security/pam_modutil.h>

#include "json.h"
#include "login.h"
#include "logind.h"

/* Logs and returns `ret`, so a failure is reported and returned in one statement. */
int log_ret(const struct login *l, int ret, int priority, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    pam_vsyslog(l->pamh, priority, format, ap);
    va_end(ap);
    return ret;
}

const char *string_item(pam_handle_t *pamh, int item) {
    const void *value = NULL;
    if (pam_get_item(pamh, item, &value) != PAM_SUCCESS || !value || !*(const char *)value)
        return NULL;
    return value;
}

/* PAM_RHOST names the remote end; the local machine under any of its usual names, or its own
 * host name (sudo's pam_rhost option sets that), is not remote. */
static bool host_is_local(const char *host) {
    static const char *const local[] = {"localhost", "localhost.localdomain", "127.0.0.1", "::1"};
    char own[HOST_NAME_MAX + 1];
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (strcmp(host, local[i]) == 0)
            return true;
    if (gethostname(own, sizeof(own)) == 0) {
        own[sizeof(own) - 1] = '\0';
        if (strcmp(host, own) == 0)
            return true;
    }
    return false;
}

/* PAM_RHOST is empty for su or sudo inside an SSH login: where logind runs, it knows whether the
 * session of the process calling PAM is remote (the session is read from the process's cgroup,
 * whether it is remote from /run/systemd/sessions/ID; logind.c). Where it does not run, that
 * fails; the daemon is told so and audits it, and PAM_RHOST alone decides. */
static void ask_logind(struct login *l) {
    char session[LOGIND_SESSION_ID_MAX];
    int r = logind_own_session(session, sizeof(session));
    if (r >= 0) {
        r = logind_session_is_remote(session);
        if (r > 0) {
            l->remote = true;
            snprintf(l->logind, sizeof(l->logind), "remote");
            return;
        }
        if (r == 0) {
            snprintf(l->logind, sizeof(l->logind), "local");
            return;
        }
    }
    snprintf(l->logind, sizeof(l->logind), "unavailable: %s", strerror(-r));
}

void login_init(struct login *l, pam_handle_t *pamh, int flags, const struct options *options) {
    *l = (struct login){.pamh = pamh, .options = *options, .flags = flags, .ruid = getuid()};
    l->account = &l->account_storage;
    const char *service = string_item(pamh, PAM_SERVICE);
    const char *tty = string_item(pamh, PAM_TTY);
    const char *host = string_item(pamh, PAM_RHOST);
    /* Over-long items are not sent; a remote host still makes the session remote. */
    l->service = service && strlen(service) <= MAX_ITEM_LENGTH ? service : NULL;
    l->tty = tty && strlen(tty) <= MAX_ITEM_LENGTH ? tty : NULL;
    l->remote = host && !host_is_local(host);
    l->remote_host = l->remote && strlen(host) <= MAX_ITEM_LENGTH ? host : NULL;
    ask_logind(l);
}

static bool is_alphanumeric(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool login_name_is_valid(const char *name) {
    size_t n = strnlen(name, MAX_NAME_LENGTH + 1);
    if (n == 0 || n > MAX_NAME_LENGTH || !is_alphanumeric(name[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_alphanumeric(name[i]) && !strchr("._-@+", name[i]))
            return false;
    return true;
}

void json_context(struct buffer *b, const struct login *l) {
    buffer_puts(b, "{\"ruid\":");
    json_unsigned(b, l->ruid);
    buffer_puts(b, l->remote ? ",\"remote\":true" : ",\"remote\":false");
    if (l->service) {
        buffer_puts(b, ",\"service\":");
        json_string(b, l->service);
    }
    if (l->tty) {
        buffer_puts(b, ",\"tty\":");
        json_string(b, l->tty);
    }
    if (l->remote_host) {
        buffer_puts(b, ",\"remoteHost\":");
        json_string(b, l->remote_host);
    }
    if (l->logind[0]) {
        buffer_puts(b, ",\"logind\":");
        json_string(b, l->logind);
    }
    /* The Unix account PAM_USER names, if it names one: the daemon refuses anyone not bound to it.
     */
    const char *user = string_item(l->pamh, PAM_USER);
    uid_t uid;
    if (user && strlen(user) <= MAX_ITEM_LENGTH && unix_account(l, user, &uid)) {
        buffer_puts(b, ",\"targetUid\":");
        json_unsigned(b, uid);
    }
    buffer_puts(b, "}");
}

bool unix_account(const struct login *l, const char *user, uid_t *uid) {
    struct account_lookup *kept = l->account;
    size_t length = strlen(user);
    if (kept && kept->done && strcmp(kept->name, user) == 0) {
        *uid = kept->uid;
        return kept->exists;
    }
    const struct passwd *account = pam_modutil_getpwnam(l->pamh, user);
    if (kept && length < sizeof(kept->name)) {
        *kept = (struct account_lookup){
            .done = true, .exists = account != NULL, .uid = account ? account->pw_uid : 0};
        memcpy(kept->name, user, length + 1);
    }
    if (account)
        *uid = account->pw_uid;
    return account != NULL;
}

void free_data(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    free(data);
}
