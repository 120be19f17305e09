"""The shipped alert rules (docs/alerts/otelgpu-rules.yml) under the real promtool.

* ``promtool check rules`` accepts the file and counts every rule;
* ``promtool test rules`` runs the unit tests shipped next to it, which feed synthetic
  series with otelgpu's exact metric names: each alert fires where it must and not where
  it must not;
* every alert has at least one firing case in those tests;
* every metric name the rules (and the test series) use is one otelgpu exports, as the
  real Prometheus exporter names it from otelgpu's metric tables -- so a renamed metric
  breaks this test instead of silently disarming an alert.
"""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.backends import (
    RULES,
    RULES_TEST,
    exposition_names,
    fed_series_names,
    fired_alerts,
    otelgpu_metric_tables,
    promql_metric_names,
    promtool,
    promtool_ok,
    rule_metric_names,
    rules_of,
)

pytestmark = pytest.mark.backend


def _rules() -> list[dict[str, Any]]:
    return rules_of(RULES)


def test_backends_promtool_check_rules_accepts_every_rule() -> None:
    assert f"SUCCESS: {len(_rules())} rules found" in promtool_ok("check", "rules", str(RULES))


def test_backends_promtool_rejects_a_broken_rule(tmp_path: Any) -> None:
    # The check above is only worth something if promtool does reject bad files.
    broken = RULES.read_text().replace(
        'hw_status{hw_state="failed"}) == 1', 'hw_status{hw_state="failed"} == 1', 1
    )
    assert broken != RULES.read_text()
    path = tmp_path / "broken.yml"
    path.write_text(broken)
    result = promtool("check", "rules", str(path))
    assert result.returncode == 1
    assert "parse error" in result.stdout + result.stderr


def test_backends_promtool_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool_ok("test", "rules", str(RULES_TEST))


def test_backends_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Any) -> None:
    # Loosen the memory margin from 8 % to 15 %: GPU-b (steady at 90 %) then alerts, which
    # the shipped tests must flag -- they pin the thresholds, not only the syntax.
    rules = RULES.read_text()
    loosened = rules.replace(") > 0.92", ") > 0.85", 1)
    assert loosened != rules
    (tmp_path / "otelgpu-rules.yml").write_text(loosened)
    (tmp_path / "otelgpu-rules.test.yml").write_text(RULES_TEST.read_text())
    result = promtool("test", "rules", str(tmp_path / "otelgpu-rules.test.yml"))
    assert result.returncode == 1
    assert "OtelgpuGpuMemoryNearOom" in result.stdout + result.stderr


def test_backends_every_alert_has_a_firing_unit_test() -> None:
    fired = fired_alerts(RULES_TEST)
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert len(alerts) >= 12
    assert alerts - fired == set(), "alerts without a firing promtool test case"


def test_backends_rules_use_only_metric_names_otelgpu_exports() -> None:
    exported = exposition_names(otelgpu_metric_tables())
    # The table is real: the names the end-to-end scrape test sees are in it.
    assert exported["hw_gpu_utilization"] == "hw.gpu.utilization"
    assert exported["otelgpu_train_step_duration_quantile_seconds"] == (
        "otelgpu.train.step.duration"
    )
    used: dict[str, set[str]] = {}
    for rule in _rules():
        for name in rule_metric_names(rule):
            used.setdefault(name, set()).add(rule.get("alert") or rule["record"])
    unknown = {name: sorted(rules) for name, rules in used.items() if name not in exported}
    assert unknown == {}, "rules use metric names otelgpu does not export"

    series_names = fed_series_names(RULES_TEST)
    assert series_names - set(exported) == set(), "unit tests feed series otelgpu never exports"
    assert set(used) <= series_names, "a metric used by the rules is never fed by the tests"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('max by (job, hw_id) (hw_status{hw_state="failed"}) == 1', {"hw_status"}),
        (
            "sum(rate(a_total[5m] offset 1h)) / on (job) group_left (x) b_bytes > 1e9",
            {"a_total", "b_bytes"},
        ),
        ('c unless c offset 10m or label_replace(d, "x", "$1", "y", "(.*)")', {"c", "d"}),
        ('{__name__=~"x.*"}', {"__name__"}),
        ("histogram_quantile(0.99, sum by (le) (rate(e_bucket[5m]))) > bool 2", {"e_bucket"}),
    ],
)
def test_backends_promql_metric_names(expr: str, expected: set[str]) -> None:
    assert promql_metric_names(expr) == expected
