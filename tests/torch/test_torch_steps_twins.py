"""The native step tracker and its pure-Python twin emit the same steps for the same events.

Random event sequences (seeded: every failure is reproducible) drive both twins with the
same clock; the records (the same dataclass), the probe and FLOPs calls, the rule, the
anchor and the counters must match after every event. The rules themselves are tested in
``test_torch_steps.py`` against real torch, on whichever twin the run selects.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from otelgpu import _impl
from otelgpu.instrumentation.torch._steps import PyStepTracker, StepRecord

_NATIVE = _impl.native_module("otelgpu.instrumentation.torch._steps_c")

if _impl.NO_EXTENSIONS:  # the pure-Python run; a native one without it fails below
    pytest.skip("this run has no native core (OTELGPU_NO_EXTENSIONS)", allow_module_level=True)


class _Twin:
    """One tracker with its own clock, record list, probe and FLOPs sources."""

    def __init__(self, cls: Any, **kwargs: Any) -> None:
        self.clock = itertools.count(1)
        self.steps: list[Any] = []  # records, or accumulators emitted ``deferred``
        self.deferred = kwargs.get("deferred", False)
        self.probes = 0
        self.flops_calls = 0
        self.tracker = cls(
            self.steps.append,
            clock=lambda: next(self.clock),
            probe=self._probe,
            flops=self._flops,
            **kwargs,
        )

    def _probe(self) -> object:
        self.probes += 1
        return ("probe", self.probes)

    def _flops(self) -> float:
        self.flops_calls += 1
        return float(self.flops_calls)

    def state(self) -> tuple[Any, ...]:
        t = self.tracker
        return (
            [a.finish() for a in self.steps] if self.deferred else list(self.steps),
            self.probes,
            self.flops_calls,
            t.rule,
            t.steps,
            t.anchor(),
            t.backward_only,
            t.total_optimizer_steps,
            t.compiled_optimizer_steps,
        )


def _event(
    rng: random.Random, times: itertools.count[int]
) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """One random hook event: (method, args, kwargs); explicit times from ``times``."""
    kind = rng.choices(
        [
            "backward_begin", "backward_end", "optimizer_step", "data_wait", "comm_wait",
            "checkpoint", "add_batch", "add_event", "compiled_begin", "compiled_end",
            "engine_begin", "engine_end", "loader_startup", "batch_consumed", "activity",
            "flush",
        ],
        weights=[12, 12, 14, 8, 3, 2, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1],
    )[0]  # fmt: skip
    maybe_n = lambda: rng.choice([None, rng.randint(1, 64)])  # noqa: E731
    if kind == "optimizer_step":
        kwargs: dict[str, Any] = {}
        if rng.random() < 0.1:
            kwargs["skipped"] = True
        if rng.random() < 0.5:
            kwargs["duration_ns"] = rng.randint(0, 5)
        if rng.random() < 0.1:
            kwargs["count"] = rng.randint(1, 3)
        args: tuple[Any, ...] = (rng.choice([101, 102, 103]),)
        if rng.random() < 0.2:
            args = (*args, next(times))
        return kind, args, kwargs
    if kind in ("data_wait", "comm_wait", "checkpoint", "loader_startup"):
        start = next(times)
        end = start + rng.randint(0, 3)
        for _ in range(end - start):
            next(times)
        if kind == "data_wait":
            return kind, (start, end, maybe_n(), maybe_n()), {}
        if kind == "comm_wait":
            return kind, (rng.choice(["all_reduce", "broadcast"]), start, end), {}
        return kind, (start, end), {}
    if kind in ("add_batch", "batch_consumed"):
        return kind, (maybe_n(), maybe_n()), {}
    if kind == "add_event":
        return kind, ("otelgpu.torch.oom", {"n": rng.randint(0, 9)}), {}
    if kind == "compiled_end":
        return kind, (rng.choice([201, 202]), rng.randint(0, 2)), {}
    if kind == "engine_end":
        return kind, (rng.choice([None, True, False]),), {}
    return kind, (), {}


@pytest.mark.parametrize("seed", range(40))
def test_random_event_sequences_give_the_same_steps(seed: int) -> None:
    rng = random.Random(seed)
    kwargs = rng.choice(
        [{}, {"window": 4, "warmup": 3}, {"step_optimizer": 102}, {"backward_only_after": 3},
         {"max_segments": 5}, {"max_warmup_ns": 40}]
    )  # fmt: skip
    assert _NATIVE is not None
    py, native = _Twin(PyStepTracker, **kwargs), _Twin(_NATIVE.StepTracker, **kwargs)
    # emitted deferred (the accumulators, their records built by finish()): the same steps
    deferred = [_Twin(cls, deferred=True, **kwargs) for cls in (PyStepTracker, _NATIVE.StepTracker)]
    twins = [native, *deferred]
    times = itertools.count(10_000)
    for i in range(400):
        method, args, kw = _event(rng, times)
        getattr(py.tracker, method)(*args, **kw)
        for twin in twins:
            getattr(twin.tracker, method)(*args, **kw)
            assert twin.state() == py.state(), f"seed {seed}, event {i}: {method}{args}{kw}"
    for twin in (py, *twins):
        twin.tracker.flush()
    assert all(twin.state() == py.state() for twin in twins)
    assert py.steps, "the sequence produced steps"
    assert all(not isinstance(a, StepRecord) for twin in deferred for a in twin.steps)


def test_native_twin_is_selected_with_the_native_core() -> None:
    from otelgpu.instrumentation.torch import _steps

    assert _NATIVE is not None
    assert _steps.StepTracker is _NATIVE.StepTracker


def test_callbacks_raise_through_both_twins() -> None:
    """The hooks layer catches what the emit, probe or FLOPs callbacks raise: both twins
    let it through at the same event, and go on alike afterwards."""
    assert _NATIVE is not None
    seen = []
    for cls in (PyStepTracker, _NATIVE.StepTracker):
        emitted: list[int] = []
        raised: list[int] = []

        def emit(
            record: StepRecord, emitted: list[int] = emitted, raised: list[int] = raised
        ) -> None:
            if len(emitted) == 3 and len(raised) == 0:
                raised.append(record.step)
                raise RuntimeError("sink failed")
            emitted.append(record.step)

        t = cls(emit, clock=itertools.count(1).__next__)
        for i in range(40):
            for method in ("backward_begin", "backward_end", "optimizer_step"):
                try:
                    getattr(t, method)(*((1,) if method == "optimizer_step" else ()))
                except RuntimeError:
                    raised.append(i)
        t.flush()
        assert len(raised) == 2, cls  # the failing record, and the event it surfaced from
        # the records delivered after the failing one in the same call are lost (the
        # session's emit never raises: it catches and counts), the later steps are not
        assert emitted[:3] == [1, 2, 3] and emitted[-1] == 40, cls
        assert emitted == sorted(emitted) and raised[0] not in emitted, cls
        seen.append((emitted, raised))
    assert seen[0] == seen[1]


def test_callback_errors_go_to_on_error_alike_in_both_twins() -> None:
    """With ``on_error`` (the session's sink), what the emit, probe or FLOPs callbacks
    raise is reported there, never raised: the failing record is lost, the records after
    it are delivered, a failed probe or FLOPs source leaves the step without its value,
    and a FLOPs source that returns no number gives none."""
    assert _NATIVE is not None
    seen = []
    for cls in (PyStepTracker, _NATIVE.StepTracker):
        emitted: list[tuple[int, object, object]] = []
        errors: list[tuple[str, str]] = []
        calls = itertools.count(1)

        def emit(record: StepRecord, emitted: list[Any] = emitted) -> None:
            if record.step == 5:
                raise RuntimeError("sink failed")
            emitted.append((record.step, record.probe, record.flops))

        def probe(calls: Any = calls) -> object:
            n = next(calls)
            if n % 7 == 0:
                raise ValueError("probe failed")
            return n

        flops_calls = itertools.count(1)

        def flops(flops_calls: Any = flops_calls) -> Any:
            n = next(flops_calls)
            if n % 9 == 0:
                raise KeyError("flops failed")
            return "many" if n % 11 == 0 else float(n)

        def on_error(where: str, exc: BaseException, errors: list[Any] = errors) -> None:
            errors.append((where, type(exc).__name__))

        t = cls(
            emit, clock=itertools.count(1).__next__, probe=probe, flops=flops, on_error=on_error
        )
        for _ in range(40):
            t.backward_begin()
            t.backward_end()
            t.optimizer_step(1)
        t.flush()
        steps = [s for s, _, _ in emitted]
        assert 5 not in steps and steps == sorted(steps) and steps[-1] >= 20, cls
        assert ("torch.step", "RuntimeError") in errors, cls
        assert ("torch.step_probe", "ValueError") in errors, cls
        assert ("torch.flops", "KeyError") in errors, cls
        assert any(p is None for _, p, _ in emitted), cls  # the failed probe's step
        assert all(f is None or isinstance(f, float) for _, _, f in emitted), cls
        seen.append((emitted, errors))
    assert seen[0] == seen[1]


def test_flops_table_spares_the_flops_call_on_a_hit() -> None:
    """With ``flops_calls``/``flops_table`` set (the FLOP counter watching), a step whose
    calls are in the table carries its figure and the list is cleared without a ``flops``
    call; a miss, or an unhashable call, calls ``flops`` with the list as it was."""
    assert _NATIVE is not None
    seen = []
    for cls in (_NATIVE.StepTracker, PyStepTracker):
        records: list[StepRecord] = []
        calls: list[Any] = []
        lists_seen: list[list[Any]] = []

        def flops(calls: list[Any] = calls, lists_seen: list[list[Any]] = lists_seen) -> float:
            lists_seen.append(list(calls))
            calls.clear()
            return -1.0

        t = cls(records.append, clock=itertools.count(1).__next__, flops=flops, step_optimizer=1)
        t.flops_calls = calls
        t.flops_table = {(("a", 1),): 100, (): 7}
        for step_calls in ([("a", 1)], [("a", 2)], [("a", 1)], [], [["unhashable"]]):
            calls.extend(step_calls)
            t.backward_begin()
            t.backward_end()
            t.optimizer_step(1)
        t.flush()
        figures = [r.flops for r in records]
        seen.append((figures, lists_seen))
        assert figures == [100.0, -1.0, 100.0, 7.0, -1.0], cls
        assert lists_seen == [[("a", 2)], [["unhashable"]]], cls
        assert all(isinstance(f, float) for f in figures if f is not None), cls
        assert calls == [], cls
    assert seen[0] == seen[1]


def test_finish_of_an_accumulator_never_settled_raises() -> None:
    """``finish()`` is for steps a tracker emitted deferred; on the accumulator of a step
    in progress it raises instead of building a record with made-up times."""
    from otelgpu.instrumentation.torch._records import Accum

    assert _NATIVE is not None
    for cls in (Accum, _NATIVE.Accum):
        with pytest.raises(RuntimeError, match="never settled"):
            cls().finish()
