"""How long the training thread is blocked per step, plain, instrumented and hooks only.

``bench_torch.py`` compares step times, whose run-to-run spread on the shared 2-core VM
(plain medians of 8-11.5 ms within half an hour on 2026-12-07) is many times the 1 %
being looked for. This diagnostic reads what the wall clock mixes together, per step of
the same loop (``bench_torch``'s MLP, ``--layers`` deep, one torch thread, step spans over
OTLP gRPC to a live receiver, tail-keeping sampling at ``--budget`` spans/s, 100 by
default), from the scheduler's own accounting of the training thread
(``/proc/self/task/<tid>/schedstat``):

* its CPU time (the hooks' own Python and the torch compute);
* its run-queue wait (runnable, waiting for a CPU: the machine's or another thread's load);
* **blocked**: wall time less both, i.e. asleep. The loop itself (``num_workers=0``, no
  I/O) hardly ever sleeps; an instrumented one sleeps while another thread holds the GIL
  it needs back after a torch op, plus the wake-up after the hand-over;
* its voluntary context switches (each such sleep is one) and its migrations between CPUs
  (``se.nr_migrations`` of ``/proc/self/task/<tid>/sched``, where the kernel has it: a
  thread moved to another CPU starts on cold caches);

and the CPU time per step of every thread of the process, by name. Modes are interleaved
(plain, instrumented, hooks only -- ``bench_torch``'s ``--hooks-only``: the background
thread drops each step -- in a rotating order), every repetition a fresh ``instrument()``.

Seen here (2026-12-07, a slow hour: 10-12 ms steps; 6 x 300 steps per mode): the
training thread slept 177 µs a step plain, 312 instrumented, 191 hooks only, with 0.12,
0.34 and 0.12 voluntary switches a step; the ``otelgpu-torch-steps`` thread used 165 µs of
CPU a step. The background drain, not the hooks, puts the training thread to sleep: about
0.2 more sleeps a step, ~600 µs each. ``py-spy record --idle`` put the training thread's
extra idle time in AdamW's ``_single_tensor_adam`` (a Python loop of small ops per
parameter, each a GIL release and re-take), not in ``backward()`` (one long call with the
GIL released: 27 of 810 GIL samples of the training thread fell inside it).

Run: ``.venv/bin/python benchmarks/diag_torch_blocking.py [--reps 6] [--steps 300] [--budget 100]``
(Linux; about 4 minutes). Diagnostic only: not part of the benchmark tables or of CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_torch as B
import torch

MODES = ("plain", "instrumented", B.HOOKS_ONLY)


def _sched(native_id: int) -> tuple[float, float, int, int]:
    """(CPU s, run-queue wait s, voluntary context switches, migrations between CPUs: 0
    where the kernel does not count them) of the thread so far."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        exec_ns, wait_ns, _slices = f.read().split()
    switches = 0
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                switches = int(line.split()[1])
    migrations = 0
    try:
        with open(f"/proc/self/task/{native_id}/sched") as f:
            for line in f:
                if line.startswith("se.nr_migrations"):
                    migrations = int(line.split(":")[1])
    except OSError:  # a kernel without scheduler statistics
        pass
    return int(exec_ns) / 1e9, int(wait_ns) / 1e9, switches, migrations


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of every live thread, by name (names of a kind summed)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # ended meanwhile
            continue
        out[thread.name] = out.get(thread.name, 0.0) + cpu
    return out


