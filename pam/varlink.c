/* The connection to the daemon (varlink.h). */

#define _GNU_SOURCE

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <security/pam_modutil.h>

#include "varlink.h"

#define DAEMON_USER "kioskauthd"
#define INTERFACE "io.kioskauth."
/* A local socket connects at once or fails at once when nothing listens; only a full listen
 * backlog makes connect() wait, and never longer than this. */
#define CONNECT_TIMEOUT_MSEC 500
#define RETRY_CONNECT_PAUSE_NSEC (10 * 1000 * 1000)

void connection_close(struct connection *c) {
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    buffer_erase(&c->input);
}

uint64_t now_msec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int remaining_msec(uint64_t deadline) {
    uint64_t now = now_msec();
    if (now >= deadline)
        return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Waits until fd is ready. A signal ends an interruptible wait (-EINTR): that is how Ctrl-C in
 * sudo, or a greeter cancelling, stops a wait for a finger. Other waits are short and resume. */
static int wait_for(int fd, short events, uint64_t deadline, bool interruptible) {
    for (;;) {
        int timeout = remaining_msec(deadline);
        if (timeout == 0)
            return -ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, timeout);
        if (r > 0)
            return 0; /* POLLHUP and POLLERR surface in the recv() or send() that follows */
        if (r == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
        if (interruptible)
            return -EINTR;
    }
}

/* Whether the process serving the socket is root or the daemon's own user. */
bool peer_is_daemon(const struct login *l, int fd) {
    struct ucred cred;
    socklen_t length = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) < 0 || length != sizeof(cred))
        return log_ret(l, false, LOG_ERR, "Cannot read the peer credentials of %s: %m",
                       l->options.socket_path);
    if (cred.uid == 0)
        return true;
    const struct passwd *daemon_user = pam_modutil_getpwnam(l->pamh, DAEMON_USER);
    if (daemon_user && daemon_user->pw_uid == cred.uid)
        return true;
    return log_ret(l, false, LOG_ERR,
                   "%s is served by uid %u, which is neither root nor %s; refusing",
                   l->options.socket_path, (unsigned)cred.uid, DAEMON_USER);
}

/* Connects within CONNECT_TIMEOUT_MSEC; returns 0 or a negative errno (already logged). */
int connection_open(const struct login *l, struct connection *c) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t length = strlen(l->options.socket_path);
    memcpy(address.sun_path, l->options.socket_path, length);
    socklen_t address_length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + length + 1);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return log_ret(l, -errno, LOG_ERR, "Cannot create a socket: %m");
    uint64_t deadline = now_msec() + CONNECT_TIMEOUT_MSEC;
    while (connect(fd, (const struct sockaddr *)&address, address_length) < 0) {
        int error = errno;
        if (error == EINTR)
            continue;
        /* Only a full listen backlog gives EAGAIN; a local socket cannot be polled for it. */
        if (error == EAGAIN && remaining_msec(deadline) > 0) {
            struct timespec pause = {.tv_nsec = RETRY_CONNECT_PAUSE_NSEC};
            nanosleep(&pause, NULL);
            continue;
        }
        close(fd);
        if (error == EAGAIN)
            error = ETIMEDOUT;
        return log_ret(l, -error, LOG_WARNING, "Cannot connect to kioskauthd at %s: %s",
                       l->options.socket_path, strerror(error));
    }
    if (!peer_is_daemon(l, fd)) {
        close(fd);
        return -EPERM;
    }
    c->fd = fd;
    return 0;
}

/* Sends the request and its terminating NUL. */
int connection_send(struct connection *c, const struct buffer *request, uint64_t deadline) {
    size_t sent = 0, total = request->length + 1;
    while (sent < total) {
        ssize_t n = send(c->fd, request->data + sent, total - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int r = wait_for(c->fd, POLLOUT, deadline, false);
            if (r < 0)
                return r;
            continue;
        }
        return n < 0 ? -errno : -EIO;
    }
    return 0;
}

void reply_clear(struct reply *r) {
    json_free(&r->root);
    *r = (struct reply){0};
}

bool is_error(const struct reply *r, const char *name) {
    return r->error && strcmp(r->error, name) == 0;
}

/* Reads the next NUL-terminated message and parses it into reply. */
int connection_receive(struct connection *c, uint64_t deadline, bool interruptible,
                       struct reply *reply) {
    reply_clear(reply);
    for (;;) {
        char *end = c->input.length ? memchr(c->input.data, '\0', c->input.length) : NULL;
        if (end) {
            size_t length = (size_t)(end - c->input.data);
            bool parsed = json_parse(c->input.data, length, &reply->root);
            size_t rest = c->input.length - length - 1;
            memmove(c->input.data, end + 1, rest);
            explicit_bzero(c->input.data + rest, c->input.length - rest);
            c->input.length = rest;
            if (!parsed || reply->root.type != JSON_OBJECT) {
                reply_clear(reply);
                return -EBADMSG;
            }
            const char *error = json_get_string(&reply->root, "error");
            if (error && STARTS_WITH(error, INTERFACE))
                error += strlen(INTERFACE);
            reply->error = error;
            reply->parameters = json_get(&reply->root, "parameters");
            reply->continues = json_get_bool(&reply->root, "continues");
            return 0;
        }
        if (c->input.length >= MAX_REPLY_SIZE)
            return -EMSGSIZE;
        int r = wait_for(c->fd, POLLIN, deadline, interruptible);
        if (r < 0)
            return r;
        if (!buffer_reserve(&c->input, 4096))
            return -ENOMEM;
        ssize_t n = recv(c->fd, c->input.data + c->input.length,
                         c->input.capacity - c->input.length - 1, MSG_DONTWAIT);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        c->input.length += (size_t)n;
        c->input.data[c->input.length] = '\0';
    }
}

/* One call on an open connection, answered within timeout_msec. An interruptible call ends at a
 * signal with -EINTR, not logged: the person chose to stop. */
int exchange_within(const struct login *l, struct connection *c, const struct buffer *request,
                    struct reply *reply, unsigned timeout_msec, bool interruptible) {
    if (request->failed)
        return log_ret(l, -ENOMEM, LOG_CRIT, "Out of memory");
    uint64_t deadline = now_msec() + timeout_msec;
    int r = connection_send(c, request, deadline);
    if (r >= 0)
        r = connection_receive(c, deadline, interruptible, reply);
    if (r == -EINTR)
        return r;
    if (r < 0)
        return log_ret(l, r, LOG_WARNING, "kioskauthd did not answer: %s", strerror(-r));
    return 0;
}

/* One call on an open connection that waits for no finger. */
int exchange(const struct login *l, struct connection *c, const struct buffer *request,
             struct reply *reply) {
    return exchange_within(l, c, request, reply, CALL_TIMEOUT_MSEC, false);
}

/* One call on a connection of its own. */
int ask(const struct login *l, const struct buffer *request, struct reply *reply) {
    _cleanup_connection_ struct connection c = CONNECTION_INIT;
    int r = connection_open(l, &c);
    if (r < 0)
        return r;
    return exchange(l, &c, request, reply);
}

/* The person named in a successful reply, when the name is one the daemon could have made. */
const char *reply_person_name(const struct reply *reply) {
    const char *name = json_get_string(json_get(reply->parameters, "person"), "name");
    return name && login_name_is_valid(name) ? name : NULL;
}
