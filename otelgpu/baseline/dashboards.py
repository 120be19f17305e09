"""Grafana dashboards as code (``grafana-foundation-sdk``, Grafana's maintained SDK).

Three dashboards -- training, inference, and the overview (training | inference side by
side, GPU health below) -- for each data path (``pull``: otelgpu's Prometheus endpoint;
``otlp``: OTLP into VictoriaMetrics with Prometheus naming, sketches as ``vmrange``
histograms). Metric names come from the catalog (:mod:`otelgpu.baseline.names`); each
panel's Grafana unit follows the catalog unit of the metric it plots. The SDK is needed
only to *build* them: the shipped JSON (``otelgpu/baseline/grafana/``) needs nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelgpu.baseline.names import metric_name, spec

__all__ = ["PANELS", "PanelSpec", "build", "expr", "grafana_unit", "write"]

SHIPPED = Path(__file__).with_name("grafana")
_UNITS = {"s": "s", "1": "percentunit", "By": "bytes", "W": "watt", "J": "joule", "Cel": "celsius"}


def grafana_unit(ucum: str) -> str:
    """Grafana's unit id for a catalog (UCUM) unit; ``short`` for counts (``{...}``)."""
    return _UNITS.get(ucum, "short")


@dataclass(frozen=True)
class PanelSpec:
    """One panel: ``metric`` (catalog name) plotted as ``view`` with ``legend``.

    Views: ``q50|q95|q99`` (a sketch quantile), ``value`` (a gauge), ``rate`` (a counter
    per second), ``share`` (counter seconds per second: a fraction of time), ``increase1h``,
    ``ratio_of:<metric>`` (gauge / gauge), ``outcome_share`` (error+timeout share).
    """

    section: str  # training | inference | health
    title: str
    metric: str
    view: str
    legend: str
    selector: str = ""

    @property
    def unit(self) -> str:
        if self.view in ("share", "outcome_share") or self.view.startswith("ratio_of:"):
            return grafana_unit("1")
        if self.view == "rate":
            return "reqps" if self.section == "inference" else "ops"
        return grafana_unit(spec(self.metric).unit)


_REQUEST = "gen_ai.server.request.duration"
_TTFT = "gen_ai.server.time_to_first_token"
_REQUESTS = "otelgpu.inference.requests"
_JOB_MODEL = "{{job}} {{gen_ai_request_model}}"
_JOB_OUTCOME = "{{job}} {{otelgpu_request_outcome}}"

PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("training", "Step time p95", "otelgpu.train.step.duration", "q95", "{{job}}"),
    PanelSpec("training", "Step time p50", "otelgpu.train.step.duration", "q50", "{{job}}"),
    PanelSpec("training", "Steps per second", "otelgpu.train.steps", "rate", "{{job}}"),
    PanelSpec("training", "Data-wait share", "otelgpu.train.data.wait.ratio", "value", "{{job}}"),
    PanelSpec("training", "Comm-wait share", "otelgpu.train.comm.wait.ratio", "value", "{{job}}"),
    PanelSpec("training", "Checkpoint p95", "otelgpu.train.checkpoint.duration", "q95", "{{job}}"),
    PanelSpec("inference", "Request latency p99", _REQUEST, "q99", _JOB_MODEL),
    PanelSpec("inference", "Time to first token p99", _TTFT, "q99", _JOB_MODEL),
    PanelSpec("inference", "Requests per second", _REQUESTS, "rate", _JOB_OUTCOME),
    PanelSpec("inference", "Error/timeout share", _REQUESTS, "outcome_share", _JOB_MODEL),
    PanelSpec("inference", "Queued requests", "otelgpu.vllm.requests.waiting", "value", "{{job}}"),
    PanelSpec("inference", "KV-cache usage", "otelgpu.vllm.kv_cache.usage", "value", "{{job}}"),
    PanelSpec(
        "health",
        "GPU utilization",
        "hw.gpu.utilization",
        "value",
        "{{job}} {{hw_id}}",
        'hw_gpu_task="general"',
    ),
    PanelSpec(
        "health",
        "GPU memory used",
        "hw.gpu.memory.usage",
        "ratio_of:hw.gpu.memory.limit",
        "{{job}} {{hw_id}}",
    ),
    PanelSpec(
        "health",
        "Throttled share (costly reasons)",
        "otelgpu.gpu.throttle.time",
        "share",
        "{{job}} {{hw_id}}",
    ),
    PanelSpec(
        "health",
        "XID errors (1 h)",
        "otelgpu.gpu.xid",
        "increase1h",
        "{{hw_id}} XID {{otelgpu_gpu_xid_code}}",
    ),
    PanelSpec("health", "GPU lost", "hw.status", "value", "{{job}} {{hw_id}}", 'hw_state="failed"'),
)

