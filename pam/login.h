/* The login being served: the options, the PAM handle, what the daemon is told about the
 * caller (the varlink CallerContext), logging, and login names as the daemon accepts them. Every
 * layer above the JSON takes a `const struct login *`. */

#ifndef KIOSKAUTH_PAM_LOGIN_H
#define KIOSKAUTH_PAM_LOGIN_H

#include <stdbool.h>
#include <sys/types.h>
#include <syslog.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include "buffer.h"

#define MAX_NAME_LENGTH 64
#define MAX_ITEM_LENGTH 255
/* What reaches the environment: a role name, and a display name cut at a character boundary. */
#define MAX_ROLE_LENGTH 32
#define MAX_DISPLAY_NAME_LENGTH 256

/* Options: parsed afresh by every entry point (pam_kioskauth.c). */

enum mode {
    MODE_AUTO,     /* finger (identify with no user, verify with one), then the passcode */
    MODE_IDENTIFY, /* finger only: walk-up identify, or verify when the user is known */
    MODE_VERIFY,   /* finger only, asking for the name when none is known */
    MODE_PASSCODE, /* passcode only */
    MODE_ACTIVATE, /* first use only: activation code, new passcode, fingerprint offer */
};

struct options {
    const char *socket_path;
    unsigned timeout_sec;
    unsigned max_tries;
    enum mode mode;
    bool activation;   /* with no user known, offer the activation code before the name */
    bool device_login; /* online logins with a code shown here and typed on a phone */
    bool debug;
};

/* The person an auth step authenticated, as the environment will show them. */
struct person_info {
    bool known;
    bool bound; /* the person is bound to a Unix uid: `uid` */
    uid_t uid;
    /* The daemon said this person must sign in online (offline window ended, local unlock
     * suspended): their finger and passcode do not work until then. */
    bool online_only;
    char role[MAX_ROLE_LENGTH + 1];
    char display_name[MAX_DISPLAY_NAME_LENGTH + 1];
};

struct handover;

/* The Unix account one PAM_USER names, as looked up once in the conversation (login.c). */
struct account_lookup {
    bool done;
    bool exists;
    uid_t uid;
    char name[MAX_ITEM_LENGTH + 1];
};

/* The login being served: the PAM handle, the options, what the daemon is told about the
 * caller (the varlink CallerContext), and where auth notes whom it authenticated and keeps the
 * connection that did it (for open_session). */
struct login {
    pam_handle_t *pamh;
    struct options options;
    int flags;
    const char *service;
    const char *tty;
    const char *remote_host; /* sent only when the session is remote */
    bool remote;
    uid_t ruid;
    char logind[96]; /* what logind says of the caller's session: local, remote, unavailable: ... */
    struct person_info *person; /* auth only; NULL elsewhere */
    struct handover *handover;  /* auth only; NULL elsewhere */
    /* The account PAM_USER names, looked up at most once per name (points at `account_storage`,
     * so that the lookup can be kept through a const login). */
    struct account_lookup *account;
    struct account_lookup account_storage;
};

/* Fills in `l` for one entry point: the handle, the flags, the options already parsed, and the
 * caller's context from the PAM items and logind. */
void login_init(struct login *l, pam_handle_t *pamh, int flags, const struct options *options);

int log_ret(const struct login *l, int ret, int priority, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

#define log_debug(l, ...)                                                                          \
    do {                                                                                           \
        if ((l)->options.debug)                                                                    \
            pam_syslog((l)->pamh, LOG_DEBUG, __VA_ARGS__);                                         \
    } while (0)

/* A PAM item as a string, or NULL when unset or empty. */
const char *string_item(pam_handle_t *pamh, int item);

/* Login names as the daemon accepts them: a-z 0-9 . _ - @ +, starting with a letter or a digit,
 * at most 64 bytes. Anything else is nobody the daemon manages. */
bool login_name_is_valid(const char *name);

/* Whether `user` names a Unix account, and its uid (in *uid) when it does. The password
 * database is asked once per name in a conversation: a name it does not hold goes through every
 * NSS source (for systemd's, loading libnss_systemd and searching the userdb directories or
 * asking systemd-userdbd), and the conversation asks the same question before its first call
 * (the CallerContext's targetUid) and again before it returns success (check_binding). */
bool unix_account(const struct login *l, const char *user, uid_t *uid);

/* Writes the CallerContext of every authenticating call. */
void json_context(struct buffer *b, const struct login *l);

/* The pam_set_data() cleanup for a plain allocation. */
void free_data(pam_handle_t *pamh, void *data, int error_status);

#endif
