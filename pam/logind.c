/* The caller's logind session and whether it is remote (logind.h), read from the cgroup files
 * and logind's session files the way libsystemd reads them:
 *
 * - which hierarchy is systemd's: the unified one ("0::" in /proc/PID/cgroup) when cgroup2 is
 *   mounted on /sys/fs/cgroup, on /sys/fs/cgroup/unified (hybrid) or on /sys/fs/cgroup/systemd;
 *   the v1 hierarchy named "systemd" when that is mounted there; otherwise none;
 * - the process's path in it, made relative to the root PID 1 sees (a container's cgroup), that
 *   root being PID 1's path without a trailing "/init.scope", "/system.slice" or "/system";
 * - past the leading slices (valid unit names ending in ".slice"), the first component, with a
 *   leading "_" (systemd's escape) dropped, must be "session-ID.scope" with ID letters and digits;
 * - /run/systemd/sessions/ID holds REMOTE= as an environment-file assignment. */

#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statfs.h>

#include "logind.h"

#define LETTERS_DIGITS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
/* What a unit name may hold before its type suffix (systemd's VALID_CHARS). */
#define UNIT_NAME_CHARS LETTERS_DIGITS ":-_.\\"
#define UNIT_NAME_MAX 256
#define SESSIONS_DIR "/run/systemd/sessions/"

static bool session_id_is_valid(const char *id, size_t n) {
    return n > 0 && strspn(id, LETTERS_DIGITS) >= n;
}

/* The type of the file system mounted at `path` (statfs's f_type), or a negative errno. */
static long long file_system(const char *path) {
    struct statfs fs;
    if (statfs(path, &fs) < 0)
        return -errno;
    return (long long)(unsigned long)fs.f_type;
}

/* Whether systemd keeps processes in the unified hierarchy (1) or the v1 "name=systemd" one (0);
 * -ENOMEDIUM when it keeps them in neither (cgroups not set up the systemd way). */
static int unified_hierarchy(void) {
    long long type = file_system("/sys/fs/cgroup/");
    if (type < 0)
        return (int)type;
    if (type == CGROUP2_SUPER_MAGIC)
        return 1;
    if (type != TMPFS_MAGIC)
        return -ENOMEDIUM;
    if (file_system("/sys/fs/cgroup/unified/") == CGROUP2_SUPER_MAGIC)
        return 1;
    type = file_system("/sys/fs/cgroup/systemd/");
    if (type < 0)
        return type == -ENOENT ? -ENOMEDIUM : (int)type;
    if (type == CGROUP2_SUPER_MAGIC)
        return 1;
    return type == CGROUP_SUPER_MAGIC ? 0 : -ENOMEDIUM;
}

/* Whether the comma-separated `list` (n bytes) holds `item`. */
static bool list_has(const char *list, size_t n, const char *item) {
    size_t length = strlen(item);
    for (const char *p = list, *end = list + n; p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t k = comma ? (size_t)(comma - p) : (size_t)(end - p);
        if (k == length && memcmp(p, item, k) == 0)
            return true;
        p += k + 1;
    }
    return false;
}

/* The path of `process` ("self" or "1") in systemd's hierarchy, malloc'd into *path. */
static int cgroup_path(const char *process, bool unified, char **path) {
    char file[32];
    snprintf(file, sizeof(file), "/proc/%s/cgroup", process);
    FILE *f = fopen(file, "re");
    if (!f)
        return errno == ENOENT ? -ESRCH : -errno;
    char *line = NULL;
    size_t capacity = 0;
    int r = -ENODATA;
    ssize_t n;
    while ((n = getline(&line, &capacity, f)) > 0) {
        if (line[n - 1] == '\n')
            line[--n] = '\0';
        /* hierarchy-id:controllers:path */
        char *first = strchr(line, ':');
        char *second = first ? strchr(first + 1, ':') : NULL;
        if (!second)
            continue;
        bool ours = unified ? (first == line + 1 && line[0] == '0' && second == first + 1)
                            : list_has(first + 1, (size_t)(second - first - 1), "name=systemd");
        if (!ours)
            continue;
        *path = strdup(second + 1);
        r = *path ? 0 : -ENOMEM;
        break;
    }
    free(line);
    fclose(f);
    return r;
}

/* The part of `path` below `root` (with its leading "/"), or NULL when `path` is not below it;
 * both compared component by component, as systemd's path_startswith does. */
static const char *below(const char *path, const char *root) {
    if ((path[0] == '/') != (root[0] == '/'))
        return NULL;
    for (;;) {
        path += strspn(path, "/");
        root += strspn(root, "/");
        if (*root == '\0')
            return path;
        size_t a = strcspn(path, "/"), b = strcspn(root, "/");
        if (a != b || memcmp(path, root, a) != 0)
            return NULL;
        path += a;
        root += b;
    }
}

/* Whether `name` (n bytes) is a plain unit name of type "slice": characters systemd allows, no
 * instance, shorter than UNIT_NAME_MAX; a leading "_" is systemd's escape. */
