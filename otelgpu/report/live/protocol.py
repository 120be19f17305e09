"""The live-snapshot protocol ``otelgpu.live/1`` (read-only, local, owner-only).

* Where: a Unix stream socket ``<dir>/<pid>.sock``. ``<dir>`` is the ``live_dir`` setting
  (``OTELGPU_LIVE_DIR``), else ``$XDG_RUNTIME_DIR/otelgpu``, else ``/tmp/otelgpu-<uid>``.
  The directory is created with mode 0700 and *refused* when it is not a directory owned
  by the current user or when group/others have any access (a directory pre-created by
  another user in ``/tmp`` cannot capture our snapshots or feed us fake ones). The socket
  is created 0600. Nothing binds to a network address.
* What: a client connects and reads; the server writes one JSON document (UTF-8, one
  line, at most :data:`MAX_BYTES`) and closes. The server reads nothing from the client,
  so the socket cannot change anything in the process. The server also checks the peer's
  uid (``SO_PEERCRED``) and closes connections from other users.
* Document: ``{"protocol": "otelgpu.live/1", "pid", "service", "time_unix_nano",
  "started_unix_nano", "train": {...}|null, "inference": {...}|null, "gpus": [...],
  "events": [...]}`` -- see :func:`otelgpu.report.live.provider.snapshot`. Unknown keys
  must be ignored by clients (fields are added without a version change).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

PROTOCOL = "otelgpu.live/1"
MAX_BYTES = 4 * 1024 * 1024
SUFFIX = ".sock"


def default_dir() -> Path:
    """The per-user directory of live sockets (not created)."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isdir(runtime_dir):
        return Path(runtime_dir) / "otelgpu"
    return Path("/tmp") / f"otelgpu-{os.getuid()}"


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (mode 0700) or check it; ``PermissionError`` if it is not private."""
    p = Path(path)
    with contextlib.suppress(FileExistsError):
        p.mkdir(mode=0o700, parents=True)
    info = os.lstat(p)
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{p} is not a directory")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{p} is owned by uid {info.st_uid}, not by this user")
    if info.st_mode & 0o077:
        raise PermissionError(
            f"{p} is accessible by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "the live view needs a 0700 directory"
        )
    return p


def socket_path(directory: str | os.PathLike[str], pid: int | None = None) -> Path:
    return Path(directory) / f"{pid if pid is not None else os.getpid()}{SUFFIX}"


def discover(directory: str | os.PathLike[str]) -> list[Path]:
    """Sockets in ``directory`` (sorted by pid); none when the directory is missing."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        if p.name.endswith(SUFFIX) and p.name[: -len(SUFFIX)].isdigit():
            try:
                if stat.S_ISSOCK(os.lstat(p).st_mode):
                    found.append(p)
            except OSError:
                continue
    return sorted(found, key=lambda p: int(p.name[: -len(SUFFIX)]))


def fetch(path: str | os.PathLike[str], timeout_s: float = 1.0) -> dict[str, Any]:
    """One snapshot from the socket at ``path``. Raises ``OSError`` or ``ValueError``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(os.fspath(path))
        chunks = []
        size = 0
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BYTES:
                raise ValueError(f"live snapshot from {path} exceeds {MAX_BYTES} bytes")
            chunks.append(chunk)
    doc = json.loads(b"".join(chunks).decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("protocol") != PROTOCOL:
        raise ValueError(f"{path} does not speak {PROTOCOL}")
    return doc


def encode(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
