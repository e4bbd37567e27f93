"""What the binaries cost to load (issue #15's footprint): the admin CLI and the daemon run on
FoundationEssentials, so neither the full Foundation nor ICU (~30 MB of data and code) is mapped
into them, and the daemon's HTTP client (async-http-client, BoringSSL inside the binary) brings no
libcurl and none of what libcurl links (gnutls, Kerberos, LDAP). `bench/rss_breakdown.py` measures
the daemon's mappings and threads."""

import json
import re
import subprocess
import time
from pathlib import Path

from elf_residency import binary_sections, mapped
from idp_testing import wait_until
from kioskauth_testing import KIOSKAUTHCTL, KIOSKAUTHD
from test_audit_delivery import delivery, make_delivery_daemon

# Foundation proper, its internationalisation layer and ICU; FoundationEssentials is fine.
HEAVY = re.compile(r"libFoundation\.so|libFoundationInternationalization|_FoundationICU|libicu|libFoundationNetworking")


# What URLSession brought into the daemon: FoundationNetworking, libcurl and the libraries libcurl
# links (TLS from gnutls, Kerberos, LDAP, SASL, SSH, RTMP).
HTTP_STACK = re.compile(r"libFoundationNetworking|libcurl|libgnutls|libkrb5|libgssapi|libldap|liblber|libsasl|"
                        r"libssh2|librtmp")


# Foundation proper comes with postgres-nio, the fleet directory's client; the daemon reaches the
# directory only through the fleet helper, kioskauth-fleet (docs/fleet.md §9.11), which links it. So
# no module linked into kioskauthd imports Foundation, and none links postgres-nio; the helper does.
FOUNDATION_IMPORT = re.compile(r"^\s*(?:@_exported\s+|@preconcurrency\s+)*(?:public |package |internal )?import\s+"
                               r"(?:(?:struct|class|enum|func|var|let|protocol)\s+)?"
                               r"(Foundation|FoundationInternationalization|FoundationNetworking)\b", re.M)
SOURCES = Path(__file__).resolve().parent.parent / "Sources"


def package_targets() -> dict:
    described = subprocess.run(["swift", "package", "describe", "--type", "json"], cwd=SOURCES.parent,
                               capture_output=True, text=True, check=True, timeout=300)
    return {target["name"]: target for target in json.loads(described.stdout)["targets"]}


def closure(targets: dict, product: str) -> tuple[set[str], set[str]]:
    """The package's own targets `product` is built from, and the products of other packages
    they name."""
    modules, products, todo = set(), set(), [product]
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        modules.add(name)
        todo.extend(targets[name].get("target_dependencies", []))
        products.update(targets[name].get("product_dependencies", []))
    return modules, products


def importing_foundation(modules: set[str]) -> dict[str, list[str]]:
    found = {}
    for module in sorted(modules):
        for path in sorted((SOURCES / module).rglob("*.swift")):
            if FOUNDATION_IMPORT.search(path.read_text()):
                found.setdefault(module, []).append(path.name)
    return found


def test_no_module_of_the_daemon_imports_foundation_or_links_the_directory_client():
    targets = package_targets()
    modules, products = closure(targets, "kioskauthd")
    assert {"KioskAuthDaemon", "KioskAuthFleet", "KioskAuthStore"} <= modules, modules
    assert "KioskAuthFleetDirectory" not in modules
    assert "PostgresNIO" not in products, products
    assert importing_foundation(modules) == {}
    # The helper is where they went, and the check finds them there.
    helper_modules, helper_products = closure(targets, "kioskauth-fleet")
    assert "KioskAuthFleetDirectory" in helper_modules and "PostgresNIO" in helper_products
    assert "KioskAuthFleetDirectory" in importing_foundation(helper_modules)


def needed(binary) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_kioskauthctl_maps_neither_foundation_nor_icu():
    heavy = [lib for lib in needed(KIOSKAUTHCTL) if HEAVY.search(lib)]
    assert heavy == [], heavy


