"""Reading recordings back, defensively: a recording is untrusted input.

A recording may be cut short by a crash, hand-edited, corrupted on disk, huge, or not a
recording at all (``otelgpu report /dev/zero``). :func:`read_recording` yields every
readable ``Export*ServiceRequest`` and skips (and counts) everything else: a line that is
not UTF-8, not JSON, not a JSON object (``null``), not OTLP, nested too deeply or longer
than ``max_line_bytes``. Reads are bounded: one line is never held beyond
``max_line_bytes``, a stream that yields ``max_garbage_bytes`` in a row without one
readable line is abandoned, and character or block devices and directories are refused
with :class:`~otelgpu.errors.CorruptDataError` before anything is read.

This module is the one reader every consumer of recordings uses (``otelgpu report`` and
the report packages built on it).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelgpu.errors import CorruptDataError
from otelgpu.otel.otlp_ids import ids_to_base64

#: Longest line read (bytes). otelgpu writes one export request per line; a metric export of
#: 1,000 series times a few dozen metrics is a few MiB.
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Unreadable bytes in a row after which a stream is abandoned as "not a recording".
MAX_GARBAGE_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 20
_KINDS = (
    ("resourceSpans", ExportTraceServiceRequest),
    ("resourceMetrics", ExportMetricsServiceRequest),
    ("resourceLogs", ExportLogsServiceRequest),
)


@dataclass
class ReadStats:
    """What one or more :func:`read_recording` calls read and skipped."""

    messages: int = 0
    skipped_lines: int = 0
    #: Why reading a file stopped early (one entry per such file), e.g. endless garbage.
    abandoned: list[str] | None = None

    def note_abandoned(self, reason: str) -> None:
        if self.abandoned is None:
            self.abandoned = []
        self.abandoned.append(reason)


def parse_line(line: bytes) -> Message | None:
    """The export request on one line, or ``None`` if the line is not one. Never raises."""
    try:
        data = json.loads(line.decode("utf-8"))
        if not isinstance(data, dict):
            return None
        for key, cls in _KINDS:
            if key in data:
                message = cls()
                json_format.ParseDict(ids_to_base64(data), message)
                return message
    except Exception:  # noqa: BLE001 - untrusted input: any failure means "not a message"
        return None
    return None


def _refuse_devices(path: str | os.PathLike[str]) -> None:
    st = os.stat(path)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        raise CorruptDataError(
            f"{os.fspath(path)} is not a recording file (a device or directory); "
            "give an OTLP JSON-lines file"
        )


def _lines(f: BinaryIO, max_line_bytes: int, max_skip: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, size)`` for each line of ``f``; ``line`` is ``None`` for a line longer than
    ``max_line_bytes`` (its rest is read in chunks and dropped, never held, for at most
    ``max_skip`` bytes)."""
    while True:
        line = f.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) <= max_line_bytes or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while size < max_skip:  # an over-long line: skip to its end
            rest = f.readline(_CHUNK)
            size += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield None, size


def read_recording(
    path: str | os.PathLike[str],
    *,
    stats: ReadStats | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_garbage_bytes: int = MAX_GARBAGE_BYTES,
) -> Iterator[Message]:
    """Yield the ``Export*ServiceRequest`` messages of one recording file, in order.

    Unreadable lines are skipped and counted in ``stats``. Raises ``OSError`` if the file
    cannot be opened and ``CorruptDataError`` for a device or directory.
    """
    stats = stats if stats is not None else ReadStats()
    _refuse_devices(path)
    garbage = 0
    with open(path, "rb") as f:
        for line, size in _lines(f, max_line_bytes, max_garbage_bytes):
            message = parse_line(line) if line is not None else None
            if message is None:
                if line is None or line.strip():
                    stats.skipped_lines += 1
                garbage += size
                if garbage >= max_garbage_bytes:
                    stats.note_abandoned(
                        f"{os.fspath(path)}: stopped after {garbage >> 20} MiB without a "
                        "readable OTLP line (not a recording?)"
                    )
                    return
                continue
            garbage = 0
            stats.messages += 1
            yield message
