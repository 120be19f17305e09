"""What a baseline holds: one :class:`Figure` per learned signal, and how its threshold follows.

A figure is a PromQL expression over otelgpu's pull-endpoint names (from the catalog),
grouped by its ``keys`` (``job``; ``job`` + model for inference; the GPU model ``hw_name``
for health). ``$M`` in the expression stands for extra label matchers (one key's labels
in a generated rule, nothing while learning). The threshold is derived from the history
of the expression's values: ``upper`` figures alert above ``p99 x (1 + margin)``
(relative) or ``p99 + margin`` (absolute), ``lower`` figures below ``p1 x (1 - margin)``;
fractions are capped at ``cap``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from otelgpu.baseline.names import metric_name, spec
from otelgpu.metrics.spec import Kind

__all__ = ["FIGURES", "Figure", "figure", "series_name"]


@dataclass(frozen=True)
class Figure:
    """One learned signal. ``margin``: relative (``relative=True``) or absolute."""

    id: str
    family: str  # training | inference | health
    alert: str  # alert name of the generated rule
    metrics: tuple[str, ...]  # catalog names the expression reads
    expr: str  # PromQL; "$M" = extra matchers (see query())
    keys: tuple[str, ...]
    direction: str  # upper | lower
    margin: float
    relative: bool
    unit: str  # UCUM unit of the expression's values
    for_: str
    severity: str
    summary: str
    runbook: str
    cap: float | None = None
    #: For a sketch figure: the quantile it is, learned from the store's merged
    #: histogram buckets when they exist (``otelgpu.baseline.merge``).
    quantile: float | None = None

    def threshold(self, reference: float) -> float:
        """The alert threshold from the history's reference figure (p99 or p1)."""
        if self.direction == "upper":
            t = reference * (1.0 + self.margin) if self.relative else reference + self.margin
        else:
            t = reference * (1.0 - self.margin) if self.relative else reference - self.margin
        return min(t, self.cap) if self.cap is not None else t

    def query(self, matchers: str = "", rate_window: str = "5m", path: str = "pull") -> str:
        """The expression with ``matchers`` (``job="x",hw_name="y"``) on every selector,
        ``rate_window`` as the range of its rates, and the series names of data ``path``."""
        text = self.expr.replace("[5m]", f"[{rate_window}]")
        if path != "pull":
            for m in self.metrics:
                pull, other = series_name(m, "pull"), series_name(m, path)
                if pull != other:
                    text = re.sub(rf"\b{pull}\b", other, text)
        text = text.replace("{$M}", "{" + matchers + "}")
        text = text.replace("$M", "," + matchers if matchers else "")
        return text.replace("{}", "")


def series_name(name: str, path: str = "pull") -> str:
    """The series a figure reads for catalog metric ``name`` on ``path``: a sketch's
    quantile gauge (served on both paths), otherwise the metric's own name."""
    if spec(name).kind is Kind.SKETCH:
        return metric_name(name, "pull")
    return metric_name(name, path)


def _n(name: str) -> str:
    return series_name(name, "pull")


_STEPS = _n("otelgpu.train.steps")
_DATA = _n("otelgpu.train.data.wait.ratio")
_COMM = _n("otelgpu.train.comm.wait.ratio")
_UTIL = _n("hw.gpu.utilization")
_REQS = _n("otelgpu.inference.requests")
_WAITING = _n("otelgpu.vllm.requests.waiting")
_KV = _n("otelgpu.vllm.kv_cache.usage")
_THROTTLE = _n("otelgpu.gpu.throttle.time")
_MEM = _n("hw.gpu.memory.usage")
_LIMIT = _n("hw.gpu.memory.limit")
_MODEL = "gen_ai_request_model"
# Clock reductions that cost throughput (idle and application-clock settings do not).
_COSTLY = "hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown|sw_power_cap|hw_slowdown"


