"""A 4-rank gloo job on the simulated node: each straggler, its cause, silence when healthy.

One job (``rank_job.py``, ~10 s on 2 cores) runs four scenarios of 40 steps each, with the
rank exchange every 10 steps: healthy; rank 2's data loader slowed (-> ``input``); rank 3's
gradient all_reduce returning late (a sleep inside the collective -> ``communication``,
seen on the others as wait); rank 1's simulated GPU thermally throttled (fault injected
into the simulator) with its forward slowed by the clock ratio its sampler reads
(-> ``compute``, evidence: throttling on that GPU's UUID). A report belongs to the
scenario of the last step of the window it was concluded in.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401  (must be importable: fail, never skip)
from fixtures.processes import free_port, run_ranks

JOB = Path(__file__).with_name("rank_job.py")

SIM_TOML = """
version = 1
name = "four-h100"
description = "4x H100 at 90 %; rank 1's GPU gets a thermal slowdown injected by the job"

[gpus]
count = 4
model = "H100-SXM"
utilization = 90
"""

pytestmark = pytest.mark.slow


def _run(tmp: Path, attempt: int) -> dict[int, dict[str, Any]] | str:
    out = tmp / f"attempt{attempt}"
    out.mkdir()
    toml = tmp / "four-h100.toml"
    toml.write_text(SIM_TOML)
    argv = [sys.executable, str(JOB), str(free_port()), str(out), str(toml)]
    return run_ranks(argv, out, ranks=4, timeout=180)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ranks")
    got = _run(tmp, 1)
    if isinstance(got, str):  # one retry for start-up flakiness (gloo teardown aborts)
        got = _run(tmp, 2)
    assert not isinstance(got, str), got
    return got


def test_diagnosis_ranks_job_ran_every_window(job: dict[int, dict[str, Any]]) -> None:
    for rank, r in job.items():
        assert r["errors"] == {}, (rank, r["errors"])
        assert r["steps"] == 160
        assert r["windows"] == 16, r["windows"]  # every exchange window completed
        assert r["exchange_timeouts"] == 0
        # the phases partition every step (sum = step time within 2 %)
        assert all(abs(x - 1.0) < 0.02 for x in r["phase_sum_ratios"])
    assert len({r["uuid"] for r in job.values()}) == 4  # each rank samples its own GPU


def _reports(job: dict[int, dict[str, Any]], scenario: str) -> list[tuple[int, str]]:
    rows = {(x["rank"], x["cause"]) for x in job[0]["reports"] if x["scenario"] == scenario}
    for r in job.values():  # every rank concluded the same
        assert {(x["rank"], x["cause"]) for x in r["reports"] if x["scenario"] == scenario} == rows
    return sorted(rows)


def _reported_once_by_rank0(job: dict[int, dict[str, Any]], rank: int, cause: str) -> str:
    zero = job[0]
    lines = [line for line in zero["logs"] if f"straggler rank {rank} " in line]
    assert len(lines) == 1, zero["logs"]
    line = lines[0]
    assert f"cause {cause};" in line and job[rank]["uuid"] in line and "host " in line
    assert [
        e["otelgpu.dist.rank"] for e in zero["events"] if e["otelgpu.diagnosis.cause"] == cause
    ] == [rank]
    assert [
        v
        for a, v in zero["findings"]
        if a == {"otelgpu.diagnosis.kind": "straggler", "otelgpu.diagnosis.cause": cause}
    ] == [1]
    for other in (1, 2, 3):  # one report per job, not one per rank
        assert job[other]["logs"] == [] and job[other]["events"] == []
    for r in job.values():
        assert rank in [s["rank"] for s in r["verdict"]["stragglers"]]
    return str(line)


def test_diagnosis_ranks_healthy_scenario_has_no_straggler(job: dict[int, dict[str, Any]]) -> None:
    healthy = [
        max(w.values(), key=lambda a: a[0])[0] for w in job[0]["assessed"][:4]
    ]  # worst rank's lateness share, per healthy window
    false_positives = sum(
        1 for r in job.values() for x in r["reports"] if x["scenario"] == "healthy"
    )
    print(
        f"healthy scenario: {false_positives} straggler false positives; worst lateness "
        f"per window {healthy} (threshold 0.10)"
    )
    assert false_positives == 0
    # and no rank was reported in a scenario where it was not the slowed one
    expected = {("input", 2, "input"), ("comm", 3, "communication"), ("compute", 1, "compute")}
    for r in job.values():
        got = {(x["scenario"], x["rank"], x["cause"]) for x in r["reports"]}
        assert got == expected, got


def test_diagnosis_ranks_input_straggler(job: dict[int, dict[str, Any]]) -> None:
    assert _reports(job, "input") == [(2, "input")]
    _reported_once_by_rank0(job, 2, "input")


def test_diagnosis_ranks_comm_straggler(job: dict[int, dict[str, Any]]) -> None:
    assert _reports(job, "comm") == [(3, "communication")]
    _reported_once_by_rank0(job, 3, "communication")


def test_diagnosis_ranks_compute_straggler_with_throttling_evidence(
    job: dict[int, dict[str, Any]],
) -> None:
    assert _reports(job, "compute") == [(1, "compute")]
    line = _reported_once_by_rank0(job, 1, "compute")
    report = next(x for x in job[0]["reports"] if x["scenario"] == "compute")
    assert report["gpu_uuid"] == job[1]["uuid"]
    evidence = " ".join(report["evidence"])
    assert "throttled" in evidence and "thermal" in evidence
    assert "SM clock 990 MHz vs 1980 MHz" in evidence
    assert "evidence: throttled" in line
    # the skew gauge: rank 1's own work is above the median in the last windows
    skews = {r: job[r]["skew"][0] for r in job}
    assert max(skews, key=lambda r: skews[r]) == 1, skews
    # its GPU's health over the run is in rank 1's verdict
    assert "hw_thermal_slowdown" in " ".join(job[1]["verdict"]["gpu"].get("throttle_reasons", []))
