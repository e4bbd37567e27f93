/*
 * pam_kioskauth — lets any PAM-aware program (a greeter, a screen locker, sudo, a kiosk app)
 * delegate login to kioskauthd.
 *
 * The module is a thin, stateless client of the daemon's varlink socket: every decision (who
 * matches, lockouts, which services may use passcodes, remote sessions) is the daemon's. It is
 * loaded into setuid programs, so it trusts nothing the caller controls: the socket path comes
 * only from its socket= option (never the environment), and the process at the other end of
 * the socket must be root or the daemon's own user. There are no module globals; every entry
 * point parses its own options, and what one step leaves for another (who was authenticated,
 * the connection for open_session, the session for close_session) lives in the PAM handle.
 * Secrets (passcodes, passwords, tickets) are wiped as soon as they are no longer needed,
 * including from the buffers they passed through.
 */

#define _GNU_SOURCE

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-login.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <security/pam_modutil.h>

/* Limits and fixed names. */
#define DEFAULT_SOCKET_PATH "/run/kioskauth/io.kioskauth"
#define DAEMON_USER "kioskauthd"
#define INTERFACE "io.kioskauth."
/* A local socket connects at once or fails at once when nothing listens; only a full listen
 * backlog makes connect() wait, and never longer than this. */
#define CONNECT_TIMEOUT_MSEC 500
/* A call that waits for no finger (passcode, account check) must be answered within this. */
#define CALL_TIMEOUT_MSEC 10000
/* How long a fingerprint call may take in all, queueing behind other conversations included
 * (timeout=); the daemon's own ScanTimeoutSec bounds each touch. */
#define DEFAULT_SCAN_TIMEOUT_SEC 60
#define MAX_SCAN_TIMEOUT_SEC 600
#define DEFAULT_MAX_TRIES 3
#define MAX_MAX_TRIES 10
#define RETRY_CONNECT_PAUSE_NSEC (10 * 1000 * 1000)
#define MAX_REPLY_SIZE (256 * 1024)
#define MAX_REQUEST_SIZE (64 * 1024)
#define MAX_JSON_DEPTH 16
#define MAX_NAME_LENGTH 64
#define MAX_ITEM_LENGTH 255
#define MAX_PASSCODE_LENGTH 128
/* The daemon's own limits for an online login (RFC 5321's path limit; a generous password cap). */
#define MAX_EMAIL_LENGTH 254
#define MAX_PASSWORD_LENGTH 1024
/* An online login waits for the identity provider, which the daemon bounds by its
 * RequestTimeoutSec (default 10 s) per request, and a first login may need three (discovery,
 * token, keys). */
#define ONLINE_LOGIN_TIMEOUT_MSEC 45000
/* A device login waits while the person signs in on their phone: as long as the code is valid,
 * but never longer than this, and a little longer than the daemon so that it says why it ended. */
#define MAX_DEVICE_LOGIN_SEC 900
#define DEVICE_LOGIN_GRACE_MSEC 5000
/* A session id is the daemon's 32 hex digits; anything else is not put in the environment. */
#define MAX_SESSION_ID_LENGTH 64
#define MAX_MESSAGE_LENGTH 512
/* An activation code is XXXX-XXXX; anything much longer is not one and is not sent. */
#define MAX_CODE_LENGTH 64
/* What reaches the environment: a role name, and a display name cut at a character boundary. */
#define MAX_ROLE_LENGTH 32
#define MAX_DISPLAY_NAME_LENGTH 256
/* pam_set_data key: this module authenticated someone in this handle (fail closed in account). */
#define DATA_AUTHENTICATED "pam_kioskauth.authenticated"
/* pam_set_data key: the connection and ticket of that authentication, for open_session. */
#define DATA_HANDOVER "pam_kioskauth.handover"
/* pam_set_data key: the id of the session open_session registered, for close_session. */
#define DATA_SESSION "pam_kioskauth.session"
/* Exported with pam_putenv() after a successful auth, so applications can choose what to show. */
#define ENV_ROLE "KIOSKAUTH_ROLE"
#define ENV_DISPLAY_NAME "KIOSKAUTH_DISPLAY_NAME"
/* Exported by open_session: the session a kiosk app reports activity, locks and step-up for. */
#define ENV_SESSION "KIOSKAUTH_SESSION"

#define PROMPT_NAME "Name: "
#define PROMPT_PASSCODE "Passcode: "
#define PROMPT_OLD_PASSCODE "Current passcode: "
#define PROMPT_NEW_PASSCODE "New passcode: "
#define PROMPT_RETYPE_PASSCODE "Retype new passcode: "
#define PROMPT_ACTIVATION_OFFER "Enter your activation code, or press Enter to skip: "
#define PROMPT_ACTIVATION_CODE "Activation code: "
#define PROMPT_CHOOSE_PASSCODE "Choose a passcode (6 digits): "
#define PROMPT_CONFIRM_PASSCODE "Type the same passcode again: "
#define PROMPT_ENABLE_FINGERPRINT "Enable fingerprint login? [y/N] "
#define PROMPT_EMAIL "Email: "
#define PROMPT_PASSWORD "Password: "
/* The longest wait a message names (a day); a reply's larger figure is shown as this. */
#define MAX_WAIT_SHOWN_SEC (24LL * 3600)
#define MESSAGE_NOT_RECOGNISED "Fingerprint not recognised."
#define MESSAGE_WRONG_PASSCODE "Wrong passcode."
#define MESSAGE_SCAN_TIMED_OUT "Fingerprint timed out: no finger was placed on the reader."
#define MESSAGE_USE_PASSCODE "Too many tries with the finger: use your passcode."
#define MESSAGE_USE_NAME "Too many tries with the finger: use your name and passcode."
#define MESSAGE_HARD_LOCKED                                                                        \
    "Your passcode is locked. Ask an administrator to reset it, or sign in online."
#define MESSAGE_IDP_FALLBACK "Biometric login failed. Please sign in with your email and password."
#define MESSAGE_SIGN_IN "Please sign in with your email and password."
#define MESSAGE_SIGN_IN_ONLINE "Sign in online: your organisation's sign-in must be renewed."
#define MESSAGE_WRONG_CREDENTIALS "Wrong email or password."
#define MESSAGE_NOT_AN_EMAIL "That is not an email address."
#define MESSAGE_IDP_UNAVAILABLE                                                                    \
    "Your organisation's sign-in cannot be reached. Try again later, or use your finger or "       \
    "passcode."
/* The same, to someone who must sign in online before their finger or passcode works again. */
#define MESSAGE_IDP_UNAVAILABLE_ONLINE_ONLY                                                        \
    "Your organisation's sign-in cannot be reached, and you must sign in online before your "      \
    "finger or passcode works again. Try again when this terminal is back online, or ask your "    \
    "coordinator."
#define MESSAGE_IDP_BROKEN "Online sign-in is not working on this terminal. Ask an administrator."
#define MESSAGE_NOT_ADMITTED "Your account may not sign in on this terminal."
#define MESSAGE_UNKNOWN_ROLE "Your account has no role this terminal knows. Ask your coordinator."
#define MESSAGE_OTHER_PERSON "You signed in as someone else. Sign in with your own account."
#define MESSAGE_ONLINE_NOT_HERE "Online sign-in is not possible here."
#define MESSAGE_LOGIN_PAUSED "Too many wrong passwords on this terminal."
#define MESSAGE_DEVICE_DENIED "The sign-in was declined."
#define MESSAGE_DEVICE_EXPIRED "The sign-in code expired before it was used."
#define MESSAGE_UNAVAILABLE "The login service is not available."
#define MESSAGE_NOT_THIS_ACCOUNT "Not allowed on this account."
#define MESSAGE_NOT_SET_UP                                                                         \
    "Your account is not set up yet. Enter the activation code you were given."
#define MESSAGE_CODE_WRONG "That code is not right. Check it and try again."
#define MESSAGE_ALREADY_ACTIVE                                                                     \
    "This account is already set up: log in with your finger or passcode."
#define MESSAGE_ENROLLED "Finger enrolled. Next time, just touch the reader."
#define MESSAGE_ENROL_LATER "You can turn on fingerprint login later: ask your coordinator."
#define MESSAGE_NOT_ENROLLED "The finger could not be enrolled."
/* The daemon's fixed enrolment hint for a reader that cannot identify (io.kioskauth.varlink). */
#define HINT_DUPLICATES_NOT_CHECKED                                                                \
    "this reader cannot check whether the finger is already enrolled"

/* The module is built with hidden visibility and a version script; only these are exported. */
#define _public_ __attribute__((visibility("default")))

/* Cleanup helpers. */

static inline void freep(void *p) { free(*(void **)p); }
#define _cleanup_free_ __attribute__((cleanup(freep)))

/* For strings that held a secret: the passcode as typed, a ticket. */
static inline void erase_and_free(char *s) {
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}
static inline void erase_and_freep(char **s) { erase_and_free(*s); }
#define _cleanup_erase_ __attribute__((cleanup(erase_and_freep)))

#define STARTS_WITH(s, prefix) (strncmp((s), (prefix), strlen(prefix)) == 0)

/* Options: parsed afresh by every entry point. */

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

static bool parse_unsigned(const char *s, unsigned min, unsigned max, unsigned *out) {
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *out = (unsigned)v;
    return true;
}

static void parse_options(pam_handle_t *pamh, int argc, const char **argv, struct options *o) {
    *o = (struct options){
        .socket_path = DEFAULT_SOCKET_PATH,
        .timeout_sec = DEFAULT_SCAN_TIMEOUT_SEC,
        .max_tries = DEFAULT_MAX_TRIES,
        .mode = MODE_AUTO,
    };
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (STARTS_WITH(arg, "socket=")) {
            const char *path = arg + strlen("socket=");
            if (path[0] != '/' || strlen(path) >= sizeof(((struct sockaddr_un *)NULL)->sun_path))
                pam_syslog(pamh, LOG_WARNING,
                           "socket= must be an absolute path shorter than %zu bytes: %s, ignoring",
                           sizeof(((struct sockaddr_un *)NULL)->sun_path), path);
            else
                o->socket_path = path;
        } else if (STARTS_WITH(arg, "timeout=")) {
            if (!parse_unsigned(arg + strlen("timeout="), 1, MAX_SCAN_TIMEOUT_SEC, &o->timeout_sec))
                pam_syslog(pamh, LOG_WARNING, "timeout= takes 1-%u seconds: %s, ignoring",
                           MAX_SCAN_TIMEOUT_SEC, arg);
        } else if (STARTS_WITH(arg, "max_tries=")) {
            if (!parse_unsigned(arg + strlen("max_tries="), 1, MAX_MAX_TRIES, &o->max_tries))
                pam_syslog(pamh, LOG_WARNING, "max_tries= takes 1-%u: %s, ignoring", MAX_MAX_TRIES,
                           arg);
        } else if (strcmp(arg, "mode=auto") == 0) {
            o->mode = MODE_AUTO;
        } else if (strcmp(arg, "mode=identify") == 0) {
            o->mode = MODE_IDENTIFY;
        } else if (strcmp(arg, "mode=verify") == 0) {
            o->mode = MODE_VERIFY;
        } else if (strcmp(arg, "mode=passcode") == 0) {
            o->mode = MODE_PASSCODE;
        } else if (strcmp(arg, "mode=activate") == 0) {
            o->mode = MODE_ACTIVATE;
        } else if (strcmp(arg, "activation") == 0) {
            o->activation = true;
        } else if (strcmp(arg, "idp_login=password") == 0) {
            o->device_login = false;
        } else if (strcmp(arg, "idp_login=device") == 0) {
            o->device_login = true;
        } else if (strcmp(arg, "debug") == 0) {
            o->debug = true;
        } else {
            pam_syslog(pamh, LOG_WARNING, "Unknown option: %s, ignoring", arg);
        }
    }
}

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
};

