#ifndef KIOSKAUTH_SYSTEM_H
#define KIOSKAUTH_SYSTEM_H

#include <sys/socket.h>
#include <sys/types.h>

/// Layout of Linux's `struct ucred` (SO_PEERCRED), which glibc hides behind _GNU_SOURCE.
struct kioskauth_peer_credentials {
    pid_t pid;
    uid_t uid;
    gid_t gid;
};

/// Buffer for SO_PEERGROUPS: the peer's supplementary groups at connect() time. A peer with more
/// groups than fit makes getsockopt fail with ERANGE, and the daemon then grants nothing that
/// depends on a group (fail closed).
#define KIOSKAUTH_MAX_PEER_GROUPS 256
struct kioskauth_peer_groups {
    gid_t gids[KIOSKAUTH_MAX_PEER_GROUPS];
};

static inline int kioskauth_so_peercred(void) { return SO_PEERCRED; }
static inline int kioskauth_so_peergroups(void) { return SO_PEERGROUPS; }

#endif
