"""The background reachability probe: the real kioskauthd against the real django-oauth-toolkit
server on loopback (killed, restarted and SIGSTOPped by the tests). GetConnectivity and the
Subscribe stream must tell online from offline without anybody logging in, and a probe must
never renew anybody's offline window.
"""

import sqlite3
import time

import pytest

from idp_testing import (
    SARAH, Connection, IdentityServer, have_identity_server, login, make_identity_daemon, ok, person, set_passcode,
    wait_until,
)
from kioskauth_testing import ensure_group
from test_idp_refresh import PASSCODE, Subscriber, median_latency
from test_pam import unix_user  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")

INTERVAL = 2
TIMEOUT = 1
# Short probes for the tests; tokens live an hour, so no refresh talks to the IdP meanwhile.
PROBE = f"ProbeIntervalSec={INTERVAL}\nProbeTimeoutSec={TIMEOUT}\n"
# The longest a probe can take to notice a change: a jittered interval, then the probe itself.
NOTICE = INTERVAL * 1.1 + TIMEOUT


def connectivity(d, people=True):
    return ok(d.call("io.kioskauth.GetConnectivity", {"people": True} if people else None))


def state(d):
    return connectivity(d)["state"]


@pytest.fixture
def idp():
    server = IdentityServer(access_seconds=3600, refresh_seconds=7200)
    yield server
    server.close()


def test_with_the_idp_up_the_terminal_is_online_at_once_without_any_login(make_daemon, idp):
    # The default interval (300 s): only the probe at the start can say so.
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    c = wait_until(lambda: (c := connectivity(d))["state"] == "online" and c, 5, message="online")
    assert c["since"] and c["lastContactAt"] and c["people"] == []
    assert c["circuit"] == "closed"


def test_with_the_idp_down_at_the_start_the_terminal_is_offline(make_daemon, idp):
    idp.kill()  # the port refuses connections
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    c = wait_until(lambda: (c := connectivity(d))["state"] == "offline" and c, 5, message="offline")
    assert c["since"] and c.get("lastContactAt") is None


def test_probing_can_be_turned_off(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp, "ProbeIntervalSec=0\n")
    d.start()
    time.sleep(2)
    assert state(d) == "unknown"  # as before the probe existed: nobody has asked yet


def test_an_idp_that_comes_up_later_is_seen_within_the_probe_interval(make_daemon, idp):
    idp.kill()
    d, _ = make_identity_daemon(make_daemon, idp, PROBE)
    d.start()
    wait_until(lambda: state(d) == "offline", 5, message="offline")
    # Still offline a few intervals later: failed probes change nothing and publish nothing new.
    subscriber = Subscriber(d)
    time.sleep(INTERVAL * 2)
    assert state(d) == "offline" and subscriber.kinds() == []
    idp.start()  # returns once the server listens
    back = time.monotonic()
    wait_until(lambda: state(d) == "online", NOTICE + 3, interval=0.1, message="online")
    assert time.monotonic() - back < NOTICE + 1
    assert subscriber.kinds(wait_for="online", timeout=5) == ["online"]
    subscriber.close()


def test_a_hanging_idp_turns_offline_after_the_probe_timeout_and_unlock_stays_fast(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp, PROBE)
    d.start()
    name = ok(login(d))["person"]["name"]
    set_passcode(d, name, PASSCODE)
    assert state(d) == "online"
    conn = Connection(d.socket)
    up, _ = median_latency(conn)
    subscriber = Subscriber(d)
    idp.stop()  # SIGSTOP: connections are accepted and never answered
    try:
        stopped = time.monotonic()
        wait_until(lambda: state(d) == "offline", NOTICE + 3, interval=0.1, message="offline")
        assert time.monotonic() - stopped < NOTICE + 1
        # Probes keep hanging at the stopped IdP meanwhile; a passcode unlock does not notice.
        hung, worst = median_latency(conn)
    finally:
        idp.cont()
    assert hung < up * 2 + 0.05, (up, hung)
    assert worst < 1.0, worst
    # The next probe after it continues brings the terminal back.
    wait_until(lambda: state(d) == "online", NOTICE + 5, interval=0.1, message="online again")
    kinds = subscriber.kinds(wait_for="online", timeout=5)
    assert kinds == ["offline", "online"], kinds
    offline = next(e for e in subscriber.events if e["kind"] == "offline")
    assert offline.get("reason"), offline
    subscriber.close()
    conn.close()


