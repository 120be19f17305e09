"""docs/metrics-torch.md documents exactly the metrics and span attributes the code emits."""

from __future__ import annotations

from pathlib import Path

from fixtures.catalog_docs import assert_docs_match_catalog

from otelgpu.instrumentation.torch import _names as N

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics-torch.md"


def test_every_metric_documented_with_kind_unit_attributes() -> None:
    assert_docs_match_catalog("torch")


def test_every_span_attribute_documented() -> None:
    text = DOC.read_text()
    for attr in (*N.SPAN_ATTRIBUTES, N.EVENT_OOM):
        assert f"`{attr}`" in text, attr
