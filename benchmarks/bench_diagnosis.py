"""Overhead of otelgpu's diagnosis (step phases + rank exchange) next to TraceML's step tracing.

The loop of ``bench_torch.py`` (a small MLP on CPU, ~5 ms steps: DataLoader, AdamW, one
backward) runs in these modes:

* ``plain``;
* ``otelgpu``: the torch instrumentation with diagnosis off (steps, data wait, spans,
  sketches: what the phase hooks and the exchange come on top of);
* ``otelgpu+diagnosis``: the same with phases (outermost-module and backward timing), the
  detectors and the rank exchange every 50 steps over a real ``torch.distributed.TCPStore``
  (one rank: each window is a set, a wait, a multi_get and a delete on the store);
* ``traceml``: TraceML (``traceml-ai``) with its default automatic step tracing
  (``traceml.init(mode="auto")`` + ``with traceml.trace_step(model):`` around each step,
  reporting to its own aggregator started with ``traceml serve``), in a second process
  with its own ``plain`` measured first (TraceML cannot be switched off once initialised).

Figures, from the most to the least load-robust (the machine this runs on is often shared):

1. **Instructions per step** (``valgrind --tool=callgrind``, when installed): one child
   process per mode runs ``--callgrind-steps`` steps with instrumentation collection
   switched on only around them (all threads: training, telemetry, exchange; the
   background work is flushed inside the window). Instruction counts do not depend on
   load; the ratio (otelgpu+diagnosis - otelgpu) / plain is the overhead figure.
2. **CPU time per step**: process CPU time (all threads) and the training thread's own
   CPU time (``time.thread_time``), per repetition; the median over the interleaved
   repetitions (the order of modes rotates every repetition) is compared.
3. **The parts, measured directly** in thread CPU time (best of 5): the training thread's
   hooks, torch's call path for a timed root, the telemetry thread's diagnosis work per
   step, the exchange hand-off and the exchange thread's store round per window.

Wall-clock medians are printed for reference only; the load average is printed with them.

Run: ``.venv/bin/python benchmarks/bench_diagnosis.py`` (a few minutes; ``--callgrind-steps
0`` skips the instruction counts). Writes ``benchmarks/results/diagnosis.md``; exits 1 if
phases + exchange add 0.5 % or more of a plain step (figure 1 when measured, else figure 2,
all threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# this checkout's otelgpu (built in place), not whichever one the environment installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_torch import _epoch, _runtime, _setup, callgrind_control, loop_parser

RESULTS = Path(__file__).resolve().parent / "results" / "diagnosis.md"
TARGET = 0.005
EVERY = 50
MODES = ("plain", "otelgpu", "otelgpu+diagnosis")
WARMUP_STEPS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def _store_exchange() -> Any:
    """An exchange factory over a real TCPStore (one rank)."""
    import datetime

    from otelgpu.diagnosis.exchange import Exchange

    store = torch.distributed.TCPStore(
        "127.0.0.1", _free_port(), 1, True, timeout=datetime.timedelta(seconds=10)
    )

    def factory(on_window: Any) -> Exchange:
        return Exchange(store, 0, 1, on_window)

    return factory


def _instrument(runtime: Any, diagnosis: bool, factory: Any) -> Any:
    from otelgpu import diagnosis as D
    from otelgpu.instrumentation.torch import TorchInstrumentor

    inst = TorchInstrumentor()
    inst.instrument(runtime=runtime, diagnosis=diagnosis, exchange_every=EVERY, verdict_log=False)
    active = D.active()
    if diagnosis and active is not None:
        active._exchange_factory = factory
    return inst


def _settle() -> int:
    """Flushes the pending step and waits (bounded) for the exchange thread to finish the
    windows handed to it, so their work falls inside the measurement. Windows sent."""
    from otelgpu import diagnosis as D
    from otelgpu.instrumentation.torch import flush

    flush()
    active = D.active()
    exchange = None if active is None else active.exchange
    if exchange is None:
        return 0
    deadline = time.monotonic() + 5.0
    while exchange.completed + exchange.timeouts < active.windows_sent:
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    return int(active.windows_sent)


def _thread_best(fn: Callable[[], Any], number: int = 2000, repeat: int = 5) -> float:
    """µs of this thread's CPU time per call of ``fn`` (best of ``repeat``)."""
    best = float("inf")
    clock = time.thread_time
    for _ in range(repeat):
        t0 = clock()
        for _ in range(number):
            fn()
        best = min(best, clock() - t0)
    return best / number * 1e6


