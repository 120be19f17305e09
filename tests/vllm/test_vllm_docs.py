"""docs/metrics-vllm.md lists every metric the vLLM instrumentation emits, with its unit."""

from __future__ import annotations

from pathlib import Path

from fixtures.catalog_docs import assert_docs_match_catalog

from otelgpu.instrumentation.vllm import environment_variables

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_vllm_metrics_doc_matches_the_catalog() -> None:
    assert_docs_match_catalog("vllm", "vllm-requests")


def test_vllm_doc_lists_every_setting() -> None:
    text = (DOCS / "vllm.md").read_text()
    settings = [v for k, v in vars(environment_variables).items() if k.startswith("OTELGPU_")]
    assert settings
    for variable in settings:
        assert f"`{variable}`" in text, variable
