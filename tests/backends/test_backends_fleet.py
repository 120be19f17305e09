"""The fleet property (brief, "Scale"): quantiles merged downstream equal one sketch's.

Three processes -- ranks 0, 1, 2 of one job (``RANK``/``WORLD_SIZE`` in the environment,
as torchrun sets them), each ``otelgpu.instrument()``-ed and fed its own slice of a known
latency data set (the ranks differ: a fast one, a slow one, one with a heavy tail) --
export OTLP (two over gRPC, one over HTTP/protobuf) to an in-process receiver standing in
for the Collector gateway. Each exports twice (mid-run and at shutdown), cumulatively.

Downstream we do what a backend does with OTLP exponential histograms: keep the latest
cumulative point per (process, series), drop the process identity (``sum without (rank,
instance)``) and add the buckets up. The merged histogram must equal, bucket for bucket,
one sketch fed every value, and its quantiles must be within 1 % of the exact ones.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import python_env
from fixtures.otlp_receiver import OtlpReceiver, attributes

from otelgpu.sketch import QuantileSketch

pytestmark = pytest.mark.backend

ROOT = Path(__file__).resolve().parents[2]
RANKS = 3
PER_RANK = 6000
PROTOCOLS = ("grpc", "http/protobuf", "grpc")
STEP = "otelgpu.train.step.duration"
REQUEST = "gen_ai.server.request.duration"
QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)

CHILD = """
    import json, sys
    import otelgpu
    from otelgpu import _runtime
    from otelgpu.runtime.records import RequestRecord, StepRecord

    data = json.load(open(sys.argv[1]))
    handle = otelgpu.instrument(
        service_name="fleet-test", gpu=False, frameworks="none", traces_sampler="always_off",
        metric_export_interval_ms=3_600_000,  # export on flush and at shutdown only
    )
    runtime = _runtime.current()
    t = 1_700_000_000_000_000_000
    half = len(data["steps"]) // 2
    for part in (slice(0, half), slice(half, None)):
        for step_ns, request_ns in zip(data["steps"][part], data["requests"][part]):
            runtime.record_step(StepRecord(t, t + step_ns))
            runtime.record_request(RequestRecord(t, t + request_ns, model="llama", output_tokens=8))
            t += step_ns
        if part.start == 0:
            handle.force_flush()  # a mid-run cumulative export
    otelgpu.shutdown()
