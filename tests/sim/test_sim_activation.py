"""Activation in-process and from the environment; resets; resource attributes."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pynvml as n
import pytest

from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.sim._runtime import cuda_driver_present

Activate = Callable[..., sim.SimGpu]


def test_activate_sets_library_env_and_attributes(sim_gpu: sim.SimGpu) -> None:
    assert sim.active() is sim_gpu
    assert os.environ[sim.ENV_NVML_LIBRARY] == sim.library_path()
    assert sim.resource_attributes() == {
        "otelgpu.sim": True,
        "otelgpu.sim.scenario": "test-small",
        "otelgpu.sim.clock": "virtual",
    }
    assert sim_gpu.virtual and sim_gpu.now_s() == 0.0
    assert sim_gpu.advance(2.5) == 2.5
    sim_gpu.set_time(1.0)
    assert sim_gpu.now_ns() == 1_000_000_000
    assert sim_gpu.time_ns() == sim_gpu.epoch_ns + 1_000_000_000
    assert "test-small" in repr(sim_gpu)


def test_dlopen_by_soname_shares_state(sim_gpu: sim.SimGpu) -> None:
    """What the native sampler does: dlopen("libnvidia-ml.so.1") gets the simulator."""
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    assert count.value == sim_gpu.scenario.gpu_count
    assert lib.nvmlShutdown() == 0


def test_reactivation_resets_state(sim_scenario: Activate) -> None:
    first = sim_scenario("ecc-storm")
    n.nvmlInit()
    first.set_time(200)
    first.inject("gpu_lost", gpu=0)
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetTotalEnergyConsumption(n.nvmlDeviceGetHandleByIndex(1)) > 0
    second = sim_scenario("dataloader-stalls")
    assert second.now_s() == 0.0
    assert n.nvmlDeviceGetCount() == 2  # pynvml stays initialised across the switch
    h = n.nvmlDeviceGetHandleByIndex(0)  # the injected loss is gone
    assert n.nvmlDeviceGetTotalEnergyConsumption(h) == 0
    assert n.nvmlDeviceGetTotalEccErrors(h, 0, 0) == 0
    n.nvmlShutdown()


def test_deactivate_makes_nvml_fail(sim_scenario: Activate) -> None:
    gpu = sim_scenario("healthy-8xh100")
    gpu.deactivate()
    assert sim.active() is None
    assert sim.resource_attributes() == {}
    with pytest.raises(n.NVMLError_DriverNotLoaded):
        n.nvmlInit()


def test_clock_errors(sim_scenario: Activate) -> None:
    with pytest.raises(ConfigurationError, match="clock"):
        sim.activate("healthy-8xh100", clock="sundial")
    wall = sim_scenario("healthy-8xh100", clock="wall")
    with pytest.raises(sim.SimLibraryError, match="virtual clock"):
        wall.advance(1)
    virtual = sim_scenario("healthy-8xh100")
    with pytest.raises(ConfigurationError, match="advance"):
        virtual.advance(-1)


def test_inject_validates(sim_gpu: sim.SimGpu) -> None:
    with pytest.raises(sim.ScenarioError, match="kind"):
        sim_gpu.inject("explode")
    with pytest.raises(sim.ScenarioError, match=r"gpu.*\[0, 1\]"):
        sim_gpu.inject("xid", gpu=5, code=79)
    with pytest.raises(sim.ScenarioError, match="code"):
        sim_gpu.inject("xid", gpu=0)
    with pytest.raises(sim.ScenarioError, match="colour"):
        sim_gpu.inject("gpu_lost", gpu=0, colour="red")


def test_activate_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sim.ENV_SIM, raising=False)
    monkeypatch.delenv(sim.ENV_CONFIG, raising=False)
    assert sim.activate_from_env() is None
    monkeypatch.setenv(sim.ENV_SIM, "inference-bursty")
    monkeypatch.setenv(sim.ENV_CLOCK, "virtual")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "")  # unset for the guard; restored afterwards
    try:
        gpu = sim.activate_from_env()
        assert gpu is not None
        # the launcher path tells vLLM there is no CUDA driver (when there is none)
        cpu = "" if cuda_driver_present() else "cpu"
        assert os.environ["VLLM_TARGET_DEVICE"] == cpu
        assert gpu.scenario.name == "inference-bursty" and gpu.clock == "virtual"
        assert sim.activate_from_env() is gpu  # idempotent
        assert sim.resource_attributes()["otelgpu.sim.scenario"] == "inference-bursty"
    finally:
        sim.deactivate()
    # without an active simulator, the env var alone still marks the resource
    assert sim.resource_attributes() == {
        "otelgpu.sim": True,
        "otelgpu.sim.scenario": "inference-bursty",
        "otelgpu.sim.clock": "virtual",
    }


def test_activate_from_env_under_sim_run() -> None:
    """Under `otelgpu sim run` the child attaches to the run's scenario file."""
    code = (
        "from otelgpu import sim; import pynvml; g = sim.activate_from_env(); "
        "pynvml.nvmlInit(); print(g.scenario.name, g.clock, pynvml.nvmlDeviceGetCount(), "
        "sorted(sim.resource_attributes().items()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=sim.env_for("thermal-throttling"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(" ", 3)[:3] == ["thermal-throttling", "wall", "4"]
    assert "('otelgpu.sim', True)" in out.stdout


def test_refuses_when_real_nvml_loaded(tmp_path: Path) -> None:
    """Another libnvidia-ml already mapped into the process: activation fails clearly."""
    other = tmp_path / "driver" / "libnvidia-ml.so.1"
    other.parent.mkdir()
    shutil.copy(sim.library_path(), other)
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1]); from otelgpu import sim\n"
        "try:\n    sim.activate('healthy-8xh100')\n"
        "except sim.SimLibraryError as e:\n    print(e); sys.exit(3)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(other)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert str(other) in out.stdout
    assert "already loaded" in out.stdout and "otelgpu sim run" in out.stdout


def test_no_scenario_means_driver_not_loaded(tmp_path: Path) -> None:
    env = {k: v for k, v in sim.env_for("healthy-8xh100").items() if k != sim.ENV_CONFIG}
    code = (
        "import pynvml\ntry:\n    pynvml.nvmlInit()\n"
        "except pynvml.NVMLError_DriverNotLoaded:\n    print('not loaded')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "not loaded"
    assert "no scenario loaded" in out.stderr
