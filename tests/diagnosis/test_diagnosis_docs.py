"""docs/diagnosis.md documents what the diagnosis exports, from the same tables."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.catalog_docs import assert_docs_match_catalog  # noqa: E402

from otelgpu.diagnosis import environment_variables as ev  # noqa: E402
from otelgpu.diagnosis import names as N  # noqa: E402

DOC = (ROOT / "docs" / "diagnosis.md").read_text(encoding="utf-8")


def test_diagnosis_docs_metric_table_matches_the_catalog() -> None:
    assert_docs_match_catalog("diagnosis")


def test_diagnosis_docs_name_every_attribute_event_and_setting() -> None:
    for phase in N.PHASES:
        assert f"| `{phase}` |" in DOC
    for cause in N.CAUSES:
        assert f"`{cause}`" in DOC
    for kind in N.KINDS:
        assert f"{N.EVENT_PREFIX}{kind}" in DOC
    for name in (N.VERDICT_SPAN, N.VERDICT_JSON, N.VERDICT_BOTTLENECK, N.SPAN_PHASE_PREFIX):
        assert name in DOC
    variables = [v for k, v in vars(ev).items() if k.startswith("OTELGPU_")]
    assert len(variables) == 5  # four diagnosis settings + OTELGPU_BASELINE
    for variable in variables:
        assert f"`{variable}`" in DOC
