"""The versioned baseline file (JSON; format documented in ``docs/baseline.md``).

``BaselineFile.save`` / ``load`` round-trip it; ``load`` refuses another format or a
newer version with a ``ValueError`` naming the file. Not thread-safe (plain data).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FORMAT", "VERSION", "BaselineFile", "Entry", "load"]

FORMAT = "otelgpu-baseline"
VERSION = 2


@dataclass
class Entry:
    """One figure for one key (``labels``): the history's statistics and the threshold."""

    figure: str
    family: str
    labels: dict[str, str]
    unit: str
    direction: str
    samples: int
    coverage: float
    median: float
    p1: float
    p99: float
    reference: float  # p99 (upper figures) or p1 (lower figures)
    margin: float
    relative: bool
    threshold: float
    #: Relative error bound of ``reference`` when it is a quantile of merged histogram
    #: buckets (the bucket's relative width; see ``otelgpu.baseline.merge``); ``None``
    #: for figures learned from sampled values. Added in version 2.
    resolution: float | None = None


@dataclass
class BaselineFile:
    """A learned baseline: where it came from, the requirements it met, its entries.

    ``sketches``: figure id -> base64 ``QuantileSketch.to_bytes()`` of the exact merged
    distribution, where the source had one (recordings); the drift detectors use it.
    """

    source: dict[str, Any]
    requirements: dict[str, Any]
    entries: list[Entry]
    created: str = ""
    sketches: dict[str, str] = field(default_factory=dict)
    format: str = FORMAT
    version: int = VERSION

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2, sort_keys=True)
            f.write("\n")

    def entry(self, figure: str, labels: dict[str, str] | None = None) -> Entry | None:
        for e in self.entries:
            if e.figure == figure and (labels is None or e.labels == labels):
                return e
        return None

    def sketch(self, figure: str) -> Any:
        """The stored distribution of ``figure`` as a ``QuantileSketch``, or None."""
        data = self.sketches.get(figure)
        if data is None:
            return None
        from otelgpu.sketch import QuantileSketch

        return QuantileSketch.from_bytes(base64.b64decode(data))


def load(path: str | os.PathLike[str]) -> BaselineFile:
    """Read a baseline file; ``ValueError`` naming the file when it is not one we can read."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a baseline file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not an otelgpu baseline file (format != {FORMAT!r})")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise ValueError(
            f"{path}: baseline format version {doc.get('version')!r}; this otelgpu reads "
            f"versions <= {VERSION}"
        )
    try:
        entries = [Entry(**e) for e in doc["entries"]]
        return BaselineFile(
            source=dict(doc["source"]),
            requirements=dict(doc["requirements"]),
            entries=entries,
            created=str(doc.get("created", "")),
            sketches=dict(doc.get("sketches", {})),
            version=int(doc["version"]),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed baseline file: {exc}") from None
