"""The HTML report: one self-contained file with interactive plots (plotly.js, inlined).

Why plotly: it is a maintained plotting library whose Python package ships the complete
``plotly.min.js``, so the page carries its own renderer and needs no network when it is
opened (an air-gapped cluster, a CI artifact, an e-mail attachment); it draws SVG, which
a headless browser test can inspect, and it gives zoom and hover for free. The price is
~4.7 MB of JavaScript per page. ``plotly`` is an optional dependency (extra ``report``):
the text report needs none of it.

The page follows ``prefers-color-scheme``: CSS variables for the page, and the plots are
re-laid-out with the theme's colours when the scheme changes.

Contents (each part only when the run recorded it): verdict cards and key figures; step
time over time with GPU health events marked (vertical lines and markers; steps with
throttled clocks highlighted); the phase breakdown; CDFs of every duration sketch
(request latency, TTFT, time per token, queue, step time) computed from the exported
sketches; per-GPU timelines (utilization, tensor activity, memory watermark, power,
temperature, throttling); stragglers and other diagnosis findings; energy per token.
The plots themselves are built in ``figures``; this module lays out the page.
"""

from __future__ import annotations

import json
import math
from typing import Any

from otelgpu.report import analysis as A
from otelgpu.report import compare as C
from otelgpu.report.figures import (
    MAX_EVENT_MARKERS,
    cdf_figure,
    esc,
    fmt_ms,
    gpu_figure,
    latency_figure,
    phase_figure,
    step_time_figure,
)
from otelgpu.report.model import Run

CSS = """
:root { color-scheme: light dark; --bg:#ffffff; --fg:#1d2330; --muted:#5b6474; --card:#f4f6fa;
  --border:#d9dee7; --grid:#e3e7ee; --accent:#4C78A8; --bad:#c0392b; --good:#2e8b57; --warn:#b9770e; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#12161d; --fg:#e6e9ef; --muted:#9aa3b2; --card:#1b212b; --border:#2c3442;
    --grid:#2a313d; --accent:#7aa6d6; --bad:#ff6b5e; --good:#5fd38d; --warn:#f0b43c; }
}
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.muted { color: var(--muted); }
.cards { display:grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: 12px; }
.card { background:var(--card); border:1px solid var(--border); border-radius:10px; padding:12px 14px; }
.verdict .label { font-weight:700; letter-spacing:.03em; }
.verdict.bad .label { color: var(--bad); } .verdict.warn .label { color: var(--warn); }
.verdict.ok .label { color: var(--good); }
.kpis { display:grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 10px; margin-top: 12px; }
.kpi { background:var(--card); border:1px solid var(--border); border-radius:10px; padding:8px 12px; }
.kpi .v { font-size: 20px; font-weight: 650; } .kpi .k { color: var(--muted); font-size: 12px; }
td.muted { word-break: break-all; max-width: 420px; }
.plot { width:100%; background:var(--card); border:1px solid var(--border);
  border-radius:10px; margin-top: 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align:left; padding: 4px 8px; border-bottom: 1px solid var(--border); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display:inline-block; padding: 1px 8px; border-radius: 9px; font-size: 12px; font-weight: 600; }
.badge.regression { background: var(--bad); color: #fff; }
.badge.improvement { background: var(--good); color: #fff; }
.badge.nochange { background: var(--border); color: var(--fg); }
ul.events { margin: 6px 0; padding-left: 18px; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""

# Draw every figure, and redraw its colours when the colour scheme changes.
SCRIPT = """
(function () {
  function theme() {
    var s = getComputedStyle(document.documentElement);
    var v = function (n) { return s.getPropertyValue(n).trim(); };
    return {fg: v('--fg'), muted: v('--muted'), grid: v('--grid')};
  }
  function themed(layout, t) {
    var out = Object.assign({}, layout);
    out.paper_bgcolor = 'rgba(0,0,0,0)'; out.plot_bgcolor = 'rgba(0,0,0,0)';
    out.font = Object.assign({}, layout.font || {}, {color: t.fg});
    Object.keys(out).forEach(function (k) {
      if (/^[xy]axis[0-9]*$/.test(k)) {
        out[k] = Object.assign({}, out[k], {gridcolor: t.grid, zerolinecolor: t.grid,
                                            linecolor: t.muted});
      }
    });
    return out;
  }
  var figures = JSON.parse(document.getElementById('otelgpu-figures').textContent);
  function draw() {
    var t = theme();
    Object.keys(figures).forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) { return; }
      Plotly.react(el, figures[id].data, themed(figures[id].layout, t),
                   {responsive: true, displaylogo: false});
    });
    document.body.setAttribute('data-plots-drawn', Object.keys(figures).length);
  }
  draw();
  if (window.matchMedia) {
    var mq = window.matchMedia('(prefers-color-scheme: dark)');
    if (mq.addEventListener) { mq.addEventListener('change', draw); }
  }
})();
"""


def plotly_js() -> str:
    """plotly.js as shipped inside the ``plotly`` package (no network)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the HTML report needs plotly: pip install 'otelgpu[report]'") from exc
    return str(get_plotlyjs())


