"""Drive libfprint's virtual fingerprint readers from end-to-end tests.

libfprint ships three virtual drivers, each enabled by an environment variable naming a Unix
socket that the driver creates when the device is opened (so the socket appears once the daemon
has started its reader):

* ``virtual_device`` (``FP_VIRTUAL_DEVICE``): a verify-only reader. One text command per
  connection; the driver answers (``LIST``) and closes the connection once it has processed the
  command, so each command is sent only after the previous one has been read to EOF. Commands
  that concern a scan (``SCAN``, ``RETRY``, ``ERROR``, ``FINGER``, ``SLEEP``) queue up until the
  reader's next operation consumes them; ``UNPLUG`` and the ``SET_*`` commands act at once.
* ``virtual_device_storage`` (``FP_VIRTUAL_DEVICE_STORAGE``): the same protocol plus identify and
  on-sensor storage (``INSERT``, ``REMOVE``, ``LIST``).
* ``virtual_image`` (``FP_VIRTUAL_IMAGE``): an image sensor whose prints are matched by
  libfprint's NBIS code. One persistent connection (a new connection closes the previous one);
  each message is two native-endian int32 ``width, height`` followed by ``width * height`` grey
  bytes, or a negative first int32 for a control message. Send an enrolment image only after the
  previous enrolment progress report.

The drivers simulate overheating after a few minutes of cumulative use: give each test (group)
a fresh daemon. Only standard-library modules are used, so any Python can import this file.

Example::

    env = fprint_virtual.environment("virtual_device", tmp_path / "fp.sock")
    daemon = subprocess.Popen([...], env=env)
    device = fprint_virtual.VirtualDevice(env["FP_VIRTUAL_DEVICE"])
    device.wait_until_ready()
    device.scan("alice-right-index")   # the touch the next scan will see
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

# The environment variable naming each virtual driver's socket.
DRIVERS = {
    "virtual_device": "FP_VIRTUAL_DEVICE",
    "virtual_device_storage": "FP_VIRTUAL_DEVICE_STORAGE",
    "virtual_image": "FP_VIRTUAL_IMAGE",
}

# FpDeviceRetry codes (for RETRY / image retry messages).
RETRY_GENERAL = 0
RETRY_TOO_SHORT = 1
RETRY_CENTER_FINGER = 2
RETRY_REMOVE_FINGER = 3

# FpDeviceError codes (for ERROR / image error messages).
ERROR_GENERAL = 0
ERROR_NOT_SUPPORTED = 1
ERROR_NOT_OPEN = 2
ERROR_ALREADY_OPEN = 3
ERROR_BUSY = 4
ERROR_PROTO = 5
ERROR_DATA_INVALID = 6
ERROR_DATA_NOT_FOUND = 7
ERROR_DATA_FULL = 8
ERROR_DATA_DUPLICATE = 9
ERROR_REMOVED = 0x100
ERROR_TOO_HOT = 0x101

# Unix socket paths are limited to 107 bytes plus the terminating NUL.
MAX_SOCKET_PATH = 107
DEFAULT_TIMEOUT = 10.0


def environment(driver: str, socket_path: str | os.PathLike, base: dict | None = None) -> dict:
    """A copy of ``base`` (default: ``os.environ``) in which exactly ``driver`` is enabled.

    Sets the driver's socket variable, removes the other virtual drivers' variables, and
    allow-lists the driver under both names libfprint has used (``FP_DRIVERS_WHITELIST`` and
    ``FP_DRIVERS_ALLOWLIST``), so no real USB reader is picked up.
    """
    if driver not in DRIVERS:
        raise ValueError(f"unknown virtual driver {driver!r}; expected one of {sorted(DRIVERS)}")
    path = os.fspath(socket_path)
    _check_socket_path(path)
    env = dict(os.environ if base is None else base)
    for variable in (*DRIVERS.values(), "FP_VIRTUAL_DEVICE_STORAGE_NO_LIST"):
        env.pop(variable, None)
    env["FP_DRIVERS_WHITELIST"] = driver
    env["FP_DRIVERS_ALLOWLIST"] = driver
    env[DRIVERS[driver]] = path
    return env


def no_reader_environment(base: dict | None = None) -> dict:
    """A copy of ``base`` (default: ``os.environ``) in which libfprint finds no reader at all."""
    env = dict(os.environ if base is None else base)
    for variable in (*DRIVERS.values(), "FP_VIRTUAL_DEVICE_STORAGE_NO_LIST"):
        env.pop(variable, None)
    env["FP_DRIVERS_WHITELIST"] = "virtual_device"
    env["FP_DRIVERS_ALLOWLIST"] = "virtual_device"
    return env


def wait_for_socket(path: str | os.PathLike, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Waits until the driver has created its socket (the reader was opened).

    Only looks at the file: connecting would cost the image driver its current client.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"virtual reader socket {os.fspath(path)} did not appear within {timeout} s")
        time.sleep(0.02)


def _check_socket_path(path: str) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"socket path longer than {MAX_SOCKET_PATH} bytes: {path}")


class VirtualDevice:
    """The command socket of ``virtual_device`` / ``virtual_device_storage``."""

    def __init__(self, socket_path: str | os.PathLike, timeout: float = DEFAULT_TIMEOUT):
        self.path = os.fspath(socket_path)
        self.timeout = timeout
        _check_socket_path(self.path)

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Waits until the reader has been opened and its socket exists."""
        wait_for_socket(self.path, self.timeout if timeout is None else timeout)

    def send(self, command: str) -> str:
        """Sends one command and returns the driver's reply once it has processed it."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(self.timeout)
            connection.connect(self.path)
            connection.sendall(command.encode())
            connection.shutdown(socket.SHUT_WR)
            reply = bytearray()
            while chunk := connection.recv(4096):
                reply += chunk
        return reply.decode()

    # Touches and their failures; queued for the reader's next (or current) scan.
    def scan(self, finger_id: str) -> None:
        """A touch by the finger called ``finger_id`` (the virtual drivers match by this id)."""
        self._require_id(finger_id)
        self.send(f"SCAN {finger_id}")

    def retry(self, code: int = RETRY_GENERAL) -> None:
        """A touch rejected with an ``FpDeviceRetry`` code (e.g. ``RETRY_CENTER_FINGER``)."""
        self.send(f"RETRY {int(code)}")

    def error(self, code: int = ERROR_GENERAL) -> None:
        """The scan fails with an ``FpDeviceError`` code (e.g. ``ERROR_TOO_HOT``)."""
        self.send(f"ERROR {int(code)}")

    def finger(self, present: bool) -> None:
        """Reports a finger placed on (``True``) or lifted from the sensor."""
        self.send(f"FINGER {1 if present else 0}")

    def sleep(self, milliseconds: int) -> None:
        """The reader pauses this long before processing the commands queued after this one."""
        self.send(f"SLEEP {int(milliseconds)}")

    def cont(self, argument: str = "") -> None:
        """Lets a non-scan operation (list, delete, open, close) proceed without waiting."""
        self.send(f"CONT {argument}")

    # Immediate commands.
    def unplug(self) -> None:
        """Simulates pulling the reader out; a running scan ends with a "removed" error."""
        self.send("UNPLUG")

    def set_enroll_stages(self, stages: int) -> None:
        self.send(f"SET_ENROLL_STAGES {int(stages)}")

    def set_scan_type(self, scan_type: str) -> None:
        """``"press"`` or ``"swipe"``."""
        if scan_type not in ("press", "swipe"):
            raise ValueError("scan type must be 'press' or 'swipe'")
        self.send(f"SET_SCAN_TYPE {scan_type}")

    def set_cancellation_enabled(self, enabled: bool) -> None:
        self.send(f"SET_CANCELLATION_ENABLED {1 if enabled else 0}")

    def set_keep_alive(self, enabled: bool) -> None:
        self.send(f"SET_KEEP_ALIVE {1 if enabled else 0}")

    # On-sensor storage (virtual_device_storage).
    def stored_ids(self) -> set[str]:
        """The ids of the prints in the simulated sensor storage."""
        return {line for line in self.send("LIST").splitlines() if line}

    def insert(self, finger_id: str) -> None:
        """Puts a print on the sensor (processed when the reader next runs an operation)."""
        self._require_id(finger_id)
        self.send(f"INSERT {finger_id}")

    def remove(self, finger_id: str) -> None:
        """Removes a print from the sensor (processed when the reader next runs an operation)."""
        self._require_id(finger_id)
        self.send(f"REMOVE {finger_id}")

    @staticmethod
    def _require_id(finger_id: str) -> None:
        if not finger_id or any(character.isspace() for character in finger_id):
            raise ValueError(f"finger id must be non-empty and without whitespace: {finger_id!r}")


@dataclass(frozen=True)
class PrintImage:
    """A fingerprint as raw 8-bit grey pixels, row-major."""

    name: str
    width: int
    height: int
    pixels: bytes

    def __post_init__(self):
        if not (0 < self.width <= 5000 and 0 < self.height <= 5000):
            raise ValueError(f"implausible image size {self.width}x{self.height}")
        if len(self.pixels) != self.width * self.height:
            raise ValueError(f"{self.name}: {len(self.pixels)} bytes for {self.width}x{self.height}")

    @classmethod
    def load(cls, name: str, directory: str | os.PathLike | None = None) -> "PrintImage":
        """Loads ``NAME.WxH.gray`` (e.g. ``whorl-rot``) from ``directory`` or ``prints_directory()``."""
        folder = Path(directory) if directory is not None else prints_directory()
        matches = sorted(folder.glob(f"{name}.*x*.gray"))
        if not matches:
            raise FileNotFoundError(f"no print image {name!r} in {folder}")
        size = matches[0].name[len(name) + 1 : -len(".gray")]
        width, height = (int(part) for part in size.split("x"))
        return cls(name, width, height, matches[0].read_bytes())


def prints_directory() -> Path:
    """The NIST example prints: ``$KIOSKAUTH_TESTDATA/prints``, else the copy in the repository
    (``tests/data/prints``, see its README for provenance)."""
    candidates = []
    if root := os.environ.get("KIOSKAUTH_TESTDATA"):
        candidates.append(Path(root) / "prints")
    repository = Path(__file__).resolve().parent.parent
    candidates.append(repository / "tests" / "data" / "prints")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("NIST prints not found; set KIOSKAUTH_TESTDATA to the testdata directory")


class VirtualImage:
    """The image socket of ``virtual_image``: one persistent connection."""

    def __init__(self, socket_path: str | os.PathLike, timeout: float = DEFAULT_TIMEOUT):
        self.path = os.fspath(socket_path)
        self.timeout = timeout
        _check_socket_path(self.path)
        self._connection: socket.socket | None = None

    def __enter__(self) -> "VirtualImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Waits until the reader has been opened and its socket exists."""
        wait_for_socket(self.path, self.timeout if timeout is None else timeout)

    def connect(self) -> None:
        """Connects now (otherwise the first message connects). Replaces any other client."""
        if self._connection is None:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.settimeout(self.timeout)
            connection.connect(self.path)
            self._connection = connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _send(self, first: int, second: int, payload: bytes = b"") -> None:
        self.connect()
        self._connection.sendall(struct.pack("=ii", first, second) + payload)

    def send_image(self, image: PrintImage) -> None:
        """Presents ``image`` as one touch (the driver reports the finger on, then off)."""
        self._send(image.width, image.height, image.pixels)

    def send_print(self, name: str, directory: str | os.PathLike | None = None) -> PrintImage:
        """Loads the NIST print ``name`` and presents it; returns the image."""
        image = PrintImage.load(name, directory)
        self.send_image(image)
        return image

    def retry(self, code: int = RETRY_GENERAL) -> None:
        """The current touch is rejected with an ``FpDeviceRetry`` code."""
        self._send(-1, int(code))

    def error(self, code: int = ERROR_GENERAL) -> None:
        """The current operation fails with an ``FpDeviceError`` code."""
        self._send(-2, int(code))

    def automatic_finger(self, enabled: bool) -> None:
        """Whether each image implies finger-on before and finger-off after it (default on)."""
        self._send(-3, 1 if enabled else 0)

    def finger(self, present: bool) -> None:
        """Reports a finger placed on or lifted from the sensor."""
        self._send(-4, 1 if present else 0)

    def unplug(self) -> None:
        """Simulates pulling the reader out."""
        self._send(-5, 0)