def test_a_probe_success_renews_nobodys_offline_window(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp, PROBE)
    d.start()
    name = ok(login(d))["person"]["name"]
    before = connectivity(d)
    mine = before["people"][0]
    contact = person(d, name)["lastOnlineContactAt"]
    # Several probes succeed: the terminal's last answer moves on ...
    wait_until(lambda: connectivity(d)["lastContactAt"] > before["lastContactAt"], NOTICE + 3,
               message="a probe answered")
    time.sleep(INTERVAL * 2)
    after = connectivity(d)
    assert after["state"] == "online" and after["lastContactAt"] > before["lastContactAt"]
    # ... but hers does not, and her window keeps closing.
    assert after["people"][0]["lastContactAt"] == mine["lastContactAt"]
    assert person(d, name)["lastOnlineContactAt"] == contact
    assert after["people"][0]["windowSecondsLeft"] <= mine["windowSecondsLeft"] - INTERVAL * 2
    # Nothing refreshed her tokens meanwhile (the IdP issued one refresh token: the login's).
    with sqlite3.connect(idp.state_dir / "idp.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM oauth2_provider_refreshtoken").fetchone() == (1,)


def test_the_per_person_list_only_when_asked_and_only_to_admins(make_daemon, unix_user):
    """Root (a greeter, a kiosk app) needs only the aggregate; the names and windows of everyone
    go to admins who ask (kioskauthctl status); anyone else asking sees only their own person."""
    noor = ("noor@clinic.example", "pw-noor", "coordinator", "nurses")
    server = IdentityServer(access_seconds=3600, refresh_seconds=7200, users=(SARAH, noor))
    try:
        d, _ = make_identity_daemon(make_daemon, server)
        d.start()
        sarah = ok(login(d))["person"]["name"]
        noor_name = ok(login(d, noor[0], noor[1]))["person"]["name"]
        ensure_group("kioskauth")
        ensure_group("kioskauth-admin")
        admin, _ = unix_user()
        own, own_uid = unix_user()
        stranger, _ = unix_user()
        assert d.ctl("user", "set", noor_name, "--uid", str(own_uid)).returncode == 0
        everyone = {sarah, noor_name}
        counts = {"open": 2, "expired": 0, "clockWentBackwards": 0, "suspended": 0, "never": 0}

        def ask(people, user=None, groups=None):
            parameters = {"people": True} if people else None
            return ok(d.call("io.kioskauth.GetConnectivity", parameters, user=user, groups=groups))

        callers = {  # (user, groups): (names listed when asked, aggregate)
            "root": ((None, None), everyone, counts),
            "admin": ((admin, ["kioskauth-admin"]), everyone, counts),
            "kioskauth": (("nobody", ["kioskauth"]), set(), counts),
            "own": ((own, None), {noor_name}, None),
            "stranger": ((stranger, None), set(), None),
        }
        for caller, ((user, groups), listed, aggregate) in callers.items():
            quiet = ask(False, user, groups)
            assert quiet["people"] == [], (caller, quiet)
            assert quiet.get("windows") == aggregate, (caller, quiet)
            assert quiet["identityProvider"] is True and quiet["state"] in ("online", "unknown"), caller
            asked = ask(True, user, groups)
            assert {p["name"] for p in asked["people"]} == listed, (caller, asked)
            assert asked.get("windows") == aggregate, (caller, asked)
        # kioskauthctl status asks: an admin sees everyone's window.
        status = d.ctl("status")
        assert status.returncode == 0, status.stderr
        assert f"  {sarah}: offline window open" in status.stdout
        assert f"  {noor_name}: offline window open" in status.stdout
    finally:
        server.close()
