"""The local recording: OTLP/JSON lines, as the OpenTelemetry Collector's file exporter writes.

Each line is one ``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest`` or
``ExportLogsServiceRequest`` in OTLP/JSON (lowerCamelCase keys, enums as integers,
64-bit integers as strings, trace and span ids as hex). Any OTLP tool that reads the
collector's ``file`` exporter output (e.g. the collector's ``otlpjsonfile`` receiver)
reads it. Spans and metrics are written straight from the SDK's data
(``otelgpu.otel.span_json``, ``otelgpu.otel.metric_json``), logs by
``opentelemetry-exporter-otlp-proto-common``'s encoder and protobuf's ``json_format``;
tests hold the first two to the latter's output, character for character.

The file is size-bounded: when a line would take it past ``max_bytes`` it is rotated to
``<path>.1`` (``.1`` → ``.2`` …, keeping ``backups`` old files). Writers share one
:class:`RecordingFile` (thread-safe, one lock per line).

Recordings carry model names, host names and request ids, so they are private: files are
created owner-only (0600) with ``O_EXCL | O_NOFOLLOW`` (a planted symlink or file is never
followed or appended to), a directory otelgpu creates is 0700, and the fallback in the shared
temporary directory is a per-user directory whose owner and mode are checked. Every process
adds files, so a directory holds at most ``dir_max_bytes`` of recordings: the oldest are
removed when a file is started or rotated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelgpu.otel.metric_json import metrics_line
from otelgpu.otel.otlp_ids import ids_to_hex

_log = logging.getLogger("otelgpu")

#: Names of recording files (current and rotated) that the directory cap counts.
RECORDING_GLOB = "*.otlp.jsonl*"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def _owned_private_dir(path: Path) -> bool:
    """Whether ``path`` is a real directory (not a symlink) owned by this user; make it 0700."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != _uid():
        return False
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError:
            return False
    return True


def private_temp_directory() -> Path:
    """This user's recording directory under the shared temporary directory (mode 0700).

    ``<tmp>/otelgpu-recordings-<uid>``; if that name is taken by anything but this user's
    own directory (another user's, a symlink, a file), a fresh ``mkdtemp`` directory.
    """
    base = Path(tempfile.gettempdir()) / f"otelgpu-recordings-{_uid()}"
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="otelgpu-recordings-"))
    if _owned_private_dir(base):
        return base
    _log.warning(
        "otelgpu: %s is not a private directory of this user; recording into a new one", base
    )
    return Path(tempfile.mkdtemp(prefix=f"otelgpu-recordings-{_uid()}-"))


def recording_directory(configured: Path) -> Path:
    """``configured`` if it exists or can be made (new directories 0700) and is writable,
    else :func:`private_temp_directory`."""
    try:
        configured.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.access(configured, os.W_OK):
            raise PermissionError(f"{configured} is not writable")
    except OSError as exc:
        fallback = private_temp_directory()
        _log.warning(
            "otelgpu: cannot record into %s (%s); recording into %s instead",
            configured,
            exc.strerror or exc,
            fallback,
        )
        return fallback
    return configured


def open_private(path: Path) -> Any:
    """Open ``path`` for appending, owner-only, never through a symlink.

    A new file is created exclusively with mode 0600. An existing one is appended to only
    if it is a regular file of this user with no other hard link (else ``PermissionError``),
    and is made 0600.
    """
    base = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, base | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, base)  # O_NOFOLLOW: a symlink raises OSError (ELOOP)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_nlink != 1:
            os.close(fd)
            raise PermissionError(f"{path} is not a private regular file of this user") from None
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")


def prune_directory(directory: Path, max_bytes: int, keep: Path) -> int:
    """Remove the oldest recording files in ``directory`` until they total ``<= max_bytes``.

    Only regular files of this user named like recordings count; ``keep`` (the file being
    written) is never removed. Returns the number of files removed. Never raises.
    """
    files = []
    try:
        for entry in os.scandir(directory):
            if not Path(entry.name).match(RECORDING_GLOB) or entry.path == str(keep):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == _uid():
                files.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        total += os.lstat(keep).st_size if os.path.lexists(keep) else 0
    except OSError:
        return 0
    removed = 0
    for _, size, name in sorted(files):
        if total <= max_bytes:
            break
        try:
            os.unlink(name)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def to_json_line(message: Message) -> str:
    """One OTLP/JSON line (no trailing newline) for an Export*ServiceRequest."""
    as_dict = json_format.MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(ids_to_hex(as_dict), separators=(",", ":"))


