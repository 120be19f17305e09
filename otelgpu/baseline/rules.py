"""Prometheus alerting rules from a baseline, and promtool unit tests for each of them.

One rule per baseline entry (figure x key), named by the figure (``Otelgpu Baseline*``)
with the key's labels as matchers; the description quotes the baseline figure, the
history it came from and the margin. The health alerts that need no baseline (GPU lost,
critical XID, uncorrected ECC, pending row remap) are always included. ``for_override``
replaces every ``for:`` and ``rate_window`` the 5-minute range of the rates (short-lived
test environments: ``rate()`` over a window longer than a series' life underestimates).
"""

from __future__ import annotations

from typing import Any

from otelgpu.baseline.figures import Figure, figure, series_name
from otelgpu.baseline.model import BaselineFile, Entry
from otelgpu.baseline.names import metric_name

__all__ = ["FIXED_ALERTS", "rules_document", "rules_yaml", "tests_document", "tests_yaml"]

_CRITICAL_XIDS = "48|63|64|74|79|92|94|95|119|120"
_XID = metric_name("otelgpu.gpu.xid")
_ERRORS = metric_name("hw.errors")
_STATUS = metric_name("hw.status")
_REMAP = metric_name("otelgpu.gpu.memory.remapped_rows")
_RUNBOOK = "docs/baseline.md#runbooks"

FIXED_ALERTS: tuple[dict[str, Any], ...] = (
    {
        "alert": "OtelgpuGpuLost",
        "expr": f'max by (job, instance, hw_id) ({_STATUS}{{hw_state="failed"}}) == 1',
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "GPU {{ $labels.hw_id }} is lost on {{ $labels.instance }}",
            "description": "NVML reports the GPU as lost (XID 79 / fallen off the bus). "
            "No baseline: any occurrence is actionable.",
            "runbook": "Drain the node, reset or replace the GPU, restart from the last "
            "checkpoint.",
        },
    },
    {
        "alert": "OtelgpuGpuXidCritical",
        # A counter series is born at 1 on the first XID, which increase() cannot see.
        "expr": (
            f"(sum by (job, instance, hw_id, otelgpu_gpu_xid_code) (increase({_XID}"
            f'{{otelgpu_gpu_xid_code=~"{_CRITICAL_XIDS}"}}[10m])) > 0)'
            f" or (sum by (job, instance, hw_id, otelgpu_gpu_xid_code) ({_XID}"
            f'{{otelgpu_gpu_xid_code=~"{_CRITICAL_XIDS}"}} unless {_XID} offset 10m) > 0)'
        ),
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "XID {{ $labels.otelgpu_gpu_xid_code }} on GPU {{ $labels.hw_id }}",
            "description": "The driver reported a critical XID in the last 10 minutes. "
            "No baseline: any occurrence is actionable.",
            "runbook": "Check `nvidia-smi -q` and dmesg; the GPU may need a reset.",
        },
    },
    {
        "alert": "OtelgpuGpuEccUncorrected",
        "expr": f'sum by (job, instance, hw_id) (increase({_ERRORS}{{error_type="uncorrected"}}'
        "[10m])) > 0",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "Uncorrected ECC errors on GPU {{ $labels.hw_id }}",
            "description": "Uncorrected ECC errors in the last 10 minutes. No baseline: any "
            "occurrence is actionable.",
            "runbook": "Results on this GPU may be wrong: drain it and check row remapping.",
        },
    },
    {
        "alert": "OtelgpuGpuRemapPending",
        "expr": f'max by (job, instance, hw_id) ({_REMAP}{{otelgpu_gpu_remap_state="pending"}}) '
        "== 1",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "GPU {{ $labels.hw_id }} has a row remap pending",
            "description": "A memory row remap waits for a GPU reset. No baseline needed.",
            "runbook": "Schedule a GPU reset at the next job boundary.",
        },
    },
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def matchers(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.3g} s"
    if unit == "1":
        return f"{value:.1%}"
    return f"{value:.3g}"


def _margin_text(fig: Figure, e: Entry) -> str:
    ref = "p99 of history" if e.direction == "upper" else "p1 of history"
    if fig.quantile is not None and e.resolution is not None:
        # Learned from merged histogram buckets: the quantile at its bucket's edge.
        ref = f"p{fig.quantile * 100:g} of the merged histogram (bucket resolution "
        ref += f"{e.resolution:.1%})"
    sign = "+" if e.direction == "upper" else "-"
    margin = f"{e.margin:.0%}" if e.relative else _fmt(e.margin, e.unit)
    capped = f", capped at {_fmt(fig.cap, e.unit)}" if fig.cap is not None else ""
    return f"{ref} {_fmt(e.reference, e.unit)} {sign} {margin}{capped}"