# --------------------------------------------------------------------------- page parts
def _verdict_class(label: str) -> str:
    if label in ("SERVING OK", "STEPS") or "OK" in label:
        return "ok"
    if "BOUND" in label:
        return "warn"
    return "bad"


def _verdicts_html(run: Run) -> str:
    parts = []
    for v in A.verdicts(run):
        evidence = "".join(f"<li>{esc(e)}</li>" for e in v.evidence)
        source = (
            "written by the diagnosis" if v.source == "recorded" else "derived from the recording"
        )
        parts.append(
            f'<div class="card verdict {_verdict_class(v.label)}">'
            f'<div class="label">{esc(v.label)}</div><div>{esc(v.headline)}</div>'
            + (f'<div class="muted">{esc(v.advice)}</div>' if v.advice else "")
            + (f"<ul>{evidence}</ul>" if evidence else "")
            + f'<div class="muted" style="font-size:11px">{source}</div></div>'
        )
    return '<div class="cards">' + "".join(parts) + "</div>" if parts else ""


def _kpi(label: str, value: str) -> str:
    return (
        f'<div class="kpi"><div class="v">{esc(value)}</div><div class="k">{esc(label)}</div></div>'
    )


def _kpis_html(run: Run) -> str:
    kpis = []
    t = A.training(run)
    if t is not None:
        kpis.append(_kpi("training steps", f"{t.steps:,}"))
        if t.step_quantiles:
            kpis.append(
                _kpi(
                    "step time p50 / p99",
                    f"{fmt_ms(t.step_quantiles[0])} / {fmt_ms(t.step_quantiles[2])}",
                )
            )
        if t.samples_per_s:
            kpis.append(_kpi("samples / s", f"{t.samples_per_s:,.0f}"))
        if t.mfu is not None:
            kpis.append(_kpi("MFU", f"{t.mfu * 100:.1f} %"))
        if t.joules_per_token:
            kpis.append(_kpi("training tokens / J", f"{1 / t.joules_per_token:,.1f}"))
    i = A.inference(run)
    if i is not None:
        kpis.append(_kpi("requests", f"{i.requests:,}"))
        kpis.append(_kpi("error rate", f"{i.error_rate * 100:.1f} %"))
        if i.latency:
            kpis.append(
                _kpi("latency p50 / p99", f"{fmt_ms(i.latency[0])} / {fmt_ms(i.latency[2])}")
            )
        if i.ttft:
            kpis.append(_kpi("TTFT p50 / p99", f"{fmt_ms(i.ttft[0])} / {fmt_ms(i.ttft[2])}"))
        if i.joules_per_output_token:
            kpis.append(_kpi("energy / output token", f"{i.joules_per_output_token:.2f} J"))
            kpis.append(_kpi("output tokens / J", f"{1 / i.joules_per_output_token:,.2f}"))
    kpis.append(_kpi("GPU health events", str(len(run.gpu_events))))
    return '<div class="kpis">' + "".join(kpis) + "</div>"


