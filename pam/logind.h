/* What logind knows of the calling process's session, read from where systemd keeps it, without
 * linking libsystemd: loading libsystemd and the libraries it pulls in (libgcrypt, liblzma,
 * libzstd, liblz4, libcap) cost every PAM conversation more than the rest of the module's work.
 * The answers and error codes are those of sd_pid_get_session() and sd_session_is_remote();
 * tests/test_pam_logind.py checks them against libsystemd's in real cgroups. */

#ifndef KIOSKAUTH_PAM_LOGIND_H
#define KIOSKAUTH_PAM_LOGIND_H

#include <stddef.h>

/* Session ids are short: logind's own are a number, or "c" and a number. */
#define LOGIND_SESSION_ID_MAX 64

/* The logind session of the calling process: the ID of the "session-ID.scope" unit its cgroup
 * (in the hierarchy systemd manages) is in, past any slices. Returns 0 with the id in `id`
 * (`size` bytes, at least 2), or a negative errno: -ENODATA when the process is in no session or
 * the cgroups are not laid out the way systemd lays them out, another one when the files could
 * not be read. */
int logind_own_session(char *id, size_t size);

/* Whether logind recorded session `id` as remote: REMOTE= in /run/systemd/sessions/ID. Returns
 * 1, 0, or a negative errno: -ENXIO when there is no such session file, -ENODATA when it says
 * nothing about REMOTE, -EINVAL for an id that is not a session id or a value that is not a
 * boolean. */
int logind_session_is_remote(const char *id);

#endif
