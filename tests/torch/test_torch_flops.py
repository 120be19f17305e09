"""Zero-code MFU: the torch instrumentor counts one step's model FLOPs with torch's FLOP
counter and gives every later step its MFU (CPU torch, the real OTel SDK in memory, the
real sampler over a simulated H100 for the peak). The model is an embedding followed by
bias-free Linear layers, so its FLOPs per step are known analytically: 6 x (Linear
parameters) x tokens (forward 2, backward 4: input and weight gradients)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.otel import attributes_of, span_seconds, span_times
from fixtures.torch_runtime import RuntimeHarness, sampler_over

from otelgpu.instrumentation.torch import TorchInstrumentor, flush
from otelgpu.instrumentation.torch._flops import FlopsCounter

NODE = {
    "version": 1,
    "name": "torch-flops-1",
    "gpus": {"count": 1, "model": "H100-SXM", "utilization": 90, "power_w": 500},
}
H100_BF16 = 989e12
VOCAB, WIDTH, LAYERS, BATCH, MICRO = 32, 48, 3, 4, 2
STEPS = 30  # warm-up (16 optimizer steps) + discovery + counted step + steps with MFU


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.Sequential(
            *(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(self.embed(ids))
        return out


def analytic_flops(seq: int) -> int:
    """6 x Linear parameters x tokens of one optimizer step (all micro-batches)."""
    linear_params = LAYERS * WIDTH * WIDTH
    return 6 * linear_params * BATCH * seq * MICRO


def train(
    model: torch.nn.Module,
    steps: int,
    seq: int,
    *,
    boom: bool = False,
    dtype: torch.dtype = torch.int64,
) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        for _ in range(MICRO):  # gradient accumulation: one optimizer step per MICRO
            ids = torch.randint(0, VOCAB, (BATCH, seq), dtype=dtype)
            out = model(ids)
            if boom:
                out = out + torch.ops.otelgpu_test.boom(out.detach()) * 0
            out.square().mean().backward()
        time.sleep(0.002)
        opt.step()
        opt.zero_grad()


@pytest.fixture
def node(sim_scenario: Any) -> Iterator[Any]:
    with sampler_over(sim_scenario, NODE) as sampler:
        yield sampler


@pytest.fixture
def run(node: Any) -> Iterator[RuntimeHarness]:
    harness = RuntimeHarness(sampler=node, step_devices="all", step_spans_per_second=0)
    try:
        yield harness
    finally:
        TorchInstrumentor().uninstrument()


def _spans(harness: RuntimeHarness) -> list[dict[str, Any]]:
    flush()
    out = []
    for span in sorted(harness.step_spans(), key=span_times):
        attrs: dict[str, Any] = dict(attributes_of(span))
        attrs["duration_s"] = span_seconds(span)
        out.append(attrs)
    return out


def _counter() -> FlopsCounter:
    session = TorchInstrumentor().session
    assert session is not None
    (counter,) = [e for e in session.extensions if isinstance(e, FlopsCounter)]
    return counter


def test_zero_code_mfu_from_counted_flops(run: RuntimeHarness) -> None:
    run.instrument()
    train(Model(), STEPS, seq=8)
    spans = _spans(run)
    counter = _counter()
    assert counter.measured == 1
    assert counter.failure is None
    with_mfu = [s for s in spans if "otelgpu.train.mfu" in s]
    # Warm-up steps, the discovery step and the counted step carry none; every later does.
    assert len(with_mfu) >= 5
    first = spans.index(with_mfu[0])
    assert all("otelgpu.train.mfu" in s for s in spans[first:])
    for attrs in with_mfu:
        flops = attrs["otelgpu.train.flops"]
        assert flops == pytest.approx(analytic_flops(8), rel=0.01)
        assert attrs["otelgpu.train.mfu"] == pytest.approx(
            flops / (attrs["duration_s"] * H100_BF16), rel=1e-6
        )
    mfu = run.sketch("otelgpu.train.mfu").merged()  # type: ignore[attr-defined]
    assert mfu.count == len(with_mfu)


def test_watching_steps_are_looked_up_by_the_tracker(
    run: RuntimeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once watching, the tracker looks each step's signature up itself (no Python call
    per step); ``step_closed`` runs again only for a signature it misses."""
    closed: list[str] = []
    real = FlopsCounter.step_closed

    def step_closed(self: FlopsCounter) -> float | None:
        closed.append(self.phase)
        return real(self)

    monkeypatch.setattr(FlopsCounter, "step_closed", step_closed)
    run.instrument()
    model = Model()
    train(model, STEPS, seq=8)
    counter = _counter()
    session = TorchInstrumentor().session
    assert session is not None
    assert counter.phase == "watch"
    assert session.tracker.flops_table is counter.by_signature
    assert session.tracker.flops_calls is counter._calls
    assert closed == ["start", "discover", "count"]  # then none: every step a hit
    train(model, 8, seq=16)  # a new shape: one miss, one counted step, then hits again
    assert closed[3:] == ["watch", "count"]
    assert counter.measured == 2
    figures = [s.get("otelgpu.train.flops") for s in _spans(run)]
    assert figures[-1] == pytest.approx(analytic_flops(16), rel=0.01)


