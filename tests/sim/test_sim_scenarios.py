"""Scenario files: built-ins load, malformed ones fail with one clear error each, and
load patterns are exact time functions (window statistics computed from the TOML)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.sim.scenario import builtin_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

Activate = Callable[..., sim.SimGpu]

REQUIRED_BUILTINS = {
    "healthy-8xh100",
    "inference-bursty",
    "thermal-throttling",
    "dataloader-stalls",
    "ecc-storm",
    "xid79-gpu-lost",
}


def test_builtins_listed_and_valid() -> None:
    names = sim.list_scenarios()
    assert set(names) >= REQUIRED_BUILTINS
    for name in names:
        sc = sim.load_scenario(name)
        assert sc.name == name
        assert 1 <= sc.gpu_count <= 16
        assert sc.description
        assert sc.to_config().startswith("otelgpu-sim-config 1\n")
    assert sim.load_scenario("healthy-8xh100").gpu_count == 8


def test_builtin_by_path_equals_by_name() -> None:
    path = builtin_dir() / "ecc-storm.toml"
    assert sim.load_scenario(path).devices == sim.load_scenario("ecc-storm").devices


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


MALFORMED = [
    # (id, TOML text, key named in the error, fragment of the accepted values)
    (
        "wrong-type-count",
        'version = 1\n[gpus]\ncount = "8"\n',
        "gpus.count",
        "an integer in [1, 16]",
    ),
    (
        "wrong-type-util",
        'version = 1\n[gpus]\nutilization = "busy"\n',
        "gpus.utilization",
        "a number in [0, 100] or a pattern table",
    ),
    (
        "util-out-of-range",
        "version = 1\n[gpus]\nutilization = 120\n",
        "gpus.utilization",
        "in [0, 100]",
    ),
    (
        "unknown-top-key",
        "version = 1\ngpu_count = 8\n",
        "gpu_count",
        "one of the keys version, name",
    ),
    (
        "unknown-gpu-key",
        "version = 1\n[gpus]\ncolour = 'green'\n",
        "gpus.colour",
        "one of the keys count, model",
    ),
    (
        "unknown-pattern-key",
        "version = 1\n[gpus]\nutilization = { kind = 'square', high = 90, low = 0, period_s = 10,"
        " low_s = 2, phase = 1 }\n",
        "gpus.utilization.phase",
        "kind, high, low, period_s, low_s, offset_s",
    ),
    (
        "bad-pattern-kind",
        'version = 1\n[gpus]\nutilization = { kind = "sine" }\n',
        "gpus.utilization.kind",
        "'constant', 'square'",
    ),
    (
        "negative-memory",
        "version = 1\n[gpus]\nmemory_gib = -80\n",
        "gpus.memory_gib",
        "a number > 0",
    ),
    (
        "negative-process-memory",
        "version = 1\n[[process]]\ngpu = 0\npid = 7\nmemory_gib = -1\n",
        "process[0].memory_gib",
        "a number >= 0",
    ),
    ("unknown-model", 'version = 1\n[gpus]\nmodel = "H200"\n', "gpus.model", "'A100-SXM'"),
    ("missing-version", "[gpus]\ncount = 1\n", "version", "version = 1"),
    ("future-version", "version = 2\n", "version", "1 (the only format version)"),
    (
        "overlapping-throttle",
        "version = 1\n"
        '[[event]]\nat_s = 10\ngpu = 0\nkind = "throttle"\nreason = "hw_thermal"\nduration_s = 20\n'
        '[[event]]\nat_s = 25\ngpu = 0\nkind = "throttle"\nreason = "sw_thermal"\nduration_s = 5\n',
        "event[1]",
        "does not overlap event[0]",
    ),
    (
        "overlapping-slow-all",
        "version = 1\n[gpus]\ncount = 2\n"
        '[[event]]\nat_s = 0\ngpu = 1\nkind = "slow"\nlatency_ms = 5\nduration_s = 10\n'
        '[[event]]\nat_s = 5\ngpu = "all"\nkind = "slow"\nlatency_ms = 5\nduration_s = 10\n',
        "event[1]",
        "does not overlap event[0]",
    ),
    (
        "lost-twice",
        'version = 1\n[[event]]\nat_s = 1\nkind = "gpu_lost"\n'
        '[[event]]\nat_s = 2\nkind = "gpu_lost"\n',
        "event[1]",
        "at most one gpu_lost per GPU",
    ),
    (
        "event-gpu-out-of-range",
        'version = 1\n[[event]]\nat_s = 1\ngpu = 3\nkind = "xid"\ncode = 79\n',
        "event[0].gpu",
        'an integer in [0, 0] or "all"',
    ),
    (
        "event-unknown-kind",
        'version = 1\n[[event]]\nat_s = 1\nkind = "meltdown"\n',
        "event[0].kind",
        "'xid', 'gpu_lost'",
    ),
    (
        "xid-missing-code",
        'version = 1\n[[event]]\nat_s = 1\nkind = "xid"\n',
        "event[0].code",
        "an Xid number in [1, 999]",
    ),
    (
        "negative-time",
        'version = 1\n[[event]]\nat_s = -5\nkind = "gpu_lost"\n',
        "event[0].at_s",
        "a number >= 0",
    ),
    (
        "bad-init-error",
        'version = 1\n[driver]\ninit_error = "nope"\n',
        "driver.init_error",
        "'driver_not_loaded'",
    ),
    (
        "low-above-period",
        "version = 1\n[gpus]\nutilization = { kind = 'square', high = 90, low = 0,"
        " period_s = 10, low_s = 12 }\n",
        "gpus.utilization.low_s",
        "<= period_s",
    ),
    (
        "duplicate-gpu-index",
        "version = 1\n[gpus]\ncount = 2\n[[gpu]]\nindex = 1\n[[gpu]]\nindex = 1\n",
        "gpu[1].index",
        "not already used",
    ),
    (
        "bad-cc",
        "version = 1\n[gpus]\ncompute_capability = 9\n",
        "gpus.compute_capability",
        '"major.minor"',
    ),
    (
        "serial-too-long",
        "version = 1\n[gpus]\nserial = '1234567890123456789012345678901'\n",
        "gpus.serial",
        "at most 29 characters",
    ),
    ("toml-syntax", "version = 1\n[gpus\n", "syntax", "valid TOML"),
]


@pytest.mark.parametrize(
    ("text", "key", "accepted"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_scenario_one_clear_error(
    tmp_path: Path, text: str, key: str, accepted: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(sim.ScenarioError) as info:
        sim.load_scenario(path)
    message = str(info.value)
    assert str(path) in message  # names the file
    assert f": {key}:" in message  # names the key
    assert accepted in message  # names the accepted values
    assert isinstance(info.value, ConfigurationError)
    assert message.count("\n") == 0  # one line


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(
        sim.ScenarioError, match=r"nope\.toml: file.*an existing TOML scenario file"
    ):
        sim.load_scenario(missing)
    with pytest.raises(sim.ScenarioError, match=r"no-such-scenario: name.*healthy-8xh100"):
        sim.load_scenario("no-such-scenario")


def test_dict_scenario_errors_name_dict() -> None:
    with pytest.raises(sim.ScenarioError, match=r"<dict>: gpus.count"):
        sim.load_scenario({"version": 1, "gpus": {"count": 0}})


def test_activation_rejects_invalid_scenario_without_side_effects(sim_gpu: sim.SimGpu) -> None:
    with pytest.raises(sim.ScenarioError):
        sim.activate({"version": 1, "gpus": {"count": 17}})
    assert sim.active() is sim_gpu  # still the previous one


# -- patterns are exact time functions ---------------------------------------------------


def _util_series(gpu: sim.SimGpu, index: int, times: list[float]) -> list[int]:
    h = n.nvmlDeviceGetHandleByIndex(index)
    out = []
    for t in times:
        gpu.set_time(t)
        out.append(n.nvmlDeviceGetUtilizationRates(h).gpu)
    return out


def test_dataloader_stalls_duty_cycle(sim_scenario: Activate) -> None:
    gpu = sim_scenario("dataloader-stalls")
    raw = tomllib.loads((builtin_dir() / "dataloader-stalls.toml").read_text())["gpus"][
        "utilization"
    ]
    n.nvmlInit()
    try:
        times = [i / 10 for i in range(600)]  # 60 s at 100 ms
        series = _util_series(gpu, 0, times)
    finally:
        n.nvmlShutdown()
    low_frac = raw["low_s"] / raw["period_s"]
    expected_mean = raw["high"] * (1 - low_frac) + raw["low"] * low_frac
    assert sum(series) / len(series) == pytest.approx(expected_mean, abs=1e-9)
    assert series.count(raw["low"]) == round(len(series) * low_frac)
    assert set(series) == {raw["high"], raw["low"]}


def _splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _bursts(p: dict[str, float], t: float) -> float:
    """docs/simulator.md: burst k starts at k*period + u_k*(period - burst)."""
    k = int(t // p["period_s"])
    u = (_splitmix64(int(p["seed"]) + k) >> 11) * 2.0**-53
    start = k * p["period_s"] + u * (p["period_s"] - p["burst_s"])
    return p["peak"] if start <= t < start + p["burst_s"] else p["base"]


def test_bursts_are_seeded_and_reproducible(sim_scenario: Activate) -> None:
    gpu = sim_scenario("inference-bursty")
    data = tomllib.loads((builtin_dir() / "inference-bursty.toml").read_text())
    p0 = data["gpus"]["utilization"]
    p1 = data["gpu"][0]["utilization"]
    times = [i * 0.05 for i in range(1200)]  # 60 s at 50 ms
    n.nvmlInit()
    try:
        s0 = _util_series(gpu, 0, times)
        s1 = _util_series(gpu, 1, times)
    finally:
        n.nvmlShutdown()
    assert s0 == [round(_bursts(p0, t)) for t in times]
    assert s1 == [round(_bursts(p1, t)) for t in times]
    assert s0 != s1  # different seeds, different traffic
    # each 10 s period holds exactly one 3 s burst: 60 samples of 50 ms at the peak
    for k in range(6):
        window = s0[k * 200 : (k + 1) * 200]
        assert window.count(p0["peak"]) == pytest.approx(p0["burst_s"] / 0.05, abs=1)


def test_ramp_and_steps(sim_scenario: Activate) -> None:
    gpu = sim_scenario(
        {
            "version": 1,
            "gpus": {
                "count": 2,
                "utilization": {
                    "kind": "ramp",
                    "from": 10,
                    "to": 90,
                    "start_s": 10,
                    "duration_s": 40,
                },
            },
            "gpu": [
                {"index": 1, "utilization": {"kind": "steps", "points": [[0, 5], [3, 60], [7, 0]]}}
            ],
        }
    )
    n.nvmlInit()
    try:
        assert _util_series(gpu, 0, [0, 10, 20, 30, 50, 99]) == [10, 10, 30, 50, 90, 90]
        assert _util_series(gpu, 1, [0, 2.99, 3, 6.5, 7, 100]) == [5, 5, 60, 60, 0, 0]
    finally:
        n.nvmlShutdown()


def test_normalized_config_roundtrip_names_the_scenario() -> None:
    text = sim.load_scenario("xid79-gpu-lost").to_config("wall", 123)
    assert "clock=wall" in text and "epoch_ns=123" in text
    assert "gpu_count=8" in text
    assert text.count("\nevent=") == 1


# -- property: the simulator evaluates patterns exactly as documented -------------------

_pct = st.integers(min_value=0, max_value=100)
_period = st.integers(min_value=1, max_value=60)


@st.composite
def _patterns(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["constant", "square", "ramp", "bursts", "steps"]))
    if kind == "constant":
        return {"kind": kind, "value": draw(_pct)}
    if kind == "square":
        period = draw(_period)
        low_s = draw(st.integers(min_value=0, max_value=period))
        offset = draw(st.integers(min_value=0, max_value=100))
        return {
            "kind": kind,
            "high": draw(_pct),
            "low": draw(_pct),
            "period_s": period,
            "low_s": low_s,
            "offset_s": offset,
        }
    if kind == "ramp":
        return {
            "kind": kind,
            "from": draw(_pct),
            "to": draw(_pct),
            "start_s": draw(_period),
            "duration_s": draw(_period),
        }
    if kind == "bursts":
        period = draw(_period)
        return {
            "kind": kind,
            "base": draw(_pct),
            "peak": draw(_pct),
            "period_s": period,
            "burst_s": draw(st.integers(min_value=0, max_value=period)),
            "seed": draw(st.integers(min_value=0, max_value=2**63 - 1)),
        }
    times = sorted(draw(st.sets(st.integers(min_value=0, max_value=200), min_size=1, max_size=8)))
    return {"kind": kind, "points": [[t, draw(_pct)] for t in times]}


def _expected(p: dict[str, Any], t: float) -> float:
    """docs/simulator.md, "Patterns"."""
    if p["kind"] == "constant":
        return float(p["value"])
    if p["kind"] == "square":
        return float(p["low"] if (t - p["offset_s"]) % p["period_s"] < p["low_s"] else p["high"])
    if p["kind"] == "ramp":
        if t < p["start_s"]:
            return float(p["from"])
        if t >= p["start_s"] + p["duration_s"]:
            return float(p["to"])
        return float(p["from"] + (p["to"] - p["from"]) * (t - p["start_s"]) / p["duration_s"])
    if p["kind"] == "bursts":
        return _bursts(p, t)
    value: float = p["points"][0][1]
    for pt, pv in p["points"]:
        if pt <= t:
            value = pv
    return value


@settings(max_examples=40, deadline=None)
@given(
    pattern=_patterns(),
    times=st.lists(st.integers(min_value=0, max_value=30_000), min_size=1, max_size=10),
)
def test_patterns_match_documented_formulas(pattern: dict[str, float], times: list[int]) -> None:
    gpu = sim.activate({"version": 1, "gpus": {"count": 1, "utilization": pattern}})
    try:
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        for ms in times:
            t = ms / 100  # 10 ms resolution up to 300 s
            gpu.set_time(t)
            expected = _expected(pattern, t)
            got = n.nvmlDeviceGetUtilizationRates(h).gpu
            # ramps interpolate: the simulator rounds half up, allow the last-bit tie
            assert abs(got - expected) <= 0.5 + 1e-9, (t, got, expected)
        n.nvmlShutdown()
    finally:
        sim.deactivate()
