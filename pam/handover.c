/* The hand-over from auth to open_session.
 *
 * OpenSession takes the ticket of the authentication that opens the session, so that the session
 * starts authenticated (step-up and the lock epoch count from that authentication), and the
 * daemon binds every ticket to the connection that earned it. So auth keeps that connection and
 * its ticket in the PAM handle (pam_set_data), and open_session presents the ticket on it. Why
 * this is safe:
 * - the connection never leaves this process's PAM handle: it is close-on-exec (SOCK_CLOEXEC),
 *   so nothing the application runs inherits it; the data's cleanup closes it at pam_end(), in a
 *   forked child that ends its copy of the handle too;
 * - the ticket is good once, only for the person this module authenticated, only on this
 *   connection and only for the daemon's TicketLifetimeSec; open_session presents it only when
 *   PAM_USER is still that person, and only on a connection that is still open and quiet;
 * - it is kept at most until open_session, the next auth on the handle or pam_end(); the daemon
 *   closes it after its idle timeout anyway (then the module holds a dead descriptor, no more).
 * The environment is not a way to pass it: it is the caller's in setuid programs, and the
 * application would see the ticket. When the connection or the ticket is gone (idle timeout, a
 * restart, the ticket used up by an enrolment or expired), open_session opens the session without
 * one: the session is registered unauthenticated and the first step-up asks for a fresh
 * authentication, which is the safe side. */

#define _GNU_SOURCE

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handover.h"

/* pam_set_data key: the connection and ticket of that authentication, for open_session. */
#define DATA_HANDOVER "pam_kioskauth.handover"

/* Whether h->fd is still the socket auth kept, not a descriptor the application opened on the
 * same number after closing ours. */
static bool handover_fd_is_ours(const struct handover *h) {
    struct stat st;
    return h->fd >= 0 && fstat(h->fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == h->dev &&
           st.st_ino == h->ino;
}

void handover_clear(struct handover *h) {
    if (handover_fd_is_ours(h))
        close(h->fd);
    erase_and_free(h->ticket);
    *h = (struct handover)HANDOVER_INIT;
}

static void free_handover(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    handover_clear(data);
    free(data);
}

/* After a successful authentication on `c` (auth only): keeps the connection and the ticket for
 * open_session. `c` is closed either way. */
void keep_for_session(const struct login *l, struct connection *c, const char *ticket,
                      const char *name) {
    struct handover *h = l->handover;
    struct stat st;
    char *copy =
        h && c->fd >= 0 && ticket && name && login_name_is_valid(name) && fstat(c->fd, &st) == 0
            ? strdup(ticket)
            : NULL;
    if (copy) {
        handover_clear(h);
        h->fd = c->fd;
        h->dev = st.st_dev;
        h->ino = st.st_ino;
        c->fd = -1;
        h->ticket = copy;
        memcpy(h->name, name, strlen(name) + 1);
    }
    connection_close(c);
}

/* Puts what auth kept into the handle; without it the session simply opens unauthenticated. */
void store_handover(const struct login *l) {
    struct handover *h = l->handover;
    if (!h || h->fd < 0)
        return;
    struct handover *kept = malloc(sizeof(*kept));
    if (!kept)
        return;
    *kept = *h;
    *h = (struct handover)HANDOVER_INIT;
    int r = pam_set_data(l->pamh, DATA_HANDOVER, kept, free_handover);
    if (r != PAM_SUCCESS) {
        free_handover(l->pamh, kept, 0);
        log_debug(l, "Cannot keep the connection for the session: %s", pam_strerror(l->pamh, r));
    }
}

/* Drops what an earlier auth kept (the data's cleanup closes the connection). */
void forget_handover(pam_handle_t *pamh) {
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_HANDOVER, &data) == PAM_SUCCESS && data)
        (void)pam_set_data(pamh, DATA_HANDOVER, NULL, NULL);
}

/* Takes the connection and ticket auth kept, when they are for `name` and the connection is still
 * open and quiet (the daemon has sent nothing: no idle-timeout notice, no hang-up). The handle
 * keeps neither afterwards. */
void take_handover(const struct login *l, const char *name, struct connection *c, char **ticket) {
    const void *data = NULL;
    if (pam_get_data(l->pamh, DATA_HANDOVER, &data) != PAM_SUCCESS || !data)
        return;
    struct handover *h = (struct handover *)data;
    if (h->ticket && strcmp(h->name, name) == 0 && handover_fd_is_ours(h) &&
        peer_is_daemon(l, h->fd)) {
        struct pollfd pfd = {.fd = h->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&pfd, 1, 0) == 0) {
            c->fd = h->fd;
            h->fd = -1;
            *ticket = h->ticket;
            h->ticket = NULL;
        }
    }
    (void)pam_set_data(l->pamh, DATA_HANDOVER, NULL, NULL);
}
