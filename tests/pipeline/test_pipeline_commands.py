"""The pipeline's commands: demo, report, doctor, run; and the Prometheus pull endpoint."""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from fixtures.otel import (
    python_env,
    reset_otel_globals,  # noqa: F401 - pytest fixtures
    run_interpreter,
)
from fixtures.processes import free_port

import otelgpu
from otelgpu.cli import main
from otelgpu.commands import doctor, report
from otelgpu.commands import run as run_command

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.mark.slow
def test_pipeline_demo_runs_on_the_simulator_and_reports(tmp_path: Path) -> None:
    """make demo: real torch training (zero code) and real transformers serving on the
    simulated 8xH100 node with faults; ends with the verdict and writes the HTML report."""
    env = python_env(OTELGPU_RECORDING_DIR=str(tmp_path))
    proc = run_interpreter(
        "-m", "otelgpu", "demo", "--seconds", "8", "--sim", env=env, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in (
        "simulated GPU",
        "sampling 8 GPU(s)",
        "injected fault: throttle",
        "injected fault: xid",
        "optimizer steps; serving tiny-gpt2",
        "┌─ verdict",
        "GPU HEALTH",
        "training   ",
        "serving    ",
        "time to first token",
        "sketch add(): native" if otelgpu.NATIVE else "sketch add(): pure Python",
    ):
        assert needle in out, (needle, out)
    # the verdict card has the training phases the torch instrumentation measured by itself
    card = out.split("┌─ verdict")[1].split("└")[0]
    # (the diagnosis' verdict when it ran: forward/backward/optimizer; else compute)
    assert re.search(r"data \d+ %", card) and re.search(r"(compute|forward) \d+ %", card), card
    (recording,) = list(tmp_path.glob("*.otlp.jsonl"))
    assert str(recording) in out
    html_line = next(line for line in out.splitlines() if "HTML report" in line)
    html_path = Path(html_line.split("HTML report", 1)[1].strip())
    assert html_path.exists() and html_path.stat().st_size > 1_000_000

    buf = io.StringIO()
    assert report.summarise([str(recording)], buf) > 0
    text = buf.getvalue()
    assert "otelgpu.train.step.duration [-]" in text
    assert "otelgpu.train.data.wait.duration" in text  # zero-code DataLoader wait
    assert "otelgpu.train.checkpoint.duration" in text  # the torch.save checkpoint
    assert "gen_ai.server.time_to_first_token" in text and "tiny-gpt2" in text
    assert "otelgpu.train.step: " in text
    events = text.split("== GPU health events ==")[1].split("\n\n")[0]
    assert "throttle_start" in events and "xid" in events
    # each injected fault lands on the step or request it happened during
    assert "on no span" not in events, events


def test_pipeline_report_of_missing_file_fails() -> None:
    assert main(["report", "/nonexistent/x.otlp.jsonl"]) == 1


def test_pipeline_doctor(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    assert doctor.report(buf) == 0
    text = buf.getvalue()
    assert "native core" in text and "settings" in text
    assert "otelgpu.sketch._sketch_c" in text
    monkeypatch.setenv("OTELGPU_OTLP_PROTOCOL", "smoke-signals")
    buf = io.StringIO()
    assert doctor.report(buf) == 1
    assert "INVALID" in buf.getvalue() and "OTELGPU_OTLP_PROTOCOL" in buf.getvalue()


def test_pipeline_doctor_names_a_lost_gpu_and_keeps_the_others() -> None:
    # GPU 1 of 3 is lost before start: NVML fails every read of it (GPU_IS_LOST); the
    # inventory still lists the two healthy GPUs and the doctor names the lost one.
    from otelgpu import sim

    sim.activate(
        {
            "version": 1,
            "name": "doctor-lost",
            "gpus": {"count": 3, "model": "H100-SXM"},
            "event": [{"at_s": 0, "kind": "gpu_lost", "gpu": 1}],
        },
        clock="virtual",
    )
    try:
        buf = io.StringIO()
        assert doctor.report(buf) == 1
    finally:
        sim.deactivate()
    text = buf.getvalue()
    assert "2 GPU(s)" in text, text
    assert text.count("NVIDIA H100 80GB HBM3  GPU-") == 2, text
    assert "NOT READABLE (lost or faulted): index 1: NVMLError_GpuIsLost(15)" in text, text


def test_pipeline_run_instruments_the_child(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import otelgpu
            from otelgpu import _runtime
            assert _runtime.current() is not None
            with otelgpu.step(samples=1):
                pass
            print("child ok", _runtime.current().settings.service_name)
            """
        )
    )
    env = python_env(OTELGPU_RECORDING_DIR=str(tmp_path / "rec"), OTELGPU_GPU="false")
    proc = run_interpreter(
        "-m", "otelgpu", "run", "-e", "OTEL_SERVICE_NAME=trainer", "--", sys.executable,
        str(script), env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "child ok trainer" in proc.stdout
    (recording,) = list((tmp_path / "rec").glob("trainer-*.otlp.jsonl"))
    assert "otelgpu.train.step" in recording.read_text()


def test_pipeline_run_env_has_bootstrap_first() -> None:
    args = argparse.Namespace(sim=None, env=["A=1"], command=["x"])
    env = run_command.build_env(args, {"PYTHONPATH": "/elsewhere"})
    first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
    assert Path(first, "sitecustomize.py").is_file()
    assert rest == "/elsewhere" and env["A"] == "1"


def test_pipeline_prometheus_endpoint_on_loopback() -> None:
    port = free_port()
    handle = otelgpu.instrument(exporters="prometheus", prometheus_port=port, gpu=False)
    try:
        runtime = handle.runtime
        assert runtime is not None and runtime.pipeline is not None
        assert runtime.pipeline.prometheus_address == ("127.0.0.1", port)
        for _ in range(3):
            with otelgpu.step(samples=4):
                pass
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        text = body.decode()
        assert re.search(r"^otelgpu_train_steps_total\{[^}]*\} 3\.0$", text, re.M), text
        assert re.search(
            r'^otelgpu_train_step_duration_quantile_seconds\{[^}]*quantile="0.99"', text, re.M
        )
    finally:
        handle.shutdown()
