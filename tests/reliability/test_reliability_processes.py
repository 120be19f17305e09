"""Processes: fork/spawn/forkserver children, DataLoader workers, torchrun ranks, signals
during export, ``os._exit`` in a child, ``instrument()`` twice, shutdown/instrument cycles.

Each probe is a real child Python process (the snippets below) with otelgpu imported from
this tree; the verdict is read from its exit status, stderr and what it recorded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import PYTHON, python_env
from fixtures.otlp_receiver import OtlpReceiver
from fixtures.reliability import SOAK
from reliability_support import otlp_settings

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def _decoded(output: bytes | str | None) -> str:
    """A timed-out child's captured output as text (bytes, str or nothing, by Python version)."""
    return output.decode() if isinstance(output, bytes) else (output or "")


def _run(
    code: str, timeout: float = 120, **env: Any
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``code`` (dedented) in a fresh interpreter: see :func:`_run_python`."""
    return _run_python(["-c", textwrap.dedent(code)], timeout, **env)


def _run_python(
    args: list[str], timeout: float = 120, **env: Any
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the interpreter with ``args`` (:func:`python_env` plus ``env``): the completed
    process (exit -9 with what it wrote and ``[killed: timeout]`` past ``timeout`` s) and
    its wall time in seconds."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [PYTHON, *args],
            capture_output=True,
            text=True,
            env=python_env(**env),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out, err = _decoded(exc.stdout), _decoded(exc.stderr)
        proc = subprocess.CompletedProcess(exc.cmd, -9, out, err + "\n[killed: timeout]")
    return proc, time.monotonic() - t0


def _spans(directory: Path) -> dict[str, int]:
    from otelgpu.otel.recording_reader import read_recording

    names: dict[str, int] = {}
    for f in sorted(directory.glob("*.otlp.jsonl*")):
        for message in read_recording(f):
            for rs in getattr(message, "resource_spans", ()):
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        names[span.name] = names.get(span.name, 0) + 1
    return names


def _clean(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == 0 and "Traceback" not in proc.stderr


def _steps_result(
    p: Any, proc: subprocess.CompletedProcess[str], wall: float, steps: int, least: int, how: str
) -> None:
    """The verdict of a probe that counts step spans: a clean exit and at least ``least``
    of them (``how``: the rest of the figure)."""
    p.result(
        _clean(proc) and steps >= least,
        f"exit {proc.returncode} in {wall:.1f} s; {steps} step spans recorded {how}",
    )


def test_dataloader_fork_workers(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "processes",
        "DataLoader fork workers",
        "torch DataLoader, 2 fork workers, 3 epochs x 20 batches under instrument(); "
        "workers also call otelgpu.step()",
    )
    proc, wall = _run(
        f"""
        import otelgpu, torch
        from torch.utils.data import DataLoader, Dataset
        class D(Dataset):
            def __len__(self): return 80
            def __getitem__(self, i):
                with otelgpu.step():   # in a forked worker: must not hang or duplicate
                    return torch.tensor([float(i)])
        otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r}, gpu=False,
                           frameworks="none")
        for epoch in range(3):
            dl = DataLoader(D(), batch_size=4, num_workers=2, multiprocessing_context="fork")
            for batch in dl:
                with otelgpu.step():
                    batch.sum()
        otelgpu.shutdown()
        """
    )
    tb = "traceback" if "Traceback" in proc.stderr else "no traceback"
    _steps_result(p, proc, wall, sum(_spans(tmp_path).values()), 60, f"by the parent; {tb}")


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_multiprocessing_children(probe: Any, tmp_path: Path, method: str) -> None:
    p = probe(
        "processes",
        f"multiprocessing {method}",
        f"instrumented parent, Pool(2) with the {method} start method; each child runs "
        "instrument() + 50 steps + shutdown()",
    )
    # spawn/forkserver children import the parent's __main__: it must be a file, not -c
    script = tmp_path / "pool_main.py"
    script.write_text(
        textwrap.dedent(
            f"""
        import multiprocessing as mp, otelgpu
        def work(i):
            otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False, frameworks="none")
            for _ in range(50):
                with otelgpu.step():
                    pass
            otelgpu.shutdown()
            return i
        if __name__ == "__main__":
            otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False, frameworks="none")
            with otelgpu.step():
                with mp.get_context({method!r}).Pool(2) as pool:
                    assert sorted(pool.map(work, range(4))) == [0, 1, 2, 3]
            otelgpu.shutdown()
        """
        )
    )
    proc, wall = _run_python([str(script)])
    _steps_result(p, proc, wall, sum(_spans(tmp_path).values()), 201, "(≥ 201 expected)")


def test_os_exit_in_child(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "processes",
        "os._exit in a child",
        "instrumented parent forks a child that steps and calls os._exit(0) mid-export; "
        "the parent steps on and shuts down",
    )
    proc, wall = _run(
        f"""
        import os, time, otelgpu
        otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r}, gpu=False,
                           frameworks="none", span_schedule_delay_ms=10,
                           step_spans_per_second=0)  # every step span: they are counted
        for _ in range(20):
            with otelgpu.step():
                pass
        pid = os.fork()
        if pid == 0:
            for _ in range(200):
                with otelgpu.step():
                    pass
            os._exit(0)
        for _ in range(200):
            with otelgpu.step():
                time.sleep(0.001)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        t = time.monotonic()
        otelgpu.shutdown()
        print("shutdown", time.monotonic() - t)
        """
    )
    _steps_result(p, proc, wall, sum(_spans(tmp_path).values()), 220, "by the parent")


def test_instrument_twice(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "processes",
        "instrument() twice",
        "instrument() called twice in a row: one pipeline, no second set of threads",
    )
    proc, _ = _run(
        f"""
        import threading, otelgpu
        a = otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False, frameworks="none")
        n = threading.active_count()
        b = otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False, frameworks="none")
        print(a is b, n, threading.active_count())
        otelgpu.shutdown()
        """
    )
    same, before, after = [*proc.stdout.split(), "?", "?", "?"][:3]
    files = len(list(tmp_path.glob("*.otlp.jsonl")))
    p.result(
        _clean(proc) and same == "True" and before == after and files == 1,
        f"same handle: {same}; threads {before} → {after}; {files} recording file(s)",
    )


def test_shutdown_instrument_three_times(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "processes",
        "shutdown(); instrument() x3",
        "three instrument()/shutdown() cycles on a simulated node, gc.collect() inside "
        "each; an Xid 48 injected in each cycle must be seen in that cycle",
    )
    proc, wall = _run(
        f"""
        import gc, json, time, otelgpu
        from otelgpu import sim
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from fixtures.sim import SMALL_SCENARIO
        gpu = sim.activate(SMALL_SCENARIO, clock="wall")
        seen = []
        for cycle in range(3):
            h = otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                                   sample_interval_ms=50, frameworks="none")
            time.sleep(0.5)
            gc.collect()
            gpu.inject("xid", gpu=1, code=48)
            deadline = time.monotonic() + 5
            found = 0
            while time.monotonic() < deadline and not found:
                time.sleep(0.2)
                found = sum(n for (kind, _), n in h.runtime.health_counts().items()
                            if kind == "xid")
            seen.append(found)
            otelgpu.shutdown()
        print("SEEN", json.dumps(seen))
        """,
        timeout=90,
    )
    seen = next(
        (json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("SEEN ")),
        None,
    )
    p.result(
        _clean(proc) and seen is not None and all(seen),
        f"Xid 48 seen per cycle: {seen}; exit {proc.returncode} in {wall:.1f} s",
    )


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_signal_during_export(probe: Any, tmp_path: Path, signame: str) -> None:
    p = probe(
        "processes",
        f"{signame} during export",
        f"host exporting OTLP/gRPC (5 s span batches) gets {signame} after 2 s of steps: "
        "exits within 5 s, and the steps recorded before the signal reach the collector",
    )
    receiver = OtlpReceiver().start()
    # every step span kept (no tail sampling): the probe counts them
    settings = otlp_settings(
        receiver.grpc_endpoint, span_schedule_delay_ms=5000, step_spans_per_second=0
    )
    code = f"""
        import otelgpu, signal, time, sys
        # a background pytest may run with SIGINT ignored, which this child would inherit
        signal.signal(signal.SIGINT, signal.default_int_handler)
        otelgpu.instrument(**{settings!r})
        n = 0
        print("READY", flush=True)
        while True:
            with otelgpu.step():
                time.sleep(0.002)
            n += 1
            if n % 50 == 0:
                print("STEPS", n, flush=True)
        """
    proc = subprocess.Popen(
        [PYTHON, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()

    def steps() -> int:
        return max((int(x.split()[1]) for x in list(lines) if x.startswith("STEPS")), default=0)

    try:
        deadline = time.monotonic() + 60  # a loaded machine may take seconds to start it
        while steps() < 300 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        steps_before = steps()
        t0 = time.monotonic()
        proc.send_signal(getattr(signal, signame))
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        exit_s = time.monotonic() - t0
        receiver.wait_for(lambda: len(receiver.spans()) >= steps_before, timeout=2)
        delivered = len(receiver.spans())
    finally:
        receiver.stop()
    err = proc.stderr.read() if proc.stderr else ""
    tb = "Traceback" in err and "KeyboardInterrupt" not in err
    # the host still dies of the signal (143 in a shell), as its supervisor expects
    died_of_it = proc.returncode in (-getattr(signal, signame), 128 + getattr(signal, signame))
    p.result(
        steps_before > 0
        and exit_s <= 5.0
        and delivered >= steps_before
        and not tb
        and (died_of_it or signame == "SIGINT"),
        f"exit {exit_s:.1f} s after the signal (code {proc.returncode}); "
        f"{delivered} of ≥ {steps_before} step spans delivered",
    )


def test_torchrun_ranks(probe: Any, tmp_path: Path) -> None:
    ranks = 4 if SOAK else 2  # 4 ranks on 2 CPU cores take ~40 s of CI time
    p = probe(
        "processes",
        f"torchrun {ranks} ranks (gloo)",
        f"torchrun --nproc-per-node {ranks}: each rank instrument() + 20 steps with an "
        "all_reduce on gloo, then shutdown()",
    )
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import otelgpu, torch, torch.distributed as dist
            dist.init_process_group("gloo")
            otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False)
            t = torch.ones(1000)
            for _ in range({200 if SOAK else 20}):
                with otelgpu.step():
                    dist.all_reduce(t)
            otelgpu.shutdown()
            dist.destroy_process_group()
            """
        )
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=python_env(OMP_NUM_THREADS="1"),
        timeout=300,
    )
    wall = time.monotonic() - t0
    files = list(tmp_path.glob("*.otlp.jsonl"))
    steps = sum(_spans(tmp_path).values())
    want = ranks * (200 if SOAK else 20)
    p.result(
        _clean(proc) and len(files) == ranks and steps >= want,
        f"exit {proc.returncode} in {wall:.1f} s; {len(files)} recordings, {steps} step spans "
        f"(≥ {want} expected)",
        stderr_tail=proc.stderr[-2000:],
    )


