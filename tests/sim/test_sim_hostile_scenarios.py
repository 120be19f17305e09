"""Malformed and hostile scenario files give a clear ``ScenarioError`` (a
``ConfigurationError`` and ``ValueError``) naming the file and the key -- never a
traceback from deep inside the TOML parser, the model or the C library."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.sim.scenario import builtin_dir

_H = b'version = 1\nname = "h"\n[gpus]\ncount = 1\nmodel = "H100"\n'

CASES: dict[str, tuple[bytes, str]] = {
    "non-utf8": (b'version = 1\nname = "x\xff\xfe"\n', "encoding"),
    "deep-arrays": (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "syntax"),
    "deep-tables": (_H + b"[x" + b".y" * 5000 + b"]\n", "x.y.y"),
    "huge-memory": (_H + b"memory_gib = 1e300\n", "gpus.memory_gib"),
    "huge-memory-used": (_H + b"memory_used_gib = 1e300\n", "gpus.memory_used_gib"),
    "huge-power": (_H + b"power_w = 1e300\n", "gpus.power_w"),
    "huge-fans": (_H + b"fans = 99999999999999999999\n", "gpus.fans"),
    "negative-ambient": (_H + b"ambient_c = -1e300\n", "gpus.ambient_c"),
    "wrong-type": (b'version = 1\nname = "h"\n[gpus]\ncount = "eight"\n', "gpus.count"),
    "gpus-not-a-table": (b'version = 1\nname = "h"\ngpus = [1, 2]\n', "gpus"),
    "event-not-an-array": (_H + b"[event]\nat_s = 1\n", "event"),
    "event-time-type": (_H + b'[[event]]\nat_s = "x"\nkind = "xid"\ncode = 48\n', "event[0].at_s"),
    "xid-flag-type": (
        _H + b'[[event]]\nat_s = 1\nkind = "xid"\ncode = 48\ncontained = 1\n',
        "event[0].contained",
    ),
    "nan": (_H + b"utilization = nan\n", "gpus.utilization"),
    "huge-version": (b"version = 99999999999999999999999999999\n", "version"),
    "too-big": (_H + b"# " + b"x" * (2 << 20) + b"\n", "file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sim_hostile_scenario_names_the_key(case: str, tmp_path: Path) -> None:
    data, key = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_bytes(data)
    with pytest.raises(sim.ScenarioError) as err:
        sim.load_scenario(path)
    assert isinstance(err.value, ConfigurationError)
    assert isinstance(err.value, ValueError)
    assert str(path) in str(err.value) and key in err.value.setting, str(err.value)


def test_sim_hostile_dict_nesting() -> None:
    nested: dict[str, Any] = {}
    cursor = nested
    for _ in range(10_000):
        cursor["x"] = {}
        cursor = cursor["x"]
    with pytest.raises(sim.ScenarioError, match="nesting"):
        sim.load_scenario({"version": 1, "name": "n", "gpus": {"count": 1}, "deep": nested})


def test_sim_mutated_scenarios_only_ever_raise_scenario_errors(tmp_path: Path) -> None:
    """500 byte-level mutations of a built-in scenario: valid ones load and the C library
    accepts them, the rest raise ScenarioError."""
    base = (builtin_dir() / "ecc-storm.toml").read_bytes()
    rng = random.Random(20261203)
    path = tmp_path / "mutant.toml"
    accepted = 0
    for _ in range(500):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            op, at = rng.random(), rng.randrange(len(data))
            if op < 0.4:
                data[at] = rng.randrange(256)
            elif op < 0.7:
                del data[at : at + rng.randint(1, 8)]
            else:
                data[at:at] = rng.choice([b"1e300", b"[", b"]", b"nan", b'"', b"\n[[event]]\n"])
        path.write_bytes(bytes(data))
        try:
            scenario = sim.load_scenario(path)
        except sim.ScenarioError:
            continue
        sim.activate(scenario)  # the C parser takes whatever the Python side accepted
        accepted += 1
    sim.deactivate()
    assert accepted > 0  # the mutations are not all fatal: the valid path is exercised too
