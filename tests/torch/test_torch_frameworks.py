"""Frameworks on top of torch, the real libraries on CPU: the Hugging Face Trainer
(transformers + accelerate), PyTorch Lightning, DeepSpeed (gloo, world size 1) and
``torch.compile``. All are test dependencies: a missing one fails, never skips."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path
from typing import Any

# accelerate and deepspeed ship no py.typed (the HF Trainer needs accelerate)
import accelerate  # type: ignore[import-untyped]  # noqa: F401
import deepspeed  # type: ignore[import-untyped]
import pytest
import pytorch_lightning as pl
import torch
import transformers
from fixtures.otel import attributes_of, span_times
from fixtures.torch_runtime import RuntimeHarness

from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch import flush
from otelgpu.metrics import catalog as C


def _checkpoints(harness: RuntimeHarness) -> dict[object, int]:
    return {
        a[N.ATTR_CHECKPOINT_KIND]: s.count
        for a, s in harness.sketch(C.CHECKPOINT_DURATION.name).series()
    }


def _counter(harness: RuntimeHarness, name: str) -> dict[tuple[Any, ...], object]:
    return {tuple(sorted(a.items())): v for a, v in harness.metrics().get(name, [])}


# --------------------------------------------------------------------------- Hugging Face


class _TokenRegressor(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, input_ids: Any, labels: Any = None) -> dict[str, Any]:
        out = self.linear(self.embed(input_ids).mean(dim=1)).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class _TokenData(torch.utils.data.Dataset[dict[str, Any]]):
    """200 rows of 6 tokens: far more than ``max_steps`` consumes (a mid-epoch stop)."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.full((6,), i % 16), "labels": torch.tensor(0.5)}


@pytest.mark.slow
def test_hf_trainer_max_steps_mid_epoch(harness: RuntimeHarness, tmp_path: Path) -> None:
    """Issue 15.4: samples and tokens are what the optimizer consumed (accelerate fetches
    one batch ahead: not 84 samples for 80), per step too; the checkpoint saved after
    the last update (checkpoint-10) is on the last step span."""
    harness.instrument()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=10,
        save_steps=5,
        report_to=[],
        logging_steps=1000,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=_TokenRegressor(), args=args, train_dataset=_TokenData())
    trainer.train()
    flush()
    spans = harness.step_spans()
    # HF's "update step" is ours: 10 steps of 2 micro-batches of 4 samples x 6 tokens.
    assert len(spans) == trainer.state.global_step == 10
    attrs = [attributes_of(s) for s in spans]
    assert [a[N.SPAN_MICRO_BATCHES] for a in attrs] == [2] * 10
    assert [a["otelgpu.train.samples"] for a in attrs] == [8] * 10
    assert [a["otelgpu.train.tokens"] for a in attrs] == [48] * 10
    assert {a[N.SPAN_STEP_RULE] for a in attrs} == {"optimizer"}
    steps = _counter(harness, "otelgpu.train.samples")
    assert list(steps.values()) == [80]
    assert list(_counter(harness, "otelgpu.train.tokens").values()) == [480]
    # Trainer._save_checkpoint ran twice; its inner torch.save calls are not counted again.
    assert _checkpoints(harness) == {"transformers": 2}
    sizes = {
        a[N.ATTR_CHECKPOINT_KIND]: s.max for a, s in harness.sketch(C.CHECKPOINT_SIZE.name).series()
    }
    last = tmp_path / "checkpoint-10"
    on_disk = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    assert sizes["transformers"] == pytest.approx(on_disk, rel=0.02)
    # The save after update 5 lies in step 6's window; the one after the last update is
    # attached to the last step, whose end moves past it.
    with_ckpt = [i + 1 for i, a in enumerate(attrs) if N.SPAN_CHECKPOINT in a]
    assert with_ckpt == [6, 10]
    start, end = span_times(spans[-1])
    assert end >= start + int(attrs[-1][N.SPAN_CHECKPOINT] * 1e9)
    assert harness.runtime.stats.errors() == {}


# --------------------------------------------------------------------------- Lightning


def _lightning_data(rows: int = 64) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(rows, 4), torch.randn(rows, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)


