"""Forked children: no export thread inherited, no deadlock on locks held by another thread."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from fixtures.otel import PYTHON, python_env

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


# ------------------------------------------------------------------ fork


def test_pipeline_forked_child_inherits_no_export_thread(tmp_path: Path) -> None:
    """The SDK restarts its periodic metric reader in a forked child; otelgpu's does not:
    a DataLoader worker runs none of the parent's collection (GPU callbacks included)."""
    code = f"""
        import os, sys, threading, time
        import otelgpu
        h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, metric_export_interval_ms=50)
        assert h.runtime.sampler is not None  # the simulated GPUs are sampled
        before = sorted(t.name for t in threading.enumerate())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            time.sleep(0.3)  # several export intervals
            names = sorted(t.name for t in threading.enumerate())
            os.write(w, repr(names).encode())
            os._exit(0)
        os.close(w)
        child = os.read(r, 4096).decode()
        os.waitpid(pid, 0)
        h.shutdown()
        print(before)
        print(child)
    """
    env = python_env(OTELGPU_SIM="healthy-8xh100")
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parent, child = proc.stdout.strip().splitlines()[-2:]
    assert "OtelPeriodicExportingMetricReader" in parent
    assert "otelgpu-sampler" in parent
    assert child == "['MainThread']"


def test_pipeline_fork_while_another_thread_holds_telemetry_locks(tmp_path: Path) -> None:
    """The after-fork handler used to acquire the sketch and stats locks: a fork while
    another thread held one (the metric export reading the sketches, a hot path counting
    an error) hung the child inside fork() -- a DataLoader worker that never starts. And
    a child calling instrument() hung on the API lock held by a parent thread."""
    code = f"""
        import os, signal, sys, threading, time
        import otelgpu
        from otelgpu import _api as api, _runtime
        h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False)
        rt = _runtime.current()
        from otelgpu.metrics.spec import Area, Kind, MetricSpec
        hist = rt.instrument(MetricSpec("review.hist", Kind.SKETCH, "s", "", Area.RUNTIME))
        hist.record(1.0, {{"a": "b"}})
        held, release = threading.Event(), threading.Event()

        def holder():
            with api._lock, rt.sketches._lock, hist._lock, rt.stats._lock, rt._lock:
                held.set()
                release.wait()

        t = threading.Thread(target=holder)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            # The child got here: fork() returned. It records nothing and exports nothing.
            assert _runtime.current() is None and hist.series() == []
            rt.close()  # the parent's handle used in the child: a no-op, not a hang
            mine = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False)
            assert mine.runtime is not None and mine.runtime is _runtime.current()
            mine.shutdown()
            os._exit(0)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        release.set()
        t.join()
        h.shutdown()
        print("child status", status)
    """
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "child status 0", proc.stdout + proc.stderr
