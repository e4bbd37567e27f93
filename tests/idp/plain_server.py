#!/usr/bin/env python3
"""Runs an unmodified OAuth/OIDC provider from PyPI on 127.0.0.1 for the end-to-end tests.

    python3 tests/idp/plain_server.py --provider dot|oidc-provider --port 0 \
        --user 'alice@example.com:password:group1,group2' [--publish-groups] [--state-dir DIR]

`dot` is django-oauth-toolkit (settings in dot_plain/settings.py), `oidc-provider` is
django-oidc-provider (oidc_provider_site/settings.py); both only through their documented
settings. This runner does what an administrator does: migrates the database, creates the RSA
key, the users and one public client through the ORM and management commands, then serves
Django on a free loopback port and prints one JSON line (`issuer`, `port`, `client_id`, ...).

It exits when stdin closes. Each line read from stdin before that is one administrator action,
done through the ORM as the admin site would, answered with one JSON line on stdout:
`{"action": "revoke-user-tokens", "email"}` deletes every token of the user,
`{"action": "set-active", "email", "active": false}`, `{"action": "set-groups", "email", "groups"}`,
`{"action": "recreate-user", "email", "password"}` deletes the user and adds one with the same email.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socketserver
import sys
import tempfile
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = "127.0.0.1"
CLIENT_ID = "kioskauth-terminal"


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--provider", choices=["dot", "oidc-provider"], required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--state-dir")
    p.add_argument("--access-token-seconds", type=int, default=300)
    p.add_argument("--refresh-token-seconds", type=int, default=3600)
    p.add_argument("--user", action="append", default=[], help="EMAIL:PASSWORD[:GROUP,GROUP]")
    p.add_argument("--publish-groups", action="store_true",
                   help="dot: publish the user's Django groups through OAUTH2_VALIDATOR_CLASS")
    p.add_argument("--id-token-claims", action="store_true",
                   help="oidc-provider: OIDC_IDTOKEN_INCLUDE_CLAIMS = True")
    p.add_argument("--sub-generator",
                   help="oidc-provider: OIDC_IDTOKEN_SUB_GENERATOR (a dotted path), as an administrator sets it")
    return p.parse_args(argv)


def users_of(args):
    for spec in args.user:
        email, password, *rest = spec.split(":")
        groups = [g for g in (rest[0].split(",") if rest else []) if g]
        yield email, password, groups


def set_groups(user, groups):
    from django.contrib.auth.models import Group

    user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])


def create_user(email, password, groups):
    from django.contrib.auth.models import User

    user = User.objects.filter(username=email).first() or User(username=email, email=email)
    user.set_password(password)
    user.save()
    set_groups(user, groups)


def setup_dot(issuer):
    from oauth2_provider.models import Application

    Application.objects.update_or_create(
        client_id=CLIENT_ID,
        defaults={
            "name": "kioskauth", "client_type": Application.CLIENT_PUBLIC,
            "authorization_grant_type": Application.GRANT_PASSWORD,
            "algorithm": Application.RS256_ALGORITHM, "redirect_uris": "",
        },
    )
    return {"revocation_endpoint": issuer + "/revoke_token/"}


def setup_oidc_provider(issuer):
    from django.core.management import call_command
    from oidc_provider.models import Client, RSAKey

    if not RSAKey.objects.exists():
        import io

        call_command("creatersakey", stdout=io.StringIO())
    client, _ = Client.objects.update_or_create(
        client_id=CLIENT_ID,
        defaults={"name": "kioskauth", "client_type": "public", "jwt_alg": "RS256"},
    )
    client.scope = ["openid", "email", "profile", "groups"]
    client.save()
    return {}


def admin_action(provider, request):
    from django.contrib.auth.models import User

    user = User.objects.get(username=request["email"])
    if request["action"] == "revoke-user-tokens":
        if provider == "dot":
            from oauth2_provider.models import AccessToken, RefreshToken

            RefreshToken.objects.filter(user=user).delete()
            AccessToken.objects.filter(user=user).delete()
        else:
            from oidc_provider.models import Token

            Token.objects.filter(user=user).delete()
    elif request["action"] == "set-active":
        user.is_active = bool(request["active"])
        user.save()
    elif request["action"] == "set-groups":
        set_groups(user, request["groups"])
    elif request["action"] == "recreate-user":
        # Deleted in the admin site and added again with the same email: a new primary key, so a
        # new `sub`; the provider deletes the old user's tokens with it.
        groups = [g.name for g in user.groups.all()]
        user.delete()
        create_user(request["email"], request["password"], groups)
    else:
        raise ValueError(f"unknown action {request['action']}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, HERE)
    httpd = _Server((LOOPBACK, args.port), _Quiet, bind_and_activate=False)
    httpd.server_bind()
    port = httpd.server_address[1]
    issuer = f"http://{LOOPBACK}:{port}"
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="kioskauth-plain-idp-")
    os.makedirs(state_dir, exist_ok=True)

    env = os.environ
    env["KIOSKAUTH_IDP_STATE_DIR"] = state_dir
    env["KIOSKAUTH_IDP_ACCESS_SECONDS"] = str(args.access_token_seconds)
    env["KIOSKAUTH_IDP_REFRESH_SECONDS"] = str(args.refresh_token_seconds)
    env["KIOSKAUTH_IDP_PUBLISH_GROUPS"] = "1" if args.publish_groups else "0"
    env["KIOSKAUTH_IDP_IDTOKEN_CLAIMS"] = "1" if args.id_token_claims else "0"
    if args.sub_generator:
        env["KIOSKAUTH_IDP_SUB_GENERATOR"] = args.sub_generator
    key_path = os.path.join(state_dir, "secret-key")
    if not os.path.exists(key_path):
        with open(key_path, "w") as f:
            f.write(secrets.token_urlsafe(32))
    env["KIOSKAUTH_IDP_SECRET_KEY"] = open(key_path).read()
    if args.provider == "dot":
        rsa_path = os.path.join(state_dir, "oidc-rsa.pem")
        if not os.path.exists(rsa_path):
            # As DOT's documentation says: `openssl genrsa -out oidc.key 4096` (2048 here).
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa

            pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption())
            with open(rsa_path, "wb") as f:
                f.write(pem)
        env["KIOSKAUTH_IDP_RSA_PRIVATE_KEY"] = open(rsa_path).read()
        env["DJANGO_SETTINGS_MODULE"] = "dot_plain.settings"
    else:
        env["DJANGO_SETTINGS_MODULE"] = "oidc_provider_site.settings"

    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("django").setLevel(logging.CRITICAL)
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0, interactive=False)
    extra = setup_dot(issuer) if args.provider == "dot" else setup_oidc_provider(issuer)
    for email, password, groups in users_of(args):
        create_user(email, password, groups)

    httpd.set_app(get_wsgi_application())
    httpd.server_activate()
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    ready = {"provider": args.provider, "issuer": issuer, "port": port, "client_id": CLIENT_ID,
             "state_dir": state_dir, "pid": os.getpid(), **extra}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            admin_action(args.provider, json.loads(line))
            answer = {"ok": True}
        except Exception as error:  # noqa: BLE001 - reported to the test
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    httpd.shutdown()
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
