"""The daemon's HTTP client checks TLS certificates against the system's trust roots: an endpoint
whose certificate no trusted authority signed is refused during the handshake, before any request
(and so before any audit event or bearer token) leaves, and the failure is named as a TLS one.

The endpoint is a real HTTPS server (http.server behind Python's ssl module) on 127.0.0.1, an
ephemeral port, with a self-signed certificate for 127.0.0.1 made here; it stops by itself.

Run: python3 -m pytest tests/test_http_tls.py
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from idp_testing import Connection, wait_until
from test_audit_delivery import add_person, delivery, make_delivery_daemon, unlocks


def self_signed(directory) -> tuple[str, str]:
    """A key and a self-signed certificate for 127.0.0.1, as PEM files in `directory`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


class UntrustedEndpoint:
    """An HTTPS collector with a self-signed certificate; counts handshakes and requests."""

    def __init__(self, directory, lifetime: float = 120.0):
        self.requests = 0
        self.handshake_failures = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 (http.server's name)
                endpoint.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                endpoint.handshake_failures += 1

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*reversed(self_signed(directory)))
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True
        self.timer.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1/audit"

    def close(self) -> None:
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def untrusted(tmp_path):
    endpoint = UntrustedEndpoint(tmp_path)
    yield endpoint
    endpoint.close()


def test_an_endpoint_whose_certificate_no_trusted_authority_signed_gets_nothing(make_daemon, untrusted):
    d = make_delivery_daemon(make_daemon, untrusted.url).start()
    add_person(d)
    conn = Connection(d.socket)
    unlocks(conn, 2)
    conn.close()

    status = wait_until(lambda: (s := delivery(d))["state"] == "retrying" and s.get("lastError") and s,
                        15, message="a delivery failure in the status")
    assert status["lastError"] == "cannot connect: TLS failed (the endpoint's certificate is not trusted)", status
    assert status["deliveredThrough"] == 0
    assert status["queued"] >= 1
    # The handshake was refused: no request, so neither the events nor the token, ever arrived.
    assert untrusted.requests == 0
