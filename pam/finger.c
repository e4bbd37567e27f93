/* Fingerprint scans (finger.h): the daemon's prompts streamed to the person, one loop over the
 * touches of a conversation for Identify and VerifyFinger alike, and what each method's final
 * reply means. */

#define _GNU_SOURCE

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "conversation.h"
#include "finger.h"
#include "handover.h"
#include "person.h"

/* A scan (VerifyFinger, Identify) on a connection of its own, `c` (which the caller closes, or
 * keeps for the session after a match): shows the daemon's prompts as they stream in and leaves
 * the final reply in `reply`. `*deadline` bounds it: when 0, it is set to timeout= from now (a
 * caller passes the same deadline again for the touches that follow an unusable one). Returns
 * 0; -ETIMEDOUT when no final reply came by the deadline; -EINTR when a signal ended the wait;
 * another negative errno when the daemon could not be asked. Closing the connection cancels a
 * scan still running. */
static int scan(const struct login *l, struct connection *c, const struct buffer *request,
                struct reply *reply, bool *touch_requested, uint64_t *deadline) {
    *touch_requested = false;
    if (request->failed)
        return log_ret(l, -ENOMEM, LOG_CRIT, "Out of memory");
    int r = connection_open(l, c);
    if (r < 0)
        return r;
    if (*deadline == 0)
        *deadline = now_msec() + (uint64_t)l->options.timeout_sec * 1000;
    r = connection_send(c, request, *deadline);
    for (;;) {
        if (r >= 0)
            r = connection_receive(c, *deadline, true, reply);
        if (r == -EINTR || r == -ETIMEDOUT) {
            log_debug(l, "Scan ended: %s", r == -EINTR ? "interrupted by a signal" : "timed out");
            return r;
        }
        if (r < 0)
            return log_ret(l, r, LOG_WARNING, "kioskauthd did not answer: %s", strerror(-r));
        if (!reply->continues)
            return 0;
        const struct json *progress = json_get(reply->parameters, "progress");
        const char *state = json_get_string(progress, "state");
        const char *hint = json_get_string(progress, "hint");
        if (state && strcmp(state, "touch") == 0)
            *touch_requested = true;
        if (hint)
            instruct(l, hint);
    }
}

/* Errors that end a scan without a verdict on the finger: a name or the passcode can go on. */
bool is_reader_trouble(const struct reply *reply) {
    return is_error(reply, "NoReader") || is_error(reply, "ScanTimeout") ||
           is_error(reply, "ReaderRemoved") || is_error(reply, "ReaderUnavailable") ||
           is_error(reply, "ScanCancelled");
}

/* What the person is told when the scan ended without a verdict on the finger. */
void say_reader_trouble(const struct login *l, const struct reply *reply) {
    if (is_error(reply, "ScanTimeout"))
        complain(l, MESSAGE_SCAN_TIMED_OUT);
}

/* A touch the reader could not use (ScanRetry: too short, off centre, a finger already down) is
 * not a failed match: the person is told why and touches again without using up a try, for as
 * long as timeout= allows from the first touch of that try. */
void say_retry(const struct login *l, const struct reply *reply) {
    const char *hint = json_get_string(reply->parameters, "hint");
    complain(l, hint ? hint : "Try again.");
}

/* Walk-up identify paused after unknown fingers: for how long, and what works meanwhile. */
void say_identify_paused(const struct login *l, const struct reply *reply) {
    long long seconds = 0;
    char text[MAX_MESSAGE_LENGTH];
    const char *alternative = l->options.mode == MODE_AUTO ? ", or use your name and passcode" : "";
    if (!json_get_integer(reply->parameters, "retryAfterSeconds", &seconds) || seconds <= 0)
        seconds = 60;
    if (seconds > MAX_WAIT_SHOWN_SEC) /* a daemon's number, never trusted to fit arithmetic */
        seconds = MAX_WAIT_SHOWN_SEC;
    long long minutes = (seconds + 59) / 60;
    if (seconds < 60)
        snprintf(text, sizeof(text),
                 "Fingerprint unlock is paused after too many unknown fingers. "
                 "Try again in %lld second%s%s.",
                 seconds, seconds == 1 ? "" : "s", alternative);
    else
        snprintf(text, sizeof(text),
                 "Fingerprint unlock is paused after too many unknown fingers. "
                 "Try again in %lld minute%s%s.",
                 minutes, minutes == 1 ? "" : "s", alternative);
    complain(l, text);
}

/* What a method makes of the final reply of one touch, before the replies both read alike. */
enum verdict {
    VERDICT_STEP,      /* the scan is over: the step says what comes next */
    VERDICT_MISS,      /* the finger was not recognised: a try is used, another may follow */
    VERDICT_LAST_MISS, /* the same, and the daemon allows no further try */
    VERDICT_OTHER,     /* not the method's own: read as for either method */
};