def _sketch_quantile(
    figure_id: str,
    family: str,
    alert: str,
    metric: str,
    quantile: float,
    margin: float,
    for_: str,
    summary: str,
    runbook: str,
) -> Figure:
    """A latency-like sketch figure: its ``quantile`` per job (and model for inference),
    alerting ``margin`` (relative) above the baseline; learned from the store's merged
    histogram buckets where they exist, the rule reads the quantile gauge."""
    keys = ("job",) if family == "training" else ("job", _MODEL)
    return Figure(
        figure_id,
        family,
        alert,
        (metric,),
        f'max by ({", ".join(keys)}) ({_n(metric)}{{quantile="{quantile:g}"$M}})',
        keys,
        "upper",
        margin,
        True,
        "s",
        for_,
        "warning",
        summary,
        runbook,
        quantile=quantile,
    )


def _share(
    figure_id: str,
    family: str,
    alert: str,
    metrics: tuple[str, ...],
    expr: str,
    keys: tuple[str, ...],
    points: float,
    summary: str,
    runbook: str,
    cap: float | None = None,
) -> Figure:
    """A fraction (share of the step spent waiting, used share of the KV cache or of GPU
    memory): alerting ``points`` (absolute) above the history's p99 for 10 minutes, the
    threshold never above ``cap``."""
    return Figure(
        figure_id,
        family,
        alert,
        metrics,
        expr,
        keys,
        "upper",
        points,
        False,
        "1",
        "10m",
        "warning",
        summary,
        runbook,
        cap=cap,
    )


