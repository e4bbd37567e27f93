#ifndef KIOSKAUTH_SYSTEM_H
#define KIOSKAUTH_SYSTEM_H

#include <sys/types.h>

/// Buffer for SO_PEERGROUPS: the peer's supplementary groups at connect() time. A peer with more
/// groups than fit makes getsockopt fail with ERANGE, and the daemon then grants nothing that
/// depends on a group (fail closed).
#define KIOSKAUTH_MAX_PEER_GROUPS 256
struct kioskauth_peer_groups {
    gid_t gids[KIOSKAUTH_MAX_PEER_GROUPS];
};

#endif
