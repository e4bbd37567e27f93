#!/usr/bin/env python3
"""A real OAuth 2.0 / OpenID Connect provider on loopback, for kioskauth's tests.

This is django-oauth-toolkit (DOT) and oauthlib from PyPI, configured in code: a throwaway
Django project with an SQLite database, an RSA signing key generated at start, and token
lifetimes in seconds. It is not a hand-written responder: every grant, rotation, reuse check
and revocation below is DOT's own code. What this file adds is only glue that DOT leaves to the
integrator:

* ID tokens on the password and device-code grants (oauthlib mints them only for the
  authorization-code, implicit, hybrid and refresh grants);
* JWT access tokens (RFC 9068 shape, ``typ: at+jwt``) through DOT's ``ACCESS_TOKEN_GENERATOR``
  hook; they are still stored by DOT, so revocation and introspection work on them;
* ``validate_device_code`` (DOT 3.4 leaves oauthlib's hook unimplemented), one-shot device
  codes, and a shim for DOT 3.4.1 choking on oauthlib 4's ``scope`` in the device response;
* a role claim and a groups claim from per-user data;
* refusing refresh for a disabled user (DOT only checks ``is_active`` on the password grant);
* test controls (``--test-controls``): approve a pending device code, create/disable users,
  change claims, revoke all of a user's tokens, inject faults.

Usage::

    python3 tests/idp/server.py --port 0 --lifetime-seconds 120 \\
        --access-token-seconds 5 --refresh-token-seconds 60 \\
        --user sarah@clinic.example:pw:caregiver:nurses --test-controls

It binds 127.0.0.1 only, prints one JSON line on stdout once it is ready, and exits by itself
after its lifetime, on SIGTERM or on SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import secrets
import shutil
import signal
import socketserver
import sys
import tempfile
import threading
import time
import types
import uuid
import warnings
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

LOOPBACK = "127.0.0.1"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
# Grants the single test client may use. DOT ties one grant type to one application; a real
# IdP lets one client register several, so the validator below widens it.
ALLOWED_GRANTS = {"password", "refresh_token", DEVICE_GRANT}
MAX_CONTROL_BODY = 64 * 1024


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    p.add_argument("--lifetime-seconds", type=float, default=300, help="exit after this long")
    p.add_argument("--access-token-seconds", type=int, default=60)
    p.add_argument("--id-token-seconds", type=int, default=None, help="default: access-token-seconds")
    p.add_argument(
        "--refresh-token-seconds",
        type=int,
        default=3600,
        help="a refresh token dies this long after it is issued (approximately: DOT counts from "
        "its access token's expiry, so the server passes R-A to DOT, at least 1 s)",
    )
    p.add_argument(
        "--refresh-grace-seconds",
        type=int,
        default=0,
        help="DOT's REFRESH_TOKEN_GRACE_PERIOD_SECONDS: how long the previous refresh token still "
        "works after rotation (0: a reused token is refused at once and its family revoked)",
    )
    p.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="EMAIL:PASSWORD:ROLE[:GROUP[,GROUP...]]",
        help="a user; ROLE may be empty (no role claim); repeatable",
    )
    p.add_argument("--client-id", default="kioskauth-test")
    p.add_argument("--client-secret", default=None, help="default: random")
    p.add_argument("--role-claim", default="kioskauth_role")
    p.add_argument("--groups-claim", default="groups")
    p.add_argument("--device-interval", type=int, default=1, help="RFC 8628 polling interval")
    p.add_argument(
        "--plain-discovery",
        action="store_true",
        help="serve DOT's OIDC discovery document unchanged (it has no revocation_endpoint and "
        "no device_authorization_endpoint), to exercise a client's endpoint overrides",
    )
    p.add_argument("--state-dir", default=None, help="keep database and key here (survives restarts)")
    p.add_argument("--test-controls", action="store_true", help="enable the /test/ endpoints")
    p.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="also exit when stdin closes (the parent died or closed the pipe)",
    )
    p.add_argument("--verbose", action="store_true", help="log requests to stderr")
    args = p.parse_args(argv)
    users = []
    for spec in args.user:
        parts = spec.split(":")
        if len(parts) < 3 or len(parts) > 4 or not parts[0] or not parts[1]:
            p.error(f"--user {spec!r}: expected EMAIL:PASSWORD:ROLE[:GROUPS]")
        groups = [g for g in parts[3].split(",") if g] if len(parts) == 4 else []
        users.append({"email": parts[0], "password": parts[1], "role": parts[2] or None, "groups": groups})
    args.users = users
    if args.id_token_seconds is None:
        args.id_token_seconds = args.access_token_seconds
    if args.client_secret is None:
        args.client_secret = secrets.token_urlsafe(32)
    return args


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    verbose = False

    def log_message(self, format, *args):  # noqa: A002 - signature fixed by http.server
        if self.verbose:
            sys.stderr.write("idp: %s - %s\n" % (self.address_string(), format % args))


# ----------------------------------------------------------------------------------------------
# Django configuration (needs the bound port for the issuer, so it runs after bind()).


def configure_django(args, issuer, state_dir, private_key_pem):
    import django
    from django.conf import settings

    refresh_for_dot = max(args.refresh_token_seconds - args.access_token_seconds, 1)
    settings.configure(
        DEBUG=False,
        SECRET_KEY=secrets.token_urlsafe(32),
        ALLOWED_HOSTS=[LOOPBACK, "localhost"],
        ROOT_URLCONF="kioskauth_test_idp_urls",
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "oauth2_provider",
        ],
        MIDDLEWARE=[],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(state_dir, "idp.sqlite3"),
                "OPTIONS": {"timeout": 20},
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        # Tables straight from the models (syncdb) instead of replaying ~40 migrations: the
        # database is throwaway, and start-up is what every test pays.
        MIGRATION_MODULES={"auth": None, "contenttypes": None, "oauth2_provider": None},
        USE_TZ=True,
        # Real hashing, cheap enough for tests (client secrets are hashed too and checked on
        # every token request).
        PASSWORD_HASHERS=["kioskauth_test_idp_hashers.FastPBKDF2PasswordHasher"],
        LOGGING_CONFIG=None,
        OAUTH2_PROVIDER={
            "OIDC_ENABLED": True,
            "OIDC_ISS_ENDPOINT": issuer,
            "OIDC_RSA_PRIVATE_KEY": private_key_pem,
            "OIDC_SERVER_CLASS": "kioskauth_test_idp_oidc.KioskOIDCServer",
            "OAUTH2_VALIDATOR_CLASS": "kioskauth_test_idp_oidc.KioskValidator",
            "SCOPES": {
                "openid": "OpenID Connect",
                "profile": "Profile",
                "email": "Email address",
                "groups": "Group membership",
            },
            "DEFAULT_SCOPES": ["openid", "profile", "email"],
            "ACCESS_TOKEN_EXPIRE_SECONDS": args.access_token_seconds,
            "ID_TOKEN_EXPIRE_SECONDS": args.id_token_seconds,
            "REFRESH_TOKEN_EXPIRE_SECONDS": refresh_for_dot,
            "ROTATE_REFRESH_TOKEN": True,
            "REFRESH_TOKEN_REUSE_PROTECTION": True,
            "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": args.refresh_grace_seconds,
            "ACCESS_TOKEN_GENERATOR": "kioskauth_test_idp_oidc.jwt_access_token",
            "REFRESH_TOKEN_GENERATOR": "oauthlib.oauth2.rfc6749.tokens.random_token_generator",
            "OAUTH_DEVICE_VERIFICATION_URI": issuer + "/device/",
            "OAUTH_DEVICE_VERIFICATION_URI_COMPLETE": issuer + "/device/?user_code={user_code}",
            "DEVICE_FLOW_INTERVAL": args.device_interval,
            "PKCE_REQUIRED": True,
        },
    )
    django.setup()


def install_support_modules(args, issuer, private_key_pem):
    """Define the modules Django imports by dotted path (hasher, validator, server, URLs)."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hashers = types.ModuleType("kioskauth_test_idp_hashers")

    class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
        iterations = 1000

    FastPBKDF2PasswordHasher.__module__ = hashers.__name__
    hashers.FastPBKDF2PasswordHasher = FastPBKDF2PasswordHasher
    sys.modules[hashers.__name__] = hashers

    oidc = types.ModuleType("kioskauth_test_idp_oidc")
    sys.modules[oidc.__name__] = oidc
    state = {"profiles": {}}  # email -> {"role": str|None}; groups live in Django's Group model
    oidc.state = state

    def define():
        # Imported lazily: these modules need configured settings.
        from jwcrypto import jwk, jwt
        from oauthlib.oauth2.rfc6749 import errors as oauth2_errors
        from oauthlib.oauth2.rfc6749.grant_types import ResourceOwnerPasswordCredentialsGrant
        from oauthlib.oauth2.rfc8628.grant_types import DeviceCodeGrant
        from oauthlib.openid import Server as OIDCServer
        from oauthlib.openid.connect.core.grant_types.base import GrantTypeBase as OIDCGrantTypeBase

        from oauth2_provider.models import get_device_grant_model
        from oauth2_provider.oauth2_validators import OAuth2Validator

        signing_key = jwk.JWK.from_pem(private_key_pem.encode())
        kid = signing_key.thumbprint()

        def jwt_access_token(request, refresh_token=False):
            """RFC 9068-shaped access token, signed with the OIDC key (DOT's generator hook)."""
            now = int(time.time())
            user = getattr(request, "user", None)
            client_id = request.client_id or getattr(request.client, "client_id", None)
            claims = {
                "iss": issuer,
                "sub": str(user.pk) if user is not None else client_id,
                "aud": client_id,
                "client_id": client_id,
                "iat": now,
                "exp": now + args.access_token_seconds,
                "jti": str(uuid.uuid4()),
                "scope": " ".join(request.scopes or []),
            }
            token = jwt.JWT(header={"alg": "RS256", "typ": "at+jwt", "kid": kid}, claims=claims)
            token.make_signed_token(signing_key)
            return token.serialize()

        class _IdTokens(OIDCGrantTypeBase):
            """oauthlib's OIDC ID-token minting, borrowed for grants it does not decorate."""

            def __init__(self, request_validator):
                self.proxy_target = ResourceOwnerPasswordCredentialsGrant(request_validator)

        class OIDCPasswordGrant(ResourceOwnerPasswordCredentialsGrant):
            def create_token_response(self, request, token_handler):
                headers = self._get_default_headers()
                try:
                    self.validate_token_request(request)
                except oauth2_errors.OAuth2Error as e:
                    headers.update(e.headers)
                    return headers, e.json, e.status_code
                token = token_handler.create_token(request, self.refresh_token)
                token = _IdTokens(self.request_validator).add_id_token(token, token_handler, request)
                self.request_validator.save_token(token, request)
                return headers, json.dumps(token), 200

        class OIDCDeviceCodeGrant(DeviceCodeGrant):
            def create_token_response(self, request, token_handler):
                headers = self._get_default_headers()
                try:
                    self.validate_token_request(request)
                except oauth2_errors.OAuth2Error as e:
                    headers.update(e.headers)
                    return headers, e.json, e.status_code
                token = token_handler.create_token(request, self.refresh_token)
                token = _IdTokens(self.request_validator).add_id_token(token, token_handler, request)
                self.request_validator.save_token(token, request)
                return headers, json.dumps(token), 200

        class KioskOIDCServer(OIDCServer):
            def __init__(self, request_validator, *a, **kwargs):
                super().__init__(request_validator, *a, **kwargs)
                self.password_grant = OIDCPasswordGrant(request_validator)
                self.device_code_grant = OIDCDeviceCodeGrant(request_validator, **kwargs)
                self._grant_types["password"] = self.password_grant
                self._grant_types[DEVICE_GRANT] = self.device_code_grant

        class KioskValidator(OAuth2Validator):
            # Every claim goes into the ID token and userinfo, whatever the scopes.
            oidc_claim_scope = None

            def get_additional_claims(self, request):
                user = request.user
                profile = state["profiles"].get(user.username, {})
                claims = {
                    "email": user.email,
                    "email_verified": True,
                    "preferred_username": user.username,
                    args.groups_claim: sorted(g.name for g in user.groups.all()),
                }
                if profile.get("role"):
                    claims[args.role_claim] = profile["role"]
                return claims

            def validate_grant_type(self, client_id, grant_type, client, request, *a, **kw):
                return grant_type in ALLOWED_GRANTS

            def validate_refresh_token(self, refresh_token, client, request, *a, **kw):
                if not super().validate_refresh_token(refresh_token, client, request, *a, **kw):
                    return False
                return bool(request.user and request.user.is_active)

            def validate_device_code(self, client_id, code, request, *a, **kw):
                model = get_device_grant_model()
                owner = getattr(request.client, "client_id", None) or client_id
                try:
                    grant = model.objects.get(device_code=code, client_id=owner)
                except model.DoesNotExist:
                    return None
                if grant.is_expired():
                    return DeviceCodeGrant.DEVICE_CODE_EXPIRED
                if grant.status == grant.AUTHORIZATION_PENDING:
                    return DeviceCodeGrant.DEVICE_CODE_PENDING
                if grant.status == grant.DENIED:
                    return DeviceCodeGrant.DEVICE_CODE_DENIED
                if grant.status != grant.AUTHORIZED or grant.user is None or not grant.user.is_active:
                    return None
                request.user = grant.user
                request.scopes = grant.scope.split() if grant.scope else []
                # A device code buys one token response (RFC 8628 §3.5: it is single-use).
                grant.status = grant.EXPIRED
                grant.save(update_fields=["status"])
                return DeviceCodeGrant.DEVICE_CODE_AUTHORIZED

        # DOT 3.4.1 builds its DeviceCodeResponse dataclass from oauthlib's whole response, and
        # oauthlib 4.0 added a "scope" member the dataclass does not know (TypeError, HTTP 500).
        import oauth2_provider.views.device as dot_device

        known = set(dot_device.DeviceCodeResponse.__dataclass_fields__)
        original = dot_device.DeviceCodeResponse
        dot_device.DeviceCodeResponse = lambda **fields: original(
            **{k: v for k, v in fields.items() if k in known}
        )

        oidc.jwt_access_token = jwt_access_token
        oidc.KioskOIDCServer = KioskOIDCServer
        oidc.KioskValidator = KioskValidator
        for obj in (KioskOIDCServer, KioskValidator):
            obj.__module__ = oidc.__name__

    oidc.define = define
    return state


