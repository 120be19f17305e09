"""Learn a baseline from history: a Prometheus-compatible store, or local recordings.

Every figure of :data:`otelgpu.baseline.figures.FIGURES` present in the history is learned
per key (job; job + model; GPU model). A figure that is present with too little history
(coverage of the window below ``min_coverage``, fewer than ``min_samples`` samples) makes
the whole learn fail with :class:`InsufficientHistory` listing every shortfall -- a
threshold is never guessed. A history with none of the figures fails the same way,
naming the metrics looked for. Figures absent from the history (an inference-only fleet
has no step times) are listed in ``source["absent"]``.

Sketch figures (latency quantiles) come from merged histogram buckets: from a store, the
per-key sum of every process's bucket increases over the window
(``otelgpu.baseline.merge``); from recordings, the merged exponential histograms.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from otelgpu.baseline.figures import FIGURES, Figure, series_name
from otelgpu.baseline.history import PromHistory
from otelgpu.baseline.merge import buckets_from_labels, merged_quantile
from otelgpu.baseline.model import BaselineFile, Entry
from otelgpu.baseline.names import histogram_name

__all__ = [
    "InsufficientHistory",
    "Requirements",
    "entry_from_values",
    "learn_prometheus",
    "learn_recordings",
]

DEFAULT_WINDOW_S = 7 * 86400.0


@dataclass(frozen=True)
class Requirements:
    """How much history a figure needs: share of the window covered, and samples."""

    min_coverage: float = 0.8
    min_samples: int = 100


class InsufficientHistory(Exception):
    """Too little history to learn from; ``problems`` names each shortfall."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of sorted ``values`` (0 <= q <= 1)."""
    pos = q * (len(values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def entry_from_values(
    fig: Figure, labels: dict[str, str], values: Iterable[float], coverage: float
) -> Entry:
    """An entry from the figure's history values (at least one)."""
    ordered = sorted(values)
    p1, median, p99 = (_percentile(ordered, q) for q in (0.01, 0.5, 0.99))
    reference = p99 if fig.direction == "upper" else p1
    return Entry(
        figure=fig.id,
        family=fig.family,
        labels=labels,
        unit=fig.unit,
        direction=fig.direction,
        samples=len(ordered),
        coverage=round(coverage, 4),
        median=median,
        p1=p1,
        p99=p99,
        reference=reference,
        margin=fig.margin,
        relative=fig.relative,
        threshold=fig.threshold(reference),
    )


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _shortfall(
    fig: Figure,
    labels: dict[str, str],
    samples: int,
    coverage: float,
    window_s: float,
    req: Requirements,
) -> str | None:
    if coverage >= req.min_coverage and samples >= req.min_samples:
        return None
    key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) or "-"
    return (
        f"{fig.id} {{{key}}}: {samples} samples covering {coverage:.1%} of the "
        f"{_human(window_s)} window (needs >= {req.min_coverage:.0%} coverage and >= "
        f"{req.min_samples} samples)"
    )


def _looked_for(path: str) -> str:
    names = sorted({series_name(m, path) for f in FIGURES for m in f.metrics})
    return ", ".join(names)


def learn_prometheus(
    history: PromHistory,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    end: float | None = None,
    step_s: float | None = None,
    requirements: Requirements = Requirements(),
    keep_values: dict[tuple[str, str], list[tuple[float, float]]] | None = None,
    path: str = "pull",
) -> BaselineFile:
    """Learn from the store behind ``history`` over ``[end - window_s, end]``.

    A sketch figure (``Figure.quantile``) is learned from the histogram buckets in the
    store (:func:`_learn_histogram`): their increases over the window, merged exactly per
    key; only for keys without bucket series are its quantile gauges used (said in
    ``source["learned_from"]`` and ``source["note"]``). Other figures from their
    expression's values.
    ``step_s`` defaults to window / 2000, at least 15 s. ``keep_values`` (optional) gets
    each learned series' points, keyed ``(figure id, label text)`` (``tighten`` uses them).
    ``path``: the store's naming (``pull``: scraped from the pull endpoint; ``otlp``: OTLP
    with Prometheus naming), kept in the file for the rules.
    Raises :class:`InsufficientHistory`, or ``StoreError`` when the store cannot answer.
    """
    end = time.time() if end is None else end
    start = end - window_s
    step = step_s if step_s is not None else max(15.0, window_s / 2000.0)
    span = _Span(start, end, step, window_s, requirements)
    entries: list[Entry] = []
    problems: list[str] = []
    absent: list[str] = []
    learned_from: dict[str, str] = {}
    gauges: list[str] = []  # sketch figures (some keys of) learned from quantile gauges
    for fig in FIGURES:
        # Keys learned from histogram buckets; the expression's series cover the rest.
        covered: set[tuple[str, ...]] = set()
        if fig.quantile is not None:
            found = _learn_histogram(history, fig, span)
            if found is not None:
                entries.extend(found.entries)
                problems.extend(found.problems)
                learned_from[fig.id] = found.how
                covered = found.keys
        series = [s for s in history.range(fig.query(path=path), start, end, step) if s.points]
        if keep_values is not None:  # the alert expression's own history, for tighten
            for s in series:
                labels = {k: s.labels.get(k, "") for k in fig.keys}
                keep_values[(fig.id, _label_text(labels))] = s.points
        series = [s for s in series if tuple(s.labels.get(k, "") for k in fig.keys) not in covered]
        if not series:
            if not covered:
                absent.append(fig.id)
            continue
        if fig.quantile is None:
            learned_from[fig.id] = "series"
        else:
            gauges.append(fig.id)
            learned_from[fig.id] = f"{found.how} + {_GAUGES}" if covered and found else _GAUGES
        for s in series:
            labels = {k: s.labels.get(k, "") for k in fig.keys}
            coverage = span.coverage(len(s.points))
            problem = _shortfall(fig, labels, len(s.points), coverage, window_s, requirements)
            if problem:
                problems.append(problem)
                continue
            entries.append(entry_from_values(fig, labels, (v for _, v in s.points), coverage))
    source: dict[str, Any] = {
        "kind": "prometheus",
        "path": path,
        "url": history.url,
        "start": start,
        "end": end,
        "window_s": window_s,
        "step_s": step,
        "absent": absent,
        "learned_from": learned_from,
    }
    if gauges:
        source["note"] = (
            f"no histogram series in the store for {', '.join(gauges)} (or some of their "
            "keys): learned from the quantile gauges (cumulative since each process "
            "started, not merged across processes)"
        )
    nothing = (
        f"no otelgpu metrics in {history.url} over the {_human(window_s)} window "
        f"ending {_dt.datetime.fromtimestamp(end, _dt.timezone.utc):%Y-%m-%d %H:%M} "
        f"UTC (looked for {_looked_for(path)})"
    )
    return _finish(entries, problems, nothing, source, requirements)


_GAUGES = "quantile gauges"
#: Longest stretch one increase() covers: bounds the samples a store loads per query.
_CHUNK_S = 6 * 3600.0


@dataclass(frozen=True)
class _Span:
    """The window being learned, its query step, and what a figure needs of it."""

    start: float
    end: float
    step: float
    window_s: float
    requirements: Requirements

    def coverage(self, points: int) -> float:
        return min(1.0, points / (int(self.window_s // self.step) + 1))


@dataclass
class _Learned:
    """What the histogram buckets gave for one figure: entries and shortfalls per key,
    the keys seen, and how (``histogram buckets (le)`` / ``(vmrange)``)."""

    entries: list[Entry]
    problems: list[str]
    keys: set[tuple[str, ...]]
    how: str


def _learn_histogram(history: PromHistory, fig: Figure, span: _Span) -> _Learned | None:
    """Entries of sketch figure ``fig`` from the store's histogram buckets, or ``None``
    when the store has no bucket series of it in the window.

    Per key: ``sum by (le, vmrange, <keys>) (increase(<family>_bucket[chunk]))`` at the
    end of each chunk of the window (at most 6 h each), summed -- the store handles
    counter resets (a run restarting) and the bucket bounds are the same in every process,
    so the sums are the exact merge of every process's buckets (Prometheus' increase()
    extrapolates each series to the chunk edges by the same factor for all of its
    buckets). The figure is the merged distribution's quantile at the bucket edge, with
    the bucket's relative width as ``Entry.resolution``; samples are the merged count.
    Coverage is the share of query steps at which the key's ``<family>_count`` exists.
    """
    assert fig.quantile is not None
    family = histogram_name(fig.metrics[0])
    keys = ", ".join(fig.keys)
    chunks = max(1, math.ceil(span.window_s / _CHUNK_S - 1e-9))
    chunk = span.window_s / chunks
    expr = (
        f"sum by (le, vmrange, {keys}) (increase({family}_bucket[{max(1, round(chunk * 1000))}ms]))"
    )
    groups: dict[tuple[str, ...], dict[tuple[str, str], float]] = {}
    for i in range(chunks):
        for labels, value in history.instant(expr, span.start + (i + 1) * chunk):
            key = tuple(labels.get(k, "") for k in fig.keys)
            bucket = (labels.get("le", ""), labels.get("vmrange", ""))
            counts = groups.setdefault(key, {})
            counts[bucket] = counts.get(bucket, 0.0) + value
    if not groups:
        return None
    present = history.range(f"sum by ({keys}) ({family}_count)", span.start, span.end, span.step)
    points = {tuple(s.labels.get(k, "") for k in fig.keys): len(s.points) for s in present}
    entries: list[Entry] = []
    problems: list[str] = []
    kinds: set[str] = set()
    for key, counts in sorted(groups.items()):
        labels = dict(zip(fig.keys, key, strict=True))
        kinds.update("vmrange" if vr else "le" for _, vr in counts)
        buckets = buckets_from_labels(counts)
        samples = round(sum(b.count for b in buckets))
        coverage = span.coverage(points.get(key, 0))
        found = merged_quantile(buckets, fig.quantile, fig.direction)
        problem = _shortfall(fig, labels, samples, coverage, span.window_s, span.requirements)
        if problem or found is None:
            problems.append(problem or f"{fig.id}: no observations")
            continue
        entry = entry_from_values(fig, labels, [found.value], coverage)
        entry.samples = samples
        entry.resolution = None if found.resolution is None else round(found.resolution, 6)
        entries.append(entry)
    how = "histogram buckets (" + ", ".join(sorted(kinds)) + ")"
    return _Learned(entries, problems, set(groups), how)


def _finish(
    entries: list[Entry],
    problems: list[str],
    nothing: str,
    source: dict[str, Any],
    requirements: Requirements,
    sketches: dict[str, str] | None = None,
) -> BaselineFile:
    """The baseline file, or :class:`InsufficientHistory` (``nothing`` when no figure was
    found at all, else every shortfall)."""
    if not entries and not problems:
        raise InsufficientHistory([nothing])
    if problems:
        raise InsufficientHistory(problems)
    return BaselineFile(
        source=source,
        requirements={
            "min_coverage": requirements.min_coverage,
            "min_samples": requirements.min_samples,
        },
        entries=entries,
        created=_now_iso(),
        sketches=sketches or {},
    )


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


# ------------------------------------------------------------------------- recordings
_SKETCH_FIGURES = {
    "train_step_p95": ("otelgpu.train.step.duration", 0.95),
    "train_checkpoint_p95": ("otelgpu.train.checkpoint.duration", 0.95),
    "inference_request_p99": ("gen_ai.server.request.duration", 0.99),
    "inference_ttft_p99": ("gen_ai.server.time_to_first_token", 0.99),
}
_GAUGE_FIGURES = {
    "train_data_wait_share": ("otelgpu.train.data.wait.ratio", {}),
    "train_comm_wait_share": ("otelgpu.train.comm.wait.ratio", {}),
    "train_gpu_utilization": ("hw.gpu.utilization", {"hw.gpu.task": "general"}),
    "inference_queue": ("otelgpu.vllm.requests.waiting", {}),
    "inference_kv_cache": ("otelgpu.vllm.kv_cache.usage", {}),
}


def learn_recordings(
    paths: Sequence[str],
    *,
    window_s: float = DEFAULT_WINDOW_S,
    requirements: Requirements = Requirements(),
) -> BaselineFile:
    """Learn from otelgpu recordings (OTLP JSON lines) of one job.

    Sketch figures come from the exact merge of every process's exponential histograms
    (``QuantileSketch.from_data_point`` + ``merge``); their quantile is the figure (and
    the merged sketch is kept for the drift detectors). Gauge figures use every recorded
    point. Coverage is the recordings' time span over the window.
    """
    return _learn_recordings(paths, window_s, requirements)


def _all_recorded() -> list[tuple[str, object]]:
    return [*_SKETCH_FIGURES.values(), *_GAUGE_FIGURES.values()]


def _load_run(paths: Sequence[str]) -> Any:
    from otelgpu.report.model import load

    return load(paths)


def _learn_recordings(
    paths: Sequence[str], window_s: float, requirements: Requirements
) -> BaselineFile:
    run = _load_run(paths)
    by_id = {f.id: f for f in FIGURES}
    job = next((str(p["service.name"]) for p in run.processes if p.get("service.name")), "unknown")
    coverage = min(1.0, run.end_s / window_s) if window_s > 0 else 0.0
    entries: list[Entry] = []
    problems: list[str] = []
    sketches: dict[str, str] = {}
    for fid, (name, q) in _SKETCH_FIGURES.items():
        fig = by_id[fid]
        merged = run.merged_sketch(name)
        if merged is None or merged.count == 0:
            continue
        labels = {k: job if k == "job" else "" for k in fig.keys}
        if fig.family == "inference":
            models = {
                str(s.attributes.get("gen_ai.request.model", "")) for s in run.sketch_series(name)
            }
            labels["gen_ai_request_model"] = next(iter(models)) if len(models) == 1 else ""
        problem = _shortfall(fig, labels, int(merged.count), coverage, window_s, requirements)
        if problem:
            problems.append(problem)
            continue
        value = float(merged.quantile(q))
        entries.append(entry_from_values(fig, labels, [value], coverage))
        entries[-1].samples = int(merged.count)
        sketches[fid] = base64.b64encode(merged.to_bytes()).decode()
    for fid, (name, where) in _GAUGE_FIGURES.items():
        fig = by_id[fid]
        values = [
            v
            for s in run.gauge_series(name)
            if all(s.attributes.get(k) == v for k, v in where.items())
            for _, v in s.points
        ]
        if not values:
            continue
        labels = dict.fromkeys(fig.keys, job)
        problem = _shortfall(fig, labels, len(values), coverage, window_s, requirements)
        if problem:
            problems.append(problem)
            continue
        entries.append(entry_from_values(fig, labels, values, coverage))
    nothing = (
        f"no otelgpu metrics in the recordings {', '.join(paths)} (looked for "
        f"{', '.join(sorted(n for n, _ in _all_recorded()))})"
    )
    source = {"kind": "recordings", "paths": list(paths), "window_s": window_s}
    source["span_s"] = run.end_s
    return _finish(entries, problems, nothing, source, requirements, sketches)
