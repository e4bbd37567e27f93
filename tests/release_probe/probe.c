/* Drives kioskauth_release_idle_memory (Sources/CKioskAuthSystem/system.c) in a program of its
 * own, for tests/test_idle_release.py: a release must keep every page the process holds a
 * private copy of, and must not disturb an object being opened or closed meanwhile.
 *
 *   probe LIBRARY SECONDS
 *
 * 1. A page of this program's constants is made writable, written and made read-only again (as
 *    a debugger's breakpoint or a live patch writes code): after a release it must still hold
 *    what was written, not what the file holds.
 * 2. For SECONDS, one thread opens LIBRARY, checks its constants and a call into it, and closes
 *    it, over and over, while another releases over and over.
 * Prints one line per check and exits 0 when all hold. */
#define _GNU_SOURCE
#include "kioskauth_system.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE_BYTES 4096
static const unsigned char constants[3 * PAGE_BYTES]
    __attribute__((aligned(PAGE_BYTES))) = {[0] = 1, [PAGE_BYTES] = 2, [2 * PAGE_BYTES] = 3};

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
    unsigned char *page = (unsigned char *)constants + PAGE_BYTES;
    if (mprotect(page, PAGE_BYTES, PROT_READ | PROT_WRITE) != 0)
        return perror("mprotect"), 1;
    page[0] = 42;
    if (mprotect(page, PAGE_BYTES, PROT_READ) != 0)
        return perror("mprotect"), 1;
    struct kioskauth_release_report report;
    kioskauth_release_idle_memory(&report);
    printf("release: error %d, unmapped %ld KiB, file-backed %ld -> %ld KiB\n", report.error,
           report.advised / 1024, report.file_kib_before, report.file_kib_after);
    printf("written constant after a release: %d (written 42, the file holds 2)\n",
           *(volatile const unsigned char *)page);
    printf("neighbouring constants: %d %d\n", *(volatile const unsigned char *)constants,
           *(volatile const unsigned char *)(constants + 2 * PAGE_BYTES));
    // Read through volatile: the compiler may otherwise take the constants' initial values.
    const volatile unsigned char *seen = constants;
    int kept = seen[PAGE_BYTES] == 42 && seen[0] == 1 && seen[2 * PAGE_BYTES] == 3;

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
