"""A person becomes a Unix account only by binding (issue #11 items 1 and 12, issue #12).

The attacks of the security review, replayed: a kioskauth-admin member (not root) binding a
person called root to their own uid; a person whose name became a Unix account after they were
bound to another uid; su and gdm-password into an account that is not the person's; an identity
provider address "!secu1@..." turned into the Unix account secu1. And remote detection through
logind where PAM_RHOST is empty (su or sudo inside an SSH login).

Unix accounts are made here with useradd (and removed after); su is run as su runs, with the
invoking user as real uid and root as effective uid (setpriv --ruid), so the daemon's peer is root.
"""

import subprocess
import uuid

import pytest

from idp_testing import IdentityServer, login, ok
from kioskauth_testing import ensure_group
from pam_support import PAM_AUTH_ERR, PAM_PERM_DENIED, PAM_SUCCESS, Client
from test_pam import PASSCODE, add_person, audit, call, module, pam, person, start, unix_user  # noqa: F401 (fixtures)
import test_pam_idp

NOT_THIS_ACCOUNT = "Not allowed on this account."


def error(reply):
    return reply.get("error", "").removeprefix("io.kioskauth.")


def su(pam, d, target, invoking_uid, service="su"):
    """`su target` by the user with `invoking_uid`: real uid theirs, effective uid root."""
    pam.kioskauth(service, d.socket, "mode=passcode")
    c = Client(pam, service, target, "authenticate", "acct_mgmt",
               run_as=["setpriv", f"--ruid={invoking_uid}", "--"])
    c.send(PASSCODE)
    return c


def test_an_admin_who_is_not_root_cannot_bind_root_system_uids_or_other_accounts(make_daemon, unix_user):
    ensure_group("kioskauth-admin")  # before the daemon starts: it looks its groups up then
    d, _ = start(make_daemon)
    admin, admin_uid = unix_user()
    other, other_uid = unix_user()

    def add(name, uid=None):
        parameters = {"name": name} if uid is None else {"name": name, "uid": uid}
        return d.call("io.kioskauth.AddPerson", parameters, user=admin, groups=["kioskauth-admin"])

    # The review's reproduction, through the CLI.
    r = d.ctl("user", "add", "root", "--uid", str(admin_uid), user=admin, groups=["kioskauth-admin"])
    assert r.returncode != 0
    assert "cannot bind root: root is a Unix account (uid 0)" in r.stderr
    for name, uid in [("root", admin_uid), ("root", 0), ("root", None), ("mallory", 0), ("mallory", 1),
                      ("mallory", 999), (other, None), (other, admin_uid), ("idp-0123456789ab", None)]:
        reply = add(name, uid)
        assert error(reply) == "BindingRefused", (name, uid, reply)
        assert reply["parameters"]["name"] == name
    names = [p["name"] for p in call(d, "ListPeople")["parameters"]["people"]]
    assert names == []
    refused = [e for e in audit(d, "person.add") if e["result"] == "refused"]
    assert len(refused) == 10 and all(e["callerUid"] == admin_uid for e in refused)
    assert "Unix account (uid 0)" in refused[0]["detail"]
    # Root is held to the same rules.
    assert error(call(d, "AddPerson", {"name": "root", "uid": 0})) == "BindingRefused"
    # The account's own uid, or a name that is no account, binds.
    assert "error" not in add(other, other_uid)
    assert "error" not in add("mallory", admin_uid)
    assert person(d, other)["uid"] == other_uid and person(d, "mallory")["uid"] == admin_uid


def test_su_and_gdm_need_the_account_the_invoking_user_and_the_binding_to_agree(make_daemon, pam, unix_user):
    d, _ = start(make_daemon)
    alice, alice_uid = unix_user()
    carol, carol_uid = unix_user()
    add_person(d, alice, uid=alice_uid)
    # "late" is bound to carol's uid; an account of that name appears afterwards, with its own uid.
    late = f"kl{uuid.uuid4().hex[:8]}"
    add_person(d, late, uid=carol_uid)
    _, late_uid = unix_user(late)
    # An application identity: no Unix account of that name.
    add_person(d, "carer", uid=None)

    # su alice by alice: the account, the invoking user and the binding agree.
    assert [r["rc"] for r in su(pam, d, alice, alice_uid).results()] == [PAM_SUCCESS, PAM_SUCCESS]
    # su late by carol: the person is carol's and the invoking user is carol, but the account is
    # another uid. (Before: the su rule checked only that the real uid is the person's uid.)
    c = su(pam, d, late, carol_uid)
    assert [r["rc"] for r in c.results()] == [PAM_AUTH_ERR]
    assert ("error", NOT_THIS_ACCOUNT) in c.messages()
    # su alice by carol: the invoking user is not the target.
    c = su(pam, d, alice, carol_uid)
    assert c.results()[0]["rc"] != PAM_SUCCESS
    # A desktop login into late's account with late's passcode: refused too.
    pam.kioskauth("gdm-password", d.socket, "mode=passcode")
    c = Client(pam, "gdm-password", late, "authenticate", "acct_mgmt")
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] == [PAM_AUTH_ERR]
    assert ("error", NOT_THIS_ACCOUNT) in c.messages()
    # The application identity is no Unix login: unaffected.
    c = Client(pam, "gdm-password", "carer", "authenticate", "acct_mgmt")
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SUCCESS]

    refused = [e for e in audit(d, "passcode.verify") if e["result"] == "refused"]
    assert [(e["person"], e["service"]) for e in refused] == [(late, "su"), (alice, "su"), (late, "gdm-password")]
    assert f"bound to uid {carol_uid}, the account is uid {late_uid}" in refused[0]["detail"]
    # Nothing counted against anyone, and the account step refuses late as well.
    assert person(d, late)["passcodeFailures"] == 0
    reply = call(d, "CheckAccount", {"name": late, "context": {"service": "gdm-password", "targetUid": late_uid}})
    assert reply["parameters"]["allowed"] is False
    assert "not allowed on this account" in reply["parameters"]["reason"]