/* One method: its name (for the log), the person (VerifyFinger), where a scan without a verdict
 * on the finger goes on, how it reads its final replies, and what ends the last try. */
struct finger_scan {
    const char *method;
    const char *name;
    enum next without_verdict;
    enum verdict (*judge)(const struct login *l, const struct finger_scan *f, struct connection *c,
                          const struct reply *reply, bool touch_requested, struct step *s);
    struct step (*out_of_tries)(const struct login *l, const struct reply *reply);
};

static enum verdict ended(struct step *s, struct step step) {
    *s = step;
    return VERDICT_STEP;
}

/* No verdict on the finger (no reader, a timeout, an unplugged reader, ...): said when there is
 * something to say, and the conversation goes on without the finger. */
static struct step no_verdict(const struct login *l, const struct finger_scan *f,
                              const struct reply *reply) {
    log_debug(l, "%s: %s", f->method, reply->error);
    say_reader_trouble(l, reply);
    return (struct step){PAM_AUTHINFO_UNAVAIL, f->without_verdict};
}

/* The touches of one conversation, for either method. A touch the reader could not use is
 * touched again within the same deadline and is not a try; a finger not recognised uses one. The
 * daemon counts failed matches per connection, and every touch has its own: the conversation's
 * count is this loop's (a retry hint is not a try). */
static struct step scan_finger(const struct login *l, const struct finger_scan *f,
                               const struct buffer *request) {
    uint64_t deadline = 0;
    for (unsigned attempt = 1;;) {
        _cleanup_connection_ struct connection c = CONNECTION_INIT;
        _cleanup_reply_ struct reply reply = {0};
        bool touch_requested;
        int r = scan(l, &c, request, &reply, &touch_requested, &deadline);
        /* Ctrl-C: the person chose another way in; the stack goes on to its next module. */
        if (r == -EINTR)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (r == -ETIMEDOUT) {
            complain(l, MESSAGE_SCAN_TIMED_OUT);
            return (struct step){PAM_AUTHINFO_UNAVAIL, f->without_verdict};
        }
        if (r < 0)
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        if (is_error(&reply, "ScanRetry")) {
            say_retry(l, &reply);
            continue;
        }
        deadline = 0;

        struct step s;
        enum verdict verdict = f->judge(l, f, &c, &reply, touch_requested, &s);
        if (verdict == VERDICT_STEP)
            return s;
        if (verdict == VERDICT_MISS || verdict == VERDICT_LAST_MISS) {
            complain(l, MESSAGE_NOT_RECOGNISED);
            if (verdict == VERDICT_LAST_MISS || attempt++ >= l->options.max_tries)
                return f->out_of_tries(l, &reply);
            continue;
        }
        if (is_reader_trouble(&reply))
            return no_verdict(l, f, &reply);
        if (is_error(&reply, "FingerprintNotAllowed")) {
            const char *reason = json_get_string(reply.parameters, "reason");
            log_debug(l, "%s refused: %s", f->method, reason ? reason : "no reason given");
            return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_NONE};
        }
        if (must_sign_in_online(&reply))
            return sign_in_required(l, &reply);
        return unexpected(l, f->method, &reply);
    }
}

static enum verdict identify_verdict(const struct login *l, const struct finger_scan *f,
                                     struct connection *c, const struct reply *reply,
                                     bool touch_requested, struct step *s) {
    if (!reply->error) {
        const char *name = reply_person_name(reply);
        if (!name)
            return ended(s, unexpected(l, f->method, &(struct reply){.error = "malformed reply"}));
        int r = pam_set_item(l->pamh, PAM_USER, name);
        if (r != PAM_SUCCESS)
            return ended(s, (struct step){log_ret(l, r, LOG_ERR, "Cannot set PAM_USER: %s",
                                                  pam_strerror(l->pamh, r)),
                                          NEXT_NONE});
        const struct json *person = json_get(reply->parameters, "person");
        const char *display_name = json_get_string(person, "displayName");
        note_person(l, person);
        char welcome[MAX_MESSAGE_LENGTH];
        snprintf(welcome, sizeof(welcome), "Welcome back, %s",
                 display_name && *display_name ? display_name : name);
        inform(l, welcome);
        keep_for_session(l, c, json_get_string(reply->parameters, "ticket"), name);
        log_debug(l, "Identified %s", name);
        return ended(s, (struct step){PAM_SUCCESS, NEXT_NONE});
    }
    if (is_error(reply, "NotIdentified")) {
        /* No touch was asked for when nobody is enrolled: ask for the name at once. */
        if (!touch_requested || json_get_bool(reply->parameters, "askForName"))
            return ended(s, (struct step){PAM_AUTH_ERR, NEXT_ASK_NAME});
        return VERDICT_MISS;
    }
    if (is_error(reply, "IdentifyPaused")) {
        say_identify_paused(l, reply);
        return ended(s, (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ASK_NAME, .finger_done = true});
    }
    /* Recognised, but not someone who may log in now (suspended by an administrator). */
    if (is_error(reply, "PersonNotActive")) {
        complain(l, not_active_message(json_get_string(reply->parameters, "state")));
        return ended(s, (struct step){PAM_AUTH_ERR, NEXT_NONE});
    }
    return VERDICT_OTHER;
}