def install_urls(args, issuer, controls):
    from django.http import JsonResponse
    from django.urls import include, path, re_path
    from django.views.decorators.csrf import csrf_exempt

    from oauth2_provider import views as dot_views

    class Discovery(dot_views.ConnectDiscoveryInfoView):
        """DOT's discovery document plus the RFC 8414 endpoints it omits (as Keycloak, Okta
        and Google publish them), unless --plain-discovery."""

        def get(self, request, *a, **kw):
            response = super().get(request, *a, **kw)
            if args.plain_discovery:
                return response
            data = json.loads(response.content)
            data["revocation_endpoint"] = issuer + "/revoke_token/"
            data["device_authorization_endpoint"] = issuer + "/device-authorization/"
            data["grant_types_supported"] = sorted(ALLOWED_GRANTS)
            out = JsonResponse(data)
            out["Access-Control-Allow-Origin"] = "*"
            return out

    urls = types.ModuleType("kioskauth_test_idp_urls")
    patterns = [
        re_path(r"^\.well-known/openid-configuration/?$", Discovery.as_view()),
    ]
    if controls is not None:
        patterns.append(path("test/<str:action>", csrf_exempt(controls.view)))
    patterns.append(path("", include("oauth2_provider.urls")))
    urls.urlpatterns = patterns
    sys.modules[urls.__name__] = urls


