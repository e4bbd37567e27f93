#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_PATH */
#endif

#include "kioskauth_datagram.h"
#include "kioskauth_system.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
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

int kioskauth_thread_id(void) {
    return (int)syscall(SYS_gettid);
}

int kioskauth_set_thread_nice(int thread, int nice) {
    return setpriority(PRIO_PROCESS, (id_t)thread, nice) == 0 ? 0 : -errno;
}

int kioskauth_thread_nice(int thread) {
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)thread);
    return nice == -1 && errno != 0 ? INT_MIN : nice;
}

int kioskauth_nice_floor(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_NICE, &limit) != 0)
        return 20;
    if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 40)
        return -20;
    return 20 - (int)limit.rlim_cur;
}

struct release_pass {
    uintptr_t page;
    uintptr_t vdso;
    int pagemap;
    long advised;
    int error;
};

static void advise(struct release_pass *pass, uintptr_t start, uintptr_t end) {
    if (end <= start)
        return;
    if (madvise((void *)start, end - start, MADV_DONTNEED) == 0)
        pass->advised += (long)(end - start);
    else
        pass->error = errno;
}

/// Advises the pages of [start, end) that hold what the file holds: those not present, and
/// those present from the page cache. A page the process has a private copy of (present or
/// swapped, and not from the file: a debugger's breakpoint, a uprobe, a live patch, anything
/// written through an mprotect) would be thrown away and read from the file again, so it is
/// left, and so is the whole rest of the range if `/proc/self/pagemap` cannot be read.
static void advise_file_pages(struct release_pass *pass, uintptr_t start, uintptr_t end) {
    uint64_t entries[512];
    uintptr_t run = start;
    uintptr_t at = start;
    while (at < end) {
        size_t wanted = (end - at) / pass->page;
        if (wanted > sizeof(entries) / sizeof(entries[0]))
            wanted = sizeof(entries) / sizeof(entries[0]);
        ssize_t got = pread(pass->pagemap, entries, wanted * sizeof(entries[0]),
                            (off_t)(at / pass->page * sizeof(entries[0])));
        if (got < (ssize_t)sizeof(entries[0])) {
            pass->error = got < 0 ? errno : EIO;
            advise(pass, run, at);
            return;
        }
        for (size_t i = 0; i < (size_t)got / sizeof(entries[0]); i++, at += pass->page) {
            uint64_t entry = entries[i];
            int present = (entry >> 63) & 1, swapped = (entry >> 62) & 1, file = (entry >> 61) & 1;
            if ((present && !file) || swapped) {
                advise(pass, run, at);
                run = at + pass->page;
            }
        }
    }
    advise(pass, run, end);
}

/// Whether the object's dynamic section asks for text relocations (its code was written to).
static int has_text_relocations(const struct dl_phdr_info *info) {
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        if (header->p_type != PT_DYNAMIC)
            continue;
        for (const ElfW(Dyn) *entry = (const ElfW(Dyn) *)(info->dlpi_addr + header->p_vaddr);
             entry->d_tag != DT_NULL; entry++) {
            if (entry->d_tag == DT_TEXTREL ||
                (entry->d_tag == DT_FLAGS && (entry->d_un.d_val & DF_TEXTREL)))
                return 1;
        }
    }
    return 0;
}

static int release_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct release_pass *pass = data;
    uintptr_t relro_start = 0, relro_end = 0;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        uintptr_t first = info->dlpi_addr + header->p_vaddr;
        if (header->p_type == PT_LOAD && first <= pass->vdso &&
            pass->vdso < first + header->p_memsz)
            return 0; // the vDSO: the kernel's own pages
        if (header->p_type == PT_GNU_RELRO) {
            relro_start = info->dlpi_addr + header->p_vaddr;
            relro_end = relro_start + header->p_memsz;
        }
    }
    if (has_text_relocations(info))
        return 0;
    // Every range is worked out before the first is advised: the program headers read here lie
    // in the object's first segment, and reading them after it was advised would map it again.
    struct {
        uintptr_t start, end;
    } ranges[16];
    int count = 0;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        if (header->p_type != PT_LOAD || (header->p_flags & PF_W) || header->p_filesz == 0)
            continue;
        if (count == 16) { // more read-only segments than any linker makes: the rest are left
            pass->error = E2BIG;
            break;
        }
        uintptr_t first = info->dlpi_addr + header->p_vaddr;
        if (first < relro_end && relro_start < first + header->p_memsz)
            continue;
        // Whole pages of the file's part only: a page the segment shares with a neighbour is
        // left, and so is the page where the file's part ends, which the loader zeroed past it
        // (a private copy) when the segment is longer in memory than in the file.
        uintptr_t start = (first + pass->page - 1) & ~(pass->page - 1);
        uintptr_t end = (first + header->p_filesz) & ~(pass->page - 1);
        if (end > start) {
            ranges[count].start = start;
            ranges[count].end = end;
            count++;
        }
    }
    for (int i = 0; i < count; i++)
        advise_file_pages(pass, ranges[i].start, ranges[i].end);
    return 0;
}