static struct step identify_out_of_tries(const struct login *l, const struct reply *reply) {
    (void)reply;
    complain(l, MESSAGE_USE_NAME);
    return (struct step){PAM_MAXTRIES, NEXT_ASK_NAME, .finger_done = true};
}

struct step identify(const struct login *l) {
    static const struct finger_scan f = {
        .method = "Identify",
        .without_verdict = NEXT_ASK_NAME,
        .judge = identify_verdict,
        .out_of_tries = identify_out_of_tries,
    };
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.Identify\",\"more\":true,"
                          "\"parameters\":{\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    return scan_finger(l, &f, &request);
}

/* After too many failed matches: the passcode, or for a person from the identity provider who
 * has none, their email and password (or a device login) with the identity provider. Either way
 * the person is told what comes next. */
static struct step fallback(const struct login *l, const struct reply *reply) {
    const char *to = json_get_string(reply->parameters, "fallback");
    if (to && strcmp(to, "idp") == 0) {
        complain(l, MESSAGE_IDP_FALLBACK);
        return (struct step){PAM_AUTHINFO_UNAVAIL, NEXT_ONLINE};
    }
    complain(l, MESSAGE_USE_PASSCODE);
    return (struct step){PAM_MAXTRIES, NEXT_PASSCODE};
}

static enum verdict verify_verdict(const struct login *l, const struct finger_scan *f,
                                   struct connection *c, const struct reply *reply,
                                   bool touch_requested, struct step *s) {
    (void)touch_requested;
    if (!reply->error) {
        const char *matched = reply_person_name(reply);
        if (!matched || strcmp(matched, f->name) != 0)
            return ended(s, unexpected(l, f->method, &(struct reply){.error = "malformed reply"}));
        note_person(l, json_get(reply->parameters, "person"));
        keep_for_session(l, c, json_get_string(reply->parameters, "ticket"), f->name);
        log_debug(l, "Fingerprint verified for %s", f->name);
        return ended(s, (struct step){PAM_SUCCESS, NEXT_NONE});
    }
    if (is_error(reply, "FingerprintNotRecognized"))
        return json_get_bool(reply->parameters, "fallbackRequired") ? VERDICT_LAST_MISS
                                                                    : VERDICT_MISS;
    if (is_error(reply, "FallbackRequired"))
        return ended(s, fallback(l, reply));
    /* No finger enrolled, or matching paused on the terminal: as with no reader, no error text,
     * only the passcode prompt. */
    if (is_error(reply, "NoFingers") || is_error(reply, "FingerprintPaused"))
        return ended(s, no_verdict(l, f, reply));
    if (is_error(reply, "NoSuchPerson"))
        return ended(s, (struct step){PAM_USER_UNKNOWN, NEXT_FIRST_LOGIN});
    if (is_error(reply, "PersonNotActive")) {
        const char *state = json_get_string(reply->parameters, "state");
        if (is_pending(state))
            return ended(s, (struct step){PAM_AUTH_ERR, NEXT_ACTIVATE});
        complain(l, not_active_message(state));
        return ended(s, (struct step){PAM_AUTH_ERR, NEXT_NONE});
    }
    return VERDICT_OTHER;
}

struct step verify_finger(const struct login *l, const char *name) {
    const struct finger_scan f = {
        .method = "VerifyFinger",
        .name = name,
        .without_verdict = NEXT_PASSCODE,
        .judge = verify_verdict,
        .out_of_tries = fallback,
    };
    _cleanup_buffer_ struct buffer request = {0};
    buffer_puts(&request, "{\"method\":\"io.kioskauth.VerifyFinger\",\"more\":true,"
                          "\"parameters\":{\"name\":");
    json_string(&request, name);
    buffer_puts(&request, ",\"context\":");
    json_context(&request, l);
    buffer_puts(&request, "}}");
    return scan_finger(l, &f, &request);
}