FIGURES: tuple[Figure, ...] = (
    _sketch_quantile(
        "train_step_p95",
        "training",
        "OtelgpuBaselineStepTimeRegression",
        "otelgpu.train.step.duration",
        0.95,
        0.25,
        "10m",
        "p95 step time above its baseline",
        "Compare with the baseline run: input pipeline (data-wait share), communication "
        "(comm-wait share), throttling, a code or config change. `otelgpu report` on a "
        "recording of the slow run names the phase that grew.",
    ),
    _share(
        "train_data_wait_share",
        "training",
        "OtelgpuBaselineDataWaitShare",
        ("otelgpu.train.data.wait.ratio",),
        f"max by (job) ({_DATA}{{$M}})",
        ("job",),
        0.10,
        "data-wait share of the step above its baseline",
        "The input pipeline no longer keeps up: more DataLoader workers, pinned memory, "
        "prefetching, or a slower storage path.",
    ),
    _share(
        "train_comm_wait_share",
        "training",
        "OtelgpuBaselineCommWaitShare",
        ("otelgpu.train.comm.wait.ratio",),
        f"max by (job) ({_COMM}{{$M}})",
        ("job",),
        0.10,
        "communication-wait share of the step above its baseline",
        "A slow rank (see the straggler findings) or a degraded interconnect: check NVLink/"
        "network errors and the slowest rank's GPU.",
    ),
    Figure(
        "train_gpu_utilization",
        "training",
        "OtelgpuBaselineUtilizationDip",
        ("hw.gpu.utilization",),
        f'avg by (job) ({_UTIL}{{hw_gpu_task="general"$M}})'
        f" and on (job) max by (job) ({_STEPS}{{$M}})",  # training jobs only
        ("job",),
        "lower",
        0.25,
        True,
        "1",
        "15m",
        "warning",
        "GPU utilization below its baseline",
        "The GPUs wait for something: data loading, host-side work, communication or a "
        "stalled rank. Look at the data-wait and comm-wait shares first.",
    ),
    _sketch_quantile(
        "train_checkpoint_p95",
        "training",
        "OtelgpuBaselineCheckpointDuration",
        "otelgpu.train.checkpoint.duration",
        0.95,
        0.50,
        "0s",
        "p95 checkpoint duration above its baseline",
        "Checkpoint storage got slower or checkpoints got bigger; check the storage "
        "backend's throughput and the checkpoint size.",
    ),
    _sketch_quantile(
        "inference_request_p99",
        "inference",
        "OtelgpuBaselineLatencyRegression",
        "gen_ai.server.request.duration",
        0.99,
        0.25,
        "5m",
        "p99 request latency above its baseline",
        "Longer prompts/outputs, a larger batch, KV-cache pressure (preemptions) or a "
        "throttled GPU: compare TTFT, queue length and KV-cache usage with the baseline.",
    ),
    _sketch_quantile(
        "inference_ttft_p99",
        "inference",
        "OtelgpuBaselineTtftRegression",
        "gen_ai.server.time_to_first_token",
        0.99,
        0.25,
        "5m",
        "p99 time to first token above its baseline",
        "Requests queue before prefill: check the queue length, prefill batch size and "
        "whether the replica count matches the load.",
    ),
    Figure(
        "inference_error_rate",
        "inference",
        "OtelgpuBaselineErrorRate",
        ("otelgpu.inference.requests",),
        f'(sum by (job, {_MODEL}) (rate({_REQS}{{otelgpu_request_outcome=~"error|timeout"$M}}[5m]))'
        f" or sum by (job, {_MODEL}) (rate({_REQS}{{$M}}[5m])) * 0)"
        f" / sum by (job, {_MODEL}) (rate({_REQS}{{$M}}[5m]))",
        ("job", _MODEL),
        "upper",
        0.02,
        False,
        "1",
        "5m",
        "critical",
        "error/timeout rate above its baseline",
        "Read the failing requests' error.type on the request spans; timeouts usually "
        "follow queue growth.",
    ),
    Figure(
        "inference_queue",
        "inference",
        "OtelgpuBaselineQueueGrowth",
        ("otelgpu.vllm.requests.waiting",),
        f"max by (job) ({_WAITING}{{$M}})",
        ("job",),
        "upper",
        0.50,
        True,
        "{request}",
        "5m",
        "warning",
        "request queue longer than its baseline",
        "Load above what the replicas serve: scale out, or check for a slowed replica "
        "(latency and throttling alerts).",
    ),
    _share(
        "inference_kv_cache",
        "inference",
        "OtelgpuBaselineKvCacheHeadroom",
        ("otelgpu.vllm.kv_cache.usage",),
        f"max by (job) ({_KV}{{$M}})",
        ("job",),
        0.05,
        "KV-cache usage above its baseline (little headroom left)",
        "Near-full KV cache means preemptions and recomputation: lower max_num_seqs, "
        "raise gpu_memory_utilization, or add replicas.",
        cap=0.98,
    ),
    Figure(
        "health_throttle_share",
        "health",
        "OtelgpuBaselineThrottling",
        ("otelgpu.gpu.throttle.time",),
        f"max by (hw_name) (sum by (job, instance, hw_id, hw_name) "
        f'(rate({_THROTTLE}{{otelgpu_gpu_throttle_reason=~"{_COSTLY}"$M}}[5m])))',
        ("hw_name",),
        "upper",
        0.05,
        False,
        "1",
        "5m",
        "warning",
        "share of time with reduced clocks above its baseline",
        "Thermal or power throttling: check cooling, fan/inlet temperature and power "
        "caps of the node; a single throttled GPU slows every rank of a job.",
    ),
    _share(
        "health_memory_usage",
        "health",
        "OtelgpuBaselineMemoryHeadroom",
        ("hw.gpu.memory.usage", "hw.gpu.memory.limit"),
        f"max by (hw_name) ({_MEM}{{$M}} / {_LIMIT}{{$M}})",
        ("hw_name",),
        0.05,
        "GPU memory use above its baseline (headroom shrinking)",
        "Memory grows beyond what the job normally uses: a leak, longer sequences or a "
        "bigger batch; OOM follows when it reaches the limit.",
        cap=0.97,
    ),
)


def figure(figure_id: str) -> Figure:
    for f in FIGURES:
        if f.id == figure_id:
            return f
    raise KeyError(figure_id)