def test_a_uid_given_to_a_new_account_does_not_inherit_the_binding(make_daemon, pam, unix_user):
    """userdel frees a uid and useradd hands it to the next account: that account's processes are
    not the person bound to the old one, and the binding lets no login through until rebound."""
    d, _ = start(make_daemon)
    alice, uid = unix_user()
    add_person(d, alice, uid=uid)
    add_person(d, "carer", uid=None)
    own = {"name": alice}
    verify = {"name": alice, "passcode": PASSCODE}
    assert error(d.call("io.kioskauth.GetPerson", own, user=alice)) == ""
    assert error(d.call("io.kioskauth.VerifyPasscode", verify, user=alice)) == ""

    subprocess.run(["userdel", alice], check=True)
    mallory, mallory_uid = unix_user(f"km{uuid.uuid4().hex[:8]}")
    if mallory_uid != uid:  # useradd picked another uid: move mallory onto alice's old one
        subprocess.run(["usermod", "-u", str(uid), mallory], check=True)
    # The same uid, another account: nothing of alice's through the socket.
    assert error(d.call("io.kioskauth.GetPerson", own, user=mallory)) == "PermissionDenied"
    assert error(d.call("io.kioskauth.VerifyPasscode", verify, user=mallory)) == "PermissionDenied"
    shown = person(d, alice)
    assert shown.get("uid") is None
    assert f"account {alice}" in shown["staleBinding"] and mallory in shown["staleBinding"]
    r = d.ctl("user", "show", alice)
    assert "binding:       STALE" in r.stdout, r.stdout
    # Nor through PAM: su into mallory's account by mallory with alice's passcode.
    pam.kioskauth("su", d.socket, "mode=passcode")
    c = Client(pam, "su", alice, "authenticate", "acct_mgmt", run_as=["setpriv", f"--ruid={uid}", "--"])
    c.send(PASSCODE)
    assert c.results()[0]["rc"] != PAM_SUCCESS
    reply = call(d, "CheckAccount", {"name": alice, "context": {"service": "login", "targetUid": uid}})
    assert reply["parameters"]["allowed"] is False
    assert "an admin must bind again" in reply["parameters"]["reason"]

    # Binding again is an admin's decision, made knowing whose uid it is now.
    assert "error" not in call(d, "BindAccount", {"name": alice, "uid": uid})
    assert error(d.call("io.kioskauth.GetPerson", own, user=mallory)) == ""
    assert person(d, alice)["uid"] == uid and "staleBinding" not in person(d, alice)


BANG = ("!secu1@clinic.example", "pw-secu1", "caregiver", "nurses")


@pytest.fixture(scope="module")
def idp():
    server = IdentityServer(access_seconds=300, users=(BANG,))
    yield server
    server.close()


def test_an_identity_provider_address_never_becomes_a_unix_account(make_daemon, pam, idp, unix_user):
    unix_user("secu1")
    d, _, _ = test_pam_idp.start(make_daemon, idp, kind=None)
    name = ok(login(d, BANG[0], BANG[1]))["person"]["name"]
    assert name != "secu1" and name.startswith("idp-") and len(name) == 16
    assert person(d, name).get("uid") is None
    # gdm-password for the Unix account secu1, with the provider's password: never let in.
    pam.kioskauth("gdm-password", d.socket)
    c = Client(pam, "gdm-password", "secu1", "authenticate", "acct_mgmt")
    for answer in (BANG[0], BANG[1], BANG[1]):
        c.send(answer)
    results = c.results()
    assert results[0]["rc"] != PAM_SUCCESS, c.transcript
    assert all(e["person"] != "secu1" for e in audit(d, "idp.login"))