def test_kioskauthctl_still_starts_and_formats_without_them(daemon):
    version = subprocess.run([str(KIOSKAUTHCTL), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()
    # The widest display name has characters outside the BMP: columns are padded by characters
    # (NSString's padding counted UTF-16 units and cut the last emoji off).
    wide = "Sarah Quinn-Ashworth \U0001F642\U0001F642"
    added = daemon.ctl("user", "add", "sarah", "--display-name", wide)
    assert added.returncode == 0, added.stderr
    assert daemon.ctl("user", "add", "omar").returncode == 0
    listing = daemon.ctl("user", "list")
    assert listing.returncode == 0, listing.stderr
    assert wide in listing.stdout, listing.stdout
    rows = [line for line in listing.stdout.splitlines() if line.strip()]
    # Every row's third column (ROLES) starts at the same character.
    starts = {len(re.match(r"\S+\s+.*?\s{2,}", row).group(0)) for row in rows}
    assert len(starts) == 1, listing.stdout


# The daemon's idle threads with its default configuration (fingerprints enabled): the main
# thread, the socket's one event loop, the GLib thread libfprint runs on and the two USB event
# threads libfprint's GUsb and libusb keep. No hashing thread until a passcode is checked, and
# none once the last hash has been idle a while; no sweep or verification thread left behind.
IDLE_THREADS = sorted(["kioskauthd", "NIO-ELT-1-#1", "fprint-glib", "GUsbEventThread", "libusb_event"])
# libdispatch's own workers (Swift concurrency's global executor and serial queues), named after
# their queue ("com.apple.root.default-qos", cut to 15 bytes): they come and go with work.
DISPATCH = re.compile(r"qos")
MAX_DISPATCH_IDLE = 3


def thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            pass  # the thread ended between listing and reading
    return sorted(names)


def settled_threads(pid: int, patience: float = 30.0) -> list[str]:
    """The threads once libdispatch's idle workers have gone (they leave after a few seconds)."""
    deadline = time.monotonic() + patience
    names = thread_names(pid)
    while sum(1 for n in names if DISPATCH.search(n)) > MAX_DISPATCH_IDLE and time.monotonic() < deadline:
        time.sleep(0.5)
        names = thread_names(pid)
    return names


def test_idle_threads_of_the_default_configuration_are_few_and_named(make_daemon):
    d = make_daemon(config="").start()
    names = settled_threads(d.proc.pid)
    own = sorted(n for n in names if not DISPATCH.search(n))
    assert own == IDLE_THREADS, names
    assert len(names) <= len(IDLE_THREADS) + MAX_DISPATCH_IDLE, names


def test_a_hashing_thread_starts_with_the_first_passcode_check(daemon):
    assert not any(n.startswith("argon2") for n in thread_names(daemon.proc.pid))
    assert daemon.ctl("user", "add", "sarah").returncode == 0
    r = daemon.call("io.kioskauth.SetPasscode", {"name": "sarah", "passcode": "482913", "confirmation": "482913"})
    assert "error" not in r, r
    # The worker that hashed it waits for more work for a while before it exits.
    assert any(n.startswith("argon2") for n in thread_names(daemon.proc.pid))


# The HTTP stack of FoundationNetworking, curl, gnutls, krb5 and LDAP stays out of the daemon.
def test_kioskauthd_needs_no_curl_gnutls_krb5_or_ldap():
    heavy = [lib for lib in needed(KIOSKAUTHD) if HTTP_STACK.search(lib)]
    assert heavy == [], heavy


def test_the_running_daemon_maps_no_curl_gnutls_krb5_or_ldap_after_using_http(make_daemon):
    # Audit delivery to a closed port: the HTTP client has made (and failed) a connection by the
    # time the status shows the error, so whatever it loads on first use is loaded.
    closed = socket_port_nobody_listens_on()
    d = make_delivery_daemon(make_daemon, f"http://127.0.0.1:{closed}/v1/audit").start()
    assert d.ctl("user", "add", "omar").returncode == 0
    wait_until(lambda: delivery(d).get("lastError"), 15, message="a delivery attempt")
    files = mapped(d.proc.pid)
    heavy = sorted(f for f in files if HTTP_STACK.search(f))
    assert heavy == [], heavy


def socket_port_nobody_listens_on() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_daemon_keeps_its_unwind_tables_out_of_memory(daemon):
    """Nothing in a serving daemon unwinds its stack, so its unwind tables (.eh_frame_hdr and
    .eh_frame: 6.5 MB in the package's kioskauthd) stay on disk. An async `main` put a megabyte of
    them in memory at every start: it hands the main thread to `dispatch_main`, which ends it with
    `pthread_exit`, and that unwinds the thread's stack through them."""
    pid = daemon.proc.pid
    assert "error" not in daemon.call("io.kioskauth.GetStatus")
    resident = binary_sections(pid, str(KIOSKAUTHD))
    assert resident is not None, "/proc/PID/pagemap cannot be read"
    unwind = sum(resident.get(name, (0, 0))[0] for name in (".eh_frame_hdr", ".eh_frame"))
    assert unwind < 128, f"{unwind} KiB of the unwind tables resident"