static int log_ret(const struct login *l, int ret, int priority, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

/* Logs and returns `ret`, so a failure is reported and returned in one statement. */
static int log_ret(const struct login *l, int ret, int priority, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    pam_vsyslog(l->pamh, priority, format, ap);
    va_end(ap);
    return ret;
}

#define log_debug(l, ...)                                                                          \
    do {                                                                                           \
        if ((l)->options.debug)                                                                    \
            pam_syslog((l)->pamh, LOG_DEBUG, __VA_ARGS__);                                         \
    } while (0)

static const char *string_item(pam_handle_t *pamh, int item) {
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
 * session of the process calling PAM is remote (sd_pid_get_session reads the session from the
 * process's cgroup, sd_session_is_remote reads /run/systemd/sessions/ID). Where it does not run,
 * the calls fail; the daemon is told so and audits it, and PAM_RHOST alone decides. */
static void ask_logind(struct login *l) {
    char *session = NULL;
    int r = sd_pid_get_session(getpid(), &session);
    if (r >= 0) {
        r = sd_session_is_remote(session);
        free(session);
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

static void login_init(struct login *l, pam_handle_t *pamh, int flags, int argc,
                       const char **argv) {
    *l = (struct login){.pamh = pamh, .flags = flags, .ruid = getuid()};
    parse_options(pamh, argc, argv, &l->options);
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

/* Text from the daemon is shown to the person: control characters (terminal escapes) become '?'. */
static void sanitise(const char *in, char *out, size_t size) {
    size_t i = 0;
    for (; in[i] && i + 1 < size; i++)
        out[i] = ((unsigned char)in[i] < 0x20 || in[i] == 0x7f) ? '?' : in[i];
    out[i] = '\0';
}

/* An instruction the person needs (touch the reader): shown even with PAM_SILENT. */
static void instruct(const struct login *l, const char *text) {
    char clean[MAX_MESSAGE_LENGTH];
    sanitise(text, clean, sizeof(clean));
    (void)pam_info(l->pamh, "%s", clean);
}

/* Information and complaints: left out with PAM_SILENT. A failed conversation here changes
 * nothing, so its result is ignored. */
static void inform(const struct login *l, const char *text) {
    if (!(l->flags & PAM_SILENT))
        instruct(l, text);
}

static void complain(const struct login *l, const char *text) {
    char clean[MAX_MESSAGE_LENGTH];
    if (l->flags & PAM_SILENT)
        return;
    sanitise(text, clean, sizeof(clean));
    (void)pam_error(l->pamh, "%s", clean);
}

/* Login names as the daemon accepts them: a-z 0-9 . _ - @ +, starting with a letter or a digit,
 * at most 64 bytes. Anything else is nobody the daemon manages. */
static bool is_alphanumeric(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

static bool login_name_is_valid(const char *name) {
    size_t n = strnlen(name, MAX_NAME_LENGTH + 1);
    if (n == 0 || n > MAX_NAME_LENGTH || !is_alphanumeric(name[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_alphanumeric(name[i]) && !strchr("._-@+", name[i]))
            return false;
    return true;
}

/* A growing byte buffer whose old and final contents are wiped: requests carry passcodes and
 * replies carry tickets. After an allocation failure every append is a no-op and `failed` stays
 * set. The data is always NUL-terminated. */
struct buffer {
    char *data;
    size_t length;
    size_t capacity;
    bool failed;
};

static void buffer_erase(struct buffer *b) {
    if (b->data) {
        explicit_bzero(b->data, b->capacity);
        free(b->data);
    }
    *b = (struct buffer){0};
}
#define _cleanup_buffer_ __attribute__((cleanup(buffer_erase)))

static bool buffer_reserve(struct buffer *b, size_t extra) {
    if (b->failed)
        return false;
    if (extra > MAX_REPLY_SIZE || b->length + extra + 1 > 2 * MAX_REPLY_SIZE) {
        b->failed = true;
        return false;
    }
    size_t need = b->length + extra + 1;
    if (need <= b->capacity)
        return true;
    size_t capacity = b->capacity ? b->capacity : 512;
    while (capacity < need)
        capacity *= 2;
    /* Not realloc(): it could leave a copy of a secret behind in freed memory. */
    char *data = malloc(capacity);
    if (!data) {
        b->failed = true;
        return false;
    }
    if (b->data) {
        memcpy(data, b->data, b->length + 1);
        explicit_bzero(b->data, b->capacity);
        free(b->data);
    }
    b->data = data;
    b->capacity = capacity;
    return true;
}

static void buffer_append(struct buffer *b, const void *bytes, size_t n) {
    if (!buffer_reserve(b, n))
        return;
    memcpy(b->data + b->length, bytes, n);
    b->length += n;
    b->data[b->length] = '\0';
}

static void buffer_puts(struct buffer *b, const char *s) { buffer_append(b, s, strlen(s)); }

/* JSON writer. */

/* Length of the valid UTF-8 sequence starting at s (1-4), or 0 when there is none; *out (when
 * not NULL) is its code point. */
static size_t utf8_decode(const unsigned char *s, uint32_t *out) {
    unsigned char c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
        if (out)
            *out = c;
        return 1;
    }
    if ((c & 0xe0) == 0xc0) {
        n = 2;
        cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3;
        cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    if (out)
        *out = cp;
    return n;
}

/* Writes s as a JSON string: quotes, backslashes and control characters escaped, bytes that are
 * not UTF-8 replaced by U+FFFD. */
static void json_string(struct buffer *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    buffer_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_decode(p, NULL);
        if (n == 0) {
            buffer_puts(b, "\\ufffd");
            p++;
            continue;
        }
        if (*p == '"' || *p == '\\') {
            char escaped[2] = {'\\', (char)*p};
            buffer_append(b, escaped, sizeof(escaped));
        } else if (*p < 0x20 || *p == 0x7f) {
            char escaped[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 0xf]};
            buffer_append(b, escaped, sizeof(escaped));
            explicit_bzero(escaped, sizeof(escaped));
        } else {
            buffer_append(b, p, n);
        }
        p += n;
    }
    buffer_puts(b, "\"");
}

static void json_unsigned(struct buffer *b, unsigned long long v) {
    char digits[24];
    int n = snprintf(digits, sizeof(digits), "%llu", v);
    buffer_append(b, digits, (size_t)n);
}

/* The CallerContext of every authenticating call. */
static void json_context(struct buffer *b, const struct login *l) {
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
    const struct passwd *account =
        user && strlen(user) <= MAX_ITEM_LENGTH ? pam_modutil_getpwnam(l->pamh, user) : NULL;
    if (account) {
        buffer_puts(b, ",\"targetUid\":");
        json_unsigned(b, account->pw_uid);
    }
    buffer_puts(b, "}");
}

/* JSON reader: just enough for the daemon's replies. Numbers keep their integer part (every
 * number in the API is an integer). */

enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
};

struct json {
    enum json_type type;
    long long number;
    char *string;
    size_t count;       /* array items or object members */
    char **keys;        /* object member names */
    struct json *items; /* array items or object values */
};

static void json_free(struct json *v) {
    for (size_t i = 0; i < v->count; i++) {
        if (v->keys)
            free(v->keys[i]);
        if (v->items)
            json_free(&v->items[i]);
    }
    free(v->keys);
    free(v->items);
    erase_and_free(v->string);
    *v = (struct json){0};
}

struct parser {
    const char *p;
    const char *end;
};

static void skip_space(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool parse_hex4(struct parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4)
        return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(ps->p[i]);
        if (h < 0)
            return false;
        v = (v << 4) | (uint32_t)h;
    }
    ps->p += 4;
    *out = v;
    return true;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses a string at ps->p (on its opening quote). The decoded text is never longer than its
 * encoding, so one allocation of that size suffices. */
static bool parse_string(struct parser *ps, char **out) {
    const char *start = ++ps->p;
    const char *close = start;
    while (close < ps->end && *close != '"') {
        if (*close == '\\')
            close++;
        close++;
    }
    if (close >= ps->end)
        return false;
    char *s = malloc((size_t)(close - start) + 1);
    if (!s)
        return false;
    size_t n = 0;
    while (ps->p < close) {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20)
            goto fail;
        if (c != '\\') {
            s[n++] = (char)c;
            continue;
        }
        char e = *ps->p++;
        switch (e) {
        case '"':
        case '\\':
        case '/':
            s[n++] = e;
            break;
        case 'b':
            s[n++] = '\b';
            break;
        case 'f':
            s[n++] = '\f';
            break;
        case 'n':
            s[n++] = '\n';
            break;
        case 'r':
            s[n++] = '\r';
            break;
        case 't':
            s[n++] = '\t';
            break;
        case 'u': {
            uint32_t cp, low;
            if (!parse_hex4(ps, &cp))
                goto fail;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (close - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    goto fail;
                ps->p += 2;
                if (!parse_hex4(ps, &low) || low < 0xdc00 || low > 0xdfff)
                    goto fail;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            } else if ((cp >= 0xdc00 && cp <= 0xdfff) || cp == 0) {
                goto fail;
            }
            n += utf8_encode(cp, s + n);
            break;
        }
        default:
            goto fail;
        }
        if (ps->p > close)
            goto fail;
    }
    s[n] = '\0';
    ps->p = close + 1;
    *out = s;
    return true;
fail:
    explicit_bzero(s, (size_t)(close - start) + 1);
    free(s);
    return false;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Parsed by hand rather than with strtod(), which follows the calling program's locale. */
static bool parse_number(struct parser *ps, long long *out) {
    const char *p = ps->p;
    bool negative = false;
    long long v = 0;
    if (p < ps->end && *p == '-') {
        negative = true;
        p++;
    }
    if (p >= ps->end || !is_digit(*p))
        return false;
    if (*p == '0') {
        p++;
    } else {
        for (; p < ps->end && is_digit(*p); p++)
            v = v > (LLONG_MAX - 9) / 10 ? LLONG_MAX : v * 10 + (*p - '0');
    }
    if (p < ps->end && *p == '.') {
        p++;
        if (p >= ps->end || !is_digit(*p))
            return false;
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        p++;
        bool negative_exponent = false;
        if (p < ps->end && (*p == '+' || *p == '-'))
            negative_exponent = *p++ == '-';
        if (p >= ps->end || !is_digit(*p))
            return false;
        int exponent = 0;
        for (; p < ps->end && is_digit(*p); p++)
            exponent = exponent > 100 ? exponent : exponent * 10 + (*p - '0');
        for (int i = 0; i < exponent && v != 0; i++)
            v = negative_exponent ? v / 10 : (v > LLONG_MAX / 10 ? LLONG_MAX : v * 10);
    }
    ps->p = p;
    *out = negative ? -v : v;
    return true;
}

static bool parse_literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return false;
    ps->p += n;
    return true;
}

static bool parse_value(struct parser *ps, struct json *v, unsigned depth);

/* Parses an array or an object at ps->p (on its opening bracket). */
static bool parse_container(struct parser *ps, struct json *v, unsigned depth) {
    bool object = *ps->p == '{';
    char close = object ? '}' : ']';
    size_t capacity = 0;
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        if (v->count == capacity) {
            size_t grown = capacity ? capacity * 2 : 8;
            struct json *items = calloc(grown, sizeof(*items));
            char **keys = object ? calloc(grown, sizeof(*keys)) : NULL;
            if (!items || (object && !keys)) {
                free(items);
                free(keys);
                return false;
            }
            if (v->count) {
                memcpy(items, v->items, v->count * sizeof(*items));
                if (object)
                    memcpy(keys, v->keys, v->count * sizeof(*keys));
            }
            free(v->items);
            free(v->keys);
            v->items = items;
            v->keys = keys;
            capacity = grown;
        }
        skip_space(ps);
        /* Counted before parsing, so that a half-parsed member is freed with the rest. */
        v->count++;
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"' || !parse_string(ps, &v->keys[v->count - 1]))
                return false;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return false;
            ps->p++;
        }
        if (!parse_value(ps, &v->items[v->count - 1], depth + 1))
            return false;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return true;
        }
        return false;
    }
}

static bool parse_value(struct parser *ps, struct json *v, unsigned depth) {
    if (depth > MAX_JSON_DEPTH)
        return false;
    skip_space(ps);
    if (ps->p >= ps->end)
        return false;
    switch (*ps->p) {
    case '{':
    case '[':
        return parse_container(ps, v, depth);
    case '"':
        v->type = JSON_STRING;
        return parse_string(ps, &v->string);
    case 't':
        v->type = JSON_TRUE;
        return parse_literal(ps, "true");
    case 'f':
        v->type = JSON_FALSE;
        return parse_literal(ps, "false");
    case 'n':
        v->type = JSON_NULL;
        return parse_literal(ps, "null");
    default:
        v->type = JSON_NUMBER;
        return parse_number(ps, &v->number);
    }
}

static bool json_parse(const char *text, size_t length, struct json *v) {
    struct parser ps = {.p = text, .end = text + length};
    *v = (struct json){0};
    if (parse_value(&ps, v, 0)) {
        skip_space(&ps);
        if (ps.p == ps.end)
            return true;
    }
    json_free(v);
    return false;
}

static const struct json *json_get(const struct json *object, const char *key) {
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0)
            return &object->items[i];
    return NULL;
}

static const char *json_get_string(const struct json *object, const char *key) {
    const struct json *v = json_get(object, key);
    return v && v->type == JSON_STRING ? v->string : NULL;
}

static bool json_get_bool(const struct json *object, const char *key) {
    const struct json *v = json_get(object, key);
    return v && v->type == JSON_TRUE;
}

static bool json_get_integer(const struct json *object, const char *key, long long *out) {
    const struct json *v = json_get(object, key);
    if (!v || v->type != JSON_NUMBER)
        return false;
    *out = v->number;
    return true;
}

/* The person in the environment. */

/* Roles are the daemon's enum (caregiver, coordinator, family): lowercase words. */
static bool role_is_valid(const char *role) {
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
static void clean_display_name(const char *in, char *out, size_t size) {
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
static void note_person(const struct login *l, const struct json *person) {
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

static int put_variable(const struct login *l, const char *variable, const char *value) {
    char entry[sizeof(ENV_DISPLAY_NAME) + 1 + MAX_DISPLAY_NAME_LENGTH + 1];
    snprintf(entry, sizeof(entry), "%s=%s", variable, value);
    int r = pam_putenv(l->pamh, entry);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set %s: %s", variable, pam_strerror(l->pamh, r));
    return PAM_SUCCESS;
}

/* After a successful auth: KIOSKAUTH_ROLE and KIOSKAUTH_DISPLAY_NAME for the application (and,
 * through pam_getenvlist(), the session it starts). */
static int export_person(const struct login *l) {
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
static void clear_person(pam_handle_t *pamh) {
    /* (libpam logs an error for deleting a variable that is not set.) */
    if (pam_getenv(pamh, ENV_ROLE))
        (void)pam_putenv(pamh, ENV_ROLE);
    if (pam_getenv(pamh, ENV_DISPLAY_NAME))
        (void)pam_putenv(pamh, ENV_DISPLAY_NAME);
}

/* The connection to the daemon. */

struct connection {
    int fd;
    struct buffer input; /* received bytes not yet taken as a message */
};
#define CONNECTION_INIT                                                                            \
    { .fd = -1 }

static void connection_close(struct connection *c) {
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    buffer_erase(&c->input);
}
#define _cleanup_connection_ __attribute__((cleanup(connection_close)))

static uint64_t now_msec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int remaining_msec(uint64_t deadline) {
    uint64_t now = now_msec();
    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Waits until fd is ready. A signal ends an interruptible wait (-EINTR): that is how Ctrl-C in
 * sudo, or a greeter cancelling, stops a wait for a finger. Other waits are short and resume. */
static int wait_for(int fd, short events, uint64_t deadline, bool interruptible) {
    for (;;) {
        int timeout = remaining_msec(deadline);
        if (timeout == 0)
            return -ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, timeout);
        if (r > 0)
            return 0; /* POLLHUP and POLLERR surface in the recv() or send() that follows */
        if (r == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
        if (interruptible)
            return -EINTR;
    }
}

/* Whether the process serving the socket is root or the daemon's own user. */
static bool peer_is_daemon(const struct login *l, int fd) {
    struct ucred cred;
    socklen_t length = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) < 0 || length != sizeof(cred))
        return log_ret(l, false, LOG_ERR, "Cannot read the peer credentials of %s: %m",
                       l->options.socket_path);
    if (cred.uid == 0)
        return true;
    const struct passwd *daemon_user = pam_modutil_getpwnam(l->pamh, DAEMON_USER);
    if (daemon_user && daemon_user->pw_uid == cred.uid)
        return true;
    return log_ret(l, false, LOG_ERR,
                   "%s is served by uid %u, which is neither root nor %s; refusing",
                   l->options.socket_path, (unsigned)cred.uid, DAEMON_USER);
}

/* Connects within CONNECT_TIMEOUT_MSEC; returns 0 or a negative errno (already logged). */
static int connection_open(const struct login *l, struct connection *c) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t length = strlen(l->options.socket_path);
    memcpy(address.sun_path, l->options.socket_path, length);
    socklen_t address_length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + length + 1);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return log_ret(l, -errno, LOG_ERR, "Cannot create a socket: %m");
    uint64_t deadline = now_msec() + CONNECT_TIMEOUT_MSEC;
    while (connect(fd, (const struct sockaddr *)&address, address_length) < 0) {
        int error = errno;
        if (error == EINTR)
            continue;
        /* Only a full listen backlog gives EAGAIN; a local socket cannot be polled for it. */
        if (error == EAGAIN && remaining_msec(deadline) > 0) {
            struct timespec pause = {.tv_nsec = RETRY_CONNECT_PAUSE_NSEC};
            nanosleep(&pause, NULL);
            continue;
        }
        close(fd);
        if (error == EAGAIN)
            error = ETIMEDOUT;
        return log_ret(l, -error, LOG_WARNING, "Cannot connect to kioskauthd at %s: %s",
                       l->options.socket_path, strerror(error));
    }
    if (!peer_is_daemon(l, fd)) {
        close(fd);
        return -EPERM;
    }
    c->fd = fd;
    return 0;
}

/* Sends the request and its terminating NUL. */
static int connection_send(struct connection *c, const struct buffer *request, uint64_t deadline) {
    size_t sent = 0, total = request->length + 1;
    while (sent < total) {
        ssize_t n = send(c->fd, request->data + sent, total - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int r = wait_for(c->fd, POLLOUT, deadline, false);
            if (r < 0)
                return r;
            continue;
        }
        return n < 0 ? -errno : -EIO;
    }
    return 0;
}

/* A reply: its parsed form, the error's short name when it is one of ours (the full name
 * otherwise), its parameters, and whether more replies follow. */
struct reply {
    struct json root;
    const char *error;
    const struct json *parameters;
    bool continues;
};

static void reply_clear(struct reply *r) {
    json_free(&r->root);
    *r = (struct reply){0};
}
#define _cleanup_reply_ __attribute__((cleanup(reply_clear)))

static bool is_error(const struct reply *r, const char *name) {
    return r->error && strcmp(r->error, name) == 0;
}

/* Reads the next NUL-terminated message and parses it into reply. */
static int connection_receive(struct connection *c, uint64_t deadline, bool interruptible,
                              struct reply *reply) {
    reply_clear(reply);
    for (;;) {
        char *end = c->input.length ? memchr(c->input.data, '\0', c->input.length) : NULL;
        if (end) {
            size_t length = (size_t)(end - c->input.data);
            bool parsed = json_parse(c->input.data, length, &reply->root);
            size_t rest = c->input.length - length - 1;
            memmove(c->input.data, end + 1, rest);
            explicit_bzero(c->input.data + rest, c->input.length - rest);
            c->input.length = rest;
            if (!parsed || reply->root.type != JSON_OBJECT) {
                reply_clear(reply);
                return -EBADMSG;
            }
            const char *error = json_get_string(&reply->root, "error");
            if (error && STARTS_WITH(error, INTERFACE))
                error += strlen(INTERFACE);
            reply->error = error;
            reply->parameters = json_get(&reply->root, "parameters");
            reply->continues = json_get_bool(&reply->root, "continues");
            return 0;
        }
        if (c->input.length >= MAX_REPLY_SIZE)
            return -EMSGSIZE;
        int r = wait_for(c->fd, POLLIN, deadline, interruptible);
        if (r < 0)
            return r;
        if (!buffer_reserve(&c->input, 4096))
            return -ENOMEM;
        ssize_t n = recv(c->fd, c->input.data + c->input.length,
                         c->input.capacity - c->input.length - 1, MSG_DONTWAIT);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        c->input.length += (size_t)n;
        c->input.data[c->input.length] = '\0';
    }
}

/* One call on an open connection, answered within timeout_msec. An interruptible call ends at a
 * signal with -EINTR, not logged: the person chose to stop. */
static int exchange_within(const struct login *l, struct connection *c,
                           const struct buffer *request, struct reply *reply, unsigned timeout_msec,
                           bool interruptible) {
    if (request->failed)
        return log_ret(l, -ENOMEM, LOG_CRIT, "Out of memory");
    uint64_t deadline = now_msec() + timeout_msec;
    int r = connection_send(c, request, deadline);
    if (r >= 0)
        r = connection_receive(c, deadline, interruptible, reply);
    if (r == -EINTR)
        return r;
    if (r < 0)
        return log_ret(l, r, LOG_WARNING, "kioskauthd did not answer: %s", strerror(-r));
    return 0;
}

/* One call on an open connection that waits for no finger. */
static int exchange(const struct login *l, struct connection *c, const struct buffer *request,
                    struct reply *reply) {
    return exchange_within(l, c, request, reply, CALL_TIMEOUT_MSEC, false);
}

/* One call on a connection of its own. */
static int ask(const struct login *l, const struct buffer *request, struct reply *reply) {
    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    int r = connection_open(l, &c);
    if (r < 0)
        return r;
    return exchange(l, &c, request, reply);
}

/* The hand-over from auth to open_session.
 *
 * OpenSession takes the ticket of the authentication that opens the session, so that the session
 * starts authenticated (step-up and the lock epoch count from that authentication), and the
 * daemon binds every ticket to the connection that earned it. So auth keeps that connection and
 * its ticket in the PAM handle (pam_set_data), and open_session presents the ticket on it. Why
 * this is safe:
 * - the connection never leaves this process's PAM handle: it is close-on-exec (SOCK_CLOEXEC),
 *   so nothing the application runs inherits it; the data's cleanup closes it at pam_end(), in a
 *   forked child that ends its copy of the handle too;
 * - the ticket is good once, only for the person this module authenticated, only on this
 *   connection and only for the daemon's TicketLifetimeSec; open_session presents it only when
 *   PAM_USER is still that person, and only on a connection that is still open and quiet;
 * - it is kept at most until open_session, the next auth on the handle or pam_end(); the daemon
 *   closes it after its idle timeout anyway (then the module holds a dead descriptor, no more).
 * The environment is not a way to pass it: it is the caller's in setuid programs, and the
 * application would see the ticket. When the connection or the ticket is gone (idle timeout, a
 * restart, the ticket used up by an enrolment or expired), open_session opens the session without
 * one: the session is registered unauthenticated and the first step-up asks for a fresh
 * authentication, which is the safe side. */
struct handover {
    int fd;
    dev_t dev; /* which socket `fd` was: the application may close and reuse the number */
    ino_t ino;
    char *ticket;
    char name[MAX_NAME_LENGTH + 1];
};
#define HANDOVER_INIT                                                                              \
    { .fd = -1 }

/* Whether h->fd is still the socket auth kept, not a descriptor the application opened on the
 * same number after closing ours. */
static bool handover_fd_is_ours(const struct handover *h) {
    struct stat st;
    return h->fd >= 0 && fstat(h->fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == h->dev &&
           st.st_ino == h->ino;
}

static void handover_clear(struct handover *h) {
    if (handover_fd_is_ours(h))
        close(h->fd);
    erase_and_free(h->ticket);
    *h = (struct handover)HANDOVER_INIT;
}

static void free_handover(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    handover_clear(data);
    free(data);
}

/* After a successful authentication on `c` (auth only): keeps the connection and the ticket for
 * open_session. `c` is closed either way. */
static void keep_for_session(const struct login *l, struct connection *c, const char *ticket,
                             const char *name) {
    struct handover *h = l->handover;
    struct stat st;
    char *copy =
        h && c->fd >= 0 && ticket && name && login_name_is_valid(name) && fstat(c->fd, &st) == 0
            ? strdup(ticket)
            : NULL;
    if (copy) {
        handover_clear(h);
        h->fd = c->fd;
        h->dev = st.st_dev;
        h->ino = st.st_ino;
        c->fd = -1;
        h->ticket = copy;
        memcpy(h->name, name, strlen(name) + 1);
    }
    connection_close(c);
}

/* Puts what auth kept into the handle; without it the session simply opens unauthenticated. */
static void store_handover(const struct login *l) {
    struct handover *h = l->handover;
    if (!h || h->fd < 0)
        return;
    struct handover *kept = malloc(sizeof(*kept));
    if (!kept)
        return;
    *kept = *h;
    *h = (struct handover)HANDOVER_INIT;
    int r = pam_set_data(l->pamh, DATA_HANDOVER, kept, free_handover);
    if (r != PAM_SUCCESS) {
        free_handover(l->pamh, kept, 0);
        log_debug(l, "Cannot keep the connection for the session: %s", pam_strerror(l->pamh, r));
    }
}

/* Drops what an earlier auth kept (the data's cleanup closes the connection). */
static void forget_handover(pam_handle_t *pamh) {
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_HANDOVER, &data) == PAM_SUCCESS && data)
        (void)pam_set_data(pamh, DATA_HANDOVER, NULL, NULL);
}

/* Takes the connection and ticket auth kept, when they are for `name` and the connection is still
 * open and quiet (the daemon has sent nothing: no idle-timeout notice, no hang-up). The handle
 * keeps neither afterwards. */
static void take_handover(const struct login *l, const char *name, struct connection *c,
                          char **ticket) {
    const void *data = NULL;
    if (pam_get_data(l->pamh, DATA_HANDOVER, &data) != PAM_SUCCESS || !data)
        return;
    struct handover *h = (struct handover *)data;
    if (h->ticket && strcmp(h->name, name) == 0 && handover_fd_is_ours(h) &&
        peer_is_daemon(l, h->fd)) {
        struct pollfd pfd = {.fd = h->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&pfd, 1, 0) == 0) {
            c->fd = h->fd;
            h->fd = -1;
            *ticket = h->ticket;
            h->ticket = NULL;
        }
    }
    (void)pam_set_data(l->pamh, DATA_HANDOVER, NULL, NULL);
}

