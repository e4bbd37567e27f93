/* Drives kioskauth_release_idle_memory (Sources/CKioskAuthSystem/system.c) in a program of its
 * own, for tests/test_idle_release.py: a release must keep every page the process holds a
 * private copy of, and must not disturb an object being opened or closed meanwhile.
 *
 *   probe LIBRARY SECONDS
 *
 * 1. A page of this program's constants is made writable, written and made read-only again (as
 *    a debugger's breakpoint or a live patch writes code): after a release it must still be
 *    mapped and hold what was written, not what the file holds, while the constant pages beside
 *    it that only were read are unmapped.
 * 2. For SECONDS, one thread opens LIBRARY, checks its constants and a call into it, and closes
 *    it, over and over, while another releases over and over.
 * Prints one line per check and exits 0 when all hold. */
#define _GNU_SOURCE
#include "kioskauth_system.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

// Three pages of the largest page size Linux uses (64 KiB); `page` is the real one.
#define MAX_PAGE 65536
static const unsigned char constants[3 * MAX_PAGE]
    __attribute__((aligned(MAX_PAGE))) = {[0] = 1, [MAX_PAGE] = 2, [2 * MAX_PAGE] = 3};
static size_t page;

/// This process's pagemap entry for the page at `address`: bit 63 present, bit 61 from a file.
static uint64_t pagemap_entry(const void *address) {
    uint64_t entry = 0;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd >= 0) {
        if (pread(fd, &entry, sizeof(entry), (off_t)((uintptr_t)address / page * sizeof(entry))) !=
            sizeof(entry))
            entry = 0;
        close(fd);
    }
    return entry;
}

static atomic_int stop;
static atomic_long opened, releases, mismatches;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *open_and_close(void *library) {
    while (!atomic_load(&stop)) {
        void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            atomic_fetch_add(&mismatches, 1);
            return NULL;
        }
        const unsigned char *table = dlsym(handle, "probe_table");
        unsigned (*sum)(void) = (unsigned (*)(void))dlsym(handle, "probe_sum");
        unsigned expected = 0;
        for (unsigned i = 0; i < 65536; i++)
            expected += (unsigned char)(i * 7 + 3);
        unsigned direct = 0;
        for (unsigned i = 0; table != NULL && i < 65536; i++)
            direct += table[i];
        if (table == NULL || sum == NULL || sum() != expected || direct != expected)
            atomic_fetch_add(&mismatches, 1);
        dlclose(handle);
        atomic_fetch_add(&opened, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: probe LIBRARY SECONDS\n");
        return 2;
    }
    page = (size_t)sysconf(_SC_PAGESIZE);
    // Pages 0 and 2 of the constants are read (so resident, from the file); page 1 is written
    // through an mprotect, as a debugger's breakpoint or a live patch writes code.
    const volatile unsigned char *seen = constants;
    unsigned char *written = (unsigned char *)constants + MAX_PAGE;
    if (seen[0] != 1 || seen[2 * MAX_PAGE] != 3)
        return fprintf(stderr, "constants not as built\n"), 1;
    if (mprotect(written, page, PROT_READ | PROT_WRITE) != 0)
        return perror("mprotect"), 1;
    written[0] = 42;
    if (mprotect(written, page, PROT_READ) != 0)
        return perror("mprotect"), 1;
    struct kioskauth_release_report report;
    kioskauth_release_idle_memory(&report);
    // Before reading anything again: the file's pages gone, the written one kept.
    uint64_t first = pagemap_entry(constants), copy = pagemap_entry(written),
             third = pagemap_entry(constants + 2 * MAX_PAGE);
    int dropped = !(first >> 63 & 1) && !(third >> 63 & 1);
    int copy_kept = (copy >> 63 & 1) && !(copy >> 61 & 1);
    printf("release: error %d, unmapped %ld KiB, file-backed %ld -> %ld KiB, %ld us\n",
           report.error, report.advised / 1024, report.file_kib_before, report.file_kib_after,
           report.elapsed_us);
    printf("after a release: file pages %s, the written page %s\n",
           dropped ? "unmapped" : "still mapped", copy_kept ? "kept" : "not kept");
    printf("written constant after a release: %d (written 42, the file holds 2)\n", seen[MAX_PAGE]);
    printf("neighbouring constants: %d %d\n", seen[0], seen[2 * MAX_PAGE]);
    int kept =
        dropped && copy_kept && seen[MAX_PAGE] == 42 && seen[0] == 1 && seen[2 * MAX_PAGE] == 3;

    pthread_t opener;
    pthread_create(&opener, NULL, open_and_close, argv[1]);
    double end = now() + atof(argv[2]);
    while (now() < end) {
        kioskauth_release_idle_memory(&report);
        atomic_fetch_add(&releases, 1);
        if (report.error != 0)
            atomic_fetch_add(&mismatches, 1);
    }
    atomic_store(&stop, 1);
    pthread_join(opener, NULL);
    printf(
        "releases %ld, opens and closes %ld, mismatches %ld; the last release unmapped %ld KiB\n",
        atomic_load(&releases), atomic_load(&opened), atomic_load(&mismatches),
        report.advised / 1024);
    return kept && atomic_load(&mismatches) == 0 && atomic_load(&opened) > 0 && report.advised > 0
               ? 0
               : 1;
}
