"""TorchInstrumentor end to end on a real Runtime: spans, metrics, reversibility, safety."""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.otel import attributes_of, span_seconds
from fixtures.torch_runtime import RuntimeHarness

from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.torch import TorchInstrumentor, flush, record_batch
from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch._gate import GATE
from otelgpu.instrumentation.torch._install import COLLECTIVES
from otelgpu.metrics import catalog as C


def _train(steps: int, *, sleep_s: float = 0.0, batch: int = 8) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = torch.utils.data.TensorDataset(
        torch.randn(steps * batch, 4), torch.randn(steps * batch, 1)
    )
    for x, y in torch.utils.data.DataLoader(ds, batch_size=batch):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if sleep_s:
            time.sleep(sleep_s)
        opt.step()
        opt.zero_grad()
    return model, opt


def _patched_surface() -> dict[str, Any]:
    """Every attribute the instrumentation may replace, as found right now."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed import distributed_c10d as c10d
    from torch.optim import optimizer as optmod
    from torch.utils.data import dataloader as dl

    surface: dict[str, Any] = {
        "autograd.backward": torch.autograd.backward,
        "torch.save": torch.save,
        "serialization.save": torch.serialization.save,
        "GradScaler.step": vars(torch.amp.GradScaler).get("step"),
        "iter.__next__": vars(dl._BaseDataLoaderIter).get("__next__"),
        "DataLoader.__iter__": vars(dl.DataLoader).get("__iter__"),
        "Work.wait": vars(c10d.Work).get("wait"),
        "DDP.__init__": vars(torch.nn.parallel.DistributedDataParallel).get("__init__"),
        "dcp.save": dcp.save,  # type: ignore[attr-defined]  # re-exported by torch without __all__
        "dcp.async_save": dcp.async_save,  # type: ignore[attr-defined]
        "saver.save": dcp.state_dict_saver.save,
        "pre_hooks": len(optmod._global_optimizer_pre_hooks),
        "post_hooks": len(optmod._global_optimizer_post_hooks),
    }
    for op in COLLECTIVES:
        surface["c10d." + op] = getattr(c10d, op, None)
        surface["dist." + op] = getattr(dist, op, None)
    return surface


def test_uninstrument_restores_everything(harness: RuntimeHarness) -> None:
    before = _patched_surface()
    harness.instrument()
    during = _patched_surface()
    changed = {k for k in before if before[k] != during[k]}
    expected = {
        "autograd.backward",
        "torch.save",
        "iter.__next__",
        "Work.wait",
        "dcp.save",
        "post_hooks",
    }
    assert expected <= changed
    assert {"dist.all_reduce", "c10d.all_reduce", "dist.barrier", "GradScaler.step"} <= changed
    TorchInstrumentor().uninstrument()
    after = _patched_surface()
    assert after == before
    assert not GATE.on
    # A second cycle works the same (no stale post-import handlers, no double patching).
    harness.instrument()
    assert _patched_surface()["autograd.backward"] is not before["autograd.backward"]
    TorchInstrumentor().uninstrument()
    assert _patched_surface() == before


def test_step_spans_and_metrics_on_the_runtime(harness: RuntimeHarness) -> None:
    harness.instrument()
    _train(6, sleep_s=0.002)
    flush()  # the last step ends for good only when the next begins, or now
    spans = harness.step_spans()
    assert len(spans) == 6
    attrs = [attributes_of(s) for s in spans]
    assert [a["otelgpu.train.step"] for a in attrs] == [1, 2, 3, 4, 5, 6]
    for span, a in zip(spans, attrs, strict=True):
        assert a[N.SPAN_MICRO_BATCHES] == 1
        assert a[N.SPAN_OPTIMIZER_STEPS] == 1
        assert a[N.SPAN_SKIPPED] is False
        assert a["otelgpu.train.samples"] == 8
        duration_s = span_seconds(span)
        assert duration_s >= 0.002
        parts = a[N.SPAN_DATA_WAIT] + a[N.SPAN_COMM_WAIT] + a[N.SPAN_COMPUTE]
        assert parts == pytest.approx(duration_s, rel=1e-6, abs=1e-9)
    # Consecutive spans tile the timeline.
    for prev, nxt in itertools.pairwise(spans):
        assert nxt.start_time == prev.end_time
    metrics = harness.metrics()
    assert metrics["otelgpu.train.steps"][0][1] == 6
    assert metrics["otelgpu.train.samples"][0][1] == 48
    assert metrics[C.OPTIMIZER_STEPS.name] == [({N.ATTR_SKIPPED: False}, 6)]
    assert metrics[C.MICRO_BATCHES.name] == [({}, 6)]
    data_ratio = metrics[C.DATA_WAIT_RATIO.name][0][1]
    total_wait = sum(a[N.SPAN_DATA_WAIT] for a in attrs)
    total = sum(span_seconds(s) for s in spans)
    assert data_ratio == pytest.approx(total_wait / total, rel=1e-6)
    assert metrics[C.COMM_WAIT_RATIO.name][0][1] == 0.0
    assert metrics[C.STEP_JITTER.name][0][1] >= 1.0
    waits = harness.sketch(C.DATA_WAIT.name).series()
    assert len(waits) == 1 and waits[0][1].count == 6
    TorchInstrumentor().uninstrument()
    # Off: the gauge keeps its final value for the runtime's last collection (shutdown()
    # uninstruments the frameworks first), and no longer changes.
    assert harness.metrics()[C.DATA_WAIT_RATIO.name] == [({}, data_ratio)]


def test_span_every_n_steps_keeps_metrics_for_all(harness: RuntimeHarness) -> None:
    harness.instrument(span_every=4)
    _train(10)
    TorchInstrumentor().uninstrument()
    assert [attributes_of(s)["otelgpu.train.step"] for s in harness.step_spans()] == [1, 5, 9]
    assert harness.metrics()["otelgpu.train.steps"][0][1] == 10


def test_record_batch_overrides_inferred_sizes(harness: RuntimeHarness) -> None:
    harness.instrument()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        record_batch(samples=2, tokens=1024)
        opt.step()
    TorchInstrumentor().uninstrument()
    got = [
        (attributes_of(s)["otelgpu.train.samples"], attributes_of(s)["otelgpu.train.tokens"])
        for s in harness.step_spans()
    ]
    assert got == [(2, 1024)] * 3


def test_hook_failures_never_reach_the_training_loop(
    harness: RuntimeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    inst = harness.instrument()
    session = inst.session
    assert session is not None

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bug in otelgpu")

    monkeypatch.setattr(session.tracker, "optimizer_step", broken)
    monkeypatch.setattr(session.tracker, "data_wait", broken)
    model, _ = _train(3)  # must not raise
    assert model is not None
    errors = harness.runtime.stats.errors()
    assert errors["torch.optimizer_post_hook"] == 3
    assert errors["torch.DataLoader.__next__"] == 3


def test_user_exceptions_propagate_untouched(harness: RuntimeHarness) -> None:
    harness.instrument()
    model = torch.nn.Linear(4, 1)
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()
    # The failed backward still closed its bookkeeping: the next ones count normally.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    TorchInstrumentor().uninstrument()
    (span,) = harness.step_spans()
    assert attributes_of(span)[N.SPAN_MICRO_BATCHES] == 3


def test_bad_configuration_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="span_every"):
        TorchInstrumentor().instrument(span_every=0)
    monkeypatch.setenv("OTELGPU_TORCH_SPAN_EVERY", "often")
    with pytest.raises(ConfigurationError, match="OTELGPU_TORCH_SPAN_EVERY"):
        TorchInstrumentor().instrument()
    monkeypatch.delenv("OTELGPU_TORCH_SPAN_EVERY")
    monkeypatch.setenv("OTELGPU_TORCH_HOOKS", "data,gpu")
    with pytest.raises(ConfigurationError, match="OTELGPU_TORCH_HOOKS"):
        TorchInstrumentor().instrument()
    assert not GATE.on


def test_hook_families_can_be_turned_off(
    harness: RuntimeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = torch.save
    monkeypatch.setenv("OTELGPU_TORCH_HOOKS", "data")
    harness.instrument()
    assert torch.save is before
    TorchInstrumentor().uninstrument()


# ----------------------------------------------------------------------- checkpoints


def test_checkpoint_measured_once_per_save(harness: RuntimeHarness, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    harness.instrument()
    model, opt = _train(2)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    torch.save(torch.ones(3), tmp_path / "tensor.pt")  # a tensor is not a checkpoint
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))  # type: ignore[attr-defined]  # re-exported by torch without __all__
    TorchInstrumentor().uninstrument()
    durations = harness.sketch(C.CHECKPOINT_DURATION.name).series()
    by_kind = {a[N.ATTR_CHECKPOINT_KIND]: s.count for a, s in durations}
    # DCP writes each tensor with torch.save: nested saves are not counted again.
    assert by_kind == {"torch.save": 1, "dcp.save": 1}
    sizes = {
        a[N.ATTR_CHECKPOINT_KIND]: s.max for a, s in harness.sketch(C.CHECKPOINT_SIZE.name).series()
    }
    assert sizes["torch.save"] == pytest.approx(os.path.getsize(path), rel=0.01)
    dcp_bytes = sum(f.stat().st_size for f in (tmp_path / "dcp").rglob("*") if f.is_file())
    assert sizes["dcp.save"] == pytest.approx(dcp_bytes, rel=0.01)
    # The save happened after step 2's optimizer step: it is part of the flushed step.
    spans = harness.step_spans()
    assert N.SPAN_CHECKPOINT not in attributes_of(spans[0])


def test_dcp_async_save_blocking_and_upload_measured_apart(
    harness: RuntimeHarness, tmp_path: Path
) -> None:
    import torch.distributed.checkpoint as dcp

    harness.instrument()
    model = torch.nn.Linear(64, 64)
    save = dcp.async_save  # type: ignore[attr-defined]  # re-exported by torch without __all__
    future = save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "a"))
    result = future.result(timeout=30) if hasattr(future, "result") else None
    assert result is not None or hasattr(future, "upload_completion")
    TorchInstrumentor().uninstrument()
    by_kind = {
        a[N.ATTR_CHECKPOINT_KIND]: s.count
        for a, s in harness.sketch(C.CHECKPOINT_DURATION.name).series()
    }
    # The executor thread's inner dcp.save is the upload, not a second checkpoint.
    assert by_kind == {"dcp.async_save": 1, "dcp.async_save.upload": 1}


def test_checkpoint_to_a_stream_counts_bytes(harness: RuntimeHarness) -> None:
    import io

    harness.instrument()
    model = torch.nn.Linear(64, 64)
    buf = io.BytesIO()
    buf.write(b"header")
    torch.save(model.state_dict(), buf)
    TorchInstrumentor().uninstrument()
    ((_attrs, sketch),) = harness.sketch(C.CHECKPOINT_SIZE.name).series()
    assert sketch.max == pytest.approx(len(buf.getvalue()) - len(b"header"), rel=0.01)


# ----------------------------------------------------------------------- laziness


@pytest.mark.slow
def test_lazy_torch_import_and_clean_forked_child() -> None:
    """Instrumenting imports no torch; hooks go in when the program imports it; a forked
    child gets torch back untouched and may instrument itself."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import os, sys
        import otelgpu.instrumentation.torch as t
        t.TorchInstrumentor().instrument()
        assert "torch" not in sys.modules, "torch imported"
        import torch
        assert t.TorchInstrumentor().session.torch_installed, "not installed on import"
        assert hasattr(torch.autograd.backward, "__wrapped__")

        def depth(fn):  # wrappers around torch.autograd.backward (steps; phases)
            n = 0
            while hasattr(fn, "__wrapped__"):
                fn, n = fn.__wrapped__, n + 1
            return n

        installed = depth(torch.autograd.backward)
        pid = os.fork()
        if pid == 0:
            ok = depth(torch.autograd.backward) == 0
            ok = ok and t.TorchInstrumentor().session is None
            t.TorchInstrumentor().instrument()  # the child asks for its own telemetry
            ok = ok and depth(torch.autograd.backward) == installed  # not wrapped twice
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert hasattr(torch.autograd.backward, "__wrapped__")  # parent unchanged
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_dependencies_are_declared() -> None:
    assert TorchInstrumentor().instrumentation_dependencies() == ("torch >= 2.1",)
    assert importlib.import_module("otelgpu.instrumentation.torch.package")._instruments == (
        "torch >= 2.1",
    )