/* A scan (VerifyFinger, Identify) on a connection of its own, `c` (which the caller closes, or
 * keeps for the session after a match): shows the daemon's prompts as they stream in and leaves
 * the final reply in `reply`. `*deadline` bounds it: when 0, it is set to timeout= from now (a
 * caller passes the same deadline again for the touches that follow an unusable one). Returns
 * 0; -ETIMEDOUT when no final reply came by the deadline; -EINTR when a signal ended the wait;
 * another negative errno when the daemon could not be asked. Closing the connection cancels a
 * scan still running. */
static int scan(const struct login *l, struct connection *c, const struct buffer *request,
                struct reply *reply, bool *touch_requested, uint64_t *deadline) {
    *touch_requested = false;
    if (request->failed)
        return log_ret(l, -ENOMEM, LOG_CRIT, "Out of memory");
    int r = connection_open(l, c);
    if (r < 0)
        return r;
    if (*deadline == 0)
        *deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
    r = connection_send(c, request, *deadline);
    for (;;) {
        if (r >= 0)
            r = connection_receive(c, *deadline, true, reply);
        if (r == -EINTR || r == -ETIMEDOUT) {
            log_debug(l, "Scan ended: %s", r == -EINTR ? "interrupted by a signal" : "timed out");
            return r;
        }
        if (r < 0)
            return log_ret(l, r, LOG_WARNING, "kioskauthd did not answer: %s", strerror(-r));
        if (!reply->continues)
            return 0;
        const struct json *progress = json_get(reply->parameters, "progress");
        const char *state = json_get_string(progress, "state");
        const char *hint = json_get_string(progress, "hint");
        if (state && strcmp(state, "touch") == 0)
            *touch_requested = true;
        if (hint)
            instruct(l, hint);
    }
}

/* The person named in a successful reply, when the name is one the daemon could have made. */
static const char *reply_person_name(const struct reply *reply) {
    const char *name = json_get_string(json_get(reply->parameters, "person"), "name");
    return name && login_name_is_valid(name) ? name : NULL;
}

static bool is_pending(const char *state) {
    return state && strcmp(state, "pending_activation") == 0;
}

static const char *not_active_message(const char *state) {
    if (state && strcmp(state, "suspended") == 0)
        return "Your account is suspended.";
    if (state && strcmp(state, "pending_activation") == 0)
        return "Your account is not activated yet.";
    return "Your account may not log in now.";
}

static void say_wait(const struct login *l, const char *what, long long seconds) {
    char text[MAX_MESSAGE_LENGTH];
    if (seconds > MAX_WAIT_SHOWN_SEC)
        seconds = MAX_WAIT_SHOWN_SEC;
    long long minutes = (seconds + 59) / 60;
    if (seconds < 60)
        snprintf(text, sizeof(text), "%s Try again in %lld second%s.", what, seconds,
                 seconds == 1 ? "" : "s");
    else
        snprintf(text, sizeof(text), "%s Try again in %lld minute%s.", what, minutes,
                 minutes == 1 ? "" : "s");
    complain(l, text);
}

/* What a step leaves to do: nothing more (return `ret`), ask for the name, ask for the
 * passcode, activate a person who has not activated yet, sign an identity-provider person in
 * online (`name`, when the step found out who), or a first online login for a name the daemon
 * does not know. `ret` is what to return when the mode allows no next step. */
enum next { NEXT_NONE, NEXT_ASK_NAME, NEXT_PASSCODE, NEXT_ACTIVATE, NEXT_ONLINE, NEXT_FIRST_LOGIN };
struct step {
    int ret;
    enum next next;
    char name[MAX_NAME_LENGTH + 1];
    /* NEXT_ONLINE: say "Please sign in..." once the daemon allows the online login. */
    bool say_sign_in;
    /* NEXT_ASK_NAME: the finger is done with (out of tries, or identify paused); after the name
     * comes the passcode, not another touch. */
    bool finger_done;
};

/* Errors that end a scan without a verdict on the finger: a name or the passcode can go on. */
static bool is_reader_trouble(const struct reply *reply) {
    return is_error(reply, "NoReader") || is_error(reply, "ScanTimeout") ||
           is_error(reply, "ReaderRemoved") || is_error(reply, "ReaderUnavailable") ||
           is_error(reply, "ScanCancelled");
}

static struct step unexpected(const struct login *l, const char *method,
                              const struct reply *reply) {
    const struct json *p = reply->parameters;
    const char *reason = json_get_string(p, "reason");
    /* The person is not bound to the Unix account PAM_USER names (the daemon audited it). */
    if (is_error(reply, "AccountNotAllowed")) {
        complain(l, MESSAGE_NOT_THIS_ACCOUNT);
        pam_syslog(l->pamh, LOG_NOTICE, "%s refused: %s", method, reason ? reason : "-");
        return (struct step){PAM_AUTH_ERR, NEXT_NONE};
    }
    pam_syslog(l->pamh, LOG_WARNING, "%s failed: %s%s%s", method, reply->error, reason ? ": " : "",
               reason ? reason : "");
    return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
}

static bool must_sign_in_online(const struct reply *reply) {
    return is_error(reply, "OfflineWindowExpired") || is_error(reply, "OnlineLoginRequired");
}

/* An identity-provider person whose offline window has ended, or whose local unlock is suspended
 * until they sign in online: the daemon's one line, then (where the conversation has a keyboard)
 * the online login. */
static struct step sign_in_required(const struct login *l, const struct reply *reply) {
    const char *message = json_get_string(reply->parameters, "message");
    const char *name = json_get_string(reply->parameters, "name");
    struct step s = {PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, ""};
    complain(l, message ? message : "Sign in online.");
    if (l->person)
        l->person->online_only = true;
    if (name && login_name_is_valid(name))
        memcpy(s.name, name, strlen(name) + 1);
    log_debug(l, "%s: %s", reply->error, name ? name : "-");
    return s;
}

/* What the person is told when the scan ended without a verdict on the finger. */
static void say_reader_trouble(const struct login *l, const struct reply *reply) {
    if (is_error(reply, "ScanTimeout"))
        complain(l, MESSAGE_SCAN_TIMED_OUT);
}

/* A touch the reader could not use (ScanRetry: too short, off centre, a finger already down) is
 * not a failed match: the person is told why and touches again without using up a try, for as
 * long as timeout= allows from the first touch of that try. */
static void say_retry(const struct login *l, const struct reply *reply) {
    const char *hint = json_get_string(reply->parameters, "hint");
    complain(l, hint ? hint : "Try again.");
}