def _selftest() -> None:  # pragma: no cover - run by hand with a Python that has gi (python3-gi)
    """Exercises the helpers against libfprint itself (no daemon): ``/usr/bin/python3 fprint_virtual.py``."""
    import tempfile
    import threading

    import gi

    gi.require_version("FPrint", "2.0")
    from gi.repository import FPrint, GLib

    def open_reader(driver: str, path: str):
        os.environ.clear()
        os.environ.update(environment(driver, path, saved))
        context = FPrint.Context()
        context.enumerate()
        devices = context.get_devices()
        assert len(devices) == 1 and devices[0].get_driver() == driver, devices
        devices[0].open_sync()
        return context, devices[0]

    def later(action, delay=0.2):
        threading.Timer(delay, action).start()

    def answered(query):
        # The driver answers from the GLib main loop, which only runs while this thread iterates it.
        result = []
        worker = threading.Thread(target=lambda: result.append(query()))
        worker.start()
        while worker.is_alive():
            GLib.MainContext.default().iteration(False)
            time.sleep(0.005)
        return result[0]

    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="fpv") as folder:
        path = os.path.join(folder, "device.sock")
        _, device = open_reader("virtual_device_storage", path)
        control = VirtualDevice(path)
        control.wait_until_ready()
        later(lambda: [control.scan("alice") for _ in range(device.get_nr_enroll_stages())])
        enrolled = device.enroll_sync(FPrint.Print.new(device), None, None, None)
        assert answered(control.stored_ids) == {"alice"}
        later(lambda: control.scan("alice"))
        assert device.verify_sync(enrolled)[0]
        later(lambda: control.retry(RETRY_CENTER_FINGER))
        try:
            device.verify_sync(enrolled)
            raise AssertionError("RETRY did not fail the scan")
        except GLib.Error as error:
            assert error.matches(FPrint.DeviceRetry.quark(), RETRY_CENTER_FINGER), error
        device.close_sync()

        path = os.path.join(folder, "image.sock")
        _, device = open_reader("virtual_image", path)
        with VirtualImage(path) as images:
            images.wait_until_ready()
            whorl = PrintImage.load("whorl")

            def progress(_device, stage, _print, _data, _error):
                if stage < device.get_nr_enroll_stages():
                    later(lambda: images.send_image(whorl))

            later(lambda: images.send_image(whorl))
            enrolled = device.enroll_sync(FPrint.Print.new(device), None, progress, None)
            later(lambda: images.send_print("whorl-rot"))
            assert device.verify_sync(enrolled)[0], "second impression did not match"
            later(lambda: images.send_print("whorl-mirror"))
            assert not device.verify_sync(enrolled)[0], "another finger matched"
        device.close_sync()
    os.environ.clear()
    os.environ.update(saved)
    print("fprint_virtual self-test passed")


if __name__ == "__main__":
    _selftest()


def scan(socket_path: str | os.PathLike, finger_id: str) -> None:
    """Touches virtual_device(_storage) at ``socket_path`` with finger ``finger_id``."""
    VirtualDevice(socket_path).scan(finger_id)