class Tally:
    """One mode's sums over its repetitions."""

    def __init__(self) -> None:
        self.medians: list[float] = []
        self.steps = 0
        self.wall = self.cpu = self.runq = 0.0
        self.switches = 0
        self.migrations = 0
        self.threads: dict[str, float] = {}

    def per_step_us(self, seconds: float) -> float:
        return seconds / self.steps * 1e6

    def line(self, mode: str) -> str:
        blocked = self.wall - self.cpu - self.runq
        others = ", ".join(
            f"{name} {self.per_step_us(cpu):.1f}"
            for name, cpu in sorted(self.threads.items())
            if name != "MainThread" and self.per_step_us(cpu) >= 0.5
        )
        return (
            f"{mode:>12}: median step {statistics.median(self.medians) * 1e3:.3f} ms, "
            f"per step: blocked {self.per_step_us(blocked):6.1f} µs, "
            f"run queue {self.per_step_us(self.runq):5.1f} µs, "
            f"CPU {self.per_step_us(self.cpu):8.1f} µs, "
            f"voluntary switches {self.switches / self.steps:.2f}, "
            f"migrations {self.migrations / self.steps:.3f}; "
            f"other threads' CPU µs/step: {others or 'none'}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6, help="repetitions per mode")
    parser.add_argument("--steps", type=int, default=300, help="steps per repetition")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers (2: ~5 ms steps)")
    parser.add_argument(
        "--budget",
        type=int,
        default=100,
        help="step spans kept per second (tail-keeping sampling; 0: every step)",
    )
    args = parser.parse_args(argv)
    modes = MODES
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        print("needs Linux's /proc/<pid>/task/<tid>/schedstat", file=sys.stderr)
        return 2

    from bench_export import start_receiver

    from otelgpu.instrumentation.torch import TorchInstrumentor, flush

    torch.set_num_threads(1)
    B.fix_malloc_thresholds()
    receiver, port, _http = start_receiver(Path(tempfile.mkdtemp(prefix="diag-torch-")))
    os.environ[B.OTLP_PORT_ENV] = str(port)
    try:
        runtime, _reader = B._exporting_runtime(B.OTLP, args.budget)
        model, opt, loader = B._setup(384, 128, args.steps, args.layers)
        B._epoch(model, opt, loader)  # warm-up: allocator, AdamW state
        inst = TorchInstrumentor()
        inst.instrument(runtime=runtime)
        B._epoch(model, opt, loader)  # the instrumented path's one-off start-up
        flush()
        inst.uninstrument()
        main_id = threading.main_thread().native_id or threading.get_native_id()
        tallies = {mode: Tally() for mode in modes}
        for rep in range(args.reps):
            turn = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in turn if rep % 2 == 0 else turn[::-1]:
                _run(mode, tallies[mode], inst, runtime, (model, opt, loader), main_id, flush)
        print(
            f"{args.reps} x {args.steps} steps per mode, {args.layers} hidden layers, "
            f"{args.budget} step spans/s, "
            "blocked = wall - CPU - run queue (the training thread asleep)"
        )
        for mode in modes:
            print(tallies[mode].line(mode))
    finally:
        import otelgpu

        otelgpu.shutdown()  # the last spans and metrics, while the receiver still listens
        receiver.terminate()
        receiver.wait(timeout=10)
    return 0


def _run(
    mode: str,
    tally: Tally,
    inst: Any,
    runtime: Any,
    loop: tuple[Any, Any, Any],
    main_id: int,
    flush: Any,
) -> None:
    """One repetition of ``mode``, added to ``tally`` (the flush of the queued steps and
    their export included, as ``bench_torch`` charges it)."""
    if mode != "plain":
        inst.instrument(runtime=runtime)
        if mode == B.HOOKS_ONLY:
            B._telemetry_off(inst)
    try:
        cpu0 = _thread_cpu()
        sched0 = _sched(main_id)
        wall0 = time.perf_counter()
        steps, _cpu = B._epoch(*loop)
        if mode != "plain":
            flush()
            runtime.pipeline.tracer_provider.force_flush()
        wall = time.perf_counter() - wall0
        sched1 = _sched(main_id)
        cpu1 = _thread_cpu()
    finally:
        if mode != "plain":
            inst.uninstrument()
    tally.medians.append(statistics.median(steps))
    tally.steps += len(steps)
    tally.wall += wall
    tally.cpu += sched1[0] - sched0[0]
    tally.runq += sched1[1] - sched0[1]
    tally.switches += sched1[2] - sched0[2]
    tally.migrations += sched1[3] - sched0[3]
    for name, cpu in cpu1.items():
        tally.threads[name] = tally.threads.get(name, 0.0) + cpu - cpu0.get(name, 0.0)


if __name__ == "__main__":
    sys.exit(main())