/* Walk-up identify paused after unknown fingers: for how long, and what works meanwhile. */
static void say_identify_paused(const struct login *l, const struct reply *reply) {
    long long seconds = 0;
    char text[MAX_MESSAGE_LENGTH];
    const char *alternative = l->options.mode == MODE_AUTO ? ", or use your name and passcode" : "";
    if (!json_get_integer(reply->parameters, "retryAfterSeconds", &seconds) || seconds <= 0)
        seconds = 60;
    if (seconds > MAX_WAIT_SHOWN_SEC) /* a daemon's number, never trusted to fit arithmetic */
        seconds = MAX_WAIT_SHOWN_SEC;
    long long minutes = (seconds + 59) / 60;
    if (seconds < 60)
        snprintf(text, sizeof(text),
                 "Fingerprint unlock is paused after too many unknown fingers. "
                 "Try again in %lld second%s%s.",
                 seconds, seconds == 1 ? "" : "s", alternative);
    else
        snprintf(text, sizeof(text),
                 "Fingerprint unlock is paused after too many unknown fingers. "
                 "Try again in %lld minute%s%s.",
                 minutes, minutes == 1 ? "" : "s", alternative);
    complain(l, text);
}

/* Walk-up unlock: on a match, and only then, PAM_USER becomes the person recognised. */
static struct step identify(const struct login *l) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.Identify\",\"more\":true,"
                          "\"parameters\":{\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");

    uint64_t deadline = 0;
    for (unsigned attempt = 1;;) {
        _cleanup_connection_ struct connection c = CONNECTION_INIT;
        _cleanup_reply_ struct reply reply = {0};
        bool touch_requested;
        int r = scan(l, &c, &request, &reply, &touch_requested, &deadline);
        /* Ctrl-C: the person chose another way in; the stack goes on to its next module. */
        if (r == -EINTR)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (r == -ETIMEDOUT) {
            complain(l, MESSAGE_SCAN_TIMED_OUT);
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ASK_NAME};
        }
        if (r < 0)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (is_error(&reply, "ScanRetry")) {
            say_retry(l, &reply);
            continue;
        }
        deadline = 0;

        if (!reply.error) {
            const char *name = reply_person_name(&reply);
            if (!name)
                return unexpected(l, "Identify", &(struct reply){.error = "malformed reply"});
            r = pam_set_item(l->pamh, PAM_USER, name);
            if (r != PAM_SUCCESS)
                return (struct step){
                    log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r)),
                    NEXT_NONE};
            const struct json *person = json_get(reply.parameters, "person");
            const char *display_name = json_get_string(person, "displayName");
            note_person(l, person);
            char welcome[MAX_MESSAGE_LENGTH];
            snprintf(welcome, sizeof(welcome), "Welcome back, %s",
                     display_name && *display_name ? display_name : name);
            inform(l, welcome);
            keep_for_session(l, &c, json_get_string(reply.parameters, "ticket"), name);
            log_debug(l, "Identified %s", name);
            return (struct step){PAM_SUCCESS, NEXT_NONE};
        }
        if (is_error(&reply, "NotIdentified")) {
            /* No touch was asked for when nobody is enrolled: ask for the name at once. */
            if (!touch_requested || json_get_bool(reply.parameters, "askForName"))
                return (struct step){PAM_AUTH_ERR, NEXT_ASK_NAME};
            complain(l, MESSAGE_NOT_RECOGNISED);
            if (attempt++ >= l->options.max_tries) {
                complain(l, MESSAGE_USE_NAME);
                return (struct step){PAM_MAXTRIES, NEXT_ASK_NAME, .finger_done = true};
            }
            continue;
        }
        if (is_error(&reply, "IdentifyPaused")) {
            say_identify_paused(l, &reply);
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ASK_NAME, .finger_done = true};
        }
        if (is_reader_trouble(&reply)) {
            log_debug(l, "Identify: %s", reply.error);
            say_reader_trouble(l, &reply);
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ASK_NAME};
        }
        if (is_error(&reply, "FingerprintNotAllowed")) {
            const char *reason = json_get_string(reply.parameters, "reason");
            log_debug(l, "Identify refused: %s", reason ? reason : "no reason given");
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        }
        if (must_sign_in_online(&reply))
            return sign_in_required(l, &reply);
        /* Recognised, but not someone who may log in now (suspended by an administrator). */
        if (is_error(&reply, "PersonNotActive")) {
            complain(l, not_active_message(json_get_string(reply.parameters, "state")));
            return (struct step){PAM_AUTH_ERR, NEXT_NONE};
        }
        return unexpected(l, "Identify", &reply);
    }
}

/* After too many failed matches: the passcode, or for a person from the identity provider who
 * has none, their email and password (or a device login) with the identity provider. Either way
 * the person is told what comes next. */
static struct step fallback(const struct login *l, const struct reply *reply) {
    const char *to = json_get_string(reply->parameters, "fallback");
    if (to && strcmp(to, "idp") == 0) {
        complain(l, MESSAGE_IDP_FALLBACK);
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE};
    }
    complain(l, MESSAGE_USE_PASSCODE);
    return (struct step){PAM_MAXTRIES, NEXT_PASSCODE};
}

/* 1:1 match of the named person's finger. */
static struct step verify_finger(const struct login *l, const char *name) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.VerifyFinger\",\"more\":true,"
                          "\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");

    uint64_t deadline = 0;
    for (unsigned attempt = 1;;) {
        _cleanup_connection_ struct connection c = CONNECTION_INIT;
        _cleanup_reply_ struct reply reply = {0};
        bool touch_requested;
        int r = scan(l, &c, &request, &reply, &touch_requested, &deadline);
        if (r == -EINTR)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (r == -ETIMEDOUT) {
            complain(l, MESSAGE_SCAN_TIMED_OUT);
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_PASSCODE};
        }
        if (r < 0)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (is_error(&reply, "ScanRetry")) {
            say_retry(l, &reply);
            continue;
        }
        deadline = 0;

        if (!reply.error) {
            const char *matched = reply_person_name(&reply);
            if (!matched || strcmp(matched, name) != 0)
                return unexpected(l, "VerifyFinger", &(struct reply){.error = "malformed reply"});
            note_person(l, json_get(reply.parameters, "person"));
            keep_for_session(l, &c, json_get_string(reply.parameters, "ticket"), name);
            log_debug(l, "Fingerprint verified for %s", name);
            return (struct step){PAM_SUCCESS, NEXT_NONE};
        }
        if (is_error(&reply, "FingerprintNotRecognized")) {
            complain(l, MESSAGE_NOT_RECOGNISED);
            /* The daemon counts failed matches per connection, and every touch has its own: the
             * conversation's count is this loop's (a retry hint is not a try). */
            if (json_get_bool(reply.parameters, "fallbackRequired") ||
                attempt++ >= l->options.max_tries)
                return fallback(l, &reply);
            continue;
        }
        if (is_error(&reply, "FallbackRequired"))
            return fallback(l, &reply);
        /* No reader, no finger enrolled, or matching paused on the terminal: no error text, only
         * the passcode prompt. */
        if (is_error(&reply, "NoFingers") || is_error(&reply, "FingerprintPaused") ||
            is_reader_trouble(&reply)) {
            log_debug(l, "VerifyFinger: %s", reply.error);
            say_reader_trouble(l, &reply);
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_PASSCODE};
        }
        if (is_error(&reply, "NoSuchPerson"))
            return (struct step){PAM_USER_UNKNOWN, NEXT_FIRST_LOGIN};
        if (is_error(&reply, "PersonNotActive")) {
            const char *state = json_get_string(reply.parameters, "state");
            if (is_pending(state))
                return (struct step){PAM_AUTH_ERR, NEXT_ACTIVATE};
            complain(l, not_active_message(state));
            return (struct step){PAM_AUTH_ERR, NEXT_NONE};
        }
        if (is_error(&reply, "FingerprintNotAllowed")) {
            const char *reason = json_get_string(reply.parameters, "reason");
            log_debug(l, "VerifyFinger refused: %s", reason ? reason : "no reason given");
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        }
        if (must_sign_in_online(&reply))
            return sign_in_required(l, &reply);
        return unexpected(l, "VerifyFinger", &reply);
    }
}

/* Turns a VerifyPasscode error into what the person is told and the PAM code; *retry says
 * whether another attempt may follow. */
static int passcode_refused(const struct login *l, const struct reply *reply, bool *retry) {
    const struct json *p = reply->parameters;
    long long seconds = 0;
    *retry = false;
    if (is_error(reply, "WrongPasscode")) {
        if (json_get_integer(p, "retryAfterSeconds", &seconds) && seconds > 0) {
            say_wait(l, "Wrong passcode. Too many attempts.", seconds);
            return PAM_MAXTRIES;
        }
        complain(l, MESSAGE_WRONG_PASSCODE);
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "PasscodeLocked")) {
        if (json_get_bool(p, "hardLocked") || !json_get_integer(p, "retryAfterSeconds", &seconds))
            complain(l, MESSAGE_HARD_LOCKED);
        else
            say_wait(l, "Too many wrong passcodes.", seconds);
        return PAM_MAXTRIES;
    }
    if (is_error(reply, "PasscodeNotAllowed")) {
        const char *reason = json_get_string(p, "reason");
        char text[MAX_MESSAGE_LENGTH];
        pam_syslog(l->pamh, LOG_NOTICE, "Passcode refused by kioskauthd: %s",
                   reason ? reason : "no reason given");
        snprintf(text, sizeof(text), "Passcode not accepted: %s.", reason ? reason : "not allowed");
        complain(l, text);
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "NoPasscode")) {
        complain(l, "No passcode is set for you.");
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "Busy")) {
        /* Not checked and not counted: the person may simply type it again. */
        complain(l, "The terminal is busy. Please try again.");
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    if (is_error(reply, "PersonNotActive")) {
        complain(l, not_active_message(json_get_string(p, "state")));
        return PAM_AUTH_ERR;
    }
    return unexpected(l, "VerifyPasscode", reply).ret;
}

static void passcode_request(struct buffer *request, const struct login *l, const char *name,
                             const char *passcode) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.VerifyPasscode\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"context\":");
    json_context(request, l);
    buffer_puts(request, "}}");
}

/* Asks for a secret of at most max_length bytes; returns PAM_SUCCESS with *answer set,
 * PAM_CONV_ERR (not logged: the application reports its own conversation failures), or
 * PAM_AUTH_ERR for an empty or over-long answer, which is not sent as an attempt. */
static int ask_secret_within(const struct login *l, const char *prompt, size_t max_length,
                             char **answer) {
    *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_OFF, answer, "%s", prompt);
    if (r != PAM_SUCCESS || !*answer) {
        erase_and_free(*answer);
        *answer = NULL;
        return PAM_CONV_ERR;
    }
    if (!**answer || strlen(*answer) > max_length) {
        erase_and_free(*answer);
        *answer = NULL;
        return PAM_AUTH_ERR;
    }
    return PAM_SUCCESS;
}

/* A passcode, or a secret as short (an activation step's). */
static int ask_secret(const struct login *l, const char *prompt, char **answer) {
    return ask_secret_within(l, prompt, MAX_PASSCODE_LENGTH, answer);
}

static int get_person(const struct login *l, const char *name, struct reply *reply);
static int account_status(const struct login *l, const char *name, struct reply *reply);
static int activate_pending(const struct login *l, const char *name);
static int sign_in_online(const struct login *l, const char *email, const char *expected);
static int sign_in_again(const struct login *l, const char *name, const char *intro);
static int first_login(const struct login *l, const char *name, bool given);

/* The person's record, to check before asking anything: GetPerson as root (an admin), else
 * CheckAccount, which authenticators such as a kiosk app may call (GetPerson would be refused,
 * and audited as refused, every time). Negative when the daemon cannot be asked. */
static int look_up(const struct login *l, const char *name, struct reply *reply) {
    if (geteuid() == 0)
        return get_person(l, name, reply);
    return account_status(l, name, reply);
}

/* Seconds from now until an RFC 3339 UTC time as the daemon writes it ("2026-01-02T03:04:05Z"),
 * or -1 when it cannot be read. Only for telling the person how long to wait. */
static long long seconds_until(const char *timestamp) {
    struct tm tm = {0};
    char zone = 0;
    if (sscanf(timestamp, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &zone) != 7 ||
        zone != 'Z')
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t until = timegm(&tm);
    time_t now = time(NULL);
    if (until == (time_t)-1)
        return -1;
    return until > now ? (long long)(until - now) : 1;
}

static bool is_identity_provider_person(const struct json *person) {
    const char *origin = json_get_string(person, "origin");
    return origin && strcmp(origin, "idp") == 0;
}

/* Before asking for a passcode, asks the daemon whether one could be accepted at all, so that
 * nobody types a passcode that is refused unread: locked, none set, not active, unknown. Returns
 * NEXT_PASSCODE to go on and ask; NEXT_ACTIVATE for a person who has not activated yet;
 * NEXT_ONLINE for an identity-provider person without a passcode, or whose passcode is
 * hard-locked (which an online login lifts); NEXT_FIRST_LOGIN for a name the daemon does not
 * know; NEXT_NONE with the PAM code otherwise. A caller that may not read the person just asks.
 * (The person's email address is not taken from this record: only CheckOnlineLogin gives it, to
 * a context that may sign them in.) */
static struct step passcode_precheck(const struct login *l, const char *name) {
    _cleanup_reply_ struct reply reply = {0};
    if (look_up(l, name, &reply) < 0)
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
    if (is_error(&reply, "NoSuchPerson"))
        return (struct step){PAM_USER_UNKNOWN, NEXT_FIRST_LOGIN};
    if (reply.error)
        return (struct step){PAM_SUCCESS, NEXT_PASSCODE};
    const struct json *p = json_get(reply.parameters, "person");
    const char *state = json_get_string(p, "state");
    const char *locked_until = json_get_string(p, "passcodeLockedUntil");
    bool online = is_identity_provider_person(p);
    if (is_pending(state))
        return (struct step){PAM_AUTH_ERR, NEXT_ACTIVATE};
    /* An identity-provider person whose local unlock is suspended until they sign in online (the
     * provider refused their token): the online login is what lifts it, not a dead end. */
    if (online && json_get_string(p, "suspendedReason")) {
        if (l->remote)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        complain(l, MESSAGE_SIGN_IN_ONLINE);
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, ""};
    }
    if (!state || strcmp(state, "active") != 0) {
        complain(l, not_active_message(state));
        return (struct step){PAM_AUTH_ERR, NEXT_NONE};
    }
    if (!json_get_bool(p, "hasPasscode")) {
        /* (No online login over a remote session: see sign_in_online.) */
        if (online && l->remote)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (online)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE, "", true};
        complain(l, "No passcode is set for you.");
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
    }
    if (json_get_bool(p, "passcodeHardLocked")) {
        complain(l, MESSAGE_HARD_LOCKED);
        return (struct step){PAM_MAXTRIES, online ? NEXT_ONLINE : NEXT_NONE};
    }
    if (locked_until) {
        long long seconds = seconds_until(locked_until);
        if (seconds > 0)
            say_wait(l, "Too many wrong passcodes.", seconds);
        else
            complain(l, "Too many wrong passcodes. Try again later.");
        return (struct step){PAM_MAXTRIES, NEXT_NONE};
    }
    return (struct step){PAM_SUCCESS, NEXT_PASSCODE};
}

