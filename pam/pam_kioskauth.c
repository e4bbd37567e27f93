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
 *
 * This file holds the PAM entry points and option parsing; the flows, the scans, the connection
 * and the JSON below them are the internal library libkioskauth-pam.a (README.md lists the files).
 */

#define _GNU_SOURCE

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include "account.h"
#include "auth.h"
#include "handover.h"
#include "login.h"
#include "passcode.h"
#include "person.h"
#include "session.h"

#define DEFAULT_SOCKET_PATH "/run/kioskauth/io.kioskauth"
/* How long a fingerprint call may take in all, queueing behind other conversations included
 * (timeout=); the daemon's own ScanTimeoutSec bounds each touch. */
#define DEFAULT_SCAN_TIMEOUT_SEC 60
#define MAX_SCAN_TIMEOUT_SEC 600
#define DEFAULT_MAX_TRIES 3
#define MAX_MAX_TRIES 10

/* The module is built with hidden visibility and a version script; only these are exported. */
#define _public_ __attribute__((visibility("default")))

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

/* Every entry point parses its own options and reads the caller's context afresh. */
static void start(struct login *l, pam_handle_t *pamh, int flags, int argc, const char **argv) {
    struct options options;
    parse_options(pamh, argc, argv, &options);
    login_init(l, pamh, flags, &options);
}

_public_ PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc,
                                            const char **argv) {
    struct login l;
    start(&l, pamh, flags, argc, argv);
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

_public_ PAM_EXTERN int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc,
                                         const char **argv) {
    struct login l;
    start(&l, pamh, flags, argc, argv);
    int r = check_account(&l, authenticated_in(pamh));
    log_debug(&l, "account: %s", pam_strerror(pamh, r));
    return r;
}

_public_ PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc,
                                            const char **argv) {
    struct login l;
    start(&l, pamh, flags, argc, argv);
    int r = open_session(&l, authenticated_in(pamh));
    log_debug(&l, "open_session: %s", pam_strerror(pamh, r));
    return r;
}

_public_ PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc,
                                             const char **argv) {
    struct login l;
    start(&l, pamh, flags, argc, argv);
    int r = close_session(&l);
    log_debug(&l, "close_session: %s", pam_strerror(pamh, r));
    return r;
}

_public_ PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc,
                                         const char **argv) {
    struct login l;
    start(&l, pamh, flags, argc, argv);
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
