"""Step detection with real torch optimizers: counts and boundaries exactly right."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.torch_runtime import Recorder

from otelgpu.instrumentation.torch._session import Session
from otelgpu.instrumentation.torch._steps import StepRecord, StepTracker


class TickClock:
    """A virtual clock: every read returns the next integer (exact, ordered boundaries)."""

    def __init__(self) -> None:
        self._it = itertools.count(1)

    def __call__(self) -> int:
        return next(self._it)


@pytest.fixture
def clock() -> TickClock:
    return TickClock()


@pytest.fixture
def session(recorder: Recorder, clock: TickClock) -> Iterator[Session]:
    s = Session(recorder.on_step, recorder, clock=clock)
    s.start()
    try:
        yield s
    finally:
        s.stop()
    assert recorder.errors == []


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _loss(model: torch.nn.Module, n: int = 8) -> torch.Tensor:
    loss: torch.Tensor = model(torch.randn(n, 4)).pow(2).mean()
    return loss


def _assert_contiguous(steps: list[StepRecord]) -> None:
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))
    for prev, nxt in itertools.pairwise(steps):
        assert nxt.start_ns == prev.end_ns
    assert all(s.end_ns > s.start_ns for s in steps)


def _timed_steps(
    session: Session,
    recorder: Recorder,
    clock: TickClock,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    n: int = 20,
) -> list[tuple[StepRecord, tuple[int, int]]]:
    """``n`` iterations of backward, ``opt.step()`` (the clock read just before and just
    after it) and ``zero_grad``; the flushed steps (one per iteration, contiguous), each
    with its ``(before, after)`` window."""
    windows = []
    for _ in range(n):
        _loss(model).backward()
        before = clock()
        opt.step()
        after = clock()
        windows.append((before, after))
        opt.zero_grad()
    session.tracker.flush()
    steps = recorder.steps
    assert len(steps) == n
    _assert_contiguous(steps)
    return list(zip(steps, windows, strict=True))


class _Wrapping(torch.optim.Optimizer):
    """A ZeRO-style optimizer: its step() steps the inner one (whose hooks fire first)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__(inner.param_groups[0]["params"], {})

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.inner.step()


def test_nested_optimizer_step_is_timed_once_by_the_outer_one(
    session: Session, recorder: Recorder, clock: TickClock
) -> None:
    """The optimizer phase of a step whose optimizer steps another inside its own step
    is the outer call, counted once: not the inner call alone, not both added up."""
    model, inner = _model()
    # hooks in outer.step(): outer pre, inner pre, inner post, outer post (one read each)
    for record, (before, after) in _timed_steps(session, recorder, clock, model, _Wrapping(inner)):
        assert record.optimizer_steps == 2
        # outer pre = before + 1, outer post = after - 1: the outer call's own interval
        assert record.optimizer_ns == (after - 1) - (before + 1)


def test_plain_loop_boundaries_are_the_optimizer_steps(
    session: Session, recorder: Recorder, clock: TickClock
) -> None:
    model, opt = _model()
    for record, (before, after) in _timed_steps(session, recorder, clock, model, opt, n=6):
        assert before < record.end_ns < after  # ends inside optimizer.step()
        assert (record.micro_batches, record.optimizer_steps, record.skipped) == (1, 1, False)
        assert record.optimizer_ns > 0


def test_gradient_accumulation_four_micro_batches(session: Session, recorder: Recorder) -> None:
    model, opt = _model()
    for i in range(20):
        (_loss(model) / 4).backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    session.tracker.flush()
    assert [(s.micro_batches, s.optimizer_steps) for s in recorder.steps] == [(4, 1)] * 5
    _assert_contiguous(recorder.steps)