/* The passcode, or what the precheck says comes instead. `given`: whether the application named
 * the person (see first_login). */
static int verify_passcode(const struct login *l, const char *name, bool given) {
    struct step s = passcode_precheck(l, name);
    switch (s.next) {
    case NEXT_PASSCODE:
        break;
    case NEXT_ACTIVATE:
        return activate_pending(l, name);
    case NEXT_ONLINE:
        return sign_in_again(l, name, s.say_sign_in ? MESSAGE_SIGN_IN : NULL);
    case NEXT_FIRST_LOGIN:
        return first_login(l, name, given);
    default:
        return s.ret;
    }
    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        int r = ask_secret(l, PROMPT_PASSCODE, &passcode);
        if (r != PAM_SUCCESS)
            return r;
        _cleanup_buffer_ struct buffer request = {0};
        passcode_request(&request, l, name, passcode);
        _cleanup_connection_ struct connection c = CONNECTION_INIT;
        _cleanup_reply_ struct reply reply = {0};
        if (connection_open(l, &c) < 0 || exchange(l, &c, &request, &reply) < 0)
            return PAM_AUTHINFO_UNAVAIL;
        if (!reply.error) {
            const char *matched = reply_person_name(&reply);
            if (!matched || strcmp(matched, name) != 0)
                return unexpected(l, "VerifyPasscode", &(struct reply){.error = "malformed reply"})
                    .ret;
            note_person(l, json_get(reply.parameters, "person"));
            keep_for_session(l, &c, json_get_string(reply.parameters, "ticket"), name);
            log_debug(l, "Passcode verified for %s", name);
            return PAM_SUCCESS;
        }
        if (must_sign_in_online(&reply)) {
            sign_in_required(l, &reply);
            return sign_in_again(l, name, NULL);
        }
        bool retry;
        r = passcode_refused(l, &reply, &retry);
        if (!retry)
            return r;
    }
    return PAM_MAXTRIES;
}

/* Asks for the name (after walk-up identify gave up, or when a mode needs one) and makes it
 * PAM_USER; *name then points at PAM's copy. */
static int ask_name(const struct login *l, const char **name) {
    _cleanup_free_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_NAME);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    /* The daemon lowercases names; PAM_USER must be the name it will answer for. */
    for (char *p = answer; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    if (!*answer)
        return PAM_AUTH_ERR;
    if (!login_name_is_valid(answer))
        return PAM_USER_UNKNOWN;
    r = pam_set_item(l->pamh, PAM_USER, answer);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    *name = string_item(l->pamh, PAM_USER);
    return *name ? PAM_SUCCESS : PAM_SERVICE_ERR;
}

/* First use: one-time activation of a person an admin provisioned. In one conversation the
 * person enters their activation code, chooses a passcode, may enrol a finger, and is logged in.
 * Everything runs on one connection because the daemon binds its tickets to the connection; if
 * the daemon closes it while the person is typing (its idle timeout, the ticket's lifetime), a
 * fresh ticket is fetched with what the person already typed, so nobody is asked twice. */

struct activation {
    struct connection c;
    char *code;   /* as typed, until the passcode is set: CheckActivationCode again for a ticket */
    char *ticket; /* for CompleteActivation, then for EnrollFinger */
    char *passcode; /* the new passcode, until enrolment: VerifyPasscode again for a ticket */
    char name[MAX_NAME_LENGTH + 1];
    char display_name[MAX_DISPLAY_NAME_LENGTH + 1];
    char *welcome;
    char *role_description;
    bool offer_fingerprint;
    /* When the authentication's ticket expires (now_msec(), CLOCK_MONOTONIC; 0: not known). An
     * offer answered later is not acted on: whoever answers may not be who authenticated. */
    uint64_t ticket_deadline;
};
#define ACTIVATION_INIT                                                                            \
    { .c = CONNECTION_INIT }

/* Records when the ticket of `reply` expires, from its ticketExpiresIn. */
static void note_ticket_lifetime(struct activation *a, const struct json *parameters) {
    long long seconds = 0;
    if (json_get_integer(parameters, "ticketExpiresIn", &seconds) && seconds >= 0 &&
        seconds <= 24 * 3600)
        a->ticket_deadline = now_msec() + (uint64_t)seconds * 1000;
    else
        a->ticket_deadline = now_msec();
}

static void activation_clear(struct activation *a) {
    connection_close(&a->c);
    erase_and_free(a->code);
    erase_and_free(a->ticket);
    erase_and_free(a->passcode);
    free(a->welcome);
    free(a->role_description);
    *a = (struct activation)ACTIVATION_INIT;
}
#define _cleanup_activation_ __attribute__((cleanup(activation_clear)))

static bool replace_string(char **slot, const char *value) {
    erase_and_free(*slot);
    *slot = value ? strdup(value) : NULL;
    return *slot != NULL;
}

/* Checks a->code on a fresh connection; on success a->ticket and a->name are set. `name` is the
 * person the code must belong to, when known. Shows the daemon's own message for each refusal;
 * *retry says whether another code may be tried. */
static int check_code(const struct login *l, struct activation *a, const char *name, bool *retry) {
    *retry = false;
    connection_close(&a->c);
    if (connection_open(l, &a->c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request,
                "{\"method\":\"io.kioskauth.CheckActivationCode\",\"parameters\":{\"code\":");
    json_string(&request, a->code);
    if (name) {
        buffer_puts(&request, ",\"name\":");
        json_string(&request, name);
    }
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, &a->c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;

    const struct json *p = reply.parameters;
    if (!reply.error) {
        const char *person = reply_person_name(&reply);
        const char *ticket = json_get_string(p, "ticket");
        if (!person || !ticket || (name && strcmp(person, name) != 0))
            return unexpected(l, "CheckActivationCode", &(struct reply){.error = "malformed reply"})
                .ret;
        memcpy(a->name, person, strlen(person) + 1);
        const char *display_name = json_get_string(json_get(p, "person"), "displayName");
        clean_display_name(display_name && *display_name ? display_name : person, a->display_name,
                           sizeof(a->display_name));
        if (!replace_string(&a->ticket, ticket))
            return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
        return PAM_SUCCESS;
    }
    const char *message = json_get_string(p, "message");
    if (is_error(&reply, "ActivationCodeWrong") || is_error(&reply, "ActivationCodeExpired") ||
        is_error(&reply, "ActivationCodeUsed") || is_error(&reply, "ActivationCodeRevoked")) {
        complain(l, message ? message : MESSAGE_CODE_WRONG);
        *retry = true;
        return PAM_AUTH_ERR;
    }
    if (is_error(&reply, "ActivationPaused")) {
        complain(l, message ? message : "Too many wrong codes on this terminal. Try again later.");
        return PAM_MAXTRIES;
    }
    if (is_error(&reply, "AlreadyActive")) {
        complain(l, MESSAGE_ALREADY_ACTIVE);
        return PAM_AUTH_ERR;
    }
    if (is_error(&reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    if (is_error(&reply, "PermissionDenied")) {
        const char *reason = json_get_string(p, "reason");
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Activation refused by kioskauthd: %s",
                       reason ? reason : "no reason given");
    }
    return unexpected(l, "CheckActivationCode", &reply).ret;
}

/* Asks for the activation code (first_code: already typed at the offer) until the daemon takes
 * one, at most max_tries times. */
static int enter_code(const struct login *l, struct activation *a, const char *name,
                      const char *first_code) {
    for (unsigned attempt = 1;; attempt++) {
        if (attempt == 1 && first_code) {
            if (!replace_string(&a->code, first_code))
                return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
        } else {
            erase_and_free(a->code);
            a->code = NULL;
            int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &a->code, "%s", PROMPT_ACTIVATION_CODE);
            if (r != PAM_SUCCESS || !a->code)
                return PAM_CONV_ERR;
        }
        if (!a->code[0])
            return PAM_AUTH_ERR;
        bool retry = true;
        int r = PAM_AUTH_ERR;
        if (strlen(a->code) > MAX_CODE_LENGTH)
            complain(l, MESSAGE_CODE_WRONG);
        else
            r = check_code(l, a, name, &retry);
        if (r == PAM_SUCCESS || !retry)
            return r;
        if (attempt >= l->options.max_tries)
            return PAM_MAXTRIES;
    }
}

static void complete_request(struct buffer *request, const char *ticket, const char *passcode,
                             const char *confirmation) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.CompleteActivation\",\"parameters\":{"
                         "\"ticket\":");
    json_string(request, ticket);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"confirmation\":");
    json_string(request, confirmation);
    buffer_puts(request, "}}");
}

/* Whether a call failed because the connection or its ticket went away while the person typed:
 * then a fresh ticket is fetched and the call made once more. */
static bool connection_lost(int r, const struct reply *reply) {
    return r < 0 || is_error(reply, "TicketInvalid") || is_error(reply, "IdleTimeout");
}

/* The person chooses a passcode (twice); a weak one is refused with the daemon's reason and
 * asked for again. On success the person is active and the code used up. */
static int choose_passcode(const struct login *l, struct activation *a) {
    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        _cleanup_erase_ char *confirmation = NULL;
        int r = ask_secret(l, PROMPT_CHOOSE_PASSCODE, &passcode);
        if (r == PAM_SUCCESS)
            r = ask_secret(l, PROMPT_CONFIRM_PASSCODE, &confirmation);
        if (r != PAM_SUCCESS)
            return r;

        _cleanup_reply_ struct reply reply = {0};
        for (bool again = true;; again = false) {
            _cleanup_buffer_ struct buffer request = {0};
            complete_request(&request, a->ticket, passcode, confirmation);
            r = exchange(l, &a->c, &request, &reply);
            if (!again || !connection_lost(r, &reply))
                break;
            log_debug(l, "Activation ticket lost; checking the code again");
            bool retry;
            r = check_code(l, a, a->name, &retry);
            if (r != PAM_SUCCESS)
                return r;
        }
        if (r < 0)
            return PAM_AUTHINFO_UNAVAIL;
        const struct json *p = reply.parameters;
        if (!reply.error) {
            const char *person = reply_person_name(&reply);
            const char *ticket = json_get_string(p, "ticket");
            if (!person || strcmp(person, a->name) != 0)
                return unexpected(l, "CompleteActivation",
                                  &(struct reply){.error = "malformed reply"})
                    .ret;
            note_person(l, json_get(p, "person"));
            a->offer_fingerprint = json_get_bool(p, "offerFingerprint") && ticket;
            /* Out of memory here costs a message or the enrolment, not the login. */
            (void)replace_string(&a->welcome, json_get_string(p, "welcome"));
            (void)replace_string(&a->role_description, json_get_string(p, "roleDescription"));
            (void)replace_string(&a->ticket, ticket);
            note_ticket_lifetime(a, p);
            /* Kept until enrolment, for a fresh ticket; the code is spent. */
            a->passcode = passcode;
            passcode = NULL;
            erase_and_free(a->code);
            a->code = NULL;
            log_debug(l, "Activated %s", a->name);
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "WeakPasscode")) {
            const char *message = json_get_string(p, "message");
            complain(l, message ? message : "That passcode is too easy to guess.");
            continue;
        }
        if (is_error(&reply, "ActivationCodeRevoked") || is_error(&reply, "ActivationCodeUsed") ||
            is_error(&reply, "ActivationCodeExpired")) {
            const char *message = json_get_string(p, "message");
            complain(l, message ? message : MESSAGE_CODE_WRONG);
            return PAM_AUTH_ERR;
        }
        if (is_error(&reply, "TicketInvalid")) {
            complain(l, "Activation could not be finished. Please start again.");
            return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "CompleteActivation: ticket refused");
        }
        return unexpected(l, "CompleteActivation", &reply).ret;
    }
    return PAM_MAXTRIES;
}

/* A fresh self-service ticket on a fresh connection, from the passcode just chosen (only while
 * the first ticket would still be valid: offer_enrolment checks). After an online login there is
 * no passcode to ask with, and the enrolment is not made without a ticket, even as root: it must
 * stay bound to the authentication that offered it. */
static int fresh_ticket(const struct login *l, struct activation *a) {
    connection_close(&a->c);
    if (!a->passcode)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                       "No fresh ticket for enrolment after an online login");
    if (connection_open(l, &a->c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    passcode_request(&request, l, a->name, a->passcode);
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, &a->c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (reply.error)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "No fresh ticket for enrolment: %s",
                       reply.error);
    if (!replace_string(&a->ticket, json_get_string(reply.parameters, "ticket")))
        return PAM_AUTH_ERR;
    return PAM_SUCCESS;
}

