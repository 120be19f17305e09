"""DataLoader wait: a slow batch shows up on its step; forked workers record nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.torch_runtime import Recorder

from otelgpu.instrumentation.torch._gate import GATE
from otelgpu.instrumentation.torch._session import Session

SLOW_INDEX = 20  # item of batch 5 (0-based), batch size 4
SLOW_S = 0.4


class SlowDataset(torch.utils.data.Dataset[tuple[Any, Any]]):
    """32 items; item SLOW_INDEX sleeps. In a worker it also exercises our hooks."""

    def __init__(self, probe: bool) -> None:
        self.probe = probe

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if i == SLOW_INDEX:
            time.sleep(SLOW_S)
        in_worker = torch.utils.data.get_worker_info() is not None
        if self.probe and in_worker:
            # Everything our hooks watch, done inside a forked worker.
            lin = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(lin.parameters(), lr=0.1)
            lin(torch.ones(1, 2)).sum().backward()
            opt.step()
            torch.save(lin.state_dict(), os.devnull)
        gate = torch.tensor([GATE.on, in_worker])
        return torch.full((3,), float(i)), gate


class PidFileSink(Recorder):
    """Recorder that also appends ``pid`` to a file whenever any hook reports."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _mark(self) -> None:
        with self.path.open("a") as f:
            f.write(f"{os.getpid()}\n")

    def on_step(self, record: Any) -> None:
        self._mark()
        super().on_step(record)

    def checkpoint(self, kind: str, start_ns: int, end_ns: int, size_bytes: int | None) -> None:
        self._mark()
        super().checkpoint(kind, start_ns, end_ns, size_bytes)


def _train(loader: Any) -> list[Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gates = []
    for x, gate in loader:
        gates.append(gate)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return gates


@pytest.mark.slow
def test_slow_batch_with_two_forked_workers(tmp_path: Path) -> None:
    marks = tmp_path / "pids"
    rec = PidFileSink(marks)
    session = Session(rec.on_step, rec)
    session.start()
    try:
        loader = torch.utils.data.DataLoader(
            SlowDataset(probe=True), batch_size=4, num_workers=2, multiprocessing_context="fork"
        )
        gates = _train(loader)
        session.tracker.flush()
    finally:
        session.stop()
    assert rec.errors == []
    steps = rec.steps
    assert len(steps) == 8
    waits_s = [s.data_wait_ns / 1e9 for s in steps]
    slow = 5  # batch 5 (0-based) is fetched at the start of step 6
    assert waits_s[slow] >= SLOW_S * 0.75, waits_s
    others = [w for i, w in enumerate(waits_s) if i not in (0, slow)]
    assert max(others) < SLOW_S / 2, waits_s
    assert all(s.samples == 4 and s.data_fetches == 1 for s in steps)
    # Worker start-up is reported separately, on the first step.
    assert len(rec.startups) == 1
    assert steps[0].loader_startup_ns == rec.startups[0] > 0
    # In the workers the gate was off: nothing recorded there, only in this process.
    assert all(bool(g[:, 1].all()) for g in gates)
    assert not any(bool(g[:, 0].any()) for g in gates)
    pids = set(marks.read_text().split())
    assert pids == {str(os.getpid())}


def test_slow_batch_single_process_loader(hooks: Session, recorder: Recorder) -> None:
    loader = torch.utils.data.DataLoader(SlowDataset(probe=False), batch_size=4)
    _train(loader)
    hooks.tracker.flush()
    waits_s = [s.data_wait_ns / 1e9 for s in recorder.steps]
    assert len(waits_s) == 8
    assert waits_s[5] >= SLOW_S
    assert max(w for i, w in enumerate(waits_s) if i != 5) < SLOW_S / 2
    assert recorder.startups == []  # no workers, no start-up


def test_dict_batches_give_samples_and_tokens(hooks: Session, recorder: Recorder) -> None:
    items = [{"input_ids": torch.arange(16), "labels": torch.tensor(1)} for _ in range(12)]
    # DataLoader takes any map-style sequence; torch annotates the argument as Dataset.
    loader: torch.utils.data.DataLoader[dict[str, torch.Tensor]] = torch.utils.data.DataLoader(
        items,  # type: ignore[arg-type]
        batch_size=3,
    )
    model = torch.nn.Embedding(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        model(batch["input_ids"]).sum().backward()
        opt.step()
    hooks.tracker.flush()
    assert [(s.samples, s.tokens) for s in recorder.steps] == [(3, 48)] * 4


def test_stateful_iterators_do_not_override_next() -> None:
    """One class-level patch covers every loader iterator: the multi-process and the
    single-process iterators share ``_BaseDataLoaderIter.__next__``."""
    from torch.utils.data import dataloader as dl

    for cls in (dl._SingleProcessDataLoaderIter, dl._MultiProcessingDataLoaderIter):
        assert "__next__" not in vars(cls)
