#include <argon2.h>
#include <string.h>
#include <sys/mman.h>

/*
 * Argon2id as argon2id_hash_raw computes it, with its working memory (64 MiB by default) in a
 * mapping of its own. With `huge_pages`, the mapping asks for transparent huge pages: Argon2 reads
 * that memory at data-dependent places, so with 4 KiB pages most reads also miss the TLB, and
 * huge pages make a default verify about a fifth faster here (bench/argon2_pages.py). Where huge
 * pages are not available, or madvise is refused, the mapping is used as it is. libargon2 wipes
 * the memory before handing it back, as for its own allocation.
 */

static inline int kioskauth_argon2_map(uint8_t **memory, size_t bytes, int huge_pages) {
    void *mapped = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
        return ARGON2_MEMORY_ALLOCATION_ERROR;
    }
    if (huge_pages) {
        (void)madvise(mapped, bytes, MADV_HUGEPAGE);
    }
    *memory = mapped;
    return ARGON2_OK;
}

static inline int kioskauth_argon2_allocate_huge(uint8_t **memory, size_t bytes) {
    return kioskauth_argon2_map(memory, bytes, 1);
}

static inline int kioskauth_argon2_allocate_small(uint8_t **memory, size_t bytes) {
    return kioskauth_argon2_map(memory, bytes, 0);
}

static inline void kioskauth_argon2_free(uint8_t *memory, size_t bytes) {
    (void)munmap(memory, bytes);
}

static inline int kioskauth_argon2id_hash_raw(uint32_t t_cost, uint32_t m_cost,
                                              uint32_t parallelism, const void *pwd, size_t pwdlen,
                                              const void *salt, size_t saltlen, void *hash,
                                              size_t hashlen, int huge_pages) {
    if (pwdlen > ARGON2_MAX_PWD_LENGTH) {
        return ARGON2_PWD_TOO_LONG;
    }
    if (saltlen > ARGON2_MAX_SALT_LENGTH) {
        return ARGON2_SALT_TOO_LONG;
    }
    if (hashlen > ARGON2_MAX_OUTLEN) {
        return ARGON2_OUTPUT_TOO_LONG;
    }
    argon2_context context;
    memset(&context, 0, sizeof context);
    context.out = (uint8_t *)hash;
    context.outlen = (uint32_t)hashlen;
    context.pwd = (uint8_t *)(uintptr_t)pwd;
    context.pwdlen = (uint32_t)pwdlen;
    context.salt = (uint8_t *)(uintptr_t)salt;
    context.saltlen = (uint32_t)saltlen;
    context.t_cost = t_cost;
    context.m_cost = m_cost;
    context.lanes = parallelism;
    context.threads = parallelism;
    context.allocate_cbk =
        huge_pages ? kioskauth_argon2_allocate_huge : kioskauth_argon2_allocate_small;
    context.free_cbk = kioskauth_argon2_free;
    context.flags = ARGON2_DEFAULT_FLAGS;
    context.version = ARGON2_VERSION_NUMBER;
    return argon2_ctx(&context, Argon2_id);
}