static bool is_yes(const char *answer) {
    static const char *const yes[] = {"y", "yes", "Y", "YES", "Yes"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (strcmp(answer, yes[i]) == 0)
            return true;
    return false;
}

/* Shows one enrolment progress report as the person's next step. */
static void show_enrol_progress(const struct login *l, const struct json *progress) {
    const char *state = json_get_string(progress, "state");
    const char *hint = json_get_string(progress, "hint");
    long long stage = 0, stages = 0;
    char text[MAX_MESSAGE_LENGTH];
    json_get_integer(progress, "stage", &stage);
    json_get_integer(progress, "stages", &stages);
    if (!state)
        return;
    if (strcmp(state, "duplicate-check") == 0) {
        /* Only the identify touch needs the person; a reader that cannot check says so to the
         * log, not to them. */
        if (hint && strcmp(hint, HINT_DUPLICATES_NOT_CHECKED) == 0) {
            log_debug(l, "Enrolment: %s", hint);
            return;
        }
        snprintf(text, sizeof(text), "%s…", hint ? hint : "Touch the reader");
    } else if (strcmp(state, "touch") == 0 || strcmp(state, "stage") == 0) {
        if (stages <= 0 || stage >= stages)
            return;
        snprintf(text, sizeof(text), "Touch the reader (stage %lld of %lld)…", stage + 1, stages);
    } else if (strcmp(state, "retry") == 0) {
        snprintf(text, sizeof(text), "%s. Touch the reader (stage %lld of %lld)…",
                 hint ? hint : "Try again", stage + 1, stages > 0 ? stages : stage + 1);
    } else {
        return;
    }
    if (text[0] >= 'a' && text[0] <= 'z')
        text[0] = (char)(text[0] - 'a' + 'A');
    instruct(l, text);
}

/* One EnrollFinger call on a->c, showing its progress. Returns PAM_SUCCESS when a finger was
 * enrolled; PAM_IGNORE, saying nothing, when the call never started because the connection or
 * its ticket was gone; PAM_AUTH_ERR when enrolment did not finish (the person was told why, or
 * ended it with a signal). */
static int enrol_once(const struct login *l, struct activation *a) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.EnrollFinger\",\"more\":true,"
                          "\"parameters\":{\"name\":");
    json_string(&request, a->name);
    if (a->ticket) {
        buffer_puts(&request, ",\"ticket\":");
        json_string(&request, a->ticket);
    }
    buffer_puts(&request, "}}");
    if (request.failed)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");

    /* Each touch gets the whole timeout=, as a scan does. */
    uint64_t deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
    int r = a->c.fd < 0 ? -ENOTCONN : connection_send(&a->c, &request, deadline);
    bool started = false;
    for (;;) {
        _cleanup_reply_ struct reply reply = {0};
        if (r >= 0)
            r = connection_receive(&a->c, deadline, true, &reply);
        if (!started && connection_lost(r, &reply))
            return PAM_IGNORE;
        if (r == -EINTR) {
            log_debug(l, "Enrolment interrupted by a signal");
            return PAM_AUTH_ERR;
        }
        if (r == -ETIMEDOUT) {
            complain(l, "No finger was touched in time.");
            return PAM_AUTH_ERR;
        }
        if (r < 0) {
            complain(l, MESSAGE_NOT_ENROLLED);
            return log_ret(l, PAM_AUTH_ERR, LOG_WARNING, "kioskauthd did not answer: %s",
                           strerror(-r));
        }
        started = true;
        if (reply.continues) {
            show_enrol_progress(l, json_get(reply.parameters, "progress"));
            deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
            continue;
        }
        if (!reply.error) {
            /* The enrolment used the ticket up and hands its authentication on in a new one
             * (no fresher), which is what the session hand-over needs. A reply without one
             * leaves the ticket as it was. */
            const char *next = json_get_string(reply.parameters, "ticket");
            if (next)
                (void)replace_string(&a->ticket, next);
            inform(l, MESSAGE_ENROLLED);
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "FingerAlreadyEnrolled"))
            complain(l, "That finger is already enrolled.");
        else if (is_error(&reply, "ScanTimeout"))
            complain(l, "No finger was touched in time.");
        else if (is_error(&reply, "ScanRetry") || is_error(&reply, "ReaderUnavailable") ||
                 is_error(&reply, "ReaderRemoved") || is_error(&reply, "NoReader") ||
                 is_error(&reply, "ReaderFull") || is_error(&reply, "ScanCancelled"))
            complain(l, MESSAGE_NOT_ENROLLED);
        else {
            complain(l, MESSAGE_NOT_ENROLLED);
            unexpected(l, "EnrollFinger", &reply);
        }
        log_debug(l, "EnrollFinger: %s", reply.error);
        return PAM_AUTH_ERR;
    }
}

/* Remembers a declined offer, so it is not made again until someone turns it back on
 * (kioskauthctl user set NAME --biometric-offer on). If the connection or its ticket went while
 * the person read the offer, it is asked again on a fresh connection without a ticket, which only
 * an administrator (root) may do. Best effort: the login goes on anyway. */
static void remember_decline(const struct login *l, struct activation *a) {
    for (bool again = true;; again = false) {
        _cleanup_buffer_ struct buffer request = {0};
        buffer_puts(&request,
                    "{\"method\":\"io.kioskauth.SetBiometricOffer\",\"parameters\":{\"name\":");
        json_string(&request, a->name);
        buffer_puts(&request, ",\"enabled\":false");
        if (a->ticket) {
            buffer_puts(&request, ",\"ticket\":");
            json_string(&request, a->ticket);
        }
        buffer_puts(&request, "}}");
        _cleanup_reply_ struct reply reply = {0};
        int r = a->c.fd < 0 ? -ENOTCONN : exchange(l, &a->c, &request, &reply);
        if (r >= 0 && !reply.error)
            return;
        if (!again || !connection_lost(r, &reply)) {
            log_debug(l, "Could not remember the declined offer: %s",
                      r < 0 ? strerror(-r) : reply.error);
            return;
        }
        erase_and_free(a->ticket);
        a->ticket = NULL;
        connection_close(&a->c);
        if (connection_open(l, &a->c) < 0)
            return;
    }
}

/* Offers fingerprint login and enrols a finger if the person wants it. Declining, or an
 * enrolment that does not finish, still logs the person in: they are active already. */
static int offer_enrolment(const struct login *l, struct activation *a) {
    _cleanup_free_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_ENABLE_FINGERPRINT);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    if (!is_yes(answer)) {
        log_debug(l, "Fingerprint enrolment declined by %s", a->name);
        remember_decline(l, a);
        inform(l, MESSAGE_ENROL_LATER);
        return PAM_SUCCESS;
    }
    /* Answered after the authentication's ticket expired (an abandoned screen): whoever answers
     * now may be someone else, so nothing is enrolled, and nothing is renewed silently. */
    if (a->ticket_deadline && now_msec() >= a->ticket_deadline) {
        pam_syslog(l->pamh, LOG_NOTICE, "Enrolment offer for %s answered too late; not enrolling",
                   a->name);
        inform(l, MESSAGE_ENROL_LATER);
        return PAM_SUCCESS;
    }
    r = enrol_once(l, a);
    if (r == PAM_IGNORE) {
        log_debug(l, "Enrolment ticket lost; asking for a fresh one");
        r = fresh_ticket(l, a);
        if (r == PAM_SUCCESS)
            r = enrol_once(l, a);
        else
            complain(l, MESSAGE_NOT_ENROLLED);
        if (r == PAM_IGNORE)
            complain(l, MESSAGE_NOT_ENROLLED);
    }
    if (r != PAM_SUCCESS)
        inform(l, MESSAGE_ENROL_LATER);
    return PAM_SUCCESS;
}

/* The whole first use. `name`: the person, when known (the code must then be theirs);
 * `first_code`: a code already typed at the offer, or NULL to ask. On success PAM_USER is the
 * person. */
static int activate(const struct login *l, const char *name, const char *first_code) {
    /* The daemon refuses activation over remote sessions; nobody is asked for a code there. */
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "No activation over a remote session");
    _cleanup_activation_ struct activation a = ACTIVATION_INIT;
    int r = enter_code(l, &a, name, first_code);
    if (r != PAM_SUCCESS)
        return r;
    char hello[MAX_MESSAGE_LENGTH];
    snprintf(hello, sizeof(hello), "Code accepted. Hello, %s.", a.display_name);
    inform(l, hello);
    r = choose_passcode(l, &a);
    if (r != PAM_SUCCESS)
        return r;
    if (a.offer_fingerprint) {
        r = offer_enrolment(l, &a);
        if (r != PAM_SUCCESS)
            return r;
    }
    if (a.welcome && *a.welcome)
        inform(l, a.welcome);
    if (a.role_description && *a.role_description)
        inform(l, a.role_description);
    r = pam_set_item(l->pamh, PAM_USER, a.name);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    keep_for_session(l, &a.c, a.ticket, a.name);
    return PAM_SUCCESS;
}

/* A person found by name who has not activated yet. */
static int activate_pending(const struct login *l, const char *name) {
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "No activation over a remote session");
    inform(l, MESSAGE_NOT_SET_UP);
    return activate(l, name, NULL);
}

/* With the activation option and nobody known yet: the code first, Enter for the name.
 * PAM_IGNORE when skipped. */
static int offer_activation(const struct login *l) {
    if (l->remote)
        return PAM_IGNORE;
    _cleanup_erase_ char *answer = NULL;
    int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &answer, "%s", PROMPT_ACTIVATION_OFFER);
    if (r != PAM_SUCCESS || !answer)
        return PAM_CONV_ERR;
    if (!answer[0])
        return PAM_IGNORE;
    return activate(l, NULL, answer);
}

/* Online login with the identity provider (docs/design.md, §2.3): a person's first login at this
 * terminal, the fallback of an identity-provider person without a passcode, and the way back in
 * when their offline window has ended. The daemon talks to the provider (LoginWithPassword, or
 * StartDeviceLogin with idp_login=device) and answers with the person, created at their first
 * login, a ticket bound to this connection, and whether to offer fingerprint enrolment; the
 * offer, the enrolment and a decline (SetBiometricOffer) use that ticket on the same connection,
 * in the same conversation, as activation does. The password is wiped as soon as it is sent. */

/* Whether a name could be an email address: something@domain.tld, one '@'. */
static bool looks_like_email(const char *name) {
    const char *at = strchr(name, '@');
    return at && at != name && !strchr(at + 1, '@') && strchr(at + 1, '.') &&
           at[strlen(at) - 1] != '.' && at[1] != '.';
}

/* The provider cannot be reached: what still works, said plainly. */
static const char *idp_unavailable_message(const struct login *l) {
    return l->person && l->person->online_only ? MESSAGE_IDP_UNAVAILABLE_ONLINE_ONLY
                                               : MESSAGE_IDP_UNAVAILABLE;
}

/* What the person is told when the daemon did not log them in, and the PAM code. */
static int online_login_refused(const struct login *l, const struct reply *reply) {
    const char *reason = json_get_string(reply->parameters, "reason");
    const char *field = json_get_string(reply->parameters, "field");
    if (!reason)
        reason = "no reason given";
    if (is_error(reply, "WrongCredentials")) {
        complain(l, MESSAGE_WRONG_CREDENTIALS);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "NotAdmitted") || is_error(reply, "UnknownRole")) {
        complain(l, is_error(reply, "NotAdmitted") ? MESSAGE_NOT_ADMITTED : MESSAGE_UNKNOWN_ROLE);
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "Online login refused: %s: %s", reply->error,
                       reason);
    }
    if (is_error(reply, "DeviceLoginDenied")) {
        complain(l, MESSAGE_DEVICE_DENIED);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "DeviceLoginExpired")) {
        complain(l, MESSAGE_DEVICE_EXPIRED);
        return PAM_AUTHINFO_UNAVAIL;
    }
    if (is_error(reply, "InvalidInput")) {
        complain(l, field && strcmp(field, "email") == 0 ? MESSAGE_NOT_AN_EMAIL
                                                         : MESSAGE_WRONG_CREDENTIALS);
        return PAM_AUTH_ERR;
    }
    if (is_error(reply, "IdentityProviderUnavailable")) {
        complain(l, idp_unavailable_message(l));
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_WARNING,
                       "The identity provider is unavailable: %s", reason);
    }
    if (is_error(reply, "IdentityProviderRefused") ||
        is_error(reply, "IdentityProviderNotConfigured")) {
        complain(l, MESSAGE_IDP_BROKEN);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_ERR, "Online login failed: %s: %s",
                       reply->error, reason);
    }
    if (is_error(reply, "OnlineLoginPaused")) {
        long long seconds = 0;
        if (json_get_integer(reply->parameters, "retryAfterSeconds", &seconds) && seconds > 0)
            say_wait(l, MESSAGE_LOGIN_PAUSED, seconds);
        else
            complain(l, MESSAGE_LOGIN_PAUSED " Try again later.");
        return PAM_MAXTRIES;
    }
    if (is_error(reply, "OnlineLoginNotAllowed")) {
        complain(l, MESSAGE_ONLINE_NOT_HERE);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s", reason);
    }
    if (is_error(reply, "PermissionDenied"))
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s", reason);
    return unexpected(l, "Online login", reply).ret;
}

/* LoginWithPassword on `c`: asks for the email address (unless known) and the password. Returns
 * PAM_SUCCESS with the daemon's final reply in `reply`, or the PAM code to return. */
static int password_login(const struct login *l, struct connection *c, const char *email,
                          struct reply *reply) {
    _cleanup_free_ char *typed = NULL;
    char prompt[MAX_MESSAGE_LENGTH];
    if (email) {
        char clean[MAX_EMAIL_LENGTH + 1];
        sanitise(email, clean, sizeof(clean));
        snprintf(prompt, sizeof(prompt), "Password for %s: ", clean);
    } else {
        int r = pam_prompt(l->pamh, PAM_PROMPT_ECHO_ON, &typed, "%s", PROMPT_EMAIL);
        if (r != PAM_SUCCESS || !typed)
            return PAM_CONV_ERR;
        if (!typed[0])
            return PAM_AUTH_ERR;
        if (strlen(typed) > MAX_EMAIL_LENGTH || !strchr(typed, '@')) {
            complain(l, MESSAGE_NOT_AN_EMAIL);
            return PAM_AUTH_ERR;
        }
        email = typed;
        snprintf(prompt, sizeof(prompt), "%s", PROMPT_PASSWORD);
    }
    _cleanup_erase_ char *password = NULL;
    int r = ask_secret_within(l, prompt, MAX_PASSWORD_LENGTH, &password);
    if (r != PAM_SUCCESS)
        return r;
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request,
                "{\"method\":\"io.kioskauth.LoginWithPassword\",\"parameters\":{\"email\":");
    json_string(&request, email);
    buffer_puts(&request, ",\"password\":");
    json_string(&request, password);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    /* Interruptible: Ctrl-C while the provider is slow ends the wait, and closing the connection
     * cancels the call in the daemon. */
    r = exchange_within(l, c, &request, reply, ONLINE_LOGIN_TIMEOUT_MSEC, true);
    if (r == -EINTR) {
        log_debug(l, "Online login interrupted by a signal");
        return PAM_AUTH_ERR;
    }
    if (r < 0) {
        complain(l, idp_unavailable_message(l));
        return PAM_AUTHINFO_UNAVAIL;
    }
    return PAM_SUCCESS;
}

/* StartDeviceLogin on `c` (RFC 8628, for providers that refuse the password grant): shows the
 * code and where to type it, then waits while the person signs in on their phone, as long as
 * the code is valid (at most MAX_DEVICE_LOGIN_SEC); a signal (Ctrl-C) ends the wait, and closing
 * the connection ends the daemon's polling. Returns as password_login does. */
static int device_login(const struct login *l, struct connection *c, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.StartDeviceLogin\",\"more\":true,"
                          "\"parameters\":{\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    if (request.failed)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
    uint64_t deadline = now_msec() + ONLINE_LOGIN_TIMEOUT_MSEC;
    int r = connection_send(c, &request, deadline);
    for (;;) {
        if (r >= 0)
            r = connection_receive(c, deadline, true, reply);
        if (r == -EINTR) {
            log_debug(l, "Device login interrupted by a signal");
            return PAM_AUTH_ERR;
        }
        if (r == -ETIMEDOUT) {
            complain(l, MESSAGE_DEVICE_EXPIRED);
            return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Device login: no answer in time");
        }
        if (r < 0) {
            complain(l, idp_unavailable_message(l));
            return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_WARNING, "kioskauthd did not answer: %s",
                           strerror(-r));
        }
        if (!reply->continues)
            return PAM_SUCCESS;
        const struct json *prompt = json_get(reply->parameters, "prompt");
        const char *code = json_get_string(prompt, "userCode");
        const char *uri = json_get_string(prompt, "verificationUri");
        long long seconds = 0;
        if (!code || !uri)
            continue;
        if (!json_get_integer(prompt, "expiresIn", &seconds) || seconds <= 0 ||
            seconds > MAX_DEVICE_LOGIN_SEC)
            seconds = MAX_DEVICE_LOGIN_SEC;
        char text[MAX_MESSAGE_LENGTH];
        long long minutes = (seconds + 59) / 60;
        snprintf(text, sizeof(text),
                 "To sign in, open %s on your phone and enter the code %s within %lld minute%s.",
                 uri, code, minutes, minutes == 1 ? "" : "s");
        instruct(l, text);
        deadline = now_msec() + (uint64_t)seconds * 1000 + DEVICE_LOGIN_GRACE_MSEC;
    }
}

