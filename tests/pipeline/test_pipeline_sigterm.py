"""Flush on SIGTERM (``OTELGPU_FLUSH_ON_SIGTERM``): the steps recorded before a polite kill
are flushed, the process still dies of SIGTERM, and only the default disposition is ever
replaced (a user's handler, ``shutdown()``, forked children, other threads)."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from fixtures.otel import PYTHON, python_env


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=timeout,
    )


def _settings(tmp_path: Path, **extra: object) -> str:
    return repr(
        {"exporters": "recording", "recording_dir": str(tmp_path), "gpu": False,
         "frameworks": "none", **extra}
    )  # fmt: skip


def _step_spans(tmp_path: Path) -> int:
    n = 0
    for path in tmp_path.glob("*.otlp.jsonl"):
        for line in path.read_text().splitlines():
            n += line.count('"otelgpu.train.step"') if line.startswith("{") else 0
    return n


def test_sigterm_flushes_then_dies_of_sigterm(tmp_path: Path) -> None:
    proc = _run(
        f"""
        import os, signal, otelgpu
        otelgpu.instrument(**{_settings(tmp_path, span_schedule_delay_ms=60000)})
        for _ in range(40):
            with otelgpu.step():
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        import time; time.sleep(30)
        print("SURVIVED")
        """
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "SURVIVED" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert _step_spans(tmp_path) >= 40


def test_sigterm_off_loses_the_queue_as_before(tmp_path: Path) -> None:
    proc = _run(
        f"""
        import os, signal, otelgpu
        otelgpu.instrument(**{
            _settings(tmp_path, span_schedule_delay_ms=60000, flush_on_sigterm=False)
        })
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        for _ in range(40):
            with otelgpu.step():
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        """
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert _step_spans(tmp_path) == 0


def test_dispositions(tmp_path: Path) -> None:
    proc = _run(
        f"""
        import json, os, signal, threading, otelgpu
        out = {{}}
        dfl = lambda: signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        # instrument()/shutdown() cycles: ours while on, the default after
        for i in range(2):
            otelgpu.instrument(**{_settings(tmp_path)})
            out[f"on_{{i}}"] = not dfl()
            pid = os.fork()
            if pid == 0:  # a forked worker gets the default back
                os._exit(0 if dfl() else 3)
            out[f"child_{{i}}"] = os.waitpid(pid, 0)[1]
            otelgpu.shutdown()
            out[f"off_{{i}}"] = dfl()
        # a user's handler is never replaced, nor restored away by shutdown()
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        otelgpu.instrument(**{_settings(tmp_path)})
        out["user_kept"] = signal.getsignal(signal.SIGTERM) is mine
        otelgpu.shutdown()
        out["user_kept_after"] = signal.getsignal(signal.SIGTERM) is mine
        # an ignored SIGTERM stays ignored
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        otelgpu.instrument(**{_settings(tmp_path)})
        out["ign_kept"] = signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        otelgpu.shutdown()
        # instrument() off the main thread installs nothing (and does not fail)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        t = threading.Thread(target=lambda: otelgpu.instrument(**{_settings(tmp_path)}))
        t.start(); t.join()
        out["thread_dfl"] = dfl()
        otelgpu.shutdown()
        print(json.dumps(out))
        """
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {
        "on_0": True, "child_0": 0, "off_0": True,
        "on_1": True, "child_1": 0, "off_1": True,
        "user_kept": True, "user_kept_after": True, "ign_kept": True, "thread_dfl": True,
    }  # fmt: skip


def test_sigterm_while_main_thread_holds_the_flush_lock_still_dies_promptly(
    tmp_path: Path,
) -> None:
    # The signal lands while the main thread holds the lock shutdown() needs: the handler
    # waits for the flush at most shutdown_timeout_ms + 1 s, then the process dies of it.
    t0 = time.monotonic()
    proc = _run(
        f"""
        import os, signal, time, otelgpu, otelgpu._api as api
        otelgpu.instrument(**{_settings(tmp_path, shutdown_timeout_ms=500)})
        with api._lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        print("SURVIVED")
        """
    )
    wall = time.monotonic() - t0
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "SURVIVED" not in proc.stdout
    assert wall < 20, wall  # the interpreter's start-up plus the 1.5 s bound, never the 30 s