def _gan(session: Session, recorder: Recorder, critic_steps: int) -> list[StepRecord]:
    """20 iterations of ``critic_steps`` discriminator updates then one generator update;
    the steps, after checking there is one per iteration, anchored on the generator's
    optimizer, and contiguous."""
    gen, opt_g = _model()
    disc, opt_d = _model()
    for _ in range(20):
        for _ in range(critic_steps):
            _loss(disc).backward()
            opt_d.step()
            opt_d.zero_grad()
        _loss(gen).backward()
        opt_g.step()
        opt_g.zero_grad()
    session.tracker.flush()
    steps = recorder.steps
    assert len(steps) == 20
    assert session.tracker.anchor() == id(opt_g)
    _assert_contiguous(steps)
    return steps


def test_gan_two_optimizers_generator_anchors(session: Session, recorder: Recorder) -> None:
    """Issue 15.3: a GAN loop (D then G) is one step per iteration from the first one."""
    steps = _gan(session, recorder, critic_steps=1)
    assert {(s.micro_batches, s.optimizer_steps, s.rule) for s in steps} == {(2, 2, "optimizer")}


def test_wgan_n_critic_five(session: Session, recorder: Recorder) -> None:
    """Issue 15.3: five critic steps before the generator's first step are no steps of
    their own (the warm-up holds them until the period is known)."""
    steps = _gan(session, recorder, critic_steps=5)
    assert {(s.micro_batches, s.optimizer_steps) for s in steps} == {(6, 6)}


def test_short_gan_run_is_cut_at_flush(session: Session, recorder: Recorder) -> None:
    """Fewer iterations than the warm-up: nothing is emitted before the end, then the
    buffered work is cut by the best rule known."""
    gen, opt_g = _model()
    disc, opt_d = _model()
    for _ in range(3):
        _loss(disc).backward()
        opt_d.step()
        _loss(gen).backward()
        opt_g.step()
    assert recorder.steps == [] and session.tracker.rule is None
    session.tracker.flush()
    assert [(s.micro_batches, s.optimizer_steps) for s in recorder.steps] == [(2, 2)] * 3
    assert session.tracker.rule == "optimizer"
    _assert_contiguous(recorder.steps)


def test_two_optimizers_after_one_backward_are_one_step(
    session: Session, recorder: Recorder
) -> None:
    torch.manual_seed(0)
    enc, dec = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_e = torch.optim.Adam(enc.parameters())
    opt_d = torch.optim.SGD(dec.parameters(), lr=0.1)
    for _ in range(5):
        dec(enc(torch.randn(8, 4))).pow(2).mean().backward()
        opt_e.step()
        opt_d.step()
        opt_e.zero_grad()
        opt_d.zero_grad()
    session.tracker.flush()
    assert [(s.micro_batches, s.optimizer_steps) for s in recorder.steps] == [(1, 2)] * 5


def test_explicit_step_optimizer_overrides_the_anchor(recorder: Recorder, clock: TickClock) -> None:
    gen, opt_g = _model()
    disc, opt_d = _model()
    s = Session(recorder.on_step, recorder, clock=clock, step_optimizer=opt_g)
    s.start()
    try:
        for _ in range(4):
            for _ in range(5):
                _loss(disc).backward()
                opt_d.step()
            _loss(gen).backward()
            opt_g.step()
        s.tracker.flush()
    finally:
        s.stop()
    assert [(r.micro_batches, r.optimizer_steps) for r in recorder.steps] == [(6, 6)] * 4


def test_grad_scaler_skipped_step_is_counted(session: Session, recorder: Recorder) -> None:
    model, opt = _model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i in range(5):
        loss = _loss(model)
        if i == 2:
            loss = loss * float("inf")  # inf gradients: GradScaler skips optimizer.step()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    session.tracker.flush()
    steps = recorder.steps
    assert [s.skipped for s in steps] == [False, False, True, False, False]
    assert [s.skipped_optimizer_steps for s in steps] == [0, 0, 1, 0, 0]
    assert all(s.micro_batches == 1 for s in steps)
    _assert_contiguous(steps)


