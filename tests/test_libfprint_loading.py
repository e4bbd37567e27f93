"""libfprint is loaded by the reader's thread when the reader starts, not linked (issue #15, cold
start): the loader maps neither it nor GLib and the twenty-odd libraries beneath it before main().

* kioskauthd names no libfprint or GLib library among those it needs;
* a daemon with fingerprints turned off never maps them; one with a reader maps them and serves it;
* a libfprint the dynamic loader cannot load, or one that lacks a function kioskauth calls,
  leaves a daemon that says why once and serves passcodes, with fingerprint calls refused by name;
* the package asks for a libfprint with every function the loader resolves.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from elf_residency import mapped
from fprint_virtual import environment
from idp_testing import set_passcode
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHD

REPO = Path(__file__).resolve().parent.parent

FPRINT_TREE = re.compile(r"lib(fprint-2|glib-2\.0|gobject-2\.0|gio-2\.0|gusb|usb-1\.0|gudev)")


def mapped_libraries(pid: int) -> set[str]:
    return {Path(path).name for path in mapped(pid)}


def passcodes_work(d) -> None:
    assert d.ctl("user", "add", "sarah").returncode == 0
    set_passcode(d, "sarah")
    assert d.ctl("passcode", "verify", "sarah", input="482913\n").returncode == 0
    assert d.ctl("passcode", "verify", "sarah", input="000000\n").returncode != 0


def test_the_daemon_links_neither_libfprint_nor_glib():
    dynamic = subprocess.run(["readelf", "-d", KIOSKAUTHD], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", dynamic)
    assert needed, dynamic
    assert [library for library in needed if FPRINT_TREE.search(library)] == [], needed


def test_with_fingerprints_off_libfprint_is_never_mapped(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n").start()
    passcodes_work(d)
    mapped = mapped_libraries(d.proc.pid)
    assert any(library.startswith("libsqlite3.so") for library in mapped), mapped
    assert [library for library in mapped if FPRINT_TREE.search(library)] == [], mapped


def test_the_reader_loads_libfprint_and_is_served(make_daemon, tmp_path):
    d = make_daemon(config=FAST_HASH_CONFIG)
    sensor = tmp_path / "sensor.sock"
    d.extra_env.update(environment("virtual_device", sensor, base={}))
    d.start()
    assert any(library.startswith("libfprint-2.so") for library in mapped_libraries(d.proc.pid))
    readers = json.loads(d.ctl("reader", "--json").stdout)["readers"]
    assert [reader["driver"] for reader in readers] == ["virtual_device"]
    # Enrolment, verify and identify through the loaded library: test_fingerprint_e2e.py.


def broken_libfprint_daemon(make_daemon, directory: Path):
    d = make_daemon(config=FAST_HASH_CONFIG)
    d.extra_env["LD_LIBRARY_PATH"] = str(directory)
    return d.start()


def assert_passcodes_only(d, reason: str) -> None:
    log = d.log_text()
    lines = [line for line in log.splitlines() if "fingerprint support unavailable; passcodes only" in line]
    assert len(lines) == 1, log
    assert reason in lines[0], lines[0]
    assert json.loads(d.ctl("reader", "--json").stdout)["readers"] == []
    passcodes_work(d)
    assert d.call("io.kioskauth.EnrollFinger", {"name": "sarah"})["error"] == "io.kioskauth.NoReader"
    assert d.call("io.kioskauth.Identify", {})["error"] == "io.kioskauth.NoReader"


def test_a_libfprint_that_cannot_be_loaded_leaves_passcodes(make_daemon, tmp_path):
    # What the loader finds first by that name is not a library (a damaged or truncated file).
    (tmp_path / "libfprint-2.so.2").write_bytes(b"")
    d = broken_libfprint_daemon(make_daemon, tmp_path)
    assert_passcodes_only(d, "cannot load libfprint-2.so.2")
    assert not any(library.startswith("libglib-2.0") for library in mapped_libraries(d.proc.pid))


def test_a_libfprint_without_a_function_kioskauth_calls_is_not_used(make_daemon, tmp_path):
    # A library by that name with only some of the functions (an older or foreign build).
    source = tmp_path / "partial.c"
    source.write_text("void *fp_context_new(void) { return 0; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libfprint-2.so.2", "-o", tmp_path / "libfprint-2.so.2", source],
        check=True)
    d = broken_libfprint_daemon(make_daemon, tmp_path)
    assert_passcodes_only(d, "libfprint-2.so.2 has no function fp_context_enumerate")
    # Closed again: the library that failed is not left mapped.
    assert not any(library.startswith("libfprint-2.so") for library in mapped_libraries(d.proc.pid))


def symbols_minimum_versions() -> dict[str, str]:
    """Each libfprint function's first version, from its Debian package's symbols file."""
    files = sorted(Path("/var/lib/dpkg/info").glob("libfprint-2-2*.symbols"))
    assert files, "libfprint-2-2's symbols file is missing"
    versions = {}
    for line in files[0].read_text().splitlines():
        match = re.match(r"^ (\w+)@\S+ (\S+)", line)
        if match:
            versions[match.group(1)] = match.group(2)
    return versions


def test_the_package_asks_for_a_libfprint_with_every_function_the_loader_resolves():
    # dh_shlibdeps cannot see a library loaded at run time: debian/control names it, and this
    # keeps that version in step with the table in CFPrint.h.
    header = (REPO / "Sources/CFPrint/include/CFPrint.h").read_text()
    functions = re.findall(r"X\((fp_\w+)\)", header)
    assert len(functions) > 30, functions
    versions = symbols_minimum_versions()
    missing = [name for name in functions if name not in versions]
    assert missing == [], missing
    newest = "0"
    for name in functions:
        if subprocess.run(["dpkg", "--compare-versions", versions[name], "gt", newest]).returncode == 0:
            newest = versions[name]
    control = (REPO / "debian/control").read_text()
    declared = re.search(r"libfprint-2-2 \(>= ([^)]+)\)", control)
    assert declared, "debian/control does not name libfprint-2-2 with a version"
    compared = subprocess.run(["dpkg", "--compare-versions", declared.group(1), "ge", newest])
    assert compared.returncode == 0, f"debian/control asks for {declared.group(1)}, the table needs {newest}"
