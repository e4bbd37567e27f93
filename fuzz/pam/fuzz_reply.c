/*
 * libFuzzer target for the PAM module's JSON parser and reply handling, built by fuzz/run with
 * clang -fsanitize=fuzzer,address,undefined and linked with the module's internal library
 * (pam/libkioskauth-pam.a, built by fuzz/run with -fsanitize=fuzzer-no-link,address,undefined).
 *
 * Each input is what the daemon might send on the connection: it is written to one end of a
 * socket pair, and the module's own connection_receive() takes NUL-terminated replies off the
 * other end until it refuses one or the bytes run out. Every reply then goes through what the
 * module does with replies: the error name, the person record (name, role, uid, display name),
 * waiting times, enrolment progress, ticket lifetimes, and the messages shown to the person.
 */

#define _GNU_SOURCE

#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <security/pam_appl.h>

#include "../../pam/conversation.h"
#include "../../pam/enrol.h"
#include "../../pam/finger.h"
#include "../../pam/passcode.h"
#include "../../pam/person.h"
#include "../../pam/step.h"
#include "../../pam/varlink.h"

static int quiet_conversation(int n, const struct pam_message **messages,
                              struct pam_response **responses, void *data) {
    (void)n, (void)messages, (void)data;
    *responses = NULL;
    return PAM_CONV_ERR;
}

static pam_handle_t *handle;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const struct pam_conv conversation = {quiet_conversation, NULL};
    if (pam_start("kioskauth-fuzz", "fuzz", &conversation, &handle) != PAM_SUCCESS)
        abort();
    return 0;
}

static void handle_reply(const struct login *l, const struct reply *reply) {
    struct activation a = ACTIVATION_INIT;
    (void)is_reader_trouble(reply);
    if (reply->error) {
        if (must_sign_in_online(reply))
            (void)sign_in_required(l, reply);
        else if (is_error(reply, "ScanRetry"))
            say_retry(l, reply);
        else if (is_error(reply, "IdentifyPaused"))
            say_identify_paused(l, reply);
        else
            (void)unexpected(l, "Fuzz", reply);
        say_reader_trouble(l, reply);
        const char *until = json_get_string(reply->parameters, "until");
        if (until) {
            long long seconds = seconds_until(until);
            if (seconds > 0)
                say_wait(l, "Locked.", seconds);
        }
    }
    const struct json *person = json_get(reply->parameters, "person");
    (void)reply_person_name(reply);
    (void)is_identity_provider_person(person);
    (void)not_active_message(json_get_string(person, "state"));
    if (person)
        note_person(l, person);
    show_enrol_progress(l, json_get(reply->parameters, "progress"));
    note_ticket_lifetime(&a, reply->parameters);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int pair[2];
    if (size > 256 * 1024 || socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0)
        return 0;
    int sndbuf = 512 * 1024;
    (void)setsockopt(pair[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    size_t sent = 0;
    while (sent < size) {
        ssize_t n = send(pair[1], data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0)
            break;
        sent += (size_t)n;
    }
    close(pair[1]);

    struct person_info who = {0};
    struct login l = {.pamh = handle, .person = &who, .flags = 0};
    struct connection c = {.fd = pair[0]};
    struct reply reply = {0};
    while (connection_receive(&c, now_msec() + 1000, false, &reply) == 0)
        handle_reply(&l, &reply);
    reply_clear(&reply);
    connection_close(&c);
    return 0;
}