/* The online login itself. `email`: the address to sign in with, or NULL to ask for it.
 * `expected`: the person who must be signed in (the one PAM_USER names), or NULL for a first
 * login whose name the module asked for itself: then the daemon's name for the person becomes
 * PAM_USER. On success PAM_USER is the person, and the connection and ticket are kept for the
 * session. */
static int sign_in_online(const struct login *l, const char *email, const char *expected) {
    /* No online login over a remote session: nobody there can enrol a finger, and the terminal
     * must not become a way to try an organisation's passwords from afar. */
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "No online login over a remote session");
    _cleanup_activation_ struct activation a = ACTIVATION_INIT;
    if (connection_open(l, &a.c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_reply_ struct reply reply = {0};
    int r = l->options.device_login ? device_login(l, &a.c, &reply)
                                    : password_login(l, &a.c, email, &reply);
    if (r != PAM_SUCCESS)
        return r;
    if (reply.error)
        return online_login_refused(l, &reply);

    const struct json *p = reply.parameters;
    const struct json *person = json_get(p, "person");
    const char *name = reply_person_name(&reply);
    if (!name)
        return unexpected(l, "Online login", &(struct reply){.error = "malformed reply"}).ret;
    if (expected && strcmp(name, expected) != 0) {
        complain(l, MESSAGE_OTHER_PERSON);
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE, "Online login as %s, not %s; refusing", name,
                       expected);
    }
    memcpy(a.name, name, strlen(name) + 1);
    const char *display_name = json_get_string(person, "displayName");
    clean_display_name(display_name && *display_name ? display_name : name, a.display_name,
                       sizeof(a.display_name));
    note_person(l, person);
    /* Out of memory here costs the enrolment offer, not the login. */
    (void)replace_string(&a.ticket, json_get_string(p, "ticket"));
    note_ticket_lifetime(&a, p);
    char welcome[MAX_MESSAGE_LENGTH];
    if (json_get_bool(p, "created"))
        snprintf(welcome, sizeof(welcome), "Welcome, %s", a.display_name);
    else
        snprintf(welcome, sizeof(welcome), "Welcome back, %s", a.display_name);
    inform(l, welcome);
    log_debug(l, "Online login of %s%s", name, json_get_bool(p, "created") ? " (created)" : "");
    if (json_get_bool(p, "offerFingerprint") && a.ticket) {
        r = offer_enrolment(l, &a);
        if (r != PAM_SUCCESS)
            return r;
    }
    r = pam_set_item(l->pamh, PAM_USER, a.name);
    if (r != PAM_SUCCESS)
        return log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s", pam_strerror(l->pamh, r));
    keep_for_session(l, &a.c, a.ticket, a.name);
    return PAM_SUCCESS;
}

/* Asks the daemon whether an online login for `name` may happen in this context (the service,
 * the invoking user, a remote session, the terminal's throttle), without contacting the
 * provider; on PAM_SUCCESS `email` holds the address recorded for the person (empty when none).
 * Nothing about the person is shown before the daemon allows it. A refusal is logged, and the
 * person told in one line; a daemon without an identity provider is PAM_USER_UNKNOWN. */
static int may_sign_in_online(const struct login *l, const char *name, char *email, size_t size) {
    email[0] = '\0';
    if (l->remote)
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "No online login over a remote session");
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CheckOnlineLogin\",\"parameters\":{");
    if (name) {
        buffer_puts(&request, "\"name\":");
        json_string(&request, name);
        buffer_puts(&request, ",");
    }
    buffer_puts(&request, "\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (ask(l, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (!reply.error) {
        const char *value = json_get_string(reply.parameters, "email");
        if (value && *value && strlen(value) < size && strlen(value) <= MAX_EMAIL_LENGTH)
            memcpy(email, value, strlen(value) + 1);
        return PAM_SUCCESS;
    }
    const char *reason = json_get_string(reply.parameters, "reason");
    long long seconds = 0;
    if (is_error(&reply, "IdentityProviderNotConfigured"))
        return PAM_USER_UNKNOWN;
    if (is_error(&reply, "OnlineLoginPaused")) {
        if (json_get_integer(reply.parameters, "retryAfterSeconds", &seconds) && seconds > 0)
            say_wait(l, MESSAGE_LOGIN_PAUSED, seconds);
        else
            complain(l, MESSAGE_LOGIN_PAUSED " Try again later.");
        return log_ret(l, PAM_MAXTRIES, LOG_NOTICE, "Online login paused on this terminal");
    }
    if (is_error(&reply, "OnlineLoginNotAllowed")) {
        complain(l, MESSAGE_ONLINE_NOT_HERE);
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE,
                       "Online login refused by kioskauthd: %s",
                       reason ? reason : "no reason given");
    }
    if (is_error(&reply, "PermissionDenied"))
        return log_ret(l, PAM_AUTHINFO_UNAVAIL, LOG_NOTICE, "Online login refused: %s",
                       reason ? reason : "no reason given");
    return unexpected(l, "CheckOnlineLogin", &reply).ret;
}

/* An identity-provider person the daemon knows signs in online, with the email address their
 * record holds (asked for when the daemon gives none), once the daemon allows an online login
 * here; `intro` is shown first. */
static int sign_in_again(const struct login *l, const char *name, const char *intro) {
    char email[MAX_EMAIL_LENGTH + 1];
    int r = may_sign_in_online(l, name, email, sizeof(email));
    if (r != PAM_SUCCESS)
        return r == PAM_USER_UNKNOWN ? PAM_AUTHINFO_UNAVAIL : r;
    if (intro)
        inform(l, intro);
    return sign_in_online(l, email[0] ? email : NULL, name);
}

/* A name the daemon does not know: someone's first login at this terminal, when the name is an
 * email address, an identity provider is configured and the daemon allows an online login here
 * (CheckOnlineLogin); otherwise nobody the daemon manages, and the next module decides. `given`:
 * whether the application named the person; then the login must be theirs, or PAM_USER would change
 * under it; a name the module asked for itself is replaced by the daemon's. */
static int first_login(const struct login *l, const char *name, bool given) {
    if (!looks_like_email(name) || l->remote)
        return PAM_USER_UNKNOWN;
    char email[MAX_EMAIL_LENGTH + 1];
    int r = may_sign_in_online(l, name, email, sizeof(email));
    if (r != PAM_SUCCESS)
        return r;
    log_debug(l, "%s is not known here yet: first online login", name);
    return sign_in_online(l, name, given ? name : NULL);
}

static int authenticate(const struct login *l) {
    enum mode mode = l->options.mode;
    const char *user = NULL;
    int r = pam_get_item(l->pamh, PAM_USER, (const void **)&user);
    if (r != PAM_SUCCESS)
        return log_ret(l, PAM_SERVICE_ERR, LOG_ERR, "Cannot read PAM_USER: %s",
                       pam_strerror(l->pamh, r));
    if (user && !*user)
        user = NULL;
    if (user && !login_name_is_valid(user)) {
        /* Not a name the daemon could manage: let the next module decide, without asking. */
        log_debug(l, "Not a kioskauth name: %s", user);
        return PAM_USER_UNKNOWN;
    }
    if (mode == MODE_ACTIVATE)
        return activate(l, user, NULL);

    bool given = user != NULL;
    bool finger_done = false;
    if (!user) {
        if (mode == MODE_AUTO || mode == MODE_IDENTIFY) {
            struct step s = identify(l);
            finger_done = s.finger_done;
            /* Recognised, but their offline window has ended: they sign in online as themselves. */
            if (s.next == NEXT_ONLINE && mode == MODE_AUTO && s.name[0])
                return sign_in_again(l, s.name, NULL);
            if (s.next != NEXT_ASK_NAME || mode == MODE_IDENTIFY)
                return s.ret;
        }
        if (l->options.activation) {
            r = offer_activation(l);
            if (r != PAM_IGNORE)
                return r;
        }
        r = ask_name(l, &user);
        if (r != PAM_SUCCESS)
            return r;
    }

    if (mode != MODE_PASSCODE && !finger_done) {
        struct step s = verify_finger(l, user);
        if (s.next == NEXT_ACTIVATE) {
            /* A finger-only conversation has no keyboard for the code. */
            if (mode == MODE_IDENTIFY) {
                complain(l, not_active_message("pending_activation"));
                return s.ret;
            }
            return activate_pending(l, user);
        }
        /* Only a conversation with a keyboard goes on to the passcode or an online login. */
        if (mode == MODE_AUTO && s.next == NEXT_ONLINE)
            return sign_in_again(l, user, NULL);
        if (mode == MODE_AUTO && s.next == NEXT_FIRST_LOGIN)
            return first_login(l, user, given);
        if (s.next != NEXT_PASSCODE || mode != MODE_AUTO)
            return s.ret;
    }
    return verify_passcode(l, user, given);
}

static void free_data(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    free(data);
}

/* Remembers in the handle that this module authenticated someone, so that account fails
 * closed. If it cannot be remembered, the authentication does not count. */
static int remember_authentication(const struct login *l) {
    const char *user = string_item(l->pamh, PAM_USER);
    char *copy = user ? strdup(user) : NULL;
    if (!copy)
        return log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
    int r = pam_set_data(l->pamh, DATA_AUTHENTICATED, copy, free_data);
    if (r != PAM_SUCCESS) {
        free(copy);
        return log_ret(l, r, LOG_ERR, "Cannot remember the authentication: %s",
                       pam_strerror(l->pamh, r));
    }
    return PAM_SUCCESS;
}

/* Whether this module authenticated someone in this handle (by its last auth). */
static bool authenticated_in(pam_handle_t *pamh) {
    const void *mark = NULL;
    return pam_get_data(pamh, DATA_AUTHENTICATED, &mark) == PAM_SUCCESS && mark;
}

/* Whether PAM_USER is someone else than the person this module's last auth authenticated. */
static bool user_changed_since_auth(pam_handle_t *pamh) {
    const void *mark = NULL;
    const char *user = string_item(pamh, PAM_USER);
    if (pam_get_data(pamh, DATA_AUTHENTICATED, &mark) != PAM_SUCCESS || !mark)
        return false;
    return !user || strcmp(user, mark) != 0;
}

/* Forgets an earlier auth's success: a new auth starts with nobody authenticated. */
static void forget_authentication(pam_handle_t *pamh) {
    const void *mark = NULL;
    if (pam_get_data(pamh, DATA_AUTHENTICATED, &mark) == PAM_SUCCESS && mark)
        (void)pam_set_data(pamh, DATA_AUTHENTICATED, NULL, NULL);
}

/* A person becomes a Unix account only by binding: when PAM_USER names a Unix account, the
 * person authenticated must be bound to exactly its uid. A PAM_USER that is no Unix account (an
 * application's own identity) is not a Unix login. The daemon refuses the same (and audits it);
 * this is the module's own check before it returns success. */
static int check_binding(const struct login *l, const struct person_info *who) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (!user)
        return log_ret(l, PAM_AUTH_ERR, LOG_ERR, "Authenticated, but PAM_USER is not set");
    const struct passwd *account = pam_modutil_getpwnam(l->pamh, user);
    if (!account)
        return PAM_SUCCESS;
    if (who && who->known && who->bound && who->uid == account->pw_uid)
        return PAM_SUCCESS;
    complain(l, MESSAGE_NOT_THIS_ACCOUNT);
    if (who && who->known && who->bound)
        return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                       "%s: the person is bound to uid %u, the account is uid %u; refusing", user,
                       (unsigned)who->uid, (unsigned)account->pw_uid);
    return log_ret(l, PAM_AUTH_ERR, LOG_NOTICE,
                   "%s: the person is bound to no Unix account; refusing", user);
}

_public_ PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc,
                                            const char **argv) {
    struct login l;
    login_init(&l, pamh, flags, argc, argv);
    log_debug(&l, "auth: service %s, tty %s, %s session", l.service ? l.service : "-",
              l.tty ? l.tty : "-", l.remote ? "remote" : "local");
    struct person_info person = {0};
    struct handover handover = HANDOVER_INIT;
    l.person = &person;
    l.handover = &handover;
    clear_person(pamh);
    forget_handover(pamh);
    forget_authentication(pamh);
    int r = authenticate(&l);
    if (r == PAM_SUCCESS)
        r = check_binding(&l, &person);
    if (r == PAM_SUCCESS)
        r = remember_authentication(&l);
    if (r == PAM_SUCCESS)
        r = export_person(&l);
    if (r == PAM_SUCCESS)
        store_handover(&l);
    handover_clear(&handover);
    log_debug(&l, "auth: %s", pam_strerror(pamh, r));
    return r;
}

_public_ PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh;
    (void)flags;
    (void)argc;
    (void)argv;
    return PAM_SUCCESS;
}

static int get_person(const struct login *l, const char *name, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.GetPerson\",\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, "}}");
    return ask(l, &request, reply);
}

/* CheckAccount: may the person log in now, and their record. */
static int account_status(const struct login *l, const char *name, struct reply *reply) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CheckAccount\",\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    return ask(l, &request, reply);
}

/* Whether the person may log in now. People the daemon does not manage are the next module's
 * business, unless this module authenticated them in this handle: then every doubt refuses. */
static int check_account(const struct login *l, bool authenticated_here) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (authenticated_here && user_changed_since_auth(l->pamh))
        return log_ret(l, PAM_PERM_DENIED, LOG_ERR, "PAM_USER changed after authentication");
    if (!user || !login_name_is_valid(user)) {
        if (authenticated_here)
            return log_ret(l, PAM_PERM_DENIED, LOG_ERR, "PAM_USER changed after authentication");
        return PAM_USER_UNKNOWN;
    }
    _cleanup_reply_ struct reply reply = {0};
    if (account_status(l, user, &reply) < 0) {
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, MESSAGE_UNAVAILABLE);
        return log_ret(l, PAM_PERM_DENIED, LOG_ERR,
                       "Cannot ask kioskauthd whether %s may log in; refusing", user);
    }
    if (!reply.error) {
        const struct json *p = reply.parameters;
        if (json_get_bool(p, "allowed")) {
            struct person_info who = {0};
            struct login copy = *l;
            copy.person = &who;
            note_person(&copy, json_get(p, "person"));
            return check_binding(l, &who) == PAM_SUCCESS ? PAM_SUCCESS : PAM_PERM_DENIED;
        }
        const char *reason = json_get_string(p, "reason");
        const char *state = json_get_string(json_get(p, "person"), "state");
        complain(l, reason ? reason : not_active_message(state));
        /* Suspended is an account an admin switched off (as an expired one is); anything else,
         * not activated yet or outside a window, is a refusal for now. */
        int r = state && strcmp(state, "suspended") == 0 ? PAM_ACCT_EXPIRED : PAM_PERM_DENIED;
        return log_ret(l, r, LOG_NOTICE, "%s may not log in: %s", user,
                       reason ? reason : (state ? state : "no reason given"));
    }
    if (is_error(&reply, "NoSuchPerson")) {
        if (!authenticated_here)
            return PAM_USER_UNKNOWN;
        complain(l, "Your account was removed from this terminal.");
        return log_ret(l, PAM_PERM_DENIED, LOG_NOTICE, "%s was removed after authenticating", user);
    }
    unexpected(l, "CheckAccount", &reply);
    if (!authenticated_here)
        return PAM_IGNORE;
    complain(l, MESSAGE_UNAVAILABLE);
    return PAM_PERM_DENIED;
}