def test_a_later_instrumentation_of_the_same_model_reuses_the_count(run: RuntimeHarness) -> None:
    # instrument(); train; uninstrument(); instrument() again (a notebook re-run): the model
    # was counted once in this process, so no step is counted again and MFU comes sooner.
    model = Model()
    run.instrument()
    train(model, STEPS, seq=8)
    assert _counter().measured == 1
    first_run = len(_spans(run))
    TorchInstrumentor().uninstrument()
    run.instrument()
    train(model, STEPS, seq=8)
    counter = _counter()
    assert counter.measured == 0 and counter.failure is None
    again = _spans(run)[first_run:]
    with_mfu = [s for s in again if "otelgpu.train.mfu" in s]
    # only the warm-up and discovery steps carry none (no counted step this time)
    assert (
        len(again) - len(with_mfu)
        == first_run - len([s for s in _spans(run)[:first_run] if "otelgpu.train.mfu" in s]) - 1
    )
    assert all(
        s["otelgpu.train.flops"] == pytest.approx(analytic_flops(8), rel=0.01) for s in with_mfu
    )


def test_shape_change_is_counted_again(run: RuntimeHarness) -> None:
    run.instrument()
    model = Model()
    train(model, STEPS, seq=8)
    train(model, 8, seq=16)  # a longer sequence: twice the FLOPs per step
    spans = _spans(run)
    assert _counter().measured == 2
    figures = [s.get("otelgpu.train.flops") for s in spans]
    short, long = analytic_flops(8), analytic_flops(16)
    assert figures.count(None) < len(figures)
    seen = [f for f in figures if f is not None]
    assert seen[0] == pytest.approx(short, rel=0.01)
    assert seen[-1] == pytest.approx(long, rel=0.01)
    # The first longer step (unknown shape) and the re-counted one carry no figure.
    switch = max(i for i, f in enumerate(figures) if f is not None and f < long * 0.75)
    assert figures[switch + 1 : switch + 3] == [None, None]
    assert all(f == pytest.approx(long, rel=0.01) for f in figures[switch + 3 :])


def test_dtype_change_is_a_new_signature(run: RuntimeHarness) -> None:
    """The same shapes in another dtype are another signature: counted again."""
    run.instrument()
    model = Model()
    train(model, STEPS, seq=8)
    assert _counter().measured == 1
    train(model, 8, seq=8, dtype=torch.int32)
    assert _counter().measured == 2
    figures = [s.get("otelgpu.train.flops") for s in _spans(run)]
    assert figures[-1] == pytest.approx(analytic_flops(8), rel=0.01)