/// Resident KiB from `/proc/self/statm` (pages: size resident shared ...): backed by files (and
/// shared memory), and the rest; -1 each when it cannot be read.
static void resident_kib(long *file, long *other) {
    *file = *other = -1;
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char text[128];
    ssize_t length = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (length <= 0)
        return;
    text[length] = 0;
    char *end;
    strtol(text, &end, 10);
    long resident = strtol(end, &end, 10);
    long shared = strtol(end, &end, 10);
    long page_kib = sysconf(_SC_PAGESIZE) / 1024;
    *file = shared * page_kib;
    *other = (resident - shared) * page_kib;
}

long kioskauth_resident_file_kib(void) {
    long file, other;
    resident_kib(&file, &other);
    return file;
}

void kioskauth_release_idle_memory(struct kioskauth_release_report *report) {
    struct timespec started, ended;
    clock_gettime(CLOCK_MONOTONIC, &started);
    resident_kib(&report->file_kib_before, &report->other_kib_before);
    // The allocator first: trimming after the code's release would map its code in again.
    kioskauth_release_free_memory();
    struct release_pass pass = {
        .page = (uintptr_t)sysconf(_SC_PAGESIZE),
        .vdso = (uintptr_t)getauxval(AT_SYSINFO_EHDR),
        .pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC),
    };
    if (pass.pagemap >= 0) {
        dl_iterate_phdr(release_object, &pass);
        close(pass.pagemap);
    } else {
        pass.error = errno; // without it, no page can be told safe to drop: no code is released
    }
    resident_kib(&report->file_kib_after, &report->other_kib_after);
    clock_gettime(CLOCK_MONOTONIC, &ended);
    report->advised = pass.advised;
    report->error = pass.error;
    report->elapsed_us =
        (ended.tv_sec - started.tv_sec) * 1000000L + (ended.tv_nsec - started.tv_nsec) / 1000L;
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

// Landlock's rights and fields newer than the kernel headers Debian 12 ships (6.1, ABI 2).
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

#if defined(__x86_64__)
#define KIOSKAUTH_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define KIOSKAUTH_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#define KIOSKAUTH_BPF_LOAD(field)                                                                  \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (__u32)offsetof(struct seccomp_data, field))
// The low 32 bits of an argument: process ids, domains and types are ints.
#define KIOSKAUTH_BPF_ARG(index) KIOSKAUTH_BPF_LOAD(args[index])
#define KIOSKAUTH_BPF_ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define KIOSKAUTH_BPF_DENY BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))

int kioskauth_seccomp_confine(pid_t self) {
#ifndef KIOSKAUTH_AUDIT_ARCH
    (void)self;
    return -ENOTSUP;
#else
    const __u32 me = (__u32)self;
    struct sock_filter program[] = {
        // Another architecture's calls (or x32's, on x86-64) would bypass the numbers below.
        KIOSKAUTH_BPF_LOAD(arch),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, KIOSKAUTH_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        KIOSKAUTH_BPF_LOAD(nr),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),
        KIOSKAUTH_BPF_DENY,

// Only to itself: the first argument is this process.
#define KIOSKAUTH_ONLY_SELF(call)                                                                  \
    KIOSKAUTH_BPF_LOAD(nr), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 0, 4),                     \
        KIOSKAUTH_BPF_ARG(0), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, me, 0, 1), KIOSKAUTH_BPF_ALLOW,  \
        KIOSKAUTH_BPF_DENY
// Only of itself: the first argument is 0 (the caller) or this process.
#define KIOSKAUTH_SELF_OR_ZERO(call)                                                               \
    KIOSKAUTH_BPF_LOAD(nr), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 0, 5),                     \
        KIOSKAUTH_BPF_ARG(0), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),                        \
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, me, 0, 1), KIOSKAUTH_BPF_ALLOW, KIOSKAUTH_BPF_DENY
// `which` (the first argument) names a process, and `who` (the second) is the caller.
#define KIOSKAUTH_WHO_SELF(call, process)                                                          \
    KIOSKAUTH_BPF_LOAD(nr), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 0, 6),                     \
        KIOSKAUTH_BPF_ARG(0), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (process), 0, 3),                \
        KIOSKAUTH_BPF_ARG(1), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1), KIOSKAUTH_BPF_ALLOW,   \
        KIOSKAUTH_BPF_DENY
