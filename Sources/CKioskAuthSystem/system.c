#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_PATH */
#endif

#include "kioskauth_datagram.h"
#include "kioskauth_system.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <string.h>
#include <sys/un.h>

int kioskauth_send_datagram(int fd, const char *path, const void *data, size_t length) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t path_length = strlen(path);
    if (path_length == 0 || path_length >= sizeof(address.sun_path))
        return -ENAMETOOLONG;
    memcpy(address.sun_path, path, path_length);
    socklen_t address_length =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_length + 1);
    for (;;) {
        // Never wait for a slow reader: a full queue is EAGAIN, and the caller writes the line
        // to standard error instead.
        ssize_t sent = sendto(fd, data, length, MSG_NOSIGNAL | MSG_DONTWAIT,
                              (const struct sockaddr *)&address, address_length);
        if (sent >= 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

void kioskauth_bound_allocator(int arenas, int threshold) {
    mallopt(M_ARENA_MAX, arenas);
    mallopt(M_TRIM_THRESHOLD, threshold);
    mallopt(M_MMAP_THRESHOLD, threshold);
}

void kioskauth_release_free_memory(void) {
    malloc_trim(0);
}

int kioskauth_open_node(const char *path) {
    return open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
}
