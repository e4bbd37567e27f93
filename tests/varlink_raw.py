#!/usr/bin/env python3
"""A minimal varlink client for tests that must run as another user (under setpriv).

Usage: varlink_raw.py SOCKET < request.json
Sends the request (a JSON object) NUL-terminated and prints each reply as one JSON line, until
a reply without "continues": true, or the server closes the connection.
"""

import json
import socket
import sys


def main() -> int:
    path = sys.argv[1]
    request = json.loads(sys.stdin.read())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    try:
        s.connect(path)
    except OSError as error:
        print(json.dumps({"error": "client.Unreachable", "parameters": {"reason": str(error)}}))
        return 0
    try:
        s.sendall(json.dumps(request).encode() + b"\0")
    except (BrokenPipeError, ConnectionResetError):
        # The server may answer and close before reading the request (a refusal such as
        # TooManyConnections): its answer is still waiting to be read.
        pass
    buf = b""
    while True:
        while b"\0" not in buf:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return 0
            buf += chunk
        message, buf = buf.split(b"\0", 1)
        reply = json.loads(message)
        print(json.dumps(reply), flush=True)
        if not reply.get("continues"):
            return 0


if __name__ == "__main__":
    sys.exit(main())