def test_only_admins_bind_people_under_the_same_rules_and_it_is_audited(make_daemon, pam, idp, unix_user):
    ensure_group("kioskauth")
    ensure_group("kioskauth-admin")
    d, _, _ = test_pam_idp.start(make_daemon, idp, kind=None)
    name = ok(login(d, BANG[0], BANG[1]))["person"]["name"]
    kiosk, kiosk_uid = unix_user()
    admin, _ = unix_user()
    # Neither the person's own kiosk-app group nor a stranger may bind.
    for groups in (["kioskauth"], []):
        r = d.ctl("user", "set", name, "--uid", str(kiosk_uid), user=kiosk, groups=groups)
        assert r.returncode != 0 and "permission denied" in r.stderr
    # Admins are held to the binding rules.
    for uid in ("0", "999"):
        r = d.ctl("user", "set", name, "--uid", uid, user=admin, groups=["kioskauth-admin"])
        assert r.returncode != 0 and f"cannot bind {name}" in r.stderr
    r = d.ctl("user", "set", name, "--uid", str(kiosk_uid), user=admin, groups=["kioskauth-admin"])
    assert r.returncode == 0, r.stderr
    assert person(d, name)["uid"] == kiosk_uid
    # A uid binds one person.
    add_person(d, "other")
    assert error(call(d, "BindAccount", {"name": "other", "uid": kiosk_uid})) == "PersonExists"
    assert d.ctl("user", "set", name, "--unbind", user=admin, groups=["kioskauth-admin"]).returncode == 0
    assert person(d, name).get("uid") is None
    events = [(e["result"], e.get("detail")) for e in audit(d, "person.bind")]
    # The kiosk-app group's refusal and the admin's two are entries of their own; the stranger's
    # (an unprivileged caller) goes into that uid's refusal summary (access.refused.summary).
    assert [r for r, _ in events] == ["refused"] * 3 + ["success", "failure", "success"]
    assert events[3][1] == f"uid none -> {kiosk_uid}" and events[5][1] == f"uid {kiosk_uid} -> none"


# Remote detection through logind -------------------------------------------------------------------

# No logind runs here (PID 1 is not systemd). The real libsystemd calls are driven as they are on
# a systemd machine: sd_pid_get_session() reads the client's cgroup from /proc/PID/cgroup and takes
# the session from its ".../session-ID.scope" path; sd_session_is_remote() reads REMOTE= from
# /run/systemd/sessions/ID. In a private mount namespace (unshare -m) the client moves itself into
# a cgroup-v2 group named like a logind session scope, and a tmpfs over /run/systemd carries the
# session file. Nothing outside the namespace sees the tmpfs; the cgroup is removed afterwards.
SESSION = "kb77"
SCOPE = f"user.slice/user-4242.slice/session-{SESSION}.scope"
IN_SESSION = f"""set -e
cg=$(mktemp -d)
mount -t cgroup2 none "$cg"
mkdir -p "$cg/{SCOPE}"
echo $$ > "$cg/{SCOPE}/cgroup.procs"
umount "$cg"
mount -t tmpfs tmpfs /run/systemd
mkdir /run/systemd/sessions
printf 'REMOTE=%s\\nTYPE=tty\\nSERVICE=sshd\\n' "$REMOTE" > /run/systemd/sessions/{SESSION}
exec "$@"
"""


def in_logind_session(remote):
    return ["env", f"REMOTE={remote}", "unshare", "-m", "sh", "-c", IN_SESSION, "sh"]


@pytest.fixture
def session_cgroup():
    yield
    subprocess.run(["unshare", "-m", "sh", "-c",
                    f'cg=$(mktemp -d) && mount -t cgroup2 none "$cg" && rmdir "$cg/{SCOPE}" '
                    f'"$cg/user.slice/user-4242.slice" "$cg/user.slice" 2>/dev/null; umount "$cg"; rmdir "$cg"'])


def test_a_session_logind_calls_remote_is_remote_without_a_remote_host(make_daemon, pam, session_cgroup):
    d, _ = start(make_daemon)
    add_person(d, "carer")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    # A login inside an SSH session (as su or sudo there): PAM_RHOST is empty, logind knows the
    # session is remote.
    c = Client(pam, "kioskauth", "carer", "authenticate", run_as=in_logind_session(1))
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] != [PAM_SUCCESS], c.transcript
    [refused] = [e for e in audit(d, "passcode.verify") if e["result"] == "refused"]
    assert refused["detail"] == "passcodes are not accepted over remote sessions; logind: remote"
    # The same in a local session goes ahead, and the audit says what logind said.
    c = Client(pam, "kioskauth", "carer", "authenticate", run_as=in_logind_session(0))
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS], c.transcript
    # Without logind (this machine as it is): PAM_RHOST alone decides, and the audit says so.
    c = Client(pam, "kioskauth", "carer", "authenticate")
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]
    successes = [e["detail"] for e in audit(d, "passcode.verify") if e["result"] == "success"]
    assert successes[0] == "logind: local"
    assert successes[1].startswith("logind: unavailable: ")
