/*
 * Argon2id with libargon2's own allocation (argon2id_hash_raw) against the daemon's
 * (kioskauth_argon2id_hash_raw in Sources/CArgon2/shim.h: a mapping that asks for transparent
 * huge pages), alternated call by call with the same inputs. Prints each call's milliseconds as
 * "own|huge MS" and fails when the two hashes ever differ. Driven by bench/argon2_pages.py.
 */
#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double milliseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MEMORY_KIB ITERATIONS ROUNDS\n", argv[0]);
        return 2;
    }
    uint32_t memory = (uint32_t)strtoul(argv[1], NULL, 10);
    uint32_t iterations = (uint32_t)strtoul(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    const char passcode[] = "482913";
    uint8_t salt[16] = {0x6b, 0x69, 0x6f, 0x73, 0x6b, 0x61, 0x75, 0x74, 0x68};
    for (int round = 0; round < rounds; round++) {
        uint8_t own[32], huge[32];
        salt[15] = (uint8_t)round;
        double started = milliseconds();
        int rc = argon2id_hash_raw(iterations, memory, 1, passcode, sizeof passcode - 1, salt,
                                   sizeof salt, own, sizeof own);
        double middle = milliseconds();
        int rc2 = kioskauth_argon2id_hash_raw(iterations, memory, 1, passcode, sizeof passcode - 1,
                                              salt, sizeof salt, huge, sizeof huge, 1);
        double ended = milliseconds();
        if (rc != ARGON2_OK || rc2 != ARGON2_OK || memcmp(own, huge, sizeof own) != 0) {
            fprintf(stderr, "round %d: the hashes differ (rc %d, %d)\n", round, rc, rc2);
            return 1;
        }
        printf("own %.3f\nhuge %.3f\n", middle - started, ended - middle);
    }
    return 0;
}