def _dynamo_counters() -> dict[str, dict[str, int]]:
    from torch._dynamo.utils import counters

    return {k: dict(counters[k]) for k in ("graph_break", "stats", "recompiles")}


def _compiled_run(compile_step: bool, iterations: int) -> tuple[dict[str, dict[str, int]], int]:
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    model, opt = _model()
    cmodel = torch.compile(model, backend="eager")

    def train_step(x: torch.Tensor) -> None:
        cmodel(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    step = torch.compile(train_step, backend="eager") if compile_step else train_step
    for _ in range(iterations):
        step(torch.randn(8, 4))
    frames = dict(counters["frames"]).get("total", 0)
    return _dynamo_counters(), frames


def _compiled_under_session(
    recorder: Recorder, clock: TickClock, *, compile_step: bool, iterations: int
) -> tuple[dict[str, dict[str, int]], Session]:
    """:func:`_compiled_run` bare, then under a hook session (flushed and stopped): the
    session's Dynamo counters and the session, after checking they are the bare run's
    (same graphs: no graph break or recompile of ours) with no more frames compiled."""
    baseline, base_frames = _compiled_run(compile_step=compile_step, iterations=iterations)
    s = Session(recorder.on_step, recorder, clock=clock)
    s.start()
    try:
        counters, frames = _compiled_run(compile_step=compile_step, iterations=iterations)
        s.tracker.flush()
    finally:
        s.stop()
    assert counters == baseline
    assert frames <= base_frames
    return counters, s


@pytest.mark.slow
def test_torch_compile_model_exact_steps_no_graph_breaks(
    recorder: Recorder, clock: TickClock
) -> None:
    counters, _ = _compiled_under_session(recorder, clock, compile_step=False, iterations=6)
    assert counters["stats"]["unique_graphs"] == 1
    assert [(r.micro_batches, r.optimizer_steps) for r in recorder.steps] == [(1, 1)] * 6
    assert recorder.errors == []


@pytest.mark.slow
def test_torch_compile_whole_train_step(recorder: Recorder, clock: TickClock) -> None:
    """Issue 15.2: the optimizer step is compiled into the train step (Dynamo runs no
    global optimizer hook there). The optimizer steps traced into the compiled function
    are counted at each of its calls: one step per call from the first, with its
    optimizer step, rule ``compiled``. We add no graph break or recompile."""
    _, s = _compiled_under_session(recorder, clock, compile_step=True, iterations=40)
    assert s.tracker.compiled_optimizer_steps == 40
    steps = recorder.steps
    assert [(r.micro_batches, r.optimizer_steps, r.rule) for r in steps] == [
        (1, 1, "compiled")
    ] * 40
    _assert_contiguous(steps)
    assert recorder.errors == []


@pytest.mark.slow
def test_torch_compile_decorator_with_gradient_accumulation(
    recorder: Recorder, clock: TickClock
) -> None:
    """``@torch.compile(...)`` (decorator form) around a step with two micro-batches."""
    import torch._dynamo

    torch._dynamo.reset()
    s = Session(recorder.on_step, recorder, clock=clock)
    s.start()
    try:
        model, opt = _model()

        @torch.compile(backend="eager")
        def train_step(xs: list[torch.Tensor]) -> None:
            for x in xs:
                (model(x).pow(2).mean() / len(xs)).backward()
            opt.step()
            opt.zero_grad()

        for _ in range(10):
            train_step([torch.randn(8, 4), torch.randn(8, 4)])
        s.tracker.flush()
    finally:
        s.stop()
    assert [(r.micro_batches, r.optimizer_steps, r.rule) for r in recorder.steps] == [
        (2, 1, "compiled")
    ] * 10
    assert recorder.errors == []


def test_no_optimizer_hook_each_backward_is_a_step(session: Session, recorder: Recorder) -> None:
    """Rule ``backward`` (a hand-written update, no torch.optim optimizer): each backward
    call is a step from the first one, also in a run shorter than the warm-up."""
    model, _ = _model()
    for _ in range(5):
        _loss(model).backward()
        with torch.no_grad():
            for p in model.parameters():
                assert p.grad is not None
                p.sub_(0.01 * p.grad)
                p.grad = None
    session.tracker.flush()
    assert [(r.micro_batches, r.optimizer_steps, r.rule) for r in recorder.steps] == [
        (1, 0, "backward")
    ] * 5
    _assert_contiguous(recorder.steps)


# ----------------------------------------------------------------- the rule in isolation


class _Collect:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []

    def __call__(self, r: StepRecord) -> None:
        self.steps.append(r)


def test_tracker_nested_optimizers_outer_wins_and_one_step_per_iteration() -> None:
    out = _Collect()
    t = StepTracker(out, clock=TickClock())
    inner, outer = 1, 2
    for _ in range(5):
        t.backward_begin()
        t.backward_end()
        t.optimizer_step(inner)  # ZeRO-style wrapper: inner fires first
        t.optimizer_step(outer)
    t.flush()
    assert [(s.micro_batches, s.optimizer_steps) for s in out.steps] == [(1, 2)] * 5


def test_tracker_engine_counts_repeated_firings_once() -> None:
    out = _Collect()
    t = StepTracker(out, clock=TickClock())
    for i in range(6):
        t.backward_begin()
        t.backward_end()
        t.engine_begin()
        for _ in range(3):  # ZeRO-3: one inner step per parameter sub-group
            t.optimizer_step(7)
        t.engine_end(stepped=i % 2 == 1)  # gradient accumulation 2 inside the engine
    t.flush()
    assert [(s.micro_batches, s.optimizer_steps) for s in out.steps] == [(2, 6)] * 3


def test_tracker_data_comm_checkpoint_attribution() -> None:
    out = _Collect()
    t = StepTracker(out, clock=TickClock())
    t.data_wait(10, 15, samples=8, tokens=None)
    t.backward_begin(20)
    t.comm_wait("all_reduce", 21, 24)
    t.backward_end(25)
    t.optimizer_step(1, 30, duration_ns=3)
    # After the optimizer step: belongs to the next step.
    t.checkpoint(31, 41)
    t.data_wait(41, 42, samples=8, tokens=100)
    t.add_batch(samples=16)
    t.backward_begin(43)
    t.backward_end(44)
    t.optimizer_step(1, 50)
    t.flush()
    first, second = out.steps
    assert (first.start_ns, first.end_ns) == (10, 30)
    assert (first.data_wait_ns, first.comm_wait_ns, first.checkpoint_ns) == (5, 3, 0)
    assert first.comm_wait_by_op_ns == {"all_reduce": 3}
    assert (first.samples, first.tokens, first.optimizer_ns) == (8, None, 3)
    assert first.compute_ns == 20 - 5 - 3
    assert (second.start_ns, second.end_ns) == (30, 50)
    assert (second.data_wait_ns, second.checkpoint_ns) == (1, 10)
    assert (second.samples, second.tokens) == (16, 100)  # given samples replace inferred


def test_tracker_window_forgets_old_optimizers() -> None:
    out = _Collect()
    t = StepTracker(out, clock=TickClock(), window=8)
    for _ in range(3):  # phase 1: optimizer 1 only
        t.backward_begin()
        t.backward_end()
        t.optimizer_step(1)
    for _ in range(20):  # phase 2: optimizer 2 only (e.g. fine-tuning head swapped)
        t.backward_begin()
        t.backward_end()
        t.optimizer_step(2)
    t.flush()
    assert t.anchor() == 2
    # The warm-up (here the window, 8 steps) decides on optimizer 1 (3 steps). While it
    # is still in the window it out-ranks optimizer 2: its 5 warm-up steps and the next
    # 3 form one step; once optimizer 1 is evicted, every step of optimizer 2 is a step.
    micro = [s.micro_batches for s in out.steps]
    assert micro == [1] * 3 + [8] + [1] * 12
