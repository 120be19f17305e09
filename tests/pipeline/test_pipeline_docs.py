"""docs/metrics.md documents every pipeline metric as the catalog defines it."""

from __future__ import annotations

from pathlib import Path

from fixtures.catalog_docs import assert_docs_match_catalog

from otelgpu.otel import gpu_context

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## Training steps and inference requests")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_pipeline_metrics_table_matches_the_catalog() -> None:
    assert_docs_match_catalog("runtime")


def test_pipeline_gpu_context_attributes_documented() -> None:
    section = _section()
    for attribute, *_ in gpu_context._FIELDS:
        assert f"`{attribute}`" in section, attribute


def test_pipeline_gpu_summary_attributes_documented() -> None:
    """Every attribute of the constant-size GPU context is in docs/metrics.md."""
    import re as _re

    section = _section()
    source = (DOCS.parents[1] / "otelgpu" / "otel" / "gpu_summary.py").read_text()
    attributes = set(_re.findall(r'"(otelgpu\.gpu\.[a-z_.]+)"', source)) | {"hw.id"}
    assert len(attributes) > 10
    for attribute in sorted(attributes):
        assert f"`{attribute}`" in section, attribute