class _Regression(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Gan(pl.LightningModule):  # type: ignore[misc]
    """Manual optimization: D then G in every batch (two optimizer steps per batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = torch.nn.Linear(4, 4)
        self.disc = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)  # one LightningOptimizer each, in order
        opt_d, opt_g = optimizers
        d_loss = self.disc(self.gen(x).detach()).mean() - self.disc(x).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = -self.disc(self.gen(x)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.disc.parameters(), lr=0.01),
            torch.optim.SGD(self.gen.parameters(), lr=0.01),
        )


def _trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.mark.slow
def test_lightning_max_steps_final_checkpoint_on_last_step(
    harness: RuntimeHarness, tmp_path: Path
) -> None:
    """Issue 15.4 with the real Lightning: 8 steps for ``max_steps=8`` mid-epoch, exact
    samples, and the checkpoint Lightning saves at the end of ``fit`` (after step 8) on the
    last step span; ``Trainer.save_checkpoint``'s inner ``torch.save`` is not counted."""
    harness.instrument()
    trainer = _trainer(tmp_path, max_steps=8)
    trainer.fit(_Regression(), _lightning_data())
    flush()
    spans = harness.step_spans()
    assert len(spans) == trainer.global_step == 8
    attrs = [attributes_of(s) for s in spans]
    assert [(a[N.SPAN_MICRO_BATCHES], a["otelgpu.train.samples"]) for a in attrs] == [(1, 4)] * 8
    assert _checkpoints(harness) == {"lightning": 1}
    (saved,) = (tmp_path / "checkpoints").iterdir()
    assert saved.name == "epoch=0-step=8.ckpt"
    ((_, size),) = harness.sketch(C.CHECKPOINT_SIZE.name).series()
    assert size.max == pytest.approx(saved.stat().st_size, rel=0.01)
    assert [i + 1 for i, a in enumerate(attrs) if N.SPAN_CHECKPOINT in a] == [8]
    assert harness.runtime.stats.errors() == {}


@pytest.mark.slow
def test_lightning_gan_one_step_per_batch(harness: RuntimeHarness, tmp_path: Path) -> None:
    """Issue 15.3 with the real Lightning (manual optimization, D then G): one step per
    batch from the first batch -- 20 for 20, not 21. Lightning's ``global_step`` counts
    optimizer steps (both optimizers), hence ``max_steps=40``."""
    harness.instrument()
    trainer = _trainer(tmp_path, max_steps=40, enable_checkpointing=False)
    trainer.fit(_Gan(), _lightning_data(rows=80))
    flush()
    attrs = [attributes_of(s) for s in harness.step_spans()]
    assert trainer.global_step == 40
    assert len(attrs) == 20
    assert {(a[N.SPAN_MICRO_BATCHES], a[N.SPAN_OPTIMIZER_STEPS]) for a in attrs} == {(2, 2)}
    assert [a["otelgpu.train.samples"] for a in attrs] == [4] * 20
    assert harness.runtime.stats.errors() == {}


# --------------------------------------------------------------------------- DeepSpeed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_deepspeed_zero3_engine_step_defines_steps(
    harness: RuntimeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real DeepSpeed engine on CPU (gloo, one rank), ZeRO-3 with small parameter
    sub-groups (the inner optimizer steps once per sub-group) and gradient accumulation 2:
    one step per ``engine.global_steps`` increment, rule ``engine``."""
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    # On CPU DeepSpeed compiles a shared-memory all-reduce kernel at init (about 50 s on
    # two cores, once per machine); one rank never uses it, so it is not built here.
    ds_comm = importlib.import_module("deepspeed.comm.torch")  # not the ``torch`` it imports
    monkeypatch.setattr(ds_comm, "build_shm_op", lambda: None)
    harness.instrument()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 3, "sub_group_size": 64},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    try:
        assert hasattr(type(engine).step, "__wrapped__")
        for _ in range(8):
            engine.backward(engine(torch.randn(4, 8)).sum())
            engine.step()
        flush()
        attrs = [attributes_of(s) for s in harness.step_spans()]
        assert len(attrs) == engine.global_steps == 4
        assert {(a[N.SPAN_MICRO_BATCHES], a[N.SPAN_STEP_RULE]) for a in attrs} == {(2, "engine")}
        # ZeRO-3 stepped its inner optimizer once per sub-group (161 parameters, groups
        # of 64): several firings per step, all counted, none a step of its own.
        firings = {a[N.SPAN_OPTIMIZER_STEPS] for a in attrs}
        assert len(firings) == 1 and firings.pop() >= 2
        assert harness.runtime.stats.errors() == {}
    finally:
        engine.destroy()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.slow
def test_compiled_train_step_counts_optimizer_steps(harness: RuntimeHarness) -> None:
    """Issue 15.2 end to end: ``opt.step()`` inside a ``torch.compile``d train step. Each
    call is a step from the first (80 for 80, not 49), with its optimizer step on the span
    and in ``otelgpu.train.optimizer.steps``; the span says which rule is in force."""
    import torch._dynamo

    torch._dynamo.reset()
    harness.instrument()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(80):
        train_step(torch.randn(4, 8), torch.randn(4, 1))
    flush()
    attrs = [attributes_of(s) for s in harness.step_spans()]
    assert len(attrs) == 80
    assert {
        (a[N.SPAN_MICRO_BATCHES], a[N.SPAN_OPTIMIZER_STEPS], a[N.SPAN_STEP_RULE]) for a in attrs
    } == {(1, 1, "compiled")}
    optimizer_steps = _counter(harness, C.OPTIMIZER_STEPS.name)
    assert optimizer_steps == {((N.ATTR_SKIPPED, False),): 80}
    assert harness.runtime.stats.errors() == {}
