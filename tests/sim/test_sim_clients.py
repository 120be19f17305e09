"""Unmodified third-party clients read the simulated GPUs, and the ``otelgpu sim`` CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from otelgpu import sim
from otelgpu.cli import main

Activate = Callable[..., sim.SimGpu]
GIB = 1 << 30
MIB = 1 << 20


def _scenario_toml(pid: int) -> str:
    # thermal_c_per_w = 0 keeps the temperature at ambient, so a wall-clock child sees
    # exactly the TOML numbers whenever it samples
    return f"""
version = 1
name = "gpustat-check"
[gpus]
count = 2
model = "A100-SXM"
utilization = 73
memory_used_gib = 1
idle_power_w = 50
max_power_w = 350
power_limit_w = 300
default_power_limit_w = 300
ambient_c = 41
thermal_c_per_w = 0
[[gpu]]
index = 1
name = "NVIDIA A100-SXM4-40GB"
memory_gib = 40
utilization = 0
[[process]]
gpu = 0
pid = {pid}
name = "pytest"
memory_gib = 12
"""


def _gpustat() -> str:
    exe = shutil.which("gpustat") or str(Path(sys.executable).with_name("gpustat"))
    if not os.path.exists(exe):
        pytest.fail("gpustat is a test dependency (pyproject [test]); it is not installed")
    return exe


def test_gpustat_json_under_sim_run(tmp_path: Path) -> None:
    path = tmp_path / "gpustat-check.toml"
    path.write_text(_scenario_toml(os.getpid()))  # gpustat resolves the pid with psutil
    out = subprocess.run(
        [sys.executable, "-m", "otelgpu", "sim", "run", str(path), "--", _gpustat(), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(out.stdout)
    g0, g1 = report["gpus"]
    sc = sim.load_scenario(path)
    assert [g0["index"], g1["index"]] == [0, 1]
    assert g0["name"] == "NVIDIA A100-SXM4-80GB"
    assert g1["name"] == "NVIDIA A100-SXM4-40GB"
    assert [g0["uuid"], g1["uuid"]] == [d["uuid"] for d in sc.devices]
    assert g0["memory.total"] == 80 * 1024  # MiB
    assert g1["memory.total"] == 40 * 1024
    assert g0["memory.used"] == (12 + 1) * 1024  # process + memory_used_gib (v2, no reserved)
    assert g0["utilization.gpu"] == 73
    assert g1["utilization.gpu"] == 0
    assert g0["power.draw"] == round(50 + (350 - 50) * 0.73)  # W
    assert g1["power.draw"] == 50
    assert g0["enforced.power.limit"] == 300
    assert g0["temperature.gpu"] == 41
    assert g0["fan.speed"] is None  # SXM: NOT_SUPPORTED
    (proc,) = g0["processes"]
    assert proc["pid"] == os.getpid()
    assert proc["gpu_memory_usage"] == 12 * 1024
    assert g1["processes"] == []


def test_nvitop_api_in_process(sim_scenario: Activate) -> None:
    from nvitop import Device

    gpu = sim_scenario("healthy-8xh100")
    devices = Device.all()
    assert len(devices) == 8
    d = devices[2]
    dev = gpu.scenario.devices[2]
    assert d.uuid() == dev["uuid"]
    assert d.bus_id() == dev["pci_bus_id"]
    assert d.memory_total() == round(dev["memory_gib"] * GIB)
    # t = 0: the square wave is high (dip starts at offset 56 s)
    util = gpu.scenario.raw["gpus"]["utilization"]
    assert d.gpu_utilization() == util["high"]
    assert d.power_usage() == round(
        (dev["idle_power_w"] + (dev["max_power_w"] - dev["idle_power_w"]) * util["high"] / 100)
        * 1000
    )
    assert d.nvlink_link_count() == dev["nvlink_links"]
    procs = d.processes()
    assert list(procs) == [4242]
    assert procs[4242].gpu_memory() == 62 * GIB
    gpu.set_time(util["offset_s"] + 1)  # inside the checkpoint dip
    assert d.gpu_utilization() == util["low"]


# -- CLI --------------------------------------------------------------------------------


def test_cli_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "list"]) == 0
    listing = capsys.readouterr().out
    for name in sim.list_scenarios():
        assert name in listing
    assert main(["sim", "show", "xid79-gpu-lost"]) == 0
    shown = capsys.readouterr().out
    assert "gpu_lost" in shown and "t=90s gpu 3" in shown
    assert main(["sim", "show", "--config", "ecc-storm"]) == 0
    assert capsys.readouterr().out.startswith("otelgpu-sim-config 1")
    assert main(["sim", "show", "nope"]) == 2
    assert "nope: name" in capsys.readouterr().err


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("version = 1\n[gpus]\ncount = 99\n")
    assert main(["sim", "validate", str(bad)]) == 1
    assert "gpus.count" in capsys.readouterr().err
    assert main(["sim", "validate", "healthy-8xh100"]) == 0


def test_cli_run_propagates_exit_status_and_env() -> None:
    code = (
        "import os, sys, pynvml; pynvml.nvmlInit(); "
        "assert pynvml.nvmlDeviceGetCount() == 8; "
        "assert os.environ['OTELGPU_SIM'] == 'xid79-gpu-lost'; sys.exit(7)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "otelgpu",
            "sim",
            "run",
            "xid79-gpu-lost",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 7, proc.stderr
    assert main(["sim", "run", "healthy-8xh100"]) == 2  # no command


def test_cli_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "env", "ecc-storm"]) == 0
    out = capsys.readouterr().out
    assert f"export LD_LIBRARY_PATH={sim.library_dir()}" in out
    assert "export OTELGPU_SIM=ecc-storm" in out
    assert "export OTELGPU_SIM_CONFIG=" in out


def test_c_client_dlopen_by_soname(tmp_path: Path) -> None:
    """A C program that dlopen()s "libnvidia-ml.so.1" (like go-nvml or the native
    sampler) finds the simulator through LD_LIBRARY_PATH."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is required to build the simulator; none found")
    src = tmp_path / "client.c"
    src.write_text(
        r"""
#include <dlfcn.h>
#include <stdio.h>
typedef unsigned (*init_t)(void);
typedef unsigned (*count_t)(unsigned *);
int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen failed\n"); return 1; }
    unsigned n = 0;
    if (((init_t)dlsym(h, "nvmlInit_v2"))()) return 2;
    if (((count_t)dlsym(h, "nvmlDeviceGetCount_v2"))(&n)) return 3;
    printf("%u\n", n);
    return 0;
}
"""
    )
    exe = tmp_path / "client"
    subprocess.run([cc, str(src), "-o", str(exe), "-ldl"], check=True, timeout=60)
    out = subprocess.run(
        [str(exe)], env=sim.env_for("ecc-storm"), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "8"