_COSTLY = (
    'otelgpu_gpu_throttle_reason=~"hw_thermal_slowdown|sw_thermal_slowdown|'
    'hw_power_brake_slowdown|sw_power_cap|hw_slowdown"'
)


def _sel(name: str, *matchers: str) -> str:
    inner = ",".join(m for m in matchers if m)
    return f"{name}{{{inner}}}" if inner else name


def expr(panel: PanelSpec, path: str) -> str:
    """The PromQL of ``panel`` on data path ``path`` (``pull`` or ``otlp``)."""
    name = metric_name(panel.metric, path)
    view = panel.view
    if view.startswith("q"):
        q = {"q50": "0.5", "q95": "0.95", "q99": "0.99"}[view]
        by = "job, gen_ai_request_model" if panel.section == "inference" else "job"
        if path == "pull":
            quantile = f'quantile="{q}"'
            return f"max by ({by}) ({_sel(name, quantile, panel.selector)})"
        return f"histogram_quantile({q}, sum by ({by}, vmrange) (rate({_sel(name)}[5m])))"
    if view == "value":
        return _sel(name, panel.selector)
    if view == "rate":
        by = "job, otelgpu_request_outcome" if panel.section == "inference" else "job"
        return f"sum by ({by}) (rate({_sel(name, panel.selector)}[5m]))"
    if view == "share":
        return f"sum by (job, hw_id) (rate({_sel(name, _COSTLY)}[5m]))"
    if view == "increase1h":
        return f"sum by (hw_id, otelgpu_gpu_xid_code) (increase({name}[1h]))"
    if view == "outcome_share":
        by = "job, gen_ai_request_model"
        bad = _sel(name, 'otelgpu_request_outcome=~"error|timeout"')
        return (
            f"(sum by ({by}) (rate({bad}[5m])) or sum by ({by}) (rate({name}[5m])) * 0)"
            f" / sum by ({by}) (rate({name}[5m]))"
        )
    if view.startswith("ratio_of:"):
        return f"{name} / {metric_name(view.split(':', 1)[1], path)}"
    raise ValueError(f"unknown view {view!r}")


def _panel(p: PanelSpec, path: str, x: int, y: int, w: int) -> Any:
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import GridPos

    return (
        timeseries.Panel()
        .title(p.title)
        .unit(p.unit)
        .grid_pos(GridPos(h=8, w=w, x=x, y=y))
        .with_target(prometheus.Dataquery().expr(expr(p, path)).legend_format(p.legend))
    )


def _dashboard(
    uid: str, title: str, path: str, layout: Iterable[tuple[PanelSpec, int, int, int]]
) -> dict[str, Any]:
    from grafana_foundation_sdk.builders import dashboard
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    builder = (
        dashboard.Dashboard(title)
        .uid(uid)
        .tags(["otelgpu", path])
        .time("now-6h", "now")
        .refresh("30s")
    )
    for p, x, y, w in layout:
        builder = builder.with_panel(_panel(p, path, x, y, w))
    return dict(json.loads(json.dumps(builder.build(), cls=JSONEncoder)))


def _grid(
    panels: list[PanelSpec], x0: int, y0: int, width: int, columns: int
) -> list[tuple[PanelSpec, int, int, int]]:
    w = width // columns
    return [(p, x0 + (i % columns) * w, y0 + (i // columns) * 8, w) for i, p in enumerate(panels)]


def build(path: str) -> dict[str, dict[str, Any]]:
    """``{file name: dashboard JSON}`` of the three dashboards for data path ``path``."""
    section = {
        s: [p for p in PANELS if p.section == s] for s in ("training", "inference", "health")
    }
    rows = max(len(section["training"]), len(section["inference"]))
    overview = (
        _grid(section["training"], 0, 0, 12, 1)  # left column: training
        + _grid(section["inference"], 12, 0, 12, 1)  # right column: inference
        + _grid(section["health"], 0, rows * 8, 24, 3)  # GPU health below both
    )
    return {
        f"otelgpu-training-{path}.json": _dashboard(
            f"otelgpu-training-{path}",
            f"otelgpu training ({path})",
            path,
            _grid(section["training"] + section["health"], 0, 0, 24, 2),
        ),
        f"otelgpu-inference-{path}.json": _dashboard(
            f"otelgpu-inference-{path}",
            f"otelgpu inference ({path})",
            path,
            _grid(section["inference"] + section["health"], 0, 0, 24, 2),
        ),
        f"otelgpu-overview-{path}.json": _dashboard(
            f"otelgpu-overview-{path}",
            f"otelgpu overview: training | inference ({path})",
            path,
            overview,
        ),
    }


def write(directory: str | os.PathLike[str], paths: Iterable[str] = ("pull", "otlp")) -> list[Path]:
    """Write every dashboard JSON into ``directory``; returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        for name, doc in build(path).items():
            target = out / name
            target.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            written.append(target)
    return written
