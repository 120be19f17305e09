"""Every documented launcher runs vLLM on a CPU machine against the simulated node.

``opentelemetry-instrument``, ``otelgpu run`` and ``otelgpu sim run … -- python serve.py``
activate the simulator before vLLM is imported. vLLM's platform detection counts GPUs
through NVML and, finding some, loads ``libcuda.so.1`` -- absent here, so the program
died at import. The simulator must not pass for a CUDA driver: vLLM resolves the CPU
platform, while NVML clients (pynvml) and otelgpu's sampler still see the simulated GPUs,
and vLLM's plugin loader still builds otelgpu's stat logger (vLLM's real classes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.otel import python_env

SCENARIO = "healthy-8xh100"
ROOT = Path(__file__).resolve().parents[2]

SERVE = """
    import json, time
    from vllm.platforms import current_platform
    from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories
    import pynvml
    from otelgpu import _runtime

    platform = current_platform.device_type  # resolved before otelgpu starts under plain python
    factories = [f.__name__ for f in load_stat_logger_plugin_factories()]
    import otelgpu
    otelgpu.instrument()  # what vLLM's stat logger does; returns the launcher's handle if any
    pynvml.nvmlInit()
    gpus = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    runtime = _runtime.current()
    sampled = 0
    if runtime is not None and runtime.sampler is not None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not runtime.sampler.devices:
            time.sleep(0.05)
        sampled = len(runtime.sampler.devices)
    print("RESULT " + json.dumps({
        "platform": type(current_platform).__name__,
        "device_type": platform,
        "nvml_gpus": gpus,
        "sampled": sampled,
        "factories": factories,
    }))
"""

VENV_BIN = Path(sys.executable).parent


def _launcher(name: str) -> list[str]:
    otelgpu = [sys.executable, "-m", "otelgpu"]
    if name == "opentelemetry-instrument":
        exe = shutil.which("opentelemetry-instrument", path=str(VENV_BIN))
        assert exe is not None, "opentelemetry-instrument is a declared test dependency"
        return [exe, sys.executable]
    if name == "otelgpu run":
        return [*otelgpu, "run", "--", sys.executable]
    if name == "otelgpu sim run":
        return [*otelgpu, "sim", "run", SCENARIO, "--", sys.executable]
    return [sys.executable]  # plain python with OTELGPU_SIM


LAUNCHERS = ("opentelemetry-instrument", "otelgpu run", "otelgpu sim run", "python")


@pytest.mark.slow
def test_vllm_resolves_the_cpu_platform_under_every_launcher(tmp_path: Path) -> None:
    serve = tmp_path / "serve.py"
    serve.write_text(textwrap.dedent(SERVE))
    env = python_env(
        OTELGPU_SIM=SCENARIO,
        OTELGPU_EXPORTERS="none",
        OTELGPU_FRAMEWORKS="vllm",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        VLLM_PLUGINS="otelgpu",
    )
    env.pop("VLLM_TARGET_DEVICE", None)
    # The launchers run side by side: each spends its time importing torch and vLLM.
    procs = {
        name: subprocess.Popen(
            [*_launcher(name), str(serve)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for name in LAUNCHERS
    }
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, (name, stderr[-4000:])
        result = json.loads(lines[-1][len("RESULT ") :])
        if name == "python":  # the simulator starts after vLLM chose: no CUDA either way
            assert result["platform"] in ("CpuPlatform", "UnspecifiedPlatform"), result
        else:  # the simulator was active first and told vLLM there is no CUDA driver
            assert result["platform"] == "CpuPlatform", (name, result)
            assert result["device_type"] == "cpu", (name, result)
        assert result["nvml_gpus"] == 8, (name, result)  # NVML clients see the simulated node
        assert "OtelGpuStatLogger" in result["factories"], (name, result)
        assert result["sampled"] == 8, (name, result)  # otelgpu samples the simulated GPUs
        assert "libcuda" not in stderr, name


def test_vllm_guard_sets_cpu_only_without_a_cuda_driver_and_never_overrides() -> None:
    from otelgpu import sim
    from otelgpu.sim._runtime import cuda_driver_present, framework_guard

    expected = {} if cuda_driver_present() else {"VLLM_TARGET_DEVICE": "cpu"}
    env = sim.env_for(SCENARIO, base={})
    assert {k: env[k] for k in expected} == expected
    assert framework_guard({"VLLM_TARGET_DEVICE": "cuda"}) == {}  # the user's choice wins
