/* The hand-over from auth to open_session: the connection that earned a ticket, and the ticket,
 * kept in the PAM handle (handover.c says why this is safe). */

#ifndef KIOSKAUTH_PAM_HANDOVER_H
#define KIOSKAUTH_PAM_HANDOVER_H

#include <sys/types.h>

#include "login.h"
#include "varlink.h"

struct handover {
    int fd;
    dev_t dev; /* which socket `fd` was: the application may close and reuse the number */
    ino_t ino;
    char *ticket;
    char name[MAX_NAME_LENGTH + 1];
};
#define HANDOVER_INIT                                                                              \
    { .fd = -1 }

void handover_clear(struct handover *h);
/* After a successful authentication on `c` (auth only): keeps the connection and the ticket for
 * open_session. `c` is closed either way. */
void keep_for_session(const struct login *l, struct connection *c, const char *ticket,
                      const char *name);
/* Puts what auth kept into the handle. */
void store_handover(const struct login *l);
/* Drops what an earlier auth kept. */
void forget_handover(pam_handle_t *pamh);
/* Takes the connection and ticket auth kept, when they are for `name` and the connection is
 * still open and quiet. */
void take_handover(const struct login *l, const char *name, struct connection *c, char **ticket);

#endif