def metrics_json_line(metrics_data: MetricsData) -> str:
    """:func:`to_json_line` of ``encode_metrics(metrics_data)``, the same line character for
    character, written straight from the SDK's data one data point at a time with the GIL
    handed back once a slice is used (``otelgpu.otel.metric_json``): protobuf's JSON
    printer walks every field in Python, 30-40 ms for a collection over two GPUs."""
    return metrics_line(metrics_data)


def read_recording(path: str | os.PathLike[str]) -> Iterator[Message]:
    """Yield the Export*ServiceRequest messages of one recording file, in order.

    Unreadable lines are skipped; see :mod:`otelgpu.otel.recording_reader`, which does the
    reading (bounded, defensive) and can also count what it skipped.
    """
    from otelgpu.otel.recording_reader import read_recording as read

    return read(path)


class RecordingFile:
    """An append-only, size-rotated JSON-lines file (thread-safe).

    Rotation is best effort and never ends the recording: if the file was removed or
    renamed under us (a tmp cleaner, logrotate, a user), the rename is skipped and a new
    file is opened at ``path``; if it cannot be opened (directory gone, disk full), the
    write raises ``OSError`` (the exporter reports a failed export) and the next write
    tries to open it again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int,
        backups: int,
        dir_max_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._dir_max_bytes = dir_max_bytes
        self._lock = threading.Lock()
        self._closed = False
        self.lines_written = 0
        self.rotations = 0
        self.pruned = 0
        self._failing = False
        self._open()

    def write_line(self, line: str) -> None:
        data = line + "\n"
        size = len(data.encode("utf-8"))
        with self._lock:
            if self._closed:
                return
            if self._file.closed:  # a failed rotation or reopen: try again now
                self._open()
            try:
                if self._size and self._size + size > self._max_bytes:
                    self._rotate()
                self._file.write(data)
                self._file.flush()
            except OSError as exc:
                self._write_failed(exc)
                raise
            self._size += size
            self.lines_written += 1
            self._failing = False

    def _write_failed(self, exc: OSError) -> None:
        """A full disk, a file-size limit, a vanished directory: drop the buffered line (a
        later close() must not raise it into the host), say so once per failure streak."""
        with contextlib.suppress(OSError):
            self._file.close()  # the buffered line is flushed once more and then dropped
        if not self._failing:
            self._failing = True
            _log.warning(
                "otelgpu: cannot write the recording %s (%s); telemetry is dropped and counted "
                "until writing works again",
                self.path,
                exc.strerror or exc,
            )

    def _open(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._file = open_private(self.path)
        self._size = self._file.tell()
        if self._dir_max_bytes is not None:
            # room for this file to grow to its rotation size before the next check
            budget = max(self._dir_max_bytes - self._max_bytes, 0)
            self.pruned += prune_directory(self.path.parent, budget, self.path)

    def _rotate(self) -> None:
        self._file.close()
        try:
            if self._backups == 0:
                self.path.unlink(missing_ok=True)
            else:
                for n in range(self._backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{n}")
                    if older.exists():
                        older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
                if self.path.exists():
                    self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        except OSError:
            pass  # keep recording into a fresh file rather than stop (see the class doc)
        self.rotations += 1
        self._open()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._file.closed:
                with contextlib.suppress(OSError):  # a full disk: never raise from shutdown()
                    self._file.close()


class RecordingSpanExporter(SpanExporter):
    """Writes each batch of spans as one ExportTraceServiceRequest line."""

    def __init__(self, recording: RecordingFile) -> None:
        self._recording = recording

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._recording.write_line(to_json_line(encode_spans(spans)))
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        # The file is shared with the metric exporter; its owner (the runtime) closes it.
        return None


class RecordingMetricExporter(MetricExporter):
    """Writes each collection as one ExportMetricsServiceRequest line."""

    def __init__(self, recording: RecordingFile, preferred_temporality: Any = None) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._recording = recording

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            self._recording.write_line(metrics_json_line(metrics_data))
        except (OSError, ValueError):
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None
