"""docs/metrics-torch.md documents exactly the metrics and span attributes the code emits."""

from __future__ import annotations

import re
from pathlib import Path

from otelgpu.instrumentation.torch import _names as N

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics-torch.md"


def _metric_rows() -> dict[str, tuple[str, str, str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(otelgpu\.[^`]+)` \| (\w+) \| ([^|]+) \|([^|]*)\| (.+) \|$", line)
        if m:
            attrs = ",".join(re.findall(r"`([^`]+)`", m.group(4)))
            rows[m.group(1)] = (m.group(2), m.group(3).strip(), attrs, m.group(5).strip())
    return rows


def test_every_metric_documented_with_kind_unit_attributes() -> None:
    rows = _metric_rows()
    expected = {
        m.name: (m.kind, m.unit, ",".join(m.attributes), m.description) for m in N.TORCH_METRICS
    }
    assert rows == expected


def test_every_span_attribute_documented() -> None:
    text = DOC.read_text()
    for attr in (*N.SPAN_ATTRIBUTES, N.EVENT_OOM):
        assert f"`{attr}`" in text, attr