def _components(runtime: Any) -> dict[str, float]:
    """µs of thread CPU time per step (or per window) of the diagnosis parts."""
    from otelgpu import diagnosis as D
    from otelgpu.diagnosis import training as T
    from otelgpu.instrumentation.torch import TorchInstrumentor
    from otelgpu.instrumentation.torch import _phases as P
    from otelgpu.instrumentation.torch._gate import GATE
    from otelgpu.instrumentation.torch._steps import StepRecord, epoch_clock

    out: dict[str, float] = {}
    hooks = P.PhaseHooks(epoch_clock(), None)  # type: ignore[arg-type]
    was = GATE.on
    GATE.on = True
    try:

        def training_thread() -> None:  # one outermost forward and one backward interval
            hooks._enter()
            hooks._exit()
            hooks.backward.append((1, 2))
            hooks.forward.clear()

        out["train: phase bookkeeping (forward enter/exit, backward interval)"] = _thread_best(
            training_thread
        )
        # torch's own call path for the root: bare, through the timed slot (what is
        # installed), and the alternatives (two instance hooks; global hooks, which
        # every module call of the model pays)
        root = torch.nn.Sequential(torch.nn.Identity())
        x = torch.zeros(1)
        bare = _thread_best(lambda: root(x), 5000)
        P._HAS_SLOT = P._has_slot()
        timed = P._TimedCall(hooks, root)
        slot = _thread_best(lambda: root(x), 5000)
        timed.restore()
        hooks.forward.clear()
        handles = [
            root.register_forward_pre_hook(hooks._root_pre),
            root.register_forward_hook(hooks._root_post, always_call=True),
        ]
        instance = _thread_best(lambda: root(x), 5000)
        for h in handles:
            h.remove()
        hooks.forward.clear()
        mm = torch.nn.modules.module

        def noop(*_a: Any) -> None:
            return None

        handles = [
            mm.register_module_forward_pre_hook(noop),
            mm.register_module_forward_hook(noop, always_call=True),
        ]
        glob = _thread_best(lambda: root(x), 5000)
        for h in handles:
            h.remove()
        out["train: root call through the timed slot, minus bare (installed)"] = slot - bare
        out["(alternative) root call with two instance hooks, minus bare"] = instance - bare
        out["(alternative) global module hooks, per module call (2 modules here), minus bare"] = (
            glob - bare
        ) / 2
    finally:
        GATE.on = was
    inst = TorchInstrumentor()
    inst.instrument(runtime=runtime, exchange_every=0, verdict_log=False)
    try:
        diagnosis = D.active()
        assert diagnosis is not None
        source = diagnosis.phase_source
        assert isinstance(source, P.PhaseHooks)
        ms = 1_000_000
        record = StepRecord(step=1, start_ns=0, end_ns=5 * ms, data_wait_ns=ms // 10)

        def telemetry_thread() -> None:  # a step with one forward and one backward
            record.step += 1
            t = record.step * 5 * ms
            record.start_ns, record.end_ns = t, t + 5 * ms
            source.forward.append((t + ms // 5, t + 2 * ms))
            source.backward.append((t + 5 * ms // 2, t + 4 * ms))
            diagnosis.observe_step(record, {}, [])

        out["telemetry: diagnosis per step (phase split, sketches, detectors, window)"] = (
            _thread_best(telemetry_thread)
        )
        window = T._Window()  # a full window, as handed over every EVERY steps
        for _ in range(EVERY):
            record.step += 1
            window.add(record, T.record_phases(record), [])
        diagnosis._exchange_factory = _store_exchange()
        exchange = diagnosis._ensure_exchange()
        assert exchange is not None
        # hand-offs are queued, not sent (no thread started): the store round is timed below
        exchange._thread = threading.Thread(target=lambda: None)

        def send() -> None:
            exchange._queue.queue.clear()
            diagnosis._send(window, 1)

        out[f"telemetry: exchange hand-off per window of {EVERY} steps (medians, queue)"] = (
            _thread_best(send, 200)
        )
        index = iter(range(10**6))
        summary = exchange._queue.queue[0][1] if exchange._queue.queue else None
        assert summary is not None

        def store_round() -> None:
            exchange.exchange(next(index), summary)

        out[f"exchange thread: store round per window of {EVERY} steps (client side)"] = (
            _thread_best(store_round, 100)
        )
        exchange._queue.queue.clear()
        exchange._thread = None
    finally:
        inst.uninstrument()
    return out


TRACEML_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from bench_torch import _epoch, _setup, train_step
torch.set_num_threads(1)
reps, steps, hidden, batch, port, logs = (int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                          int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
model, opt, loader = _setup(hidden, batch, steps)
_epoch(model, opt, loader)
plain = []
for _ in range(reps):
    plain.extend(_epoch(model, opt, loader)[0])
import traceml_ai as traceml
traceml.init(mode="auto", aggregator_host="127.0.0.1", aggregator_port=port, logs_dir=logs,
             ui_mode="summary", on_missing_aggregator="raise", session_id="bench")

def traced():
    out = []
    clock = time.perf_counter
    t0 = clock()
    for x, y in loader:
        with traceml.trace_step(model):
            train_step(model, opt, x, y)
        t1 = clock()
        out.append(t1 - t0)
        t0 = t1
    return out

traced()
traceml_times = []
for _ in range(reps):
    traceml_times.extend(traced())
print(json.dumps({"plain": statistics.median(plain), "traceml": statistics.median(traceml_times),
                  "steps": len(traceml_times)}))
"""


def _traceml(reps: int, steps: int, hidden: int, batch: int) -> dict[str, Any] | str:
    """TraceML in its own process (with its aggregator): plain vs traced medians."""
    try:
        import traceml_ai  # noqa: F401
    except ImportError as exc:  # the bench extra installs it
        return f"not installed ({exc})"
    port = _free_port()
    with tempfile.TemporaryDirectory() as logs:
        exe = Path(sys.executable).with_name("traceml")
        server = subprocess.Popen(
            [
                str(exe),
                "serve",
                "--mode",
                "summary",
                "--aggregator-port",
                str(port),
                "--logs-dir",
                logs,
                "--run-name",
                "bench",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.2)
            child = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    TRACEML_CHILD,
                    str(Path(__file__).resolve().parent),
                    str(reps),
                    str(steps),
                    str(hidden),
                    str(batch),
                    str(port),
                    logs,
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        return f"failed: rc={child.returncode} {child.stderr[-600:]!r}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _callgrind_child(mode: str, steps: int, hidden: int, batch: int) -> int:
    """Runs under callgrind with collection off; switches it on around ``steps`` steps."""
    from otelgpu import diagnosis as D
    from otelgpu.diagnosis import training as T

    torch.set_num_threads(1)
    runtime, _reader = _runtime()
    factory = _store_exchange()
    model, opt, loader = _setup(hidden, batch, steps)
    _m, _o, warm = _setup(hidden, batch, WARMUP_STEPS)
    inst = None if mode == "plain" else _instrument(runtime, mode != "otelgpu", factory)
    _epoch(model, opt, warm)  # warm-up: discovery, lazy imports (valgrind runs it slowly)
    if inst is not None:
        _settle()
    active = D.active()
    if active is not None and active.settings.exchange_every:
        # One window exchanged before counting (the exchange's set-up and thread start are
        # once per process); the counted steps then close exactly one window of their own.
        window, active._window = active._window, T._Window()
        active._send(window, 0)
        _settle()

    callgrind_control("on")
    _epoch(model, opt, loader)
    if inst is not None:
        _settle()
    callgrind_control("off")
    if inst is not None:
        inst.uninstrument()
    return 0


def _callgrind(
    steps: int, hidden: int, batch: int, modes: Sequence[str] = MODES
) -> dict[str, float] | str:
    """Instructions per step of each mode (children under callgrind, run in parallel)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None or shutil.which("callgrind_control") is None:
        return "valgrind not installed"
    with tempfile.TemporaryDirectory() as tmp:
        children = {}
        for mode in modes:
            cmd = [
                valgrind,
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={tmp}/{mode}.out",
                sys.executable,
                __file__,
                "--callgrind-child",
                mode,
                "--steps",
                str(steps),
                "--hidden",
                str(hidden),
                "--batch",
                str(batch),
            ]
            children[mode] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        out: dict[str, float] = {}
        errors = []
        for mode, child in children.items():
            _, err = child.communicate(timeout=3600)
            found = re.findall(r"Collected : (\d+)", err)
            if child.returncode != 0 or not found:
                errors.append(f"{mode}: rc={child.returncode} {err[-300:]!r}")
                continue
            out[mode] = int(found[-1]) / steps
    return "; ".join(errors) if errors else out


def main(argv: Sequence[str] | None = None) -> int:
    parser = loop_parser(__doc__, reps=30, steps=100)
    parser.add_argument(
        "--callgrind-steps",
        type=int,
        default=2 * EVERY,
        help="steps counted under callgrind (0: off; a multiple of the exchange period; "
        "more steps average out the work done once per window or per export)",
    )
    parser.add_argument("--callgrind-child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-traceml", action="store_true")
    args = parser.parse_args(argv)
    if args.callgrind_child:
        return _callgrind_child(args.callgrind_child, args.steps, args.hidden, args.batch)

    load_before = _load()
    torch.set_num_threads(1)
    runtime, _reader = _runtime()
    factory = _store_exchange()
    model, opt, loader = _setup(args.hidden, args.batch, args.steps)
    _epoch(model, opt, loader)
    for diagnosis in (False, True):  # warm-up of both instrumented paths
        inst = _instrument(runtime, diagnosis, factory)
        _epoch(model, opt, loader)
        _settle()
        inst.uninstrument()

    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_all: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_train: dict[str, list[float]] = {m: [] for m in MODES}
    windows = 0
    for rep in range(args.reps):
        order = MODES[rep % 3 :] + MODES[: rep % 3]
        for mode in order:
            inst = None
            if mode != "plain":
                inst = _instrument(runtime, mode == "otelgpu+diagnosis", factory)
            try:
                c0, t0 = time.process_time(), time.thread_time()
                steps, _ = _epoch(model, opt, loader)
                t1 = time.thread_time()
                if inst is not None:
                    f0 = time.perf_counter()
                    windows += _settle()
                    steps[-1] += time.perf_counter() - f0
                c1 = time.process_time()
                n = len(steps)
                cpu_all[mode].append((c1 - c0) / n)
                cpu_train[mode].append((t1 - t0) / n)
                times[mode].extend(steps)
            finally:
                if inst is not None:
                    inst.uninstrument()
    load_after = _load()
    med = {m: statistics.median(v) for m, v in times.items()}
    all_step = {m: statistics.median(v) for m, v in cpu_all.items()}
    train_step = {m: statistics.median(v) for m, v in cpu_train.items()}
    # Diagnosis on top of otelgpu, as a share of the plain step (CPU time per step).
    cpu_cost = (all_step["otelgpu+diagnosis"] - all_step["otelgpu"]) / all_step["plain"]
    train_cost = (train_step["otelgpu+diagnosis"] - train_step["otelgpu"]) / train_step["plain"]
    wall_cost = (med["otelgpu+diagnosis"] - med["otelgpu"]) / med["plain"]
    parts = _components(runtime)
    traceml = None if args.no_traceml else _traceml(args.reps, args.steps, args.hidden, args.batch)
    instructions = (
        _callgrind(args.callgrind_steps, args.hidden, args.batch) if args.callgrind_steps else None
    )
    load_end = _load()

    lines = [
        "# Diagnosis overhead (step phases + rank exchange) and TraceML",
        "",
        f"`python benchmarks/bench_diagnosis.py` on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}; "
        f"{args.reps} interleaved repetitions x {args.steps} steps per mode; exchange every "
        f"{EVERY} steps over a real TCPStore ({windows} windows exchanged). Load average "
        f"(1/5/15 min): {load_before} at the start, {load_after} after the timed "
        f"repetitions, {load_end} at the end.",
        "",
    ]
    criterion = cpu_cost
    if isinstance(instructions, dict):
        ir = instructions
        ir_cost = (ir["otelgpu+diagnosis"] - ir["otelgpu"]) / ir["plain"]
        criterion = ir_cost
        lines += [
            f"**1. Instructions per step** (callgrind, {args.callgrind_steps} steps per mode, "
            "all threads, load-independent):",
            "",
            "| mode | instructions per step | vs plain |",
            "|---|---:|---:|",
        ]
        for m in MODES:
            lines.append(f"| {m} | {ir[m]:,.0f} | {ir[m] / ir['plain'] - 1:+.2%} |")
        lines += [
            "",
            f"Phases + exchange (`otelgpu+diagnosis` - `otelgpu`): **{ir_cost:+.3%}** of a "
            f"plain step's instructions (target < {TARGET:.1%}).",
            "",
        ]
    elif instructions is not None:
        lines += [f"**1. Instructions per step**: not measured ({instructions}).", ""]
    lines += [
        "**2. CPU time per step** (median over repetitions):",
        "",
        "| mode | CPU, all threads | vs plain | CPU, training thread | vs plain "
        "| wall median (load-dependent) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in MODES:
        lines.append(
            f"| {m} | {all_step[m] * 1e3:.3f} ms | {all_step[m] / all_step['plain'] - 1:+.2%} "
            f"| {train_step[m] * 1e3:.3f} ms | {train_step[m] / train_step['plain'] - 1:+.2%} "
            f"| {med[m] * 1e3:.3f} ms |"
        )
    if isinstance(traceml, dict):
        ratio = traceml["traceml"] / traceml["plain"] - 1
        lines.append(
            f"| traceml (own process; wall only: plain {traceml['plain'] * 1e3:.3f} ms, "
            f"{ratio:+.2%}) | | | | | {traceml['traceml'] * 1e3:.3f} ms |"
        )
    elif traceml is not None:
        lines.append(f"| traceml | {traceml} | | | | |")
    lines += [
        "",
        f"Phases + exchange (`otelgpu+diagnosis` - `otelgpu`) as a share of the plain step: "
        f"{cpu_cost:+.2%} in CPU time of all threads, {train_cost:+.2%} in the training "
        f"thread's CPU time, {wall_cost:+.2%} in wall-clock medians (noise on a loaded "
        "machine: compare the modes' spread).",
        "",
        "**3. The parts, measured directly** (thread CPU time, best of 5):",
        "",
        "| part | µs | µs per step |",
        "|---|---:|---:|",
    ]
    per_step_total = 0.0
    for name, us in parts.items():
        per_window = "per window" in name
        per_step = us / EVERY if per_window else us
        if not name.startswith("("):
            per_step_total += per_step
        lines.append(f"| {name} | {us:.2f} | {per_step:.2f} |")
    plain_us = train_step["plain"] * 1e6
    lines += [
        f"| **installed parts, total** | | **{per_step_total:.2f}** |",
        "",
        f"Sum of the installed parts: {per_step_total:.1f} µs per step = "
        f"{per_step_total / plain_us:.2%} of the plain step's training-thread CPU time "
        f"({plain_us / 1e3:.3f} ms).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0 if criterion < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
