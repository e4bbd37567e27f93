/* The connection to the daemon: a varlink Unix socket whose peer must be root or the daemon's
 * user, NUL-terminated JSON messages each way, calls with deadlines. */

#ifndef KIOSKAUTH_PAM_VARLINK_H
#define KIOSKAUTH_PAM_VARLINK_H

#include <stdbool.h>
#include <stdint.h>

#include "buffer.h"
#include "json.h"
#include "login.h"

/* A call that waits for no finger (passcode, account check) must be answered within this. */
#define CALL_TIMEOUT_MSEC 10000
#define MAX_REQUEST_SIZE (64 * 1024)

struct connection {
    int fd;
    struct buffer input; /* received bytes not yet taken as a message */
};
#define CONNECTION_INIT                                                                            \
    { .fd = -1 }
#define _cleanup_connection_ __attribute__((cleanup(connection_close)))

/* A reply: its parsed form, the error's short name when it is one of ours (the full name
 * otherwise), its parameters, and whether more replies follow. */
struct reply {
    struct json root;
    const char *error;
    const struct json *parameters;
    bool continues;
};
#define _cleanup_reply_ __attribute__((cleanup(reply_clear)))

/* CLOCK_MONOTONIC in milliseconds: what deadlines are. */
uint64_t now_msec(void);

/* Connects within CONNECT_TIMEOUT_MSEC; returns 0 or a negative errno (already logged). */
int connection_open(const struct login *l, struct connection *c);
void connection_close(struct connection *c);
/* Whether the process serving the socket is root or the daemon's own user. */
bool peer_is_daemon(const struct login *l, int fd);
/* Sends the request and its terminating NUL. */
int connection_send(struct connection *c, const struct buffer *request, uint64_t deadline);
/* Reads the next NUL-terminated message and parses it into reply. */
int connection_receive(struct connection *c, uint64_t deadline, bool interruptible,
                       struct reply *reply);

void reply_clear(struct reply *r);
bool is_error(const struct reply *r, const char *name);
/* The person named in a successful reply, when the name is one the daemon could have made. */
const char *reply_person_name(const struct reply *reply);

/* One call on an open connection, answered within timeout_msec; an interruptible one ends at a
 * signal with -EINTR, not logged. */
int exchange_within(const struct login *l, struct connection *c, const struct buffer *request,
                    struct reply *reply, unsigned timeout_msec, bool interruptible);
/* One call on an open connection that waits for no finger. */
int exchange(const struct login *l, struct connection *c, const struct buffer *request,
             struct reply *reply);
/* One call on a connection of its own. */
int ask(const struct login *l, const struct buffer *request, struct reply *reply);

#endif
