"""docs/metrics.md documents every pipeline metric with the unit and kind in the code."""

from __future__ import annotations

import re
from pathlib import Path

from otelgpu.otel import gpu_context, names

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
KINDS = {"sketch": "sketch", "counter": "counter", "observable_counter": "counter",
         "observable_gauge": "gauge"}  # fmt: skip


def _section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## Training steps and inference requests")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_pipeline_metrics_table_matches_names() -> None:
    rows = re.findall(r"^\| `([a-z][\w.]+)` \| `([^`]+)` \| (\w+) \|", _section(), re.M)
    documented = {name: (unit, kind) for name, unit, kind in rows}
    in_code = {m.name: (m.unit, KINDS[m.kind]) for m in names.ALL}
    assert documented == in_code


def test_pipeline_gpu_context_attributes_documented() -> None:
    section = _section()
    for attribute, *_ in gpu_context._FIELDS:
        assert f"`{attribute}`" in section, attribute
