"""The one place the report package reads recordings (OTLP JSON lines).

Everything in :mod:`otelgpu.report` goes through :func:`messages`, which delegates the
reading to :func:`otelgpu.otel.recording_reader.read_recording` -- the defensive reader
(bad bytes, truncated or huge lines, ``null`` lines, devices such as ``/dev/zero``) -- so
its guarantees hold for every report, comparison and HTML page alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from otelgpu.otel.recording_reader import ReadStats


def messages(
    paths: Iterable[str | os.PathLike[str]], stats: ReadStats | None = None
) -> Iterator[Any]:
    """Yield the Export*ServiceRequest messages of every file in ``paths``, in order.

    Unreadable lines are skipped and counted in ``stats``. Raises ``OSError`` when a file
    cannot be opened and ``CorruptDataError`` for a device or a directory.
    """
    from otelgpu.otel.recording_reader import read_recording

    for path in paths:
        yield from read_recording(path, stats=stats)
