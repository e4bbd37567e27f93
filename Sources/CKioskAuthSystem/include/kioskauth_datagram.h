#ifndef KIOSKAUTH_DATAGRAM_H
#define KIOSKAUTH_DATAGRAM_H

#include <sys/types.h>

/// Sends one datagram to the Unix socket at `path` over `fd` (an AF_UNIX SOCK_DGRAM socket), as
/// sd_journal_send does to journald's native socket. Returns 0, or -errno (ENAMETOOLONG when the
/// path does not fit sockaddr_un, EMSGSIZE when the datagram is too large); retries EINTR.
int kioskauth_send_datagram(int fd, const char *path, const void *data, size_t length);

#endif
