"""The plotly figures of the HTML report, as plain ``{"data", "layout"}`` dicts.

Each ``*_figure(run)`` returns None when the run recorded nothing for it. Times are
plotted in milliseconds (steps, latencies) or seconds since the run's start (timelines);
colours come from :data:`PALETTE`, GPU health events are drawn in :data:`EVENT_COLOR`
(at most :data:`MAX_EVENT_MARKERS` of them).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from otelgpu.report import analysis as A
from otelgpu.report.model import GpuEvent, Run

__all__ = [
    "CDF_POINTS",
    "EVENT_COLOR",
    "MAX_EVENT_MARKERS",
    "PALETTE",
    "cdf_figure",
    "esc",
    "fmt_ms",
    "gpu_figure",
    "latency_figure",
    "phase_figure",
    "step_time_figure",
]

#: CDF resolution: quantiles evaluated per sketch.
CDF_POINTS = 200
MAX_EVENT_MARKERS = 200

PALETTE = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#FF9DA6",
    "#9D755D",
    "#BAB0AC",
    "#EECA3B",
)
EVENT_COLOR = "#E45756"


def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attributes."""
    return html.escape(str(value))


def fmt_ms(v: float) -> str:
    """Seconds as ``12.3 ms``; ``n/a`` when not finite."""
    return f"{v * 1e3:.1f} ms" if math.isfinite(v) else "n/a"


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "margin": {"l": 64, "r": 20, "t": 84, "b": 48},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def step_time_figure(run: Run) -> dict[str, Any] | None:
    if not run.steps:
        return None
    normal = [r for r in run.steps if not (r.attributes.get("otelgpu.gpu.throttled_fraction") or 0)]
    throttled = [r for r in run.steps if r.attributes.get("otelgpu.gpu.throttled_fraction")]
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "step",
            "x": [round(r.end_s, 4) for r in normal],
            "y": [round(r.duration_s * 1e3, 3) for r in normal],
            "marker": {"size": 5, "color": PALETTE[0]},
            "hovertemplate": "t=%{x:.2f}s<br>%{y:.1f} ms<extra>step</extra>",
        }
    ]
    if throttled:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "step, GPU throttled",
                "x": [round(r.end_s, 4) for r in throttled],
                "y": [round(r.duration_s * 1e3, 3) for r in throttled],
                "marker": {"size": 6, "color": PALETTE[1], "symbol": "diamond"},
                "hovertemplate": "t=%{x:.2f}s<br>%{y:.1f} ms<extra>throttled</extra>",
            }
        )
    n = len(run.steps)
    if n >= 10:
        # median of the k steps around each point (k ~ n/20), at most ~400 points
        half = max(2, n // 40)
        stride = max(1, n // 400)
        xs, ys = [], []
        for i in range(0, n, stride):
            chunk = sorted(r.duration_s for r in run.steps[max(0, i - half) : i + half + 1])
            xs.append(round(run.steps[i].end_s, 4))
            ys.append(round(chunk[len(chunk) // 2] * 1e3, 3))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "rolling median",
                "x": xs,
                "y": ys,
                "line": {"color": PALETTE[2], "width": 2},
            }
        )
    layout = _layout("Step time over time (GPU events marked)", height=420)
    layout["xaxis"] = {"title": {"text": "time since start (s)"}}
    # log scale: a slow first step (worker start-up) or a checkpoint must not flatten the rest
    layout["yaxis"] = {"title": {"text": "step time (ms, log scale)"}, "type": "log"}
    _mark_events(run, data, layout, y_top=max(r.duration_s for r in run.steps) * 1e3 * 1.3)
    return {"data": data, "layout": layout}


def _event_lines(events: Sequence[GpuEvent], *, width: float) -> list[dict[str, Any]]:
    """A dotted vertical line (full plot height) at each GPU event's time."""
    return [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": round(e.time_s, 4),
            "x1": round(e.time_s, 4),
            "y0": 0,
            "y1": 1,
            "line": {"color": EVENT_COLOR, "width": width, "dash": "dot"},
        }
        for e in events
    ]


def _mark_events(
    run: Run, data: list[dict[str, Any]], layout: dict[str, Any], y_top: float
) -> None:
    events = run.gpu_events[:MAX_EVENT_MARKERS]
    if not events:
        return
    layout["shapes"] = _event_lines(events, width=1.5)
    data.append(
        {
            "type": "scatter",
            "mode": "markers+text",
            "name": "GPU events",
            "x": [round(e.time_s, 4) for e in events],
            "y": [round(y_top, 3)] * len(events),
            "text": [e.kind for e in events],
            "textposition": "top center",
            "marker": {"size": 11, "color": EVENT_COLOR, "symbol": "x"},
            "customdata": [f"{e.detail} on {e.uuid[:16]}" for e in events],
            "hovertemplate": "%{text} at %{x:.2f}s<br>%{customdata}<extra></extra>",
        }
    )


def phase_figure(run: Run) -> dict[str, Any] | None:
    phases = [p for p in A.phase_shares(run) if p[2] >= 0.005]
    if not phases:
        return None
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": phase,
            "y": ["step time"],
            "x": [round(share * 100, 2)],
            "text": [f"{phase} {share * 100:.0f} %"],
            "textposition": "inside",
            "marker": {"color": PALETTE[i % len(PALETTE)]},
            "hovertemplate": f"{phase}: %{{x:.1f}} % ({seconds:.2f} s)<extra></extra>",
        }
        for i, (phase, seconds, share) in enumerate(phases)
    ]
    layout = _layout("Where step time went (phases)", barmode="stack", height=220)
    layout["xaxis"] = {"title": {"text": "share of step time (%)"}, "range": [0, 100]}
    layout["yaxis"] = {"showticklabels": False}
    return {"data": data, "layout": layout}


