/* Closed-loop load on already connected stream sockets, for bench/compare.
 *
 *   loadgen MODE SECONDS REQUEST OUT FD...
 *
 * MODE is "varlink" (a reply ends with a NUL byte) or "dbus" (a reply is framed by its header's
 * lengths; signals are skipped; the request's serial, at byte 8, is bumped on every call).
 * REQUEST is a file holding one encoded call. Each FD is a connected socket (for D-Bus:
 * authenticated and past Hello), inherited from bench/compare, which sets them up. One thread
 * per socket sends the call, reads the whole reply and sends the next, for SECONDS after all
 * threads are ready. OUT receives every call's latency in ms as native doubles; stdout one line:
 * "calls errors seconds" (seconds: the mean of the threads' measured spans).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum mode { VARLINK, DBUS };

struct worker {
    pthread_t thread;
    int fd;
    unsigned char *request;
    size_t request_length;
    double *latencies;
    size_t count, capacity;
    long errors;
    double span;
    int failed;
};

static enum mode mode;
static double seconds;
static pthread_barrier_t barrier;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int send_all(int fd, const unsigned char *data, size_t length) {
    while (length > 0) {
        ssize_t n = send(fd, data, length, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        data += n;
        length -= (size_t)n;
    }
    return 0;
}

/* Reads exactly `length` bytes into buffer (growing it). */
static int read_exact(int fd, unsigned char **buffer, size_t *capacity, size_t offset, size_t length) {
    if (offset + length > *capacity) {
        *capacity = (offset + length) * 2;
        *buffer = realloc(*buffer, *capacity);
        if (*buffer == NULL) return -1;
    }
    while (length > 0) {
        ssize_t n = recv(fd, *buffer + offset, length, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        offset += (size_t)n;
        length -= (size_t)n;
    }
    return 0;
}

/* One call; returns 1 for a success, 0 for an error reply, -1 when the connection failed. */
static int call(struct worker *w, unsigned char **buffer, size_t *capacity, uint32_t *serial) {
    if (mode == DBUS) {
        ++*serial;
        memcpy(w->request + 8, serial, 4);
    }
    if (send_all(w->fd, w->request, w->request_length) < 0) return -1;
    if (mode == VARLINK) {
        size_t used = 0;
        for (;;) {
            if (used + 4096 > *capacity) {
                *capacity = (used + 4096) * 2;
                *buffer = realloc(*buffer, *capacity);
                if (*buffer == NULL) return -1;
            }
            ssize_t n = recv(w->fd, *buffer + used, *capacity - used - 1, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return -1;
            used += (size_t)n;
            if ((*buffer)[used - 1] == '\0') break;
        }
        return memmem(*buffer, used, "\"error\":\"", 9) == NULL;
    }
    for (;;) {
        if (read_exact(w->fd, buffer, capacity, 0, 16) < 0) return -1;
        uint32_t body, fields;
        memcpy(&body, *buffer + 4, 4);
        memcpy(&fields, *buffer + 12, 4);
        size_t header = 16 + fields;
        header += (8 - header % 8) % 8;
        if (read_exact(w->fd, buffer, capacity, 16, header - 16 + body) < 0) return -1;
        unsigned char type = (*buffer)[1];
        if (type == 2) return 1;
        if (type == 3) return 0;
        /* a signal: read the next message */
    }
}

static void *run(void *argument) {
    struct worker *w = argument;
    unsigned char *buffer = NULL;
    size_t capacity = 0;
    uint32_t serial = 1000;
    pthread_barrier_wait(&barrier);
    double started = now(), deadline = started + seconds, t = started;
    while (t < deadline) {
        int result = call(w, &buffer, &capacity, &serial);
        double finished = now();
        if (result < 0) {
            w->failed = 1;
            break;
        }
        if (w->count == w->capacity) {
            w->capacity = w->capacity ? w->capacity * 2 : 4096;
            w->latencies = realloc(w->latencies, w->capacity * sizeof(double));
            if (w->latencies == NULL) {
                w->failed = 1;
                break;
            }
        }
        w->latencies[w->count++] = (finished - t) * 1000.0;
        w->errors += result == 0;
        t = finished;
    }
    w->span = t - started;
    free(buffer);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s varlink|dbus SECONDS REQUEST OUT FD...\n", argv[0]);
        return 2;
    }
    mode = strcmp(argv[1], "dbus") == 0 ? DBUS : VARLINK;
    seconds = atof(argv[2]);
    FILE *file = fopen(argv[3], "rb");
    if (file == NULL) {
        perror(argv[3]);
        return 2;
    }
    unsigned char request[65536];
    size_t request_length = fread(request, 1, sizeof request, file);
    fclose(file);
    int workers = argc - 5;
    struct worker *w = calloc((size_t)workers, sizeof *w);
    pthread_barrier_init(&barrier, NULL, (unsigned)workers);
    for (int i = 0; i < workers; i++) {
        w[i].fd = atoi(argv[5 + i]);
        w[i].request = malloc(request_length);
        memcpy(w[i].request, request, request_length);
        w[i].request_length = request_length;
        pthread_create(&w[i].thread, NULL, run, &w[i]);
    }
    long calls = 0, errors = 0;
    double span = 0;
    int failed = 0;
    FILE *out = fopen(argv[4], "wb");
    if (out == NULL) {
        perror(argv[4]);
        return 2;
    }
    for (int i = 0; i < workers; i++) {
        pthread_join(w[i].thread, NULL);
        fwrite(w[i].latencies, sizeof(double), w[i].count, out);
        calls += (long)w[i].count;
        errors += w[i].errors;
        span += w[i].span;
        failed |= w[i].failed;
    }
    fclose(out);
    printf("%ld %ld %.6f\n", calls, errors, span / workers);
    if (failed) fprintf(stderr, "loadgen: a connection failed\n");
    return failed ? 1 : 0;
}
