#include "kioskauth_system.h"

#include <malloc.h>

void kioskauth_bound_allocator(int arenas, int threshold) {
    mallopt(M_ARENA_MAX, arenas);
    mallopt(M_TRIM_THRESHOLD, threshold);
    mallopt(M_MMAP_THRESHOLD, threshold);
}

void kioskauth_release_free_memory(void) { malloc_trim(0); }