def test_roots_are_signed_through_their_call_slot_and_left_plain(run: RuntimeHarness) -> None:
    """The shape signature is taken by a wrapper in the root's call slot, chained with
    the step phases' timing (no forward hook: the model keeps torch's fast call path);
    a compiled call put in the slot later (``module.compile()``) is wrapped again at the
    first step whose signature misses, and the FLOPs go on; uninstrument leaves the
    model as it was, the foreign call in place."""
    from otelgpu.instrumentation.torch import _call_slot as call_slot

    run.instrument()
    model = Model()
    train(model, STEPS, seq=8)
    counter = _counter()
    assert counter.measured == 1 and counter.failure is None
    assert not model._forward_pre_hooks and not model._forward_hooks
    ((ref, signed),) = counter._linked
    assert ref() is model and call_slot.linked(model, signed)
    theirs_calls: list[int] = []

    def theirs(*args: Any, **kwargs: Any) -> Any:
        theirs_calls.append(1)
        return model._call_impl(*args, **kwargs)

    model._compiled_call_impl = theirs  # drops the phases' and the counter's wrappers
    train(model, 6, seq=8)
    assert theirs_calls  # theirs always runs
    ((_, relinked),) = counter._linked
    assert relinked is not signed and call_slot.linked(model, relinked)
    figures = [s.get("otelgpu.train.flops") for s in _spans(run)[-6:]]
    # the step that found the slot replaced carries none; the next ones have the figure
    assert figures[0] is None
    assert figures[-3:] == [pytest.approx(analytic_flops(8), rel=0.01)] * 3
    assert counter.measured == 1  # not counted again
    TorchInstrumentor().uninstrument()
    assert vars(model)["_compiled_call_impl"] is theirs


def test_at_most_max_measures_then_gives_up(
    run: RuntimeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="otelgpu.torch")
    run.instrument()
    model = Model()
    train(model, 20, seq=8)
    counter = _counter()
    counter.max_measures = 2
    for seq in (9, 10, 11, 12):
        train(model, 3, seq=seq)
    assert counter.measured == 2
    gave_up = [r for r in caplog.records if "input shapes changed" in r.getMessage()]
    assert len(gave_up) == 1


def test_explicit_flops_win_and_nothing_is_counted(run: RuntimeHarness) -> None:
    run.instrument(flops_per_step=5e9)
    session = TorchInstrumentor().session
    assert session is not None
    assert not [e for e in session.extensions if isinstance(e, FlopsCounter)]
    train(Model(), STEPS, seq=8)
    spans = _spans(run)
    assert spans
    assert {s["otelgpu.train.flops"] for s in spans} == {5e9}


def test_counting_can_be_turned_off(run: RuntimeHarness, monkeypatch: Any) -> None:
    monkeypatch.setenv("OTELGPU_TORCH_COUNT_FLOPS", "false")
    run.instrument()
    train(Model(), STEPS, seq=8)
    spans = _spans(run)
    assert spans
    assert not [s for s in spans if "otelgpu.train.mfu" in s]


@pytest.fixture
def boom_op() -> Iterator[None]:
    """A custom op whose FLOP formula raises inside the counted step."""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    lib = torch.library.Library("otelgpu_test", "FRAGMENT")  # a test-only op
    lib.define("boom(Tensor x) -> Tensor")
    lib.impl("boom", lambda x: x.clone(), "CompositeExplicitAutograd")
    op = torch.ops.otelgpu_test.boom

    @register_flop_formula(op)
    def _formula(*args: Any, **kwargs: Any) -> int:
        raise ValueError("no formula for these shapes")

    try:
        yield
    finally:
        flop_registry.pop(op, None)
        lib._destroy()


def test_failing_flop_formula_never_reaches_the_loop(
    run: RuntimeHarness, boom_op: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run.instrument()
    train(Model(), STEPS, seq=8, boom=True)  # raises nothing
    spans = _spans(run)
    assert len(spans) >= STEPS - 2
    assert not [s for s in spans if "otelgpu.train.mfu" in s]
    counter = _counter()
    assert counter.failure is not None and "formula" in counter.failure
    assert counter.measured == 0
    logged = [r for r in caplog.records if "torch.flops" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]


def test_compiled_code_is_not_counted(
    run: RuntimeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="otelgpu.torch")
    run.instrument()
    model = torch.compile(Model(), backend="eager")  # Dynamo frames, no C++ compiler
    assert isinstance(model, torch.nn.Module)  # an OptimizedModule wrapping Model
    train(model, STEPS, seq=8)
    spans = _spans(run)
    assert spans
    assert not [s for s in spans if "otelgpu.train.mfu" in s]
    counter = _counter()
    assert counter.failure is not None and "torch.compile" in counter.failure
    assert counter.phase == "off"
    refused = [r for r in caplog.records if "model FLOPs not counted" in r.getMessage()]
    assert len(refused) == 1