def rule_for(
    e: Entry, source: dict[str, Any], for_override: str | None = None, rate_window: str = "5m"
) -> dict[str, Any]:
    fig = figure(e.figure)
    op = ">" if e.direction == "upper" else "<"
    key = ", ".join(f"{k}={v}" for k, v in sorted(e.labels.items()) if v) or "all"
    window = source.get("window_s", 0) / 86400
    return {
        "alert": fig.alert,
        "expr": f"({fig.query(matchers(e.labels), rate_window, source.get('path', 'pull'))}) "
        f"{op} {e.threshold:.6g}",
        "for": for_override or fig.for_,
        # The key label keeps two keys' rules distinct (promtool lints duplicates).
        "labels": {
            "severity": fig.severity,
            "otelgpu_baseline_figure": fig.id,
            "otelgpu_baseline_key": key,
        },
        "annotations": {
            "summary": f"{key}: {fig.summary} (threshold {_fmt(e.threshold, e.unit)})",
            "description": (
                f"Baseline {fig.id} for {key}: median {_fmt(e.median, e.unit)}, "
                f"p1 {_fmt(e.p1, e.unit)}, p99 {_fmt(e.p99, e.unit)} over {e.samples} samples "
                f"({e.coverage:.0%} coverage of a {window:g}-day window, source "
                f"{source.get('kind', '?')}). Threshold {_fmt(e.threshold, e.unit)} = "
                f"{_margin_text(fig, e)}."
            ),
            "runbook": f"{fig.runbook} ({_RUNBOOK})",
        },
    }


def rules_document(
    baseline: BaselineFile, for_override: str | None = None, rate_window: str = "5m"
) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {"training": [], "inference": [], "health": []}
    for e in baseline.entries:
        groups[e.family].append(rule_for(e, baseline.source, for_override, rate_window))
    fixed = []
    for rule in FIXED_ALERTS:
        rule = dict(rule)
        if "for" in rule and for_override:
            rule["for"] = for_override
        fixed.append(rule)
    groups["health"].extend(fixed)
    return {
        "groups": [
            {"name": f"otelgpu-baseline-{family}", "rules": rules}
            for family, rules in groups.items()
            if rules
        ]
    }


def _dump(doc: dict[str, Any], header: str) -> str:
    # PyYAML (extra `baseline`): rule files are read and reviewed by people, as YAML.
    import yaml  # type: ignore[import-untyped]

    return header + str(yaml.safe_dump(doc, sort_keys=False, width=100))


def rules_yaml(
    baseline: BaselineFile, for_override: str | None = None, rate_window: str = "5m"
) -> str:
    header = (
        "# Generated by `otelgpu baseline rules` from a baseline learned "
        f"{baseline.created} ({baseline.source.get('kind')}).\n"
        "# Check: promtool check rules <this file>. Regenerate rather than edit.\n"
    )
    return _dump(rules_document(baseline, for_override, rate_window), header)


# ----------------------------------------------------------------------- promtool tests
def _series(
    fig: Figure, labels: dict[str, str], value: float, path: str = "pull"
) -> list[dict[str, str]]:
    """Input series (1m interval, 30 points) on which the figure's expression is ``value``."""
    sel = dict(labels)
    if "hw_name" in sel:
        sel.update(job="j", instance="i", hw_id="GPU-0")
    steady = f"{value:.9g}x30"

    def s(name: str, extra: dict[str, str], values: str) -> dict[str, str]:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted({**sel, **extra}.items()))
        return {"series": f"{name}{{{body}}}", "values": values}

    def n(name: str) -> str:
        return series_name(name, path)

    if fig.quantile is not None:  # a sketch figure: its quantile gauge
        return [s(n(fig.metrics[0]), {"quantile": f"{fig.quantile:g}"}, steady)]
    if fig.id == "train_gpu_utilization":
        return [
            s(n("hw.gpu.utilization"), {"hw_gpu_task": "general"}, steady),
            s(n("otelgpu.train.steps"), {}, "0+600x30"),
        ]
    if fig.id == "inference_error_rate":
        bad, ok = 600 * value, 600 * (1 - value)  # requests per minute by outcome
        return [
            s(
                n("otelgpu.inference.requests"),
                {"otelgpu_request_outcome": "error"},
                f"0+{bad:.9g}x30",
            ),
            s(n("otelgpu.inference.requests"), {"otelgpu_request_outcome": "ok"}, f"0+{ok:.9g}x30"),
        ]
    if fig.id == "health_throttle_share":
        return [
            s(
                n("otelgpu.gpu.throttle.time"),
                {"otelgpu_gpu_throttle_reason": "hw_thermal_slowdown"},
                f"0+{60 * value:.9g}x30",
            )
        ]
    if fig.id == "health_memory_usage":
        limit = 80e9
        return [
            s(n("hw.gpu.memory.usage"), {}, f"{limit * value:.9g}x30"),
            s(n("hw.gpu.memory.limit"), {}, f"{limit:.9g}x30"),
        ]
    single = {
        "train_data_wait_share": "otelgpu.train.data.wait.ratio",
        "train_comm_wait_share": "otelgpu.train.comm.wait.ratio",
        "inference_queue": "otelgpu.vllm.requests.waiting",
        "inference_kv_cache": "otelgpu.vllm.kv_cache.usage",
    }
    return [s(n(single[fig.id]), {}, steady)]


