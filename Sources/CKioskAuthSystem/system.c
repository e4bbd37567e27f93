#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_PATH */
#endif

#include "kioskauth_datagram.h"
#include "kioskauth_system.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

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

int kioskauth_spawn_connected(const char *path, char *const argv[], int *socket_out,
                              pid_t *pid_out) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return errno;
    // The child's end becomes its descriptor 0 by dup2, which clears close-on-exec, unless it
    // already is 0 (a caller without standard input): then move it out of the way first.
    if (pair[1] <= 2) {
        int moved = fcntl(pair[1], F_DUPFD_CLOEXEC, 3);
        int saved = errno;
        close(pair[1]);
        if (moved < 0) {
            close(pair[0]);
            return saved;
        }
        pair[1] = moved;
    }
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int result = posix_spawn_file_actions_init(&actions);
    if (result == 0) {
        result = posix_spawnattr_init(&attributes);
        if (result == 0) {
            if ((result = posix_spawn_file_actions_adddup2(&actions, pair[1], 0)) == 0 &&
                (result = posix_spawn_file_actions_addclosefrom_np(&actions, 3)) == 0 &&
                (result = posix_spawnattr_setsigmask(&attributes, &none)) == 0 &&
                (result = posix_spawnattr_setsigdefault(&attributes, &all)) == 0 &&
                (result = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK |
                                                                    POSIX_SPAWN_SETSIGDEF)) == 0) {
                char *const environment[] = {NULL};
                result = posix_spawn(pid_out, path, &actions, &attributes, argv, environment);
            }
            posix_spawnattr_destroy(&attributes);
        }
        posix_spawn_file_actions_destroy(&actions);
    }
    close(pair[1]);
    if (result != 0) {
        close(pair[0]);
        return result;
    }
    *socket_out = pair[0];
    return 0;
}

// Landlock's rights and fields newer than the kernel headers Debian 12 ships (6.1, ABI 3).
#define KIOSKAUTH_LANDLOCK_FS_REFER (1ULL << 13)
#define KIOSKAUTH_LANDLOCK_FS_TRUNCATE (1ULL << 14)
#define KIOSKAUTH_LANDLOCK_FS_IOCTL_DEV (1ULL << 15)
#define KIOSKAUTH_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define KIOSKAUTH_LANDLOCK_SCOPE_SIGNAL (1ULL << 1)

/// `struct landlock_ruleset_attr` as of ABI 6; older kernels are given its first field only.
struct kioskauth_landlock_ruleset {
    __u64 handled_access_fs;
    __u64 handled_access_net;
    __u64 scoped;
};

int kioskauth_landlock_confine(const char *const readable[]) {
    int abi = (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0)
        return -errno;
    // Every file-system right this kernel knows is handled, and so denied unless granted below.
    __u64 handled = (1ULL << 13) - 1;
    if (abi >= 2)
        handled |= KIOSKAUTH_LANDLOCK_FS_REFER;
    if (abi >= 3)
        handled |= KIOSKAUTH_LANDLOCK_FS_TRUNCATE;
    if (abi >= 5)
        handled |= KIOSKAUTH_LANDLOCK_FS_IOCTL_DEV;
    struct kioskauth_landlock_ruleset attributes = {.handled_access_fs = handled};
    size_t size = sizeof(attributes.handled_access_fs);
    if (abi >= 6) {
        // Network access is not handled (the directory may be on any port): that field stays 0.
        attributes.scoped =
            KIOSKAUTH_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | KIOSKAUTH_LANDLOCK_SCOPE_SIGNAL;
        size = sizeof(attributes);
    }
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attributes, size, 0);
    if (ruleset < 0)
        return -errno;
    const __u64 file_rights = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_EXECUTE;
    const __u64 directory_rights = file_rights | LANDLOCK_ACCESS_FS_READ_DIR;
    int result = 0;
    for (const char *const *path = readable; *path != NULL && result == 0; path++) {
        int fd = open(*path, O_PATH | O_CLOEXEC);
        if (fd < 0) {
            if (errno != ENOENT && errno != ENOTDIR)
                result = -errno;
            continue;
        }
        struct stat status;
        struct landlock_path_beneath_attr rule = {.parent_fd = fd};
        if (fstat(fd, &status) != 0)
            result = -errno;
        else {
            rule.allowed_access = S_ISDIR(status.st_mode) ? directory_rights : file_rights;
            if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0)
                result = -errno;
        }
        close(fd);
    }
    if (result == 0 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        result = -errno;
    if (result == 0 && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0)
        result = -errno;
    close(ruleset);
    return result == 0 ? abi : result;
}
