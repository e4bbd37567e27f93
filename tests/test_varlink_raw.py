"""The raw varlink client the socket tests run as other uids (varlink_raw.py).

A daemon that refuses a connection (TooManyConnections) answers and closes before it reads
the request. The client must still print that answer: sending into the closed connection fails
(EPIPE), but the answer is already waiting in its receive queue. A client that gave up on the
failed send made `test_unprivileged_uids_cannot_take_the_connections_reserved_for_root_and_the_groups`
fail now and then.
"""

import json
import socket
import subprocess
import sys
import threading

from kioskauth_testing import RAW_CLIENT

REFUSAL = {"error": "io.kioskauth.TooManyConnections", "parameters": {"limit": 48}}


def test_an_answer_sent_before_the_server_closed_is_printed_even_when_the_request_cannot_be_sent(tmp_path):
    path = str(tmp_path / "refusing.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    stop = threading.Event()

    def refuse_everyone():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.sendall(json.dumps(REFUSAL).encode() + b"\0")
            connection.close()

    server = threading.Thread(target=refuse_everyone, daemon=True)
    server.start()
    outcomes = []
    try:
        # The send races the server's close: about one attempt in seven loses it, so with
        # 150 attempts a client that gives up on a failed send is all but sure to be caught.
        for _ in range(150):
            run = subprocess.run([sys.executable, str(RAW_CLIENT), path], input='{"method": "io.kioskauth.GetStatus"}',
                                 capture_output=True, text=True, timeout=30)
            outcomes.append((run.returncode, run.stdout.strip(), run.stderr.strip()[-200:]))
    finally:
        stop.set()
        listener.close()
    failures = [o for o in outcomes if o[0] != 0 or o[1] != json.dumps(REFUSAL)]
    assert failures == [], f"{len(failures)} of {len(outcomes)} runs lost the answer, e.g. {failures[0]}"
