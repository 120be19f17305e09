"""Frameworks on top of torch: the real Hugging Face Trainer (transformers + accelerate);
DeepSpeed and Lightning (not installable here) through modules at their import paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from torch_helpers import RuntimeHarness

from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch import flush
from otelgpu.metrics import catalog as C


class _Regressor(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        out = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class _Data(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((4,), float(i % 7)), "labels": torch.tensor(0.5)}


@pytest.mark.slow
def test_hf_trainer_steps_and_checkpoints(harness: RuntimeHarness, tmp_path: Path) -> None:
    import accelerate  # noqa: F401  (HF Trainer needs it; the test extra installs it)
    import transformers

    harness.instrument()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_steps=4,
        save_steps=2,
        report_to=[],
        logging_steps=1000,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=_Regressor(), args=args, train_dataset=_Data())
    trainer.train()
    flush()
    spans = harness.step_spans()
    # HF's "update step" is ours: 4 steps of 2 micro-batches of 8 samples.
    assert len(spans) == trainer.state.global_step == 4
    attrs = [dict(s.attributes) for s in spans]
    assert [a[N.SPAN_MICRO_BATCHES] for a in attrs] == [2, 2, 2, 2]
    # accelerate's DataLoaderShard fetches one batch ahead, so the per-step split of
    # samples is shifted by one batch; the total is exact.
    assert sum(a["otelgpu.train.samples"] for a in attrs) == 4 * 16
    # Trainer._save_checkpoint ran twice; its inner torch.save calls are not counted again.
    durations = {
        a[N.ATTR_CHECKPOINT_KIND]: s.count
        for a, s in harness.sketch(C.CHECKPOINT_DURATION.name).series()
    }
    assert durations == {"transformers": 2}
    sizes = {
        a[N.ATTR_CHECKPOINT_KIND]: s.max for a, s in harness.sketch(C.CHECKPOINT_SIZE.name).series()
    }
    last = tmp_path / "checkpoint-4"
    on_disk = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    assert sizes["transformers"] == pytest.approx(on_disk, rel=0.02)
    # The save after update 2 lies in step 3's window.
    assert N.SPAN_CHECKPOINT in attrs[2] and N.SPAN_CHECKPOINT not in attrs[1]
    assert harness.runtime.stats.errors() == {}


ENGINE = '''
class DeepSpeedEngine:
    """Stand-in with DeepSpeed's contract (deepspeed/runtime/engine.py): step() takes a
    model step only at gradient-accumulation boundaries, counted in global_steps; ZeRO-3
    steps the inner optimizer once per parameter sub-group."""

    def __init__(self, optimizer, sub_groups, accumulation):
        self.optimizer = optimizer
        self.sub_groups = sub_groups
        self.accumulation = accumulation
        self.micro_steps = 0
        self.global_steps = 0

    def step(self):
        self.micro_steps += 1
        if self.micro_steps % self.accumulation == 0:
            for _ in range(self.sub_groups):
                self.optimizer.step()
            self.global_steps += 1
'''


def test_engine_step_defines_steps_when_deepspeed_is_imported(
    harness: RuntimeHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSpeed itself is not installable here: a module at its import path with its
    ``DeepSpeedEngine.step``/``global_steps`` contract checks the post-import wiring."""
    import importlib
    import sys

    pkg = tmp_path / "deepspeed" / "runtime"
    pkg.mkdir(parents=True)
    (tmp_path / "deepspeed" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.engine"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    harness.instrument()
    engine_mod = importlib.import_module("deepspeed.runtime.engine")  # hook fires here
    try:
        assert hasattr(engine_mod.DeepSpeedEngine.step, "__wrapped__")
        model = torch.nn.Linear(4, 1)
        engine = engine_mod.DeepSpeedEngine(
            torch.optim.SGD(model.parameters(), lr=0.1), sub_groups=3, accumulation=2
        )
        for _ in range(8):
            model(torch.randn(2, 4)).sum().backward()
            engine.step()
        flush()
        attrs = [dict(s.attributes) for s in harness.step_spans()]
        assert len(attrs) == engine.global_steps == 4
        assert [(a[N.SPAN_MICRO_BATCHES], a[N.SPAN_OPTIMIZER_STEPS]) for a in attrs] == [(2, 3)] * 4
    finally:
        for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.engine"):
            sys.modules.pop(name, None)


LIGHTNING_TRAINER = '''
import io

import torch


class Trainer:
    """Stand-in with Lightning's save path (Trainer.save_checkpoint -> _atomic_save):
    torch.save into a buffer, then the bytes written to the file."""

    def __init__(self, model):
        self.model = model

    def save_checkpoint(self, filepath, weights_only=None, storage_options=None):
        checkpoint = {"state_dict": self.model.state_dict(), "epoch": 1}
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        with open(filepath, "wb") as f:
            f.write(buffer.getvalue())
'''


def test_lightning_save_checkpoint_counted_once(
    harness: RuntimeHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning is not installed here: a module at its import path with the shape of
    ``Trainer.save_checkpoint`` checks the post-import wiring and the nesting rule."""
    import importlib
    import sys

    names = (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.trainer",
        "lightning.pytorch.trainer.trainer",
    )
    pkg = tmp_path / "lightning" / "pytorch" / "trainer"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "lightning", tmp_path / "lightning" / "pytorch", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(LIGHTNING_TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    harness.instrument()
    try:
        trainer_mod = importlib.import_module("lightning.pytorch.trainer.trainer")
        target = tmp_path / "epoch=1.ckpt"
        trainer_mod.Trainer(torch.nn.Linear(32, 32)).save_checkpoint(str(target))
        flush()
        durations = {
            a[N.ATTR_CHECKPOINT_KIND]: s.count
            for a, s in harness.sketch(C.CHECKPOINT_DURATION.name).series()
        }
        assert durations == {"lightning": 1}  # its inner torch.save is not counted
        ((_, size),) = harness.sketch(C.CHECKPOINT_SIZE.name).series()
        assert size.max == pytest.approx(target.stat().st_size, rel=0.01)
    finally:
        for name in names:
            sys.modules.pop(name, None)
