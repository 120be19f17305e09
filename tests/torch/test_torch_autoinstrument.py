"""Zero-code: ``opentelemetry-instrument python train.py`` and ``otelgpu run -- python
train.py`` on an unmodified training script (gradient accumulation, a DataLoader with two
forked workers, a checkpoint save), received over OTLP/gRPC."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401  (must be importable: fail, never skip)
from fixtures.otel import PYTHON, zero_code_env
from fixtures.otlp_receiver import OtlpReceiver, attributes

from otelgpu.instrumentation.torch import _names as N
from otelgpu.metrics import catalog as C

STEPS = 12

TRAIN = textwrap.dedent(
    f"""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = {STEPS * 2 * 8}
    data = torch.utils.data.TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    loader = torch.utils.data.DataLoader(
        data, batch_size=8, num_workers=2, multiprocessing_context="fork", persistent_workers=True
    )
    for i, (x, y) in enumerate(loader):          # 2 micro-batches per update
        (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    torch.save(model.state_dict(), "model.pt")
    print("trained")
    """
)


LAUNCHERS = {
    "opentelemetry-instrument": [str(Path(PYTHON).parent / "opentelemetry-instrument"), PYTHON],
    "otelgpu-run": [PYTHON, "-m", "otelgpu", "run", "--", PYTHON],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_zero_code_unmodified_script(
    launcher: str, otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = zero_code_env(
        otlp_receiver,
        "train-zero-code",
        # Longer than the job: only the final collection at exit exports metrics.
        OTEL_METRIC_EXPORT_INTERVAL="600000",
    )
    proc = subprocess.run(
        [*LAUNCHERS[launcher], str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "trained"

    spans = [(res, s) for res, _, s in otlp_receiver.spans() if s.name == "otelgpu.train.step"]
    assert len(spans) == STEPS
    assert all(res["service.name"] == "train-zero-code" for res, _ in spans)
    # Forked DataLoader workers export nothing: one process on the wire.
    pids = {res["process.pid"] for res, _, _ in otlp_receiver.spans()}
    pids |= {res["process.pid"] for res, _, _ in otlp_receiver.metrics()}
    assert len(pids) == 1
    attrs = sorted(
        (attributes(s.attributes) for _, s in spans), key=lambda a: a["otelgpu.train.step"]
    )
    assert [a["otelgpu.train.step"] for a in attrs] == list(range(1, STEPS + 1))
    assert all(a[N.SPAN_MICRO_BATCHES] == 2 and a["otelgpu.train.samples"] == 16 for a in attrs)
    assert all(a[N.SPAN_DATA_WAIT] > 0 for a in attrs)

    steps = otlp_receiver.last_metric("otelgpu.train.steps")
    assert steps is not None and steps.sum.data_points[0].as_int == STEPS
    duration = otlp_receiver.last_metric("otelgpu.train.step.duration")
    assert duration is not None and duration.exponential_histogram.data_points[0].count == STEPS
    micro = otlp_receiver.last_metric(C.MICRO_BATCHES.name)
    assert micro is not None and micro.sum.data_points[0].as_int == 2 * STEPS
    wait = otlp_receiver.last_metric(C.DATA_WAIT.name)
    assert wait is not None and wait.exponential_histogram.data_points[0].count == STEPS
    ckpt = otlp_receiver.last_metric(C.CHECKPOINT_DURATION.name)
    assert ckpt is not None
    (point,) = ckpt.exponential_histogram.data_points
    assert point.count == 1 and attributes(point.attributes) == {
        N.ATTR_CHECKPOINT_KIND: "torch.save"
    }
    # Issue 15.5: the final collection at exit carries every instrument, the gauges of
    # the torch telemetry included (they were dropped under ``otelgpu run``).
    gauges = {}
    for metric in (C.DATA_WAIT_RATIO, C.COMM_WAIT_RATIO, C.STEP_JITTER):
        got = otlp_receiver.last_metric(metric.name)
        assert got is not None, metric.name
        (gauge_point,) = got.gauge.data_points
        gauges[metric.name] = gauge_point.as_double
    assert 0 < gauges[C.DATA_WAIT_RATIO.name] < 1
    assert gauges[C.COMM_WAIT_RATIO.name] == 0.0  # no collective in this script
    assert gauges[C.STEP_JITTER.name] >= 1.0
