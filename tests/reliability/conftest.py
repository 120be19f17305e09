"""The reliability suite: probes that each do one hostile thing and record what happened.

Every test here asks for the ``probe`` fixture, does its thing against the real component
(the SDK's OTLP exporters on real sockets, the simulated NVML, real processes and signals)
and calls ``probe.result(held, figure)``. The row (area, probe, what was done, the figure,
held / failed) is written, when ``OTELGPU_RELIABILITY_OUT`` names a file, as JSON at the
end of the session; ``benchmarks/reliability_table.py`` renders ``docs/reliability.md``
from those files (``make reliability``; ``make soak`` for the long versions).

A probe is *asserted* by default: a failed row fails the test. A probe whose fix belongs
to an open issue is created with ``pending="..."``: it records its verdict (so the table
shows "failed" until the fix lands) without failing the suite; it is turned into an
assertion when the fix merges.

``OTELGPU_SOAK=1`` selects the long versions (60 s collector outage, 1,000,000 steps).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from reliability_support import SOAK

_ROWS: list[dict[str, Any]] = []


@dataclass
class Probe:
    """One row of the reliability table."""

    area: str
    name: str
    what: str
    pending: str | None = None
    figure: str = ""
    held: bool | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def result(self, held: bool, figure: str, **details: Any) -> None:
        """Record the verdict; fails the test when asserted and not held."""
        self.held, self.figure = bool(held), figure
        self.details.update(details)
        if not held and self.pending is None:
            pytest.fail(f"[{self.area}] {self.name}: FAILED — {figure}")


@pytest.fixture
def probe(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``probe(area, name, what, pending=None)`` -> :class:`Probe` (recorded at the end)."""
    made: list[Probe] = []
    start = time.monotonic()

    def make(area: str, name: str, what: str, pending: str | None = None) -> Probe:
        p = Probe(area, name, what, pending)
        made.append(p)
        return p

    yield make
    for p in made:
        row = asdict(p)
        row["seconds"] = round(time.monotonic() - start, 2)
        row["test"] = request.node.nodeid
        if p.held is None:  # the test raised before its verdict
            row["held"] = False
            row["figure"] = p.figure or "the probe itself failed (see the test log)"
        _ROWS.append(row)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("OTELGPU_RELIABILITY_OUT")
    if not out or not _ROWS:
        return
    from otelgpu import _impl

    doc = {
        "twin": "pure" if _impl.NO_EXTENSIONS else "native",
        "soak": SOAK,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        ),
        "rows": _ROWS,
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
