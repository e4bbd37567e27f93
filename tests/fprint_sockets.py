"""Driving libfprint's own virtual readers from tests.

`virtual_device` / `virtual_device_storage` take text commands (`SCAN id`, `ERROR n`, `RETRY n`,
`UNPLUG`, `LIST`, ...), one per connection: write it, shut down writing, read to EOF.
`virtual_image` takes images: two native-endian int32 (width, height) and the grey pixels.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def virtual_env(kind: str, socket_path: Path) -> dict:
    """Environment that makes libfprint expose exactly one virtual reader of `kind`."""
    var = {"virtual_device": "FP_VIRTUAL_DEVICE", "virtual_device_storage": "FP_VIRTUAL_DEVICE_STORAGE",
           "virtual_image": "FP_VIRTUAL_IMAGE"}[kind]
    return {var: str(socket_path), "FP_DRIVERS_WHITELIST": kind, "FP_DRIVERS_ALLOWLIST": kind}


def _connect(path: Path, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def command(path: Path, text: str, timeout: float = 10.0) -> str:
    """Sends one command to virtual_device(_storage) and returns its answer."""
    s = _connect(path, timeout)
    s.settimeout(timeout)
    s.sendall(text.encode())
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.decode()


def scan(path: Path, finger_id: str) -> None:
    command(path, f"SCAN {finger_id}")


class ImageSensor:
    """A persistent connection to virtual_image; each image is one touch."""

    def __init__(self, path: Path, timeout: float = 10.0):
        self.sock = _connect(path, timeout)

    def touch(self, image: bytes, width: int, height: int) -> None:
        self.sock.sendall(struct.pack("=ii", width, height) + image)

    def close(self) -> None:
        self.sock.close()


def load_gray(path: Path) -> tuple[bytes, int, int]:
    """Reads a `NAME.WxH.gray` file."""
    width, height = (int(v) for v in path.name.split(".")[-2].split("x"))
    return path.read_bytes(), width, height


def nist_prints_dir() -> Path | None:
    """The NIST example prints: $KIOSKAUTH_TESTDATA/prints, else ../shared/testdata/prints."""
    candidates = []
    if os.environ.get("KIOSKAUTH_TESTDATA"):
        candidates.append(Path(os.environ["KIOSKAUTH_TESTDATA"]) / "prints")
    candidates.append(Path(__file__).resolve().parent.parent.parent / "shared" / "testdata" / "prints")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None
