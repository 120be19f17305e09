"""The fleet view (docs/alerts/otelgpu-diagnosis-rules.yml) under the real promtool.

``promtool check rules`` accepts the file; ``promtool test rules`` runs the shipped unit
tests (per-rank skew and the slowest rank computed from per-rank phase sketches; in-job
straggler, memory-creep and drift findings alerting); every alert has a firing case; a
loosened threshold is caught; every metric name is one otelgpu exports, as the real
Prometheus exporter names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.backends import (
    exposition_names,
    fed_series_names,
    fired_alerts,
    otelgpu_metric_tables,
    promtool,
    promtool_ok,
    rule_metric_names,
    rules_of,
)

from otelgpu.diagnosis import names as N

pytestmark = pytest.mark.backend

ALERTS = Path(__file__).resolve().parents[2] / "docs" / "alerts"
RULES = ALERTS / "otelgpu-diagnosis-rules.yml"
RULES_TEST = ALERTS / "otelgpu-diagnosis-rules.test.yml"


def _rules() -> list[dict[str, Any]]:
    return rules_of(RULES)


def test_diagnosis_rules_check() -> None:
    assert f"SUCCESS: {len(_rules())} rules found" in promtool_ok(
        "check", "rules", str(RULES), cwd=ALERTS
    )


def test_diagnosis_rules_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool_ok("test", "rules", str(RULES_TEST), cwd=ALERTS)


def test_diagnosis_rules_catch_a_wrong_threshold(tmp_path: Path) -> None:
    # A straggler threshold of 20 % would miss rank 2 (17 %): the tests must notice.
    rules = RULES.read_text()
    loosened = rules.replace(
        "otelgpu:train_rank_skew:ratio > 0.10", "otelgpu:train_rank_skew:ratio > 0.20"
    )
    assert loosened != rules
    (tmp_path / RULES.name).write_text(loosened)
    (tmp_path / RULES_TEST.name).write_text(RULES_TEST.read_text())
    result = promtool("test", "rules", str(tmp_path / RULES_TEST.name), cwd=tmp_path)
    assert result.returncode == 1
    assert "OtelgpuTrainRankStraggler" in result.stdout + result.stderr


def test_diagnosis_rules_every_alert_fires_in_a_test() -> None:
    fired = fired_alerts(RULES_TEST)
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert alerts and alerts - fired == set()


def test_diagnosis_rules_use_exported_names() -> None:
    exported = exposition_names(otelgpu_metric_tables())  # the catalog holds ours too
    assert exported["otelgpu_train_phase_duration_quantile_seconds"] == N.PHASE_DURATION.name
    assert exported["otelgpu_diagnosis_findings_total"] == N.FINDINGS.name
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    used = set().union(*(rule_metric_names(rule) for rule in _rules()))
    assert used - recorded - set(exported) == set()
    fed = fed_series_names(RULES_TEST)
    assert fed - set(exported) == set()
    assert used - recorded <= fed