def _gpu_table(run: Run) -> str:
    gpus = A.gpus(run)
    if not gpus:
        return ""
    rows = []
    for n, g in enumerate(gpus):

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v * 100:.0f} %"

        rows.append(
            "<tr>"
            f"<td>GPU {n}</td><td>{esc(g.name)}</td><td><code>{esc(g.uuid[:20])}</code></td>"
            f'<td class="num">{pct(g.utilization_mean)}</td>'
            f'<td class="num">{pct(g.tensor_activity_mean)}</td>'
            f'<td class="num">{"n/a" if g.memory_peak_bytes is None else f"{g.memory_peak_bytes / 2**30:.1f} GiB"}</td>'
            f'<td class="num">{"n/a" if g.power_mean_w is None else f"{g.power_mean_w:.0f} W"}</td>'
            f'<td class="num">{"n/a" if g.temperature_max_c is None else f"{g.temperature_max_c:.0f} °C"}</td>'
            f'<td class="num">{pct(g.throttle_share)}</td>'
            f'<td class="num">{"n/a" if g.energy_j is None else f"{g.energy_j:,.0f} J"}</td>'
            f"<td>{esc(', '.join(f'{k} x{v}' for k, v in sorted(g.events.items())) or '-')}</td>"
            "</tr>"
        )
    head = (
        "<tr><th></th><th>model</th><th>UUID</th><th class=num>util (mean)</th>"
        "<th class=num>tensor</th><th class=num>memory peak</th><th class=num>power (mean)</th>"
        "<th class=num>temp (max)</th><th class=num>throttled</th><th class=num>energy</th>"
        "<th>events</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _events_html(run: Run) -> str:
    if not run.gpu_events:
        return '<p class="muted">No GPU health events.</p>'
    items = "".join(
        f'<li class="gpu-event">{e.time_s:.2f} s — <b>{esc(e.kind)}</b> {esc(e.detail)} '
        f"on <code>{esc(e.uuid)}</code></li>"
        for e in run.gpu_events[:MAX_EVENT_MARKERS]
    )
    return f'<ul class="events">{items}</ul>'


def _findings_html(run: Run) -> str:
    stragglers = A.stragglers(run)
    other = A.other_findings(run)
    if not stragglers and not other:
        return (
            '<p class="muted">No straggler, drift or memory-creep findings were recorded '
            "(single process, or diagnosis not enabled).</p>"
        )
    rows = "".join(
        f"<tr><td class=num>{f.time_s:.1f} s</td><td>{esc(f.name)}</td>"
        f"<td>{esc(f.body or ', '.join(f'{k}={v}' for k, v in sorted(f.attributes.items())))}</td></tr>"
        for f in (stragglers + other)[:200]
    )
    return f"<table><tr><th class=num>time</th><th>finding</th><th>detail</th></tr>{rows}</table>"


def _distributions_html(run: Run) -> str:
    rows = []
    for s in sorted(run.sketches.values(), key=lambda s: (s.name, s.label)):
        if not s.sketch.count:
            continue
        qs = s.sketch.quantiles(list(A.QUANTILES))
        scale, unit = (1e3, "ms") if s.unit == "s" else (1.0, s.unit)
        cells = "".join(f'<td class="num">{v * scale:.2f}</td>' for v in qs)
        rows.append(
            f"<tr><td>{esc(s.name)}</td><td class=muted>{esc(s.label)}</td>"
            f'<td class="num">{s.sketch.count}</td>{cells}<td>{esc(unit)}</td></tr>'
        )
    head = "<tr><th>metric</th><th>series</th><th class=num>n</th><th class=num>p50</th><th class=num>p95</th><th class=num>p99</th><th>unit</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _page(title: str, subtitle: str, body: str, figures: dict[str, dict[str, Any]]) -> str:
    figures_json = json.dumps(figures, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style>"
        f"<script>{plotly_js()}</script></head><body><main>"
        f"<h1>{esc(title)}</h1><div class=muted>{subtitle}</div>{body}"
        "<footer>otelgpu report · self-contained (plots by plotly.js, inlined) · "
        "light and dark themes follow your system</footer></main>"
        f'<script type="application/json" id="otelgpu-figures">{figures_json}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def _section(title: str, content: str) -> str:
    return f"<section><h2>{esc(title)}</h2>{content}</section>"


def _plot_div(plot_id: str, figures: dict[str, Any], figure: dict[str, Any] | None) -> str:
    if figure is None:
        return ""
    figures[plot_id] = _clean(figure)
    height = figure["layout"].get("height", 420)
    return f'<div class="plot" id="{plot_id}" style="height:{int(height)}px"></div>'


def _clean(node: Any) -> Any:
    """Drop ``None`` values and non-finite numbers (JSON has neither)."""
    if isinstance(node, dict):
        return {k: _clean(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    if isinstance(node, float) and not math.isfinite(node):
        return None
    return node


def render(run: Run) -> str:
    """The report page of one run (a complete HTML document)."""
    figures: dict[str, dict[str, Any]] = {}
    body = [_section("Verdict", _verdicts_html(run) + _kpis_html(run))]
    training = _plot_div("step-time", figures, step_time_figure(run))
    training += _plot_div("phases", figures, phase_figure(run))
    if training:
        body.append(_section("Training", training))
    latency = _plot_div("latency-cdf", figures, latency_figure(run))
    if latency:
        body.append(_section("Latency and step-time distributions", latency))
    gpu = _plot_div("gpu-timelines", figures, gpu_figure(run)) + _gpu_table(run)
    if gpu:
        body.append(_section("GPUs", gpu))
    body.append(_section("GPU health events", _events_html(run)))
    body.append(_section("Stragglers and diagnosis findings", _findings_html(run)))
    body.append(_section("All distributions", _distributions_html(run)))
    gpus = run.gpus()
    subtitle = esc(
        f"{', '.join(p.rsplit('/', 1)[-1] for p in run.paths)} · {len(run.processes)} process(es)"
        f" · {len(gpus)} GPU(s) · {run.end_s:.1f} s recorded"
    )
    return _page("otelgpu run report", subtitle, "".join(body), figures)


# --------------------------------------------------------------------------- comparison
def render_comparison(run_a: Run, run_b: Run, comparison: C.Comparison) -> str:
    figures: dict[str, dict[str, Any]] = {}
    rows = []
    for m in comparison.metrics:
        badge_class = m.verdict.replace(" ", "")
        verdict = f"only in {m.only_in}" if m.only_in else m.verdict
        scale, unit = (1e3, "ms") if m.unit == "s" else (1.0, m.unit)
        cells = (
            "".join(
                f'<td class="num">{s.a * scale:.2f} → {s.b * scale:.2f} '
                f'<span class="badge {s.verdict.replace(" ", "")}">{s.change * 100:+.1f} %</span></td>'
                for s in m.shifts
            )
            or "<td></td><td></td><td></td>"
        )
        rows.append(
            f'<tr class="metric-row" data-verdict="{esc(verdict)}"><td>{esc(m.name)}</td>'
            f"<td class=muted>{esc(m.label)}</td><td class=num>{m.count_a}→{m.count_b}</td>"
            f'{cells}<td>{esc(unit)}</td><td><span class="badge {badge_class}">{esc(verdict)}</span></td></tr>'
        )
    head = (
        "<tr><th>metric</th><th>series</th><th class=num>n (A→B)</th><th class=num>p50</th>"
        "<th class=num>p95</th><th class=num>p99</th><th>unit</th><th>verdict</th></tr>"
    )
    table = f"<table>{head}{''.join(rows)}</table>"
    ctx = "".join(
        f"<tr><td>{esc(w)}</td><td class=num>{esc(a)}</td><td class=num>{esc(b)}</td>"
        f"<td class=num>{esc(d)}</td></tr>"
        for w, a, b, d in comparison.context
    )
    ctx_table = (
        "<table><tr><th></th><th class=num>A</th><th class=num>B</th><th class=num>B - A</th></tr>"
        f"{ctx}</table>"
    )
    plots = ""
    shown = 0
    for m in comparison.metrics:
        if m.only_in or m.unit != "s" or shown >= 8:
            continue
        sa = run_a.sketches[(m.name, m.label)].sketch
        sb = run_b.sketches[(m.name, m.label)].sketch
        shown += 1
        plots += _plot_div(
            f"cmp-{shown}",
            figures,
            cdf_figure(
                [("A", sa), ("B", sb)],
                f"{m.name} [{m.label}] — {m.verdict}",
                dash=("solid", "dash"),
            ),
        )
    n_reg = len(comparison.regressions())
    summary = (
        f'<div class="cards"><div class="card verdict {"bad" if n_reg else "ok"}">'
        f'<div class="label">{"REGRESSION" if n_reg else "NO REGRESSION"}</div>'
        f"<div>{n_reg} metric(s) regressed beyond the sketch's error bound and the quantile's "
        "sampling uncertainty</div></div></div>"
    )
    body = (
        _section("Verdict", summary)
        + _section("Distributions: B against A", table)
        + _section("GPU context", ctx_table)
        + _section("CDFs (A solid, B dashed)", plots)
    )
    subtitle = esc(f"A = {', '.join(run_a.paths)} · B = {', '.join(run_b.paths)}")
    return _page("otelgpu run comparison", subtitle, body, figures)