static bool is_slice(const char *name, size_t n) {
    static const char suffix[] = ".slice";
    size_t s = sizeof(suffix) - 1;
    if (n < s + 1 || memcmp(name + n - s, suffix, s) != 0)
        return false;
    if (name[0] == '_') {
        name++;
        n--;
    }
    if (n >= UNIT_NAME_MAX || n <= s)
        return false;
    for (size_t i = 0; i < n - s; i++)
        if (!strchr(UNIT_NAME_CHARS, name[i]) || name[i] == '\0')
            return false;
    return true;
}

/* The session of a path in systemd's hierarchy: the first component past the slices. */
static int session_of_path(const char *path, char *id, size_t size) {
    const char *p = path;
    for (;;) {
        p += strspn(p, "/");
        size_t n = strcspn(p, "/");
        if (!is_slice(p, n))
            break;
        p += n;
    }
    size_t n = strcspn(p, "/");
    if (n > 0 && p[0] == '_') {
        p++;
        n--;
    }
    static const char prefix[] = "session-", suffix[] = ".scope";
    size_t a = sizeof(prefix) - 1, b = sizeof(suffix) - 1;
    if (n < a + b || n >= UNIT_NAME_MAX || memcmp(p, prefix, a) != 0 ||
        memcmp(p + n - b, suffix, b) != 0)
        return -ENXIO;
    size_t length = n - a - b;
    if (!session_id_is_valid(p + a, length))
        return -ENXIO;
    if (length + 1 > size)
        return -ENOBUFS;
    memcpy(id, p + a, length);
    id[length] = '\0';
    return 0;
}

int logind_own_session(char *id, size_t size) {
    int unified = unified_hierarchy();
    if (unified < 0)
        return unified == -ENOMEDIUM ? -ENODATA : unified;
    char *own = NULL, *root = NULL;
    int r = cgroup_path("self", unified, &own);
    if (r >= 0)
        r = cgroup_path("1", unified, &root);
    if (r >= 0) {
        /* PID 1's own unit is not part of the root. */
        static const char *const units[] = {"/init.scope", "/system.slice", "/system"};
        size_t n = strlen(root);
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            size_t k = strlen(units[i]);
            if (n >= k && strcmp(root + n - k, units[i]) == 0) {
                root[n - k] = '\0';
                break;
            }
        }
        const char *inside = below(own, root);
        r = session_of_path(inside && inside > own ? inside - 1 : own, id, size);
    }
    free(own);
    free(root);
    return r == -ENXIO ? -ENODATA : r;
}

/* systemd's parse_boolean: 1, 0, or -EINVAL. */
static int boolean(const char *value) {
    static const char *const yes[] = {"1", "yes", "y", "true", "t", "on"};
    static const char *const no[] = {"0", "no", "n", "false", "f", "off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(value, yes[i]) == 0)
            return 1;
        if (strcasecmp(value, no[i]) == 0)
            return 0;
    }
    return -EINVAL;
}

/* The value of the last `REMOTE=` assignment in an environment file line by line: whitespace
 * around the key and the value dropped, one pair of matching quotes around the value removed.
 * Returns 1 when `line` assigns it (the value in place, in `line`), 0 otherwise. */
static int remote_assignment(char *line, char **value) {
    char *p = line + strspn(line, " \t");
    if (strncmp(p, "REMOTE", 6) != 0)
        return 0;
    p += 6;
    p += strspn(p, " \t");
    if (*p != '=')
        return 0;
    p++;
    p += strspn(p, " \t");
    size_t n = strlen(p);
    while (n > 0 && isspace((unsigned char)p[n - 1]))
        p[--n] = '\0';
    if (n >= 2 && (p[0] == '"' || p[0] == '\'') && p[n - 1] == p[0]) {
        p[n - 1] = '\0';
        p++;
    }
    *value = p;
    return 1;
}

int logind_session_is_remote(const char *id) {
    size_t n = strlen(id);
    if (!session_id_is_valid(id, n) || n >= LOGIND_SESSION_ID_MAX)
        return -EINVAL;
    char file[sizeof(SESSIONS_DIR) + LOGIND_SESSION_ID_MAX];
    snprintf(file, sizeof(file), SESSIONS_DIR "%s", id);
    FILE *f = fopen(file, "re");
    if (!f)
        return errno == ENOENT ? -ENXIO : -errno;
    char *line = NULL, *value, *remote = NULL;
    size_t capacity = 0;
    ssize_t length;
    int r = 0;
    while ((length = getline(&line, &capacity, f)) > 0) {
        if (remote_assignment(line, &value)) {
            free(remote);
            remote = strdup(value);
            if (!remote) {
                r = -ENOMEM;
                break;
            }
        }
    }
    free(line);
    fclose(f);
    if (r == 0)
        r = remote && *remote ? boolean(remote) : -ENODATA;
    free(remote);
    return r;
}
