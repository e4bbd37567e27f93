#include "CFPrint.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static struct kioskauth_fprint_functions functions;
const struct kioskauth_fprint_functions *const kioskauth_fprint = &functions;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure[512];

static void load(void) {
    // RTLD_LOCAL: libfprint's tree stays out of the global scope, so nothing loaded later
    // binds to it by accident; GLib's own modules name their libraries themselves.
    void *library = dlopen(KIOSKAUTH_FPRINT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *reason = dlerror();
        snprintf(failure, sizeof failure, "cannot load %s: %s", KIOSKAUTH_FPRINT_LIBRARY,
                 reason != NULL ? reason : "unknown error");
        return;
    }
    // Resolved into a copy first: the table is either whole or untouched.
    struct kioskauth_fprint_functions resolved;
#define KIOSKAUTH_FPRINT_RESOLVE(name)                                                             \
    {                                                                                              \
        void *symbol = dlsym(library, #name);                                                      \
        if (symbol == NULL) {                                                                      \
            snprintf(failure, sizeof failure, "%s has no function %s", KIOSKAUTH_FPRINT_LIBRARY,   \
                     #name);                                                                       \
            dlclose(library);                                                                      \
            return;                                                                                \
        }                                                                                          \
        resolved.name = (__typeof__(resolved.name))symbol;                                         \
    }
    KIOSKAUTH_FPRINT_FUNCTIONS(KIOSKAUTH_FPRINT_RESOLVE)
#undef KIOSKAUTH_FPRINT_RESOLVE
    functions = resolved;
}

const char *kioskauth_fprint_load(void) {
    pthread_once(&once, load);
    return failure[0] != '\0' ? failure : NULL;
}