"""


def _rank_data(rank: int) -> dict[str, list[int]]:
    """Durations in integer nanoseconds (exactly representable as the child records them)."""
    rng = random.Random(1000 + rank)
    if rank == 0:  # a fast, steady rank
        steps = [rng.lognormvariate(math.log(0.020), 0.15) for _ in range(PER_RANK)]
    elif rank == 1:  # a slower rank (a straggler)
        steps = [rng.lognormvariate(math.log(0.031), 0.25) for _ in range(PER_RANK)]
    else:  # 3 % very slow steps (checkpoint writes, data stalls)
        body = math.log(0.022)
        steps = [
            rng.uniform(0.2, 2.0) if rng.random() < 0.03 else rng.lognormvariate(body, 0.2)
            for _ in range(PER_RANK)
        ]
    requests = [rng.paretovariate(2.5) * 0.05 for _ in range(PER_RANK)]
    return {
        "steps": [int(s * 1e9) for s in steps],
        "requests": [int(r * 1e9) for r in requests],
    }


def _latest_points(receiver: OtlpReceiver, name: str) -> dict[tuple[Any, ...], Any]:
    """Latest cumulative point per (process, series) of the exponential histogram ``name``."""
    latest: dict[tuple[Any, ...], Any] = {}
    for request in receiver.requests("metrics"):
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            process = (resource["service.instance.id"], resource["otelgpu.dist.rank"])
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != name:
                        continue
                    assert metric.WhichOneof("data") == "exponential_histogram"
                    assert metric.exponential_histogram.aggregation_temporality == 2  # cumulative
                    for dp in metric.exponential_histogram.data_points:
                        key = (*process, tuple(sorted(attributes(dp.attributes).items())))
                        previous = latest.get(key)
                        if previous is not None:
                            # Cumulative: same start, never fewer values.
                            assert dp.start_time_unix_nano == previous.start_time_unix_nano
                            assert dp.count >= previous.count or (
                                dp.time_unix_nano < previous.time_unix_nano
                            )
                        if previous is None or dp.time_unix_nano > previous.time_unix_nano:
                            latest[key] = dp
    return latest


def _buckets(dp: Any) -> dict[int, int]:
    """Positive buckets of an OTLP data point (or an SDK point) as {index: count}."""
    counts = dp.positive.bucket_counts
    return {dp.positive.offset + i: int(c) for i, c in enumerate(counts) if c}


def _exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _run_ranks(tmp_path: Path, receiver: OtlpReceiver) -> dict[int, dict[str, list[int]]]:
    data = {rank: _rank_data(rank) for rank in range(RANKS)}
    procs = []
    for rank in range(RANKS):
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps(data[rank]))
        protocol = PROTOCOLS[rank]
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        env = python_env(
            RANK=rank,
            LOCAL_RANK=rank,
            WORLD_SIZE=RANKS,
            OTELGPU_OTLP_ENDPOINT=endpoint,
            OTELGPU_OTLP_PROTOCOL=protocol,
            OTELGPU_OTLP_INSECURE="true",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(CHILD), str(path)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0, f"rank {rank}: {out.decode(errors='replace')}"
    return data


@pytest.mark.slow
def test_backends_fleet_histograms_merge_like_one_sketch(
    tmp_path: Path, otlp_receiver: OtlpReceiver
) -> None:
    data = _run_ranks(tmp_path, otlp_receiver)
    transports = {t for t, s, _ in otlp_receiver.received if s == "metrics"}
    assert transports == {"grpc", "http"}

    for name, field in ((STEP, "steps"), (REQUEST, "requests")):
        latest = _latest_points(otlp_receiver, name)
        ranks = sorted({key[1] for key in latest})
        assert ranks == [0, 1, 2], (name, ranks)
        assert len(latest) == RANKS, name  # one series per process (no attribute split)
        assert [dp.count for dp in latest.values()] == [PER_RANK] * RANKS, name

        # A backend's merge: points of one scale add bucket by bucket.
        scales = {dp.scale for dp in latest.values()}
        assert len(scales) == 1, scales
        summed: dict[int, int] = defaultdict(int)
        for dp in latest.values():
            for index, count in _buckets(dp).items():
                summed[index] += count

        # The same through the sketch API, as otelgpu's own tools merge them.
        merged = QuantileSketch(relative_accuracy=0.01)
        for dp in latest.values():
            merged.merge(QuantileSketch.from_data_point(dp))

        values = [ns / 1e9 for rank in range(RANKS) for ns in data[rank][field]]
        single = QuantileSketch(relative_accuracy=0.01)
        for v in values:
            single.add(v)
        reference = single.to_data_point(0, 1)

        assert reference.scale in scales
        assert dict(summed) == _buckets(reference), name
        merged_point = merged.to_data_point(0, 1)
        assert (merged_point.scale, _buckets(merged_point)) == (
            reference.scale,
            _buckets(reference),
        )
        assert merged.count == single.count == len(values)
        assert merged.min == min(values) and merged.max == max(values)
        assert merged.sum == pytest.approx(math.fsum(values), rel=1e-12)
        assert sum(dp.zero_count for dp in latest.values()) == reference.zero_count

        estimates = merged.quantiles(list(QUANTILES))
        assert estimates == single.quantiles(list(QUANTILES)), name
        for q, estimate in zip(QUANTILES, estimates, strict=True):
            exact = _exact(values, q)
            assert abs(estimate - exact) <= 0.01 * exact, (name, q, estimate, exact)

    # Each process exported twice, cumulatively: half its values mid-run, all at the end.
    counts: dict[int, list[int]] = defaultdict(list)
    for resource, _, metric in otlp_receiver.metrics():
        if metric.name == STEP:
            counts[resource["otelgpu.dist.rank"]] += [
                dp.count for dp in metric.exponential_histogram.data_points
            ]
    assert {rank: sorted(c) for rank, c in counts.items()} == {
        rank: [PER_RANK // 2, PER_RANK] for rank in range(RANKS)
    }

    # The per-rank quantiles differ (a straggler is visible before the merge hides it).
    steps = _latest_points(otlp_receiver, STEP)
    p50 = {key[1]: QuantileSketch.from_data_point(dp).quantile(0.5) for key, dp in steps.items()}
    assert p50[1] > 1.3 * p50[0]