_public_ PAM_EXTERN int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc,
                                         const char **argv) {
    struct login l;
    login_init(&l, pamh, flags, argc, argv);
    int r = check_account(&l, authenticated_in(pamh));
    log_debug(&l, "account: %s", pam_strerror(pamh, r));
    return r;
}

/* Sessions: open_session registers the session with the daemon (OpenSession with the caller's
 * context), so that its idle timeout, overnight cut-off, maximum age, locks and step-up apply;
 * close_session ends it (CloseSession). The session id is kept in the handle for close_session
 * (never taken from the environment, which the application or a user's pam_env file could set)
 * and exported as KIOSKAUTH_SESSION, so that a kiosk app can report activity, lock the session
 * and ask for step-up. After this module's auth, the session opens with the authentication's
 * ticket (see "The hand-over from auth to open_session" above). */

static bool session_id_is_valid(const char *id) {
    size_t n = strnlen(id, MAX_SESSION_ID_LENGTH + 1);
    if (n == 0 || n > MAX_SESSION_ID_LENGTH)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}

static void open_session_request(struct buffer *request, const struct login *l, const char *name,
                                 const char *ticket) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.OpenSession\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"context\":");
    json_context(request, l);
    if (ticket) {
        buffer_puts(request, ",\"ticket\":");
        json_string(request, ticket);
    }
    buffer_puts(request, "}}");
}

/* CloseSession. A session that already ended (idle, overnight, a security logout) is no error. */
static int end_session(const struct login *l, const char *id) {
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.CloseSession\",\"parameters\":{\"id\":");
    json_string(&request, id);
    buffer_puts(&request, "}}");
    _cleanup_reply_ struct reply reply = {0};
    if (ask(l, &request, &reply) < 0)
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "Cannot end session %.8s with kioskauthd", id);
    if (!reply.error || is_error(&reply, "NoSuchSession") || is_error(&reply, "SessionEnded")) {
        log_debug(l, "Session %.8s ended%s%s", id, reply.error ? " already: " : "",
                  reply.error ? reply.error : "");
        return PAM_SUCCESS;
    }
    unexpected(l, "CloseSession", &reply);
    return PAM_SESSION_ERR;
}

/* The session this module registered in this handle, or NULL. */
static const char *registered_session(pam_handle_t *pamh) {
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_SESSION, &data) != PAM_SUCCESS)
        return NULL;
    return data;
}

static void forget_session(pam_handle_t *pamh) {
    if (registered_session(pamh))
        (void)pam_set_data(pamh, DATA_SESSION, NULL, NULL);
    if (pam_getenv(pamh, ENV_SESSION))
        (void)pam_putenv(pamh, ENV_SESSION);
}

/* Keeps the id for close_session and exports it; if either fails, the session is ended at once
 * rather than left open with nobody able to end it. */
static int remember_session(const struct login *l, const char *id) {
    char *copy = strdup(id);
    int r = copy ? pam_set_data(l->pamh, DATA_SESSION, copy, free_data) : PAM_BUF_ERR;
    if (r != PAM_SUCCESS)
        free(copy);
    if (r == PAM_SUCCESS)
        r = put_variable(l, ENV_SESSION, id);
    if (r != PAM_SUCCESS) {
        (void)end_session(l, id);
        forget_session(l->pamh);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "Cannot keep session %.8s: %s", id,
                       pam_strerror(l->pamh, r));
    }
    return PAM_SUCCESS;
}

/* Why the daemon would not open the session, in one line for the person; PAM_SESSION_ERR, or
 * PAM_IGNORE for someone it does not know whom another module authenticated. */
static int session_refused(const struct login *l, const char *user, const struct reply *reply,
                           bool authenticated_here) {
    const struct json *p = reply->parameters;
    const char *message = json_get_string(p, "message");
    const char *reason = json_get_string(p, "reason");
    char text[MAX_MESSAGE_LENGTH];
    if (is_error(reply, "NoSuchPerson")) {
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, "Your account was removed from this terminal.");
    } else if (must_sign_in_online(reply)) {
        complain(l, message ? message : "Sign in online.");
    } else if (is_error(reply, "PersonNotActive")) {
        complain(l, not_active_message(json_get_string(p, "state")));
    } else if (is_error(reply, "InvalidInput") && message) {
        snprintf(text, sizeof(text), "Cannot open a session: %s.", message);
        complain(l, text);
    } else if (is_error(reply, "PermissionDenied")) {
        complain(l, MESSAGE_UNAVAILABLE);
    } else {
        complain(l, MESSAGE_UNAVAILABLE);
        unexpected(l, "OpenSession", reply);
    }
    return log_ret(l, PAM_SESSION_ERR, LOG_NOTICE, "No session for %s: %s%s%s", user, reply->error,
                   reason || message ? ": " : "", reason ? reason : (message ? message : ""));
}

static int open_session(const struct login *l, bool authenticated_here) {
    const char *user = string_item(l->pamh, PAM_USER);
    if (authenticated_here && user_changed_since_auth(l->pamh)) {
        forget_handover(l->pamh);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "PAM_USER changed after authentication");
    }
    if (!user || !login_name_is_valid(user)) {
        forget_handover(l->pamh);
        if (authenticated_here)
            return log_ret(l, PAM_SESSION_ERR, LOG_ERR, "PAM_USER changed after authentication");
        return PAM_IGNORE;
    }
    /* A second open_session on one handle replaces the first session rather than leaking it. */
    const char *earlier = registered_session(l->pamh);
    if (earlier && end_session(l, earlier) == PAM_SUCCESS)
        forget_session(l->pamh);

    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    _cleanup_erase_ char *ticket = NULL;
    _cleanup_reply_ struct reply reply = {0};
    int r = -ENOTCONN;
    take_handover(l, user, &c, &ticket);
    if (ticket) {
        /* Only when the ticketed call surely registered nothing (it could not be sent, or the
         * daemon answered that the ticket or the connection is gone) is it made again without
         * the ticket; after a call that may have reached the daemon, a second one could register
         * a second session. */
        _cleanup_buffer_ struct buffer request = {0};
        open_session_request(&request, l, user, ticket);
        uint64_t deadline = now_msec() + CALL_TIMEOUT_MSEC;
        r = request.failed ? -ENOMEM : connection_send(&c, &request, deadline);
        if (r >= 0) {
            r = connection_receive(&c, deadline, false, &reply);
            if (r < 0) {
                if (!authenticated_here)
                    return PAM_IGNORE;
                complain(l, MESSAGE_UNAVAILABLE);
                return log_ret(l, PAM_SESSION_ERR, LOG_ERR,
                               "kioskauthd did not answer OpenSession for %s: %s", user,
                               strerror(-r));
            }
            if (is_error(&reply, "TicketInvalid") || is_error(&reply, "IdleTimeout"))
                r = -ENOTCONN;
        }
        if (r < 0) {
            log_debug(l, "The authentication's ticket is gone; opening the session without it");
            reply_clear(&reply);
        }
    }
    if (r < 0) {
        _cleanup_buffer_ struct buffer request = {0};
        open_session_request(&request, l, user, NULL);
        r = ask(l, &request, &reply);
    }
    if (r < 0) {
        /* Fail closed: a person this module let in gets no session the daemon does not know. */
        if (!authenticated_here)
            return PAM_IGNORE;
        complain(l, MESSAGE_UNAVAILABLE);
        return log_ret(l, PAM_SESSION_ERR, LOG_ERR,
                       "Cannot register the session of %s with kioskauthd; refusing", user);
    }
    if (reply.error)
        return session_refused(l, user, &reply, authenticated_here);
    const struct json *session = json_get(reply.parameters, "session");
    const char *id = json_get_string(session, "id");
    if (!id || !session_id_is_valid(id)) {
        unexpected(l, "OpenSession", &(struct reply){.error = "malformed reply"});
        return PAM_SESSION_ERR;
    }
    log_debug(l, "Session %.8s opened for %s%s", id, user,
              json_get_string(session, "lastAuthenticationAt") ? ", authenticated" : "");
    return remember_session(l, id);
}

static int close_session(const struct login *l) {
    const char *registered = registered_session(l->pamh);
    if (!registered)
        return PAM_IGNORE;
    char id[MAX_SESSION_ID_LENGTH + 1];
    snprintf(id, sizeof(id), "%s", registered);
    int r = end_session(l, id);
    if (r == PAM_SUCCESS)
        forget_session(l->pamh);
    return r;
}

_public_ PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc,
                                            const char **argv) {
    struct login l;
    login_init(&l, pamh, flags, argc, argv);
    int r = open_session(&l, authenticated_in(pamh));
    log_debug(&l, "open_session: %s", pam_strerror(pamh, r));
    return r;
}

_public_ PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc,
                                             const char **argv) {
    struct login l;
    login_init(&l, pamh, flags, argc, argv);
    int r = close_session(&l);
    log_debug(&l, "close_session: %s", pam_strerror(pamh, r));
    return r;
}

/* Checks the current passcode on `c` (opened here if closed) and keeps the ticket it returns:
 * a person changes their own passcode with a ticket bound to this connection. */
static int verify_for_change(const struct login *l, struct connection *c, const char *name,
                             const char *passcode, char **ticket) {
    erase_and_free(*ticket);
    *ticket = NULL;
    connection_close(c);
    if (connection_open(l, c) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    _cleanup_buffer_ struct buffer request = {0};
    passcode_request(&request, l, name, passcode);
    _cleanup_reply_ struct reply reply = {0};
    if (exchange(l, c, &request, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (reply.error) {
        bool retry;
        int r = passcode_refused(l, &reply, &retry);
        return r == PAM_AUTH_ERR ? PAM_PERM_DENIED : r;
    }
    const char *t = json_get_string(reply.parameters, "ticket");
    if (!t)
        return unexpected(l, "VerifyPasscode", &(struct reply){.error = "no ticket"}).ret;
    *ticket = strdup(t);
    return *ticket ? PAM_SUCCESS : log_ret(l, PAM_BUF_ERR, LOG_CRIT, "Out of memory");
}

static void set_passcode_request(struct buffer *request, const char *name, const char *passcode,
                                 const char *confirmation, const char *ticket) {
    buffer_puts(request, "{\"method\":\"io.kioskauth.SetPasscode\",\"parameters\":{\"name\":");
    json_string(request, name);
    buffer_puts(request, ",\"passcode\":");
    json_string(request, passcode);
    buffer_puts(request, ",\"confirmation\":");
    json_string(request, confirmation);
    buffer_puts(request, ",\"ticket\":");
    json_string(request, ticket);
    buffer_puts(request, "}}");
}

static int change_passcode(const struct login *l, const char *name) {
    _cleanup_erase_ char *old = NULL;
    _cleanup_erase_ char *ticket = NULL;
    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    int r = ask_secret(l, PROMPT_OLD_PASSCODE, &old);
    if (r != PAM_SUCCESS)
        return r == PAM_CONV_ERR ? r : PAM_AUTHTOK_ERR;
    r = verify_for_change(l, &c, name, old, &ticket);
    if (r != PAM_SUCCESS)
        return r;

    for (unsigned attempt = 1; attempt <= l->options.max_tries; attempt++) {
        _cleanup_erase_ char *passcode = NULL;
        _cleanup_erase_ char *confirmation = NULL;
        r = ask_secret(l, PROMPT_NEW_PASSCODE, &passcode);
        if (r == PAM_SUCCESS)
            r = ask_secret(l, PROMPT_RETYPE_PASSCODE, &confirmation);
        if (r != PAM_SUCCESS)
            return r == PAM_CONV_ERR ? r : PAM_AUTHTOK_ERR;

        /* The daemon closes idle connections and a ticket is used once: while the person was
         * typing, either may have gone. Then the current passcode is checked again for a fresh
         * ticket, once. */
        _cleanup_reply_ struct reply reply = {0};
        for (bool again = true;; again = false) {
            _cleanup_buffer_ struct buffer request = {0};
            set_passcode_request(&request, name, passcode, confirmation, ticket);
            r = exchange(l, &c, &request, &reply);
            if (!again ||
                (r >= 0 && !is_error(&reply, "TicketInvalid") && !is_error(&reply, "IdleTimeout")))
                break;
            r = verify_for_change(l, &c, name, old, &ticket);
            if (r != PAM_SUCCESS)
                return r;
        }
        if (r < 0)
            return PAM_AUTHTOK_ERR;
        if (!reply.error) {
            inform(l, "Passcode changed.");
            return PAM_SUCCESS;
        }
        if (is_error(&reply, "WeakPasscode")) {
            const char *message = json_get_string(reply.parameters, "message");
            complain(l, message ? message : "That passcode is too easy to guess.");
            continue;
        }
        if (is_error(&reply, "NoSuchPerson"))
            return PAM_USER_UNKNOWN;
        if (is_error(&reply, "PermissionDenied") || is_error(&reply, "TicketInvalid")) {
            complain(l, "You may not change this passcode here.");
            return log_ret(l, PAM_PERM_DENIED, LOG_NOTICE, "SetPasscode refused for %s: %s", name,
                           reply.error);
        }
        unexpected(l, "SetPasscode", &reply);
        return PAM_AUTHTOK_ERR;
    }
    return PAM_AUTHTOK_ERR;
}

/* The preliminary pass only checks that the daemon manages this person. */
static int check_passcode_change(const struct login *l, const char *name) {
    _cleanup_reply_ struct reply reply = {0};
    if (get_person(l, name, &reply) < 0)
        return PAM_AUTHINFO_UNAVAIL;
    if (!reply.error)
        return PAM_SUCCESS;
    if (is_error(&reply, "NoSuchPerson"))
        return PAM_USER_UNKNOWN;
    return unexpected(l, "GetPerson", &reply).ret;
}

_public_ PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc,
                                         const char **argv) {
    struct login l;
    login_init(&l, pamh, flags, argc, argv);
    const char *user = string_item(pamh, PAM_USER);
    int r;
    if (!user || !login_name_is_valid(user))
        r = PAM_USER_UNKNOWN;
    else if (flags & PAM_PRELIM_CHECK)
        r = check_passcode_change(&l, user);
    else
        r = change_passcode(&l, user);
    log_debug(&l, "chauthtok%s: %s", flags & PAM_PRELIM_CHECK ? " (check)" : "",
              pam_strerror(pamh, r));
    return r;
}
