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

static inline int kioskauth_so_peercred(void) {
    return SO_PEERCRED;
}
static inline int kioskauth_so_peergroups(void) {
    return SO_PEERGROUPS;
}

/// Bounds what glibc's allocator keeps after a burst, before any thread allocates: at most
/// `arenas` arenas (glibc's default is 8 per core, each keeping its own free memory), and a fixed
/// trim and mmap threshold of `threshold` bytes. Fixed, because glibc otherwise raises both after
/// the first large block is freed (up to 32 MB and 64 MB), after which an arena keeps a megabyte
/// or more of free memory at its top for good.
void kioskauth_bound_allocator(int arenas, int threshold);

/// Returns free memory in every arena to the kernel (`malloc_trim(0)`).
void kioskauth_release_free_memory(void);

/// The calling thread's id (`gettid`), which `setpriority(PRIO_PROCESS, id, ...)` takes to set
/// one thread's nice value.
int kioskauth_thread_id(void);

/// Sets thread `thread`'s nice value: 0, or minus an errno value.
int kioskauth_set_thread_nice(int thread, int nice);

/// Thread `thread`'s nice value, or INT_MIN when it cannot be read.
int kioskauth_thread_nice(int thread);

/// The lowest nice value RLIMIT_NICE lets this process set without CAP_SYS_NICE (20 - limit;
/// -20 when unlimited).
int kioskauth_nice_floor(void);

/// What `kioskauth_release_idle_memory` did: resident KiB backed by files (with shared memory)
/// and the rest, before and after (from `/proc/self/statm`; -1 when it cannot be read), the
/// bytes of address range unmapped, the microseconds the whole release took, and 0 or the errno
/// of what failed (`/proc/self/pagemap` unreadable: no code unmapped, or none from where a read
/// of it failed on; a range `madvise` refused, or more than 16 read-only segments in an object:
/// the others still unmapped).
struct kioskauth_release_report {
    long file_kib_before, other_kib_before, file_kib_after, other_kib_after;
    long advised;
    long elapsed_us;
    int error;
};

/// The most of the program's .bss `kioskauth_populate_hot_bss` makes resident.
#define KIOSKAUTH_HOT_BSS_LIMIT (1L << 20)

/// Makes resident, writable, the part of the program's .bss a start of the daemon touches (linked
/// first by the symbol ordering file), in one `madvise(MADV_POPULATE_WRITE)` instead of a page
/// fault for each of its pages, two for the many read before they are written (the Swift
/// runtime's lazy caches), each a TLB shootdown once other threads run. Call it before other
/// threads start. Returns the bytes made resident; 0 when the program was linked without that
/// order (the part is then not known); -ERANGE when the part is larger than
/// KIOSKAUTH_HOT_BSS_LIMIT; or minus the errno of `madvise` (EINVAL before Linux 5.14). The part
/// is made of whole input sections, of which a start touches most pages but not every one: in
/// all, fewer pages than a start touched before its sections were linked together.
long kioskauth_populate_hot_bss(void);

/// Resident KiB backed by files (with shared memory), from `/proc/self/statm`; -1 if unreadable.
long kioskauth_resident_file_kib(void);

/// Unmaps from this process, without unmapping the files, the pages of code and constants of
/// every ELF object loaded (the program and its libraries): `madvise(MADV_DONTNEED)` over the
/// file's part of each loadable segment that is not writable, so its pages leave the process's
/// page tables (and its resident set) and stay in the page cache; a page used again is mapped
/// again by the next fault on it, from the cache while the cache holds it, else from the disk.
/// Only pages that hold what the file holds are dropped: `/proc/self/pagemap` tells, page by
/// page, which ones the process has a private copy of (the page where a segment's file part
/// ends, which the loader zeroes past it; a debugger's breakpoint; a uprobe; a live patch), and
/// those are left, as are writable segments, the part made read-only after relocation
/// (`PT_GNU_RELRO`), objects with text relocations and the vDSO. (A page written between the
/// pagemap read and the `madvise`, microseconds apart, would be lost: nothing in the daemon
/// writes to its code.) Walks the objects with `dl_iterate_phdr`, under the loader's list lock:
/// no object is unmapped meanwhile, though one being opened may be listed before it is
/// relocated (its read-only segments are not written by relocation, or it has text
/// relocations and is left). Returns the allocator's free memory first (`malloc_trim(0)`). All
/// in C, and nothing after the release but a read of `statm`, so that as little code as
/// possible is mapped in again before the caller goes back to idling.
void kioskauth_release_idle_memory(struct kioskauth_release_report *report);

/// Opens the file at `path` itself, never what a symbolic link there points to, without reading
/// or writing it (`O_PATH | O_NOFOLLOW | O_CLOEXEC`, which glibc hides behind _GNU_SOURCE): a
/// descriptor to check and change that very inode. Returns -1 with errno set on failure.
int kioskauth_open_node(const char *path);

/// Starts the program at `path` with `argv`, an empty environment, default signal dispositions
/// and no blocked signals, and one end of a new Unix stream socket pair as its standard input;
/// its standard output and error are the caller's, and it inherits no other descriptor. The
/// caller's end (close-on-exec) goes to `*socket_out`, the child's process id to `*pid_out`.
/// Returns 0, or an errno value (nothing is left open then).
int kioskauth_spawn_connected(const char *path, char *const argv[], int *socket_out,
                              pid_t *pid_out);

/// Confines the calling process, and whatever it starts, with Landlock for good: from then on it
/// may open files and directories only beneath the paths of `readable` (a NULL-terminated list;
/// a path that does not exist is left out), and only to read, list, map or execute them; it may
/// write, create, rename or remove nothing; and, on kernels with Landlock ABI 6 or later, it may
/// neither signal nor reach an abstract Unix socket of a process outside it. Landlock also keeps
/// it from tracing, or reading the memory of, any process outside it. Sets no_new_privs first.
/// Returns the Landlock ABI version applied (1 or more), or minus an errno value: -ENOSYS or
/// -EOPNOTSUPP when the kernel has no Landlock (nothing is confined then).
int kioskauth_landlock_confine(const char *const readable[]);

/// Installs a seccomp filter on the calling process (which must have one thread: it is not
/// synchronised to others) that keeps it from acting on any other process of its user, which
/// Landlock does not cover: signals (`kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo`)
/// only to `self`; resource limits, scheduling and CPU affinity only of itself; `setpriority`
/// and `ioprio_set` only of itself; no `tkill`, pidfd, `ptrace`, `process_vm_*`,
/// `process_madvise`, `migrate_pages` or `move_pages`; and Unix sockets of the stream type only
/// (no datagram socket, so not the journal's native socket). Those calls fail with EPERM; a
/// system call of another architecture kills the process. Sets no_new_privs first. Returns 0 or
/// minus an errno value.
int kioskauth_seccomp_confine(pid_t self);

/// Reads the open-files limit of process `pid` (`prlimit`, which glibc hides behind _GNU_SOURCE):
/// 0, or minus an errno value. For `kioskauth-fleet --sandbox-check`.
int kioskauth_read_file_limit(pid_t pid);

#endif
