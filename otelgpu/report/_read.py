"""The one place the report package reads recordings (OTLP JSON lines).

Everything in :mod:`otelgpu.report` goes through :func:`messages`, which delegates the
line reading to :func:`otelgpu.otel.recording.read_recording` -- so a hardening of that
reader (bad bytes, truncated lines, special files) applies to every report, comparison
and HTML page alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any


def messages(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Any]:
    """Yield the Export*ServiceRequest messages of every file in ``paths``, in order.

    Raises ``OSError`` when a file cannot be opened.
    """
    from otelgpu.otel.recording import read_recording

    for path in paths:
        yield from read_recording(path)
