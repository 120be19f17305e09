"""Step records and the step rules' names: what the step tracker produces and reports.

:class:`StepRecord` is one finished training step as the tracker emits it;
:class:`Accum` holds the sums of the step (or warm-up segment) in progress, and
:func:`epoch_clock` is the tracker's default clock. Nothing here imports torch; the rules
themselves are explained in ``otelgpu.instrumentation.torch._steps``.

Thread-safety: records are built under the tracker's lock and handed over whole; an
:class:`Accum` is only touched under that lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "RULES",
    "RULE_BACKWARD",
    "RULE_COMPILED",
    "RULE_ENGINE",
    "RULE_OPTIMIZER",
    "RULE_STEP_OPTIMIZER",
    "RULE_TEXT",
    "Accum",
    "Clock",
    "Records",
    "StepRecord",
    "add",
    "epoch_clock",
]

RULE_OPTIMIZER = "optimizer"
RULE_STEP_OPTIMIZER = "step_optimizer"
RULE_COMPILED = "compiled"
RULE_BACKWARD = "backward"
RULE_ENGINE = "engine"
RULES = (RULE_OPTIMIZER, RULE_STEP_OPTIMIZER, RULE_COMPILED, RULE_BACKWARD, RULE_ENGINE)
"""Step rules (see the module docstring); ``otelgpu.train.step.rule`` takes these values."""

RULE_TEXT = {
    RULE_OPTIMIZER: "at the least frequently stepping optimizer's step",
    RULE_STEP_OPTIMIZER: "at the step of the optimizer given as step_optimizer",
    RULE_COMPILED: (
        "at the end of each call of the torch.compile'd function that steps the optimizer"
    ),
    RULE_BACKWARD: "at each backward call (no optimizer step hook fired)",
    RULE_ENGINE: "at the engine's own step (DeepSpeed)",
}

Clock = Callable[[], int]
Records = Sequence["StepRecord | Accum"]


def epoch_clock() -> Clock:
    """A monotonic nanosecond clock on the ``time.time_ns()`` epoch (offset fixed once)."""
    offset = time.time_ns() - time.perf_counter_ns()
    perf = time.perf_counter_ns

    def now() -> int:
        return perf() + offset

    return now


@dataclass(slots=True)
class StepRecord:
    """One training step (iteration). Times are ns on the tracker's clock.

    ``samples``/``tokens`` are ``None`` when neither inferred from batches nor given.
    ``comm_wait_by_op_ns`` maps a collective name (``all_reduce``) to its host wait.
    ``flops``: model FLOPs of the step as the tracker's ``flops`` source gave them when
    the step closed (``None``: not known, e.g. a warm-up step or the counted step itself).
    """

    step: int
    start_ns: int
    end_ns: int
    optimizer_steps: int = 0
    skipped_optimizer_steps: int = 0
    micro_batches: int = 0
    data_wait_ns: int = 0
    data_fetches: int = 0
    loader_startup_ns: int = 0
    comm_wait_ns: int = 0
    comm_wait_by_op_ns: dict[str, int] = field(default_factory=dict)
    checkpoint_ns: int = 0
    optimizer_ns: int = 0
    samples: int | None = None
    tokens: int | None = None
    events: list[tuple[str, int, dict[str, object]]] = field(default_factory=list)
    probe: object = None
    rule: str = ""
    flops: float | None = None

    @property
    def duration_ns(self) -> int:
        """End minus start (ns)."""
        return self.end_ns - self.start_ns

    @property
    def skipped(self) -> bool:
        """True when every optimizer step in this step was skipped (inf/NaN gradients)."""
        return self.optimizer_steps > 0 and self.skipped_optimizer_steps == self.optimizer_steps

    @property
    def compute_ns(self) -> int:
        """Host time not spent waiting for data, collectives or checkpoints (>= 0)."""
        waits = self.data_wait_ns + self.comm_wait_ns + self.checkpoint_ns
        return max(0, self.duration_ns - waits)


class Accum:
    """Mutable accumulators of the step (or warm-up segment) in progress."""

    __slots__ = (
        "checkpoint_ns",
        "comm_by_op",
        "comm_ns",
        "data_fetches",
        "data_ns",
        "end_ns",
        "events",
        "explicit_samples",
        "explicit_tokens",
        "flops",
        "inferred_samples",
        "inferred_tokens",
        "loader_startup_ns",
        "marks",
        "micro_batches",
        "optimizer_ns",
        "optimizer_steps",
        "probe",
        "settled",
        "skipped",
        "tail_end_ns",
    )

    def __init__(self) -> None:
        self.optimizer_steps = 0
        self.skipped = 0
        self.micro_batches = 0
        self.data_ns = 0
        self.data_fetches = 0
        self.loader_startup_ns = 0
        self.comm_ns = 0
        self.comm_by_op: dict[str, int] = {}
        self.checkpoint_ns = 0
        self.optimizer_ns = 0
        self.explicit_samples: int | None = None
        self.explicit_tokens: int | None = None
        self.inferred_samples: int | None = None
        self.inferred_tokens: int | None = None
        self.events: list[tuple[str, int, dict[str, object]]] = []
        self.probe: object = None
        self.flops: float | None = None
        self.end_ns = 0
        self.tail_end_ns = 0
        self.marks: tuple[object, ...] = ()
        #: (step, start_ns, end_ns, rule) of a settled step emitted deferred
        self.settled: tuple[int, int, int, str] | None = None

    def absorb_earlier(self, earlier: Accum) -> None:
        """Adds ``earlier`` (the work just before this) into this accumulator."""
        self.optimizer_steps += earlier.optimizer_steps
        self.skipped += earlier.skipped
        self.micro_batches += earlier.micro_batches
        self.data_ns += earlier.data_ns
        self.data_fetches += earlier.data_fetches
        self.loader_startup_ns += earlier.loader_startup_ns
        self.comm_ns += earlier.comm_ns
        for op, ns in earlier.comm_by_op.items():
            self.comm_by_op[op] = self.comm_by_op.get(op, 0) + ns
        self.checkpoint_ns += earlier.checkpoint_ns
        self.optimizer_ns += earlier.optimizer_ns
        self.explicit_samples = add(earlier.explicit_samples, self.explicit_samples)
        self.explicit_tokens = add(earlier.explicit_tokens, self.explicit_tokens)
        self.inferred_samples = add(earlier.inferred_samples, self.inferred_samples)
        self.inferred_tokens = add(earlier.inferred_tokens, self.inferred_tokens)
        if earlier.events:
            self.events = (earlier.events + self.events)[-16:]
        if self.probe is None:
            self.probe = earlier.probe
        if self.flops is None:
            self.flops = earlier.flops
        self.end_ns = max(self.end_ns, earlier.end_ns)
        self.tail_end_ns = max(self.tail_end_ns, earlier.tail_end_ns)

    def record(self, step: int, start_ns: int, end_ns: int, rule: str) -> StepRecord:
        """The finished step: explicit samples/tokens win over those inferred."""
        samples = self.explicit_samples
        tokens = self.explicit_tokens
        return StepRecord(
            step=step,
            start_ns=start_ns,
            end_ns=end_ns,
            optimizer_steps=self.optimizer_steps,
            skipped_optimizer_steps=self.skipped,
            micro_batches=self.micro_batches,
            data_wait_ns=self.data_ns,
            data_fetches=self.data_fetches,
            loader_startup_ns=self.loader_startup_ns,
            comm_wait_ns=self.comm_ns,
            comm_wait_by_op_ns=self.comm_by_op,
            checkpoint_ns=self.checkpoint_ns,
            optimizer_ns=self.optimizer_ns,
            samples=self.inferred_samples if samples is None else samples,
            tokens=self.inferred_tokens if tokens is None else tokens,
            events=self.events,
            probe=self.probe,
            rule=rule,
            flops=self.flops,
        )

    def finish(self) -> StepRecord:
        """The record of a step its tracker emitted deferred (``settled`` set)."""
        if self.settled is None:
            raise RuntimeError("finish() of a step never settled")
        return self.record(*self.settled)

    @property
    def trains(self) -> bool:
        """True when this work includes a backward call or an optimizer step."""
        return bool(self.micro_batches or self.optimizer_steps)


def add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value