def _cdf(sketch: Any) -> tuple[list[float], list[float]]:
    qs = [i / CDF_POINTS for i in range(1, CDF_POINTS)]
    values = sketch.quantiles(qs)
    return [round(v * 1e3, 4) for v in values], [round(q, 4) for q in qs]


def cdf_figure(
    sketches: Sequence[tuple[str, Any]], title: str, *, dash: Sequence[str] = ()
) -> dict[str, Any] | None:
    data = []
    for i, (name, sketch) in enumerate(sketches):
        if sketch is None or not sketch.count:
            continue
        x, y = _cdf(sketch)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{name} (n={sketch.count})",
                "x": x,
                "y": y,
                "line": {
                    "color": PALETTE[(i // 2 if dash else i) % len(PALETTE)],
                    "width": 2,
                    "dash": dash[i % len(dash)] if dash else "solid",
                },
                "hovertemplate": "%{x:.2f} ms<br>q=%{y:.3f}<extra>" + esc(name) + "</extra>",
            }
        )
    if not data:
        return None
    layout = _layout(title, height=420)
    layout["xaxis"] = {"title": {"text": "ms (log scale)"}, "type": "log"}
    layout["yaxis"] = {"title": {"text": "fraction ≤ x"}, "range": [0, 1]}
    return {"data": data, "layout": layout}


_DURATIONS = (
    ("request latency", "gen_ai.server.request.duration"),
    ("time to first token", "gen_ai.server.time_to_first_token"),
    ("time per output token", "gen_ai.server.time_per_output_token"),
    ("queue", "otelgpu.inference.queue.duration"),
    ("step time", "otelgpu.train.step.duration"),
    ("data wait", "otelgpu.train.data.wait.duration"),
)


def latency_figure(run: Run) -> dict[str, Any] | None:
    return cdf_figure(
        [(label, run.merged_sketch(name)) for label, name in _DURATIONS],
        "CDFs from the exported sketches",
    )


_GPU_ROWS: tuple[tuple[str, str, float, dict[str, Any] | None], ...] = (
    ("utilization (%)", "hw.gpu.utilization", 100.0, {"hw.gpu.task": "general"}),
    ("tensor activity (%)", "<tensor>", 100.0, {"otelgpu.gpu.tensor.pipe": "any"}),
    ("memory watermark (GiB)", "otelgpu.gpu.memory.watermark", 1 / 2**30, None),
    ("power (W)", "hw.power", 1.0, None),
    ("temperature (°C)", "hw.temperature", 1.0, None),
    (
        "throttled (%)",
        "otelgpu.gpu.throttle.fraction",
        100.0,
        {"otelgpu.gpu.throttle.reason": "any"},
    ),
)


def gpu_figure(run: Run) -> dict[str, Any] | None:
    uuids = run.gpus()
    if not uuids:
        return None
    tensor = A.tensor_gauges(run)
    rows = []
    for label, name, scale, where in _GPU_ROWS:
        metric = tensor[0] if name == "<tensor>" and tensor else name
        per_gpu = [s for s in run.gauge_series(metric) if "hw.id" in s.attributes]
        # the filtered series (general task, any tensor pipe) when the feed has them
        series = [
            s
            for s in per_gpu
            if not (where and any(s.attributes.get(k) != v for k, v in where.items()))
        ] or [s for s in per_gpu if not (where and any(k in s.attributes for k in where))]
        if series:
            rows.append((label, scale, series))
    if not rows:
        return None
    n = len(rows)
    gap = 0.04
    height = (1 - gap * (n - 1)) / n
    layout = _layout("Per-GPU timelines", height=150 * n + 140, showlegend=True)
    layout["margin"] = dict(layout["margin"], t=100)
    data: list[dict[str, Any]] = []
    names = run.gpu_names()
    for r, (label, scale, series) in enumerate(rows):
        axis = "" if r == 0 else str(r + 1)
        top = 1 - r * (height + gap)
        layout[f"yaxis{axis}"] = {
            "domain": [round(top - height, 4), round(top, 4)],
            "title": {"text": label, "font": {"size": 11}},
            "rangemode": "tozero",
        }
        xaxis: dict[str, Any] = {"anchor": f"y{axis}", "showticklabels": r == n - 1}
        if r:
            xaxis["matches"] = "x"
        if r == n - 1:
            xaxis["title"] = {"text": "time since start (s)"}
        layout[f"xaxis{axis}"] = xaxis
        for s in series:
            uuid = str(s.attributes["hw.id"])
            g = uuids.index(uuid) if uuid in uuids else 0
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"GPU {g} {uuid[:12]}",
                    "legendgroup": uuid,
                    "showlegend": r == 0,
                    "x": [round(t, 3) for t, _ in s.points],
                    "y": [round(v * scale, 3) for _, v in s.points],
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "line": {"color": PALETTE[g % len(PALETTE)], "width": 1.5},
                    "marker": {"size": 3},
                    "hovertemplate": f"GPU {g} {esc(names.get(uuid, ''))}<br>"
                    + "t=%{x:.1f}s: %{y:.1f}<extra>"
                    + esc(label)
                    + "</extra>",
                }
            )
    events = run.gpu_events[:MAX_EVENT_MARKERS]
    if events:
        layout["shapes"] = _event_lines(events, width=1)
    return {"data": data, "layout": layout}
