"""Checks that tests/idp/server.py is the OAuth 2.0 / OIDC server the Swift tests rely on.

Run: python3 -m pytest tests/idp -q
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("django", reason="django-oauth-toolkit is not installed (pip install django-oauth-toolkit)")
pytest.importorskip("oauth2_provider", reason="django-oauth-toolkit is not installed")

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")
READY_TIMEOUT = 60
SARAH = ("sarah@clinic.example", "correct horse", "caregiver", "nurses,night")
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class IdP:
    def __init__(self, *extra):
        cmd = [
            sys.executable, SERVER, "--port", "0", "--lifetime-seconds", "120",
            "--access-token-seconds", "30", "--refresh-token-seconds", "300",
            "--user", ":".join(SARAH), "--test-controls", *extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited early with {self.proc.wait(5)}")
        self.info = json.loads(line)
        self.issuer = self.info["issuer"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, path, form=None, json_body=None, auth=True, method=None):
        url = path if path.startswith("http") else self.issuer + path
        headers = {}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            pair = f"{self.info['client_id']}:{self.info['client_secret']}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, (json.loads(raw) if raw else None)

    def password(self, email=SARAH[0], password=SARAH[1]):
        return self.request("/token/", {"grant_type": "password", "username": email,
                                        "password": password, "scope": "openid email profile"})

    def refresh(self, token):
        return self.request("/token/", {"grant_type": "refresh_token", "refresh_token": token})


def claims(jwt):
    header, payload, _ = jwt.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    return json.loads(base64.urlsafe_b64decode(pad(header))), json.loads(base64.urlsafe_b64decode(pad(payload)))


@pytest.fixture(scope="module")
def idp():
    server = IdP()
    yield server
    server.close()


def test_discovery_and_jwks(idp):
    status, doc = idp.request("/.well-known/openid-configuration", auth=False)
    assert status == 200
    assert doc["issuer"] == idp.issuer
    assert doc["token_endpoint"] == idp.issuer + "/token/"
    assert doc["revocation_endpoint"] == idp.issuer + "/revoke_token/"
    assert doc["device_authorization_endpoint"] == idp.issuer + "/device-authorization/"
    assert "RS256" in doc["id_token_signing_alg_values_supported"]
    status, jwks = idp.request(doc["jwks_uri"], auth=False)
    assert status == 200
    (key,) = jwks["keys"]
    assert key["kty"] == "RSA" and key["alg"] == "RS256" and key["kid"]


def test_plain_discovery_omits_what_dot_omits():
    server = IdP("--plain-discovery")
    try:
        status, doc = server.request("/.well-known/openid-configuration", auth=False)
        assert status == 200
        assert "revocation_endpoint" not in doc
        assert "device_authorization_endpoint" not in doc
    finally:
        server.close()


def test_password_grant_issues_signed_tokens_with_claims(idp):
    status, tok = idp.password()
    assert status == 200, tok
    assert tok["expires_in"] == 30
    header, id_claims = claims(tok["id_token"])
    assert header["alg"] == "RS256" and header["kid"]
    assert id_claims["iss"] == idp.issuer
    assert id_claims["aud"] == idp.info["client_id"]
    assert id_claims["email"] == SARAH[0]
    assert id_claims["kioskauth_role"] == "caregiver"
    assert id_claims["groups"] == ["night", "nurses"]
    at_header, at_claims = claims(tok["access_token"])
    assert at_header["typ"] == "at+jwt"
    assert at_claims["sub"] == id_claims["sub"]


def test_userinfo_carries_the_same_claims(idp):
    _, tok = idp.password()
    req = urllib.request.Request(idp.issuer + "/userinfo/", headers={"Authorization": "Bearer " + tok["access_token"]})
    with urllib.request.urlopen(req, timeout=10) as resp:
        info = json.loads(resp.read())
    assert info["kioskauth_role"] == "caregiver"
    assert info["email"] == SARAH[0]


def test_password_grant_wrong_password_is_invalid_grant(idp):
    status, body = idp.password(password="wrong")
    assert status == 400
    assert body["error"] == "invalid_grant"


def test_wrong_client_secret_is_invalid_client(idp):
    status, body = idp.request("/token/", {"grant_type": "password", "username": SARAH[0],
                                           "password": SARAH[1], "client_id": idp.info["client_id"],
                                           "client_secret": "nope"}, auth=False)
    assert status == 401
    assert body["error"] == "invalid_client"


def test_refresh_rotates_and_reuse_revokes_the_family(idp):
    _, first = idp.password()
    status, second = idp.refresh(first["refresh_token"])
    assert status == 200, second
    assert second["refresh_token"] != first["refresh_token"]
    assert "id_token" in second
    # The rotated-out token is reused: refused, and the live descendant dies with it.
    status, body = idp.refresh(first["refresh_token"])
    assert (status, body["error"]) == (400, "invalid_grant")
    status, body = idp.refresh(second["refresh_token"])
    assert (status, body["error"]) == (400, "invalid_grant")


def test_revocation_rfc7009(idp):
    _, tok = idp.password()
    status, _ = idp.request("/revoke_token/", {"token": tok["refresh_token"], "token_type_hint": "refresh_token"})
    assert status == 200
    status, body = idp.refresh(tok["refresh_token"])
    assert (status, body["error"]) == (400, "invalid_grant")
    # Unknown tokens are not an error (RFC 7009 §2.2).
    status, _ = idp.request("/revoke_token/", {"token": "never-issued"})
    assert status == 200


def test_device_flow_with_test_approval(idp):
    status, auth = idp.request("/device-authorization/", {"client_id": idp.info["client_id"],
                                                          "scope": "openid email profile"})
    assert status == 200, auth
    assert auth["verification_uri"] == idp.issuer + "/device/"
    assert auth["user_code"] in auth["verification_uri_complete"]
    assert auth["interval"] == 1
    poll = {"grant_type": DEVICE_GRANT, "device_code": auth["device_code"], "client_id": idp.info["client_id"]}
    status, body = idp.request("/token/", poll)
    assert (status, body["error"]) == (400, "authorization_pending")
    status, body = idp.request("/test/approve-device", json_body={"user_code": auth["user_code"], "email": SARAH[0]}, auth=False)
    assert status == 200, body
    status, tok = idp.request("/token/", poll)
    assert status == 200, tok
    assert claims(tok["id_token"])[1]["email"] == SARAH[0]
    assert tok["refresh_token"]
    # Single use.
    status, body = idp.request("/token/", poll)
    assert status == 400 and body["error"] == "expired_token"


def test_device_flow_denied(idp):
    _, auth = idp.request("/device-authorization/", {"client_id": idp.info["client_id"]})
    idp.request("/test/approve-device", json_body={"user_code": auth["user_code"], "email": SARAH[0], "deny": True}, auth=False)
    status, body = idp.request("/token/", {"grant_type": DEVICE_GRANT, "device_code": auth["device_code"]})
    assert (status, body["error"]) == (400, "access_denied")


def test_disabled_user_cannot_refresh_or_log_in(idp):
    idp.request("/test/create-user", json_body={"email": "tom@clinic.example", "password": "pw", "role": "family"}, auth=False)
    status, tok = idp.password("tom@clinic.example", "pw")
    assert status == 200
    idp.request("/test/update-user", json_body={"email": "tom@clinic.example", "active": False}, auth=False)
    assert idp.refresh(tok["refresh_token"])[1]["error"] == "invalid_grant"
    assert idp.password("tom@clinic.example", "pw")[1]["error"] == "invalid_grant"


def test_revoke_all_user_tokens(idp):
    _, a = idp.password()
    _, b = idp.password()
    status, body = idp.request("/test/revoke-user-tokens", json_body={"email": SARAH[0]}, auth=False)
    assert status == 200 and body["revoked"] >= 2
    assert idp.refresh(a["refresh_token"])[1]["error"] == "invalid_grant"
    assert idp.refresh(b["refresh_token"])[1]["error"] == "invalid_grant"


def test_injected_server_error(idp):
    idp.request("/test/fault", json_body={"kind": "status", "status": 503}, auth=False)
    status, _ = idp.password()
    assert status == 503
    assert idp.password()[0] == 200


def test_short_lifetimes_expire_tokens():
    server = IdP("--access-token-seconds", "1", "--refresh-token-seconds", "2")
    try:
        _, tok = server.password()
        assert tok["expires_in"] == 1
        time.sleep(3.5)
        status, body = server.refresh(tok["refresh_token"])
        assert (status, body["error"]) == (400, "invalid_grant")
    finally:
        server.close()


def test_exits_after_its_lifetime():
    proc = subprocess.Popen([sys.executable, SERVER, "--lifetime-seconds", "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline())["port"] > 0
        assert proc.wait(READY_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