def _bad_value(e: Entry, fig: Figure) -> float:
    if e.direction == "lower":
        return e.threshold * 0.5
    value = e.threshold * 1.5 if e.threshold > 0 else e.threshold + 1.0
    if fig.unit == "1":  # a fraction stays <= 1
        value = min(1.0, max(value, e.threshold + (1.0 - e.threshold) / 2))
    return value


def _minutes(duration: str) -> int:
    from otelgpu.baseline.history import parse_duration

    return 0 if duration in ("0", "0s") else int(parse_duration(duration) // 60)


def tests_document(
    baseline: BaselineFile, rules_file: str, for_override: str | None = None
) -> dict[str, Any]:
    """promtool unit tests: each baseline alert fires on a bad series and stays quiet on
    its baseline median (the rules file is referenced by ``rules_file``)."""
    tests = []
    for e in baseline.entries:
        fig = figure(e.figure)
        rule = rule_for(e, baseline.source, for_override)
        eval_time = f"{_minutes(for_override or fig.for_) + 10}m"
        for value, fires in ((_bad_value(e, fig), True), (e.median, False)):
            expected: list[dict[str, Any]] = []
            if fires:
                key_labels = dict(e.labels)
                expected = [
                    {
                        "exp_labels": {
                            **{k: v for k, v in key_labels.items() if v},
                            "severity": fig.severity,
                            "otelgpu_baseline_figure": fig.id,
                            "otelgpu_baseline_key": rule["labels"]["otelgpu_baseline_key"],
                        },
                        "exp_annotations": rule["annotations"],
                    }
                ]
            tests.append(
                {
                    "name": f"{fig.alert} {'fires' if fires else 'quiet'} "
                    f"({matchers(e.labels)}, value {value:.6g})",
                    "interval": "1m",
                    "input_series": _series(
                        fig, e.labels, value, baseline.source.get("path", "pull")
                    ),
                    "alert_rule_test": [
                        {"eval_time": eval_time, "alertname": fig.alert, "exp_alerts": expected}
                    ],
                }
            )
    tests.extend(_fixed_tests(for_override))
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}


_GPU = {"job": "j", "instance": "i", "hw_id": "GPU-0"}


def _render(text: str, labels: dict[str, str]) -> str:
    for k, v in labels.items():
        text = text.replace(f"{{{{ $labels.{k} }}}}", v)
    return text


def _fixed_tests(for_override: str | None) -> list[dict[str, Any]]:
    """Each always-on health alert fires on its fault and is quiet on a healthy GPU."""

    def sel(name: str, **extra: str) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in {**_GPU, **extra}.items()) + "}"

    lost = sel(_STATUS, hw_state="failed")
    ecc = sel(_ERRORS, error_type="uncorrected")
    remap = sel(_REMAP, otelgpu_gpu_remap_state="pending")
    xid79, xid13 = (sel(_XID, otelgpu_gpu_xid_code=code) for code in ("79", "13"))
    # alert: (faulty series, healthy series, labels the alert adds); series = (name, values)
    cases: dict[str, tuple[tuple[str, str], tuple[str, str], dict[str, str]]] = {
        "OtelgpuGpuLost": ((lost, "1x30"), (lost, "0x30"), {}),
        "OtelgpuGpuXidCritical": (
            (xid79, "_x5 1x25"),
            (xid13, "_x5 1x25"),
            {"otelgpu_gpu_xid_code": "79"},
        ),
        "OtelgpuGpuEccUncorrected": ((ecc, "0x5 3x25"), (ecc, "0x30"), {}),
        "OtelgpuGpuRemapPending": ((remap, "1x30"), (remap, "0x30"), {}),
    }
    out = []
    for rule in FIXED_ALERTS:
        name = rule["alert"]
        bad, good, extra = cases[name]
        labels = {**_GPU, **extra}
        eval_time = f"{_minutes(for_override or rule.get('for', '0s')) + 10}m"
        for series, fires in ((bad, True), (good, False)):
            expected = []
            if fires:
                expected = [
                    {
                        "exp_labels": {**labels, **rule["labels"]},
                        "exp_annotations": {
                            k: _render(v, labels) for k, v in rule["annotations"].items()
                        },
                    }
                ]
            out.append(
                {
                    "name": f"{name} {'fires' if fires else 'quiet'}",
                    "interval": "1m",
                    "input_series": [{"series": series[0], "values": series[1]}],
                    "alert_rule_test": [
                        {"eval_time": eval_time, "alertname": name, "exp_alerts": expected}
                    ],
                }
            )
    return out


def tests_yaml(baseline: BaselineFile, rules_file: str, for_override: str | None = None) -> str:
    header = "# Generated by `otelgpu baseline rules --tests`: promtool test rules <this file>\n"
    return _dump(tests_document(baseline, rules_file, for_override), header)
