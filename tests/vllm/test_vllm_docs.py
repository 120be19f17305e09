"""docs/metrics-vllm.md lists every metric the vLLM instrumentation emits, with its unit."""

from __future__ import annotations

import re
from pathlib import Path

from otelgpu.instrumentation.vllm import _names, environment_variables
from otelgpu.otel import names as runtime_names

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _table_rows(text: str) -> dict[str, list[str]]:
    """First-column backticked name -> the row's cells, for every markdown table row."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = [c.strip() for c in match.group(2).split("|")]
    return rows


def test_vllm_metrics_doc_matches_the_name_table() -> None:
    # the metric tables come before the span attributes (which reuse some names)
    rows = _table_rows((DOCS / "metrics-vllm.md").read_text().split("## Spans")[0])
    for metric in _names.ALL:
        assert metric.name in rows, metric.name
        assert f"`{metric.unit}`" in rows[metric.name], (metric.name, rows[metric.name])
    units = {m.name: m.unit for m in runtime_names.ALL}
    for name, _source in _names.RUNTIME_METRICS:
        assert name in rows, name
        assert f"`{units[name]}`" in rows[name], (name, rows[name])


def test_vllm_doc_lists_every_setting() -> None:
    text = (DOCS / "vllm.md").read_text()
    settings = [v for k, v in vars(environment_variables).items() if k.startswith("OTELGPU_")]
    assert settings
    for variable in settings:
        assert f"`{variable}`" in text, variable