# ----------------------------------------------------------------------------------------------
# Users, the client, and test controls.


def upsert_user(state, email, password=None, role=None, groups=None, active=None, set_role=False):
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username=email, defaults={"email": email})
    user.email = email
    if password is not None:
        user.set_password(password)
    if active is not None:
        user.is_active = bool(active)
    user.save()
    if groups is not None:
        user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])
    if set_role:
        state["profiles"].setdefault(email, {})["role"] = role or None
    return user


def revoke_all_tokens(user):
    from oauth2_provider.models import AccessToken, RefreshToken

    count = 0
    for rt in RefreshToken.objects.filter(user=user, revoked__isnull=True):
        rt.revoke()
        count += 1
    for at in AccessToken.objects.filter(user=user):
        at.revoke()
        count += 1
    return count


class Faults:
    """Faults injected by tests, applied by the WSGI wrapper to matching paths.

    POST /test/fault {"kind": ..., "path": "/token/", "count": 1, ...}; the next `count`
    requests whose path starts with `path` get, by kind:

    * ``status``: answered at once with HTTP `status` (503) and an OAuth error body, unprocessed;
    * ``stall-before``: `seconds` (30) of silence, then processed and answered;
    * ``stall-after``: processed at once, answered `seconds` (30) later;
    * ``drip``: processed at once; status line and headers (with Content-Length) go out, then
      the body one byte at a time, `interval` (0.1) seconds apart.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.queue = collections.deque()

    def add(self, fault):
        with self.lock:
            for _ in range(int(fault.get("count", 1))):
                self.queue.append(dict(fault))

    def take(self, path):
        with self.lock:
            for i, fault in enumerate(self.queue):
                if path.startswith(fault.get("path", "/token/")):
                    del self.queue[i]
                    return fault
        return None


class Controls:
    """POST /test/<action> with a JSON body; only with --test-controls."""

    def __init__(self, state, faults):
        self.state = state
        self.faults = faults

    def view(self, request, action):
        from django.contrib.auth.models import User
        from django.http import JsonResponse

        from oauth2_provider.models import get_device_grant_model

        if request.method != "POST":
            return JsonResponse({"error": "method_not_allowed"}, status=405)
        if len(request.body) > MAX_CONTROL_BODY:
            return JsonResponse({"error": "too_large"}, status=413)
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return JsonResponse({"error": "bad_json"}, status=400)

        def find_user():
            try:
                return User.objects.get(username=body["email"])
            except (KeyError, User.DoesNotExist):
                return None

        if action == "create-user":
            upsert_user(
                self.state,
                body["email"],
                password=body["password"],
                role=body.get("role"),
                groups=body.get("groups", []),
                active=True,
                set_role=True,
            )
            return JsonResponse({"ok": True})
        if action == "update-user":
            user = find_user()
            if user is None:
                return JsonResponse({"error": "no_such_user"}, status=404)
            upsert_user(
                self.state,
                user.username,
                password=body.get("password"),
                role=body.get("role"),
                groups=body.get("groups"),
                active=body.get("active"),
                set_role="role" in body,
            )
            return JsonResponse({"ok": True})
        if action == "revoke-user-tokens":
            user = find_user()
            if user is None:
                return JsonResponse({"error": "no_such_user"}, status=404)
            return JsonResponse({"ok": True, "revoked": revoke_all_tokens(user)})
        if action == "approve-device":
            model = get_device_grant_model()
            user = find_user()
            if user is None:
                return JsonResponse({"error": "no_such_user"}, status=404)
            try:
                grant = model.objects.get(user_code=body["user_code"], status=model.AUTHORIZATION_PENDING)
            except (KeyError, model.DoesNotExist):
                return JsonResponse({"error": "no_pending_grant"}, status=404)
            if grant.is_expired():
                return JsonResponse({"error": "expired"}, status=410)
            grant.user = user
            grant.status = model.DENIED if body.get("deny") else model.AUTHORIZED
            grant.save(update_fields=["user", "status"])
            return JsonResponse({"ok": True, "status": grant.status})
        if action == "fault":
            kind = body.get("kind")
            if kind not in ("status", "stall-before", "stall-after", "drip"):
                return JsonResponse({"error": "unknown_fault"}, status=400)
            self.faults.add(body)
            return JsonResponse({"ok": True})
        return JsonResponse({"error": "unknown_action"}, status=404)


def warm_up(issuer, client_id, client_secret):
    """One request to each kind of endpoint before saying ready. Django and oauthlib import most
    of their code on the first request, which on a loaded machine can take longer than a client's
    request timeout; a daemon whose refresh times out that way has its token rotated with the
    answer lost (a true ambiguous outcome, but not the one a test means to set up). Nothing here
    changes state: an unknown grant type is refused before any token is looked at."""
    import base64
    import urllib.error
    import urllib.request

    basic = base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
    requests = [
        urllib.request.Request(issuer + "/.well-known/openid-configuration"),
        urllib.request.Request(issuer + "/.well-known/jwks.json"),
        urllib.request.Request(
            issuer + "/token/", data=b"grant_type=urn%3Akioskauth%3Awarm-up", method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded", "Authorization": f"Basic {basic}"}),
    ]
    for request in requests:
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        except (urllib.error.URLError, OSError):
            pass


def make_app(django_app, faults):
    """Serialise Django (one SQLite writer at a time) and apply injected faults.

    A stall sleeps outside the lock, so a stalled request never blocks the others.
    """
    lock = threading.Lock()

    def app(environ, start_response):
        fault = faults.take(environ.get("PATH_INFO", "")) if faults is not None else None
        if fault and fault["kind"] == "stall-before":
            time.sleep(float(fault.get("seconds", 30)))
        if fault and fault["kind"] == "status":
            status = int(fault.get("status", 503))
            body = json.dumps({"error": "server_error", "error_description": "injected fault"}).encode()
            start_response(f"{status} Injected", [("Content-Type", "application/json")])
            return [body]
        captured = {}

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        with lock:
            result = django_app(environ, capture)
            try:
                body = b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        if fault and fault["kind"] == "stall-after":
            # The request has been processed (a refresh token rotated, say); the answer is late.
            time.sleep(float(fault.get("seconds", 30)))
        if fault and fault["kind"] == "drip":
            # The request has been processed; the answer trickles out one byte at a time, each
            # written (and flushed) on its own: a client that only times out while no byte comes
            # would wait len(body) * interval.
            headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
            start_response(captured["status"], headers + [("Content-Length", str(len(body)))])
            interval = float(fault.get("interval", 0.1))

            def drip():
                for i in range(len(body)):
                    time.sleep(interval)
                    yield body[i:i + 1]

            return drip()
        start_response(captured["status"], captured["headers"])
        return [body]

    return app


# ----------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    warnings.filterwarnings("ignore", module="oauth2_provider")
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    _QuietHandler.verbose = args.verbose
    # Django logs every 4xx ("Bad Request: /token/"); expected refusals are the point of tests.
    logging.getLogger("django").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    # Bound now (the issuer URL needs the port) but listening only once everything is set up: a
    # bound socket that does not listen refuses connections, as a server that is not there yet
    # should. Listening early would queue a client's request in the backlog while Django starts,
    # then process it after the client had given up — a restart turned into a lost response.
    httpd = _ThreadingWSGIServer((LOOPBACK, args.port), _QuietHandler, bind_and_activate=False)
    httpd.server_bind()
    port = httpd.server_address[1]
    issuer = f"http://{LOOPBACK}:{port}"

    temporary = args.state_dir is None
    state_dir = tempfile.mkdtemp(prefix="kioskauth-idp-") if temporary else args.state_dir
    os.makedirs(state_dir, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    # A parent that started us from a thread with SIGTERM blocked (Swift's Foundation.Process
    # from async code does) passes the blocked mask on: unblock, or SIGTERM would never arrive.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.exit_on_stdin_eof:

        def watch_stdin():
            # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader makes
            # interpreter shutdown abort.
            while os.read(0, 4096):
                pass
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        key_path = os.path.join(state_dir, "oidc-rsa.pem")
        if os.path.exists(key_path):
            with open(key_path) as f:
                private_key_pem = f.read()
        else:
            from jwcrypto import jwk

            private_key_pem = jwk.JWK.generate(kty="RSA", size=2048).export_to_pem(
                private_key=True, password=None
            ).decode()
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(private_key_pem)

        state = install_support_modules(args, issuer, private_key_pem)
        configure_django(args, issuer, state_dir, private_key_pem)
        sys.modules["kioskauth_test_idp_oidc"].define()

        faults = Faults() if args.test_controls else None
        controls = Controls(state, faults) if args.test_controls else None
        install_urls(args, issuer, controls)

        from django.core.management import call_command
        from django.core.wsgi import get_wsgi_application

        call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)

        from oauth2_provider.models import Application

        Application.objects.update_or_create(
            client_id=args.client_id,
            defaults={
                "name": "kioskauth",
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_PASSWORD,
                "client_secret": args.client_secret,
                "algorithm": Application.RS256_ALGORITHM,
                "redirect_uris": "",
            },
        )
        for u in args.users:
            upsert_user(
                state, u["email"], password=u["password"], role=u["role"], groups=u["groups"],
                active=True, set_role=True,
            )

        httpd.set_app(make_app(get_wsgi_application(), faults))

        httpd.server_activate()
        serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        serving.start()
        warm_up(issuer, args.client_id, args.client_secret)
        ready = {
            "issuer": issuer,
            "port": port,
            "client_id": args.client_id,
            "client_secret": args.client_secret,
            "token_endpoint": issuer + "/token/",
            "revocation_endpoint": issuer + "/revoke_token/",
            "device_authorization_endpoint": issuer + "/device-authorization/",
            "jwks_uri": issuer + "/.well-known/jwks.json",
            "role_claim": args.role_claim,
            "groups_claim": args.groups_claim,
            "test_controls": issuer + "/test/" if args.test_controls else None,
            "pid": os.getpid(),
        }
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        stop.wait(args.lifetime_seconds)
        httpd.shutdown()
    finally:
        httpd.server_close()
        if temporary:
            shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