def test_torchrun_agent_sigterm(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "processes",
        "SIGTERM to torchrun's agent",
        "torchrun (1 rank) stepping with 60 s span batches gets SIGTERM after 200 steps; the "
        "elastic agent forwards it to the rank: all ends within 5 s and the rank's steps are "
        "flushed to its recording",
    )
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import otelgpu, sys, time
            sys.stderr = open({str(tmp_path / "rank.err")!r}, "w", buffering=1)
            otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                               gpu=False, frameworks="none", span_schedule_delay_ms=60000,
                               step_spans_per_second=0)
            n = 0
            while True:
                with otelgpu.step():
                    time.sleep(0.002)
                n += 1
                if n == 200:
                    print("STEPS200", flush=True)
            """
        )
    )
    agent = subprocess.Popen(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=python_env(OMP_NUM_THREADS="1"),
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(agent.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("STEPS200" in x for x in list(output)) and time.monotonic() < deadline:
        if agent.poll() is not None:
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(30)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
    exit_s = time.monotonic() - t0
    reader.join(5)
    steps = _spans(tmp_path).get("otelgpu.train.step", 0)
    text = "".join(output)
    rank_err = tmp_path / "rank.err"
    rank_tb = not rank_err.exists() or "Traceback" in rank_err.read_text()
    p.result(
        steps >= 200 and exit_s <= 5.0 and not rank_tb,
        f"agent exit {agent.returncode} {exit_s:.1f} s after the signal; {steps} of ≥ 200 "
        f"step spans in the rank's recording",
        stderr_tail=text[-2000:] + (rank_err.read_text()[-2000:] if rank_err.exists() else ""),
    )