#define KIOSKAUTH_NEVER(call)                                                                      \
    KIOSKAUTH_BPF_LOAD(nr), BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 0, 1), KIOSKAUTH_BPF_DENY

        KIOSKAUTH_ONLY_SELF(SYS_kill),
        KIOSKAUTH_ONLY_SELF(SYS_tgkill),
        KIOSKAUTH_ONLY_SELF(SYS_rt_sigqueueinfo),
        KIOSKAUTH_ONLY_SELF(SYS_rt_tgsigqueueinfo),
        KIOSKAUTH_SELF_OR_ZERO(SYS_prlimit64),
        KIOSKAUTH_SELF_OR_ZERO(SYS_sched_setaffinity),
        KIOSKAUTH_SELF_OR_ZERO(SYS_sched_setscheduler),
        KIOSKAUTH_SELF_OR_ZERO(SYS_sched_setparam),
        KIOSKAUTH_SELF_OR_ZERO(SYS_sched_setattr),
        KIOSKAUTH_WHO_SELF(SYS_setpriority, PRIO_PROCESS),
        KIOSKAUTH_WHO_SELF(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */),
        KIOSKAUTH_NEVER(SYS_tkill),
        KIOSKAUTH_NEVER(SYS_ptrace),
        KIOSKAUTH_NEVER(SYS_process_vm_readv),
        KIOSKAUTH_NEVER(SYS_process_vm_writev),
        KIOSKAUTH_NEVER(SYS_migrate_pages),
        KIOSKAUTH_NEVER(SYS_move_pages),
        KIOSKAUTH_NEVER(SYS_kcmp),
        KIOSKAUTH_NEVER(424 /* pidfd_send_signal */),
        KIOSKAUTH_NEVER(434 /* pidfd_open */),
        KIOSKAUTH_NEVER(438 /* pidfd_getfd */),
        KIOSKAUTH_NEVER(440 /* process_madvise */),
        KIOSKAUTH_NEVER(448 /* process_mrelease */),

        // Unix sockets of the stream type only: a datagram socket could reach the journal's
        // native socket and write fields of the daemon's own.
        KIOSKAUTH_BPF_LOAD(nr),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 7),
        KIOSKAUTH_BPF_ARG(0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 3),
        KIOSKAUTH_BPF_ARG(1),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOCK_STREAM, 0, 1),
        KIOSKAUTH_BPF_ALLOW,
        KIOSKAUTH_BPF_DENY,

        KIOSKAUTH_BPF_ALLOW,
    };
    struct sock_fprog filter = {.len = (unsigned short)(sizeof(program) / sizeof(program[0])),
                                .filter = program};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -errno;
    // prctl, not seccomp(2): systemd's @system-service allows the one and not the other.
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter, 0, 0) != 0)
        return -errno;
    return 0;
#endif
}

int kioskauth_read_file_limit(pid_t pid) {
    struct rlimit limit;
    return syscall(SYS_prlimit64, pid, RLIMIT_NOFILE, NULL, &limit) == 0 ? 0 : -errno;
}

/* The first and the last input section of the program's .bss: the symbol ordering file
 * (debian/kioskauthd.text-order, whose .bss part bench/bss_order.py writes) lists the .bss input
 * sections a start of the daemon touches between these two, so lld links those sections here,
 * together, at the start of .bss. */
__attribute__((section(".bss.kioskauth_hot_bss_start"), used)) char kioskauth_hot_bss_start[1];
__attribute__((section(".bss.kioskauth_hot_bss_end"), used)) char kioskauth_hot_bss_end[1];

/* Where .bss begins (the linker defines it). */
extern char __bss_start[];

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

long kioskauth_populate_hot_bss(void) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)kioskauth_hot_bss_start & ~(page - 1);
    uintptr_t end = ((uintptr_t)kioskauth_hot_bss_end + 1 + page - 1) & ~(page - 1);
    /* Linked without that order (a development build), the two lie anywhere in .bss: the first
     * comes first only with it. */
    if ((uintptr_t)kioskauth_hot_bss_start != (uintptr_t)__bss_start || end <= start)
        return 0;
    if (end - start > KIOSKAUTH_HOT_BSS_LIMIT)
        return -ERANGE;
    if (madvise((void *)start, end - start, MADV_POPULATE_WRITE) != 0)
        return -errno;
    return (long)(end - start);
}
