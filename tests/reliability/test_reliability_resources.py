"""Resources: long runs with flat memory and flat per-call cost, a label-cardinality
attack, a full disk and an unwritable recording directory.

CI runs 20,000 steps / requests and a 4,000-name cardinality attack (4x the series cap, so
the overflow series is exercised); ``make soak`` (``OTELGPU_SOAK=1``) runs 1,000,000 and
100,000. Only the sizes differ: the assertions are the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.reliability import SOAK
from fixtures.sim import SMALL_SCENARIO
from reliability_support import HostRun, run_host

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

N = 1_000_000 if SOAK else 20_000


def _recording(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "exporters": "recording",
        "recording_dir": str(tmp_path),
        "metric_export_interval_ms": 1000,
        "frameworks": "none",
        **extra,
    }


def _check_flat(p: Any, config: dict[str, Any]) -> None:
    """Run the host for N calls with ``config`` (RSS every tenth); ``p``'s verdict: memory
    and per-call cost stayed flat, the host exited cleanly."""
    run = run_host({**config, "steps": N, "work_us": 0, "rss_every": N // 10}, timeout=3600)
    ok, figure = _flat(run)
    p.result(ok and run.returncode == 0 and not run.traceback, figure)


def _flat(run: HostRun) -> tuple[bool, str]:
    rss = run["rss_mb"]
    warm = rss[2] if len(rss) > 3 else rss[0]  # after 20 % of the run
    growth = rss[-1] - warm
    # flat = no trend with the run's length: a leak or an O(n) structure raises every later
    # call's cost, so the cheapest tenth of the run's end (tenths 7-10) is compared with the
    # cheapest of its start (tenths 2-5), 2x apart at most. The cheapest, not a median:
    # periodic work (a metric collection, a batch of spans written) lands in some tenths
    # and not others. The cost is the process's CPU time per call (the host's thread and
    # otelgpu's): a wall clock also counts whatever else loads the machine meanwhile (CI
    # runs the two twins' suites side by side on 2 cores).
    cost = run["per_call_cpu_us"]
    early = min(cost[1:5])
    late = min(cost[6:10])
    wall = run["per_call_us"]
    ok = growth < 20 and late <= max(2 * early, early + 20)
    figure = (
        f"{run['steps']:,} calls; RSS {warm:.0f} → {rss[-1]:.0f} MiB after warm-up "
        f"({growth:+.1f}); CPU per call (cheapest tenth) {early:.0f} µs early, {late:.0f} µs "
        f"late (wall {min(wall[1:5]):.0f} → {min(wall[6:10]):.0f} µs)"
    )
    return ok, figure


@pytest.mark.parametrize(
    ("calls", "what", "workload", "instrument"),
    [
        ("steps", "otelgpu.step() on a simulated 2-GPU node", {"sim": SMALL_SCENARIO}, {}),
        (
            "requests",
            "otelgpu.request() over 4 models",
            {"mode": "request", "models": 4},
            {"gpu": False},
        ),
    ],
    ids=["steps", "requests"],
)
def test_many_calls_flat(
    probe: Any,
    tmp_path: Path,
    calls: str,
    what: str,
    workload: dict[str, Any],
    instrument: dict[str, Any],
) -> None:
    p = probe(
        "resources",
        f"{N:,} {calls}",
        f"{N:,} {what}, recording exporter; RSS and mean per-call cost per tenth of the run",
    )
    _check_flat(p, {**workload, "instrument": _recording(tmp_path, **instrument)})


def _series(path: Path) -> dict[str, tuple[int, bool]]:
    """metric name -> (data points, has an overflow point) in the newest export of each."""
    from otelgpu.otel.recording_reader import read_recording

    newest: dict[str, tuple[int, bool]] = {}
    for message in read_recording(path):
        for rm in getattr(message, "resource_metrics", ()):
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points
                    overflow = any(
                        kv.key == "otel.metric.overflow" for dp in points for kv in dp.attributes
                    )
                    newest[metric.name] = (len(points), overflow)
    return newest


def test_label_cardinality_attack(probe: Any, tmp_path: Path) -> None:
    models = 100_000 if SOAK else 4_000
    p = probe(
        "resources",
        "label-cardinality attack",
        f"{models:,} requests, each with a distinct model name (max_series 1000)",
    )
    run = run_host(
        {
            "instrument": _recording(tmp_path, gpu=False),
            "mode": "request",
            "models": models,
            "steps": models,
            "work_us": 0,
            "rss_every": models // 10,
        },
        timeout=1200,
    )
    series = _series(Path(run["recording"])) if run.result else {}
    request_metrics = {k: v for k, v in series.items() if k.startswith("gen_ai.")}
    most = max((n for n, _ in request_metrics.values()), default=0)
    overflow = all(o for n, o in request_metrics.values() if n > 1000)
    rss = run["rss_mb"] if run.result else [0.0]
    ok = bool(request_metrics) and most <= 2001 and overflow and rss[-1] - rss[1] < 100
    p.result(
        ok and run.returncode == 0,
        f"largest gen_ai.* metric has {most} series (limit 1000 per sketch metric, the SDK's "
        f"2000 per counter), overflow series {'present' if overflow else 'MISSING'}; "
        f"RSS {rss[1]:.0f} → {rss[-1]:.0f} MiB; shutdown (final export) "
        f"{run.result.get('shutdown_s', '?')} s",
    )


def test_disk_full(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "resources",
        "disk full",
        "recording with the file-size limit at 64 KiB (writes fail with EFBIG, as on a full "
        "disk) during a 3 s run",
    )
    run = run_host(
        {
            "instrument": _recording(tmp_path, gpu=False, span_schedule_delay_ms=100),
            "duration_s": 3.0,
            "fsize_limit": 64 * 1024,
        }
    )
    warnings = [
        w
        for w in run.result.get("warnings", [])
        if w.startswith(("WARNING", "ERROR")) and "recording telemetry to" not in w
    ]
    ok = run.returncode == 0 and not run.traceback and len(warnings) == 1
    said = warnings[0].split(" (", 1)[-1].split(")")[0] if warnings else ""
    p.result(
        ok,
        f"host ran {run.result.get('steps', 0)} steps, exit {run.returncode}; "
        f"{len(warnings)} warning ('cannot write the recording … ({said}); telemetry is dropped "
        f"and counted'); dropped {sum(run.result.get('dropped', {}).values())} (counted); "
        f"{'TRACEBACK on stderr' if run.traceback else 'no traceback'}",
        warnings=warnings[:5],
    )


def test_unwritable_recording_dir(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "resources",
        "unwritable recording directory",
        "recording_dir is a path that cannot be created (below a regular file)",
    )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = run_host(
        {"instrument": _recording(blocker / "sub", gpu=False), "duration_s": 1.0},
    )
    warnings = [w for w in run.result.get("warnings", []) if w.startswith(("WARNING", "ERROR"))]
    about = [w for w in warnings if str(blocker / "sub") in w]
    where = run.result.get("recording")
    ok = run.returncode == 0 and not run.traceback and len(about) == 1
    p.result(
        ok,
        f"exit {run.returncode}; recorded to {where and Path(where).parent.name} in the temp dir "
        f"instead; {len(about)} warning naming the unusable directory and the fallback",
    )
