"""The live view: the owner-only snapshot socket, ``otelgpu top``, ``otelgpu run --live``
as plain lines (not a TTY) and as a redrawn dashboard in a real terminal (tmux)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.otel import python_env, steps_then_request
from report_support import ARTIFACTS, HERE

import otelgpu
from otelgpu.report.live import protocol

WORKLOAD = str(HERE / "live_workload.py")
pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def test_live_directory_must_be_private(tmp_path: Path) -> None:
    d = protocol.ensure_private_dir(tmp_path / "live")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PermissionError, match="accessible by other users"):
        protocol.ensure_private_dir(shared)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match="not a directory"):
        protocol.ensure_private_dir(tmp_path / "file")


def test_live_socket_is_owner_only_and_serves_snapshots(tmp_path: Path) -> None:
    live_dir = tmp_path / "live"
    handle = otelgpu.instrument(
        live=True, live_dir=str(live_dir), exporters="none", gpu=False, frameworks="none"
    )
    try:
        (sock,) = protocol.discover(live_dir)
        assert sock.name == f"{os.getpid()}.sock"
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert stat.S_IMODE(live_dir.stat().st_mode) == 0o700
        steps_then_request(5, 0.01, samples=8)
        handle.force_flush()  # 10 ms steps finish on the deferred thread, within 50 ms
        doc = protocol.fetch(sock)
        assert doc["protocol"] == "otelgpu.live/1" and doc["pid"] == os.getpid()
        assert doc["train"]["steps"] == 5
        assert 0.009 < doc["train"]["step_time_s"]["p50"] < 0.05
        assert doc["train"]["recent"]["steps"] == 5
        assert doc["inference"]["requests"] == 1
        assert doc["gpus"] == []  # gpu=False
    finally:
        handle.shutdown()
    deadline = time.monotonic() + 3
    while protocol.discover(live_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert protocol.discover(live_dir) == []  # removed when the runtime closes


def _live_cmd(seconds: int) -> list[str]:
    return [
        sys.executable, "-m", "otelgpu", "run", "--live", "--interval", "0.5",
        "--sim", "healthy-8xh100", "-e", "OTELGPU_EXPORTERS=none",
        "--", sys.executable, WORKLOAD, str(seconds),
    ]  # fmt: skip


def test_live_run_prints_plain_lines_when_not_a_tty() -> None:
    proc = subprocess.run(
        _live_cmd(3), env=python_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b[" not in out  # no escape sequences in a pipe
    assert "workload done" in out  # the program's own output passes through
    lines = [line for line in out.splitlines() if " steps=" in line]
    assert len(lines) >= 3
    last = lines[-1]
    p50 = float(re.search(r"step_p50=([\d.]+) ms", last).group(1))  # type: ignore[union-attr]
    assert 19.0 < p50 < 30.0  # 20 ms steps
    # the scenario's 64.5 GiB less the 0.5 GiB the driver reserves (memory v2, as nvidia-smi shows)
    assert re.search(r"gpu7 util=95 % mem=64\.0/79\.6GiB", last)
    assert re.search(r"gpu7 [^|]*tensor=\d+ %", last)  # GPM tensor activity, sampled on H100
    assert re.search(r"gpu1 [^|]*throttle=[^|]*hw_thermal", last)
    assert not re.search(r"gpu0 [^|]*throttle=", last)
    assert re.search(r"EVENT throttle_start gpu1 ", out)


def test_live_top_attaches_to_a_running_process(tmp_path: Path) -> None:
    live_dir = tmp_path / "live"
    env = python_env(OTELGPU_LIVE="true", OTELGPU_LIVE_DIR=str(live_dir), OTELGPU_EXPORTERS="none")
    child = subprocess.Popen(
        [sys.executable, "-m", "otelgpu", "run", "--sim", "healthy-8xh100", "--",
         sys.executable, WORKLOAD, "30"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not protocol.discover(live_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        top = subprocess.run(
            [sys.executable, "-m", "otelgpu", "top", "--dir", str(live_dir), "--plain",
             "--count", "2", "--interval", "0.5"],
            env=python_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        # long enough for a slow machine's start-ups; stopped once `top` has seen it
        child.terminate()
        child.wait(timeout=60)
    assert top.returncode == 0, top.stderr
    lines = [line for line in top.stdout.splitlines() if " steps=" in line]
    assert len(lines) == 2, top.stdout
    assert f"pid={child.pid}" in lines[-1]
    assert "requests=" in lines[-1] and "gpu0 util=95 %" in lines[-1]


# --------------------------------------------------------------------------- tmux
def _tmux(server: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", server, *args], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _dashboard(screen: str) -> list[str]:
    lines = screen.splitlines()
    tops = [
        i for i, line in enumerate(lines) if line.startswith("╭") and "otelgpu run --live" in line
    ]
    assert len(tops) == 1, screen  # drawn once: no stale copy left above or below
    top = tops[0]
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return lines[top : bottom + 1]


def test_live_view_redraws_in_a_real_terminal(tmp_path: Path) -> None:
    assert shutil.which("tmux"), "tmux missing: run tests/report/install.sh"
    server = f"otelgpu-test-{os.getpid()}"
    # the terminal's own size, not the one pytest's environment may carry
    env = {k: v for k, v in python_env().items() if k not in ("COLUMNS", "LINES")}
    script = tmp_path / "run.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if k.isidentifier())
    script.write_text(
        exports
        + "unset COLUMNS LINES\n"
        + " ".join(shlex.quote(a) for a in _live_cmd(8))
        + "; echo EXIT=$?; sleep 60\n"
    )
    _tmux(server, "new-session", "-d", "-x", "150", "-y", "50", "sh", str(script))
    try:
        screens: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(screens) < 4:
            time.sleep(0.8)
            screen = _tmux(server, "capture-pane", "-p")
            # the board's own event panel, not the runtime's log line above it, which is
            # printed the moment the sampler sees the throttle, before the next redraw
            board_has_event = any(
                line.startswith("│ │") and "throttle_start gpu1" in line
                for line in screen.splitlines()
            )
            if board_has_event and "workload step 50" in screen:
                screens.append(screen)
        assert len(screens) == 4, _tmux(server, "capture-pane", "-p")
        colour = _tmux(server, "capture-pane", "-p", "-e")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "live-view.ansi").write_text(colour)
        (ARTIFACTS / "live-view.txt").write_text(screens[-1])
        steps_seen = []
        for screen in screens:
            board = _dashboard(screen)
            width = len(board[0])
            for line in board[1:-1]:
                # the box is intact on every line: no leftovers of an earlier frame
                assert line.startswith("│") and line.rstrip().endswith("│"), board
                assert len(line.rstrip()) == width, board
            text = "\n".join(board)
            assert text.count("GPU health events") == 1
            gpu_rows = [line for line in board if re.match(r"│ │\s+\d\s+H100 80GB HBM3", line)]
            assert len(gpu_rows) == 8, text
            assert all("95 %" in row and "64.0/79.6" in row for row in gpu_rows)
            assert "hw_thermal" in gpu_rows[1] and "hw_thermal" not in gpu_rows[0]
            p50 = float(re.search(r"step time\s+p50 ([\d.]+) ms", text).group(1))  # type: ignore[union-attr]
            assert 19.0 < p50 < 30.0
            steps_seen.append(int(re.search(r"steps\s+([\d,]+)", text).group(1).replace(",", "")))  # type: ignore[union-attr]
            assert "throttle_start gpu1" in text
        assert steps_seen == sorted(steps_seen) and steps_seen[-1] > steps_seen[0]  # it redraws
        # the program's output scrolls above the dashboard, the dashboard stays below it
        last = screens[-1].splitlines()
        board_top = next(i for i, line in enumerate(last) if line.startswith("╭"))
        assert any("workload step" in line for line in last[:board_top])
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=30)


def test_live_view_shows_mfu_tensor_activity_and_phases_when_present() -> None:
    """Fields other instrumentation adds (MFU, GPM tensor activity, diagnosis phases) are
    shown when a snapshot carries them, in both renderings."""
    import io

    from rich.console import Console

    from otelgpu.report.live import view

    doc = {
        "protocol": protocol.PROTOCOL, "pid": 7, "service": "t", "time_unix_nano": 2_000_000_000,
        "started_unix_nano": 1_000_000_000,
        "train": {"steps": 10, "step_time_s": {"p50": 0.02, "p95": 0.03, "p99": 0.04},
                  "recent": {"steps": 10, "steps_per_s": 50.0, "p50_s": 0.02, "p99_s": 0.04,
                             "last_s": 0.02, "phases": {"forward": 0.3, "backward": 0.5,
                                                        "data": 0.2},
                             "mfu": 0.412, "tensor_activity": 0.38}},
        "inference": None,
        "gpus": [{"index": 0, "uuid": "GPU-x", "name": "NVIDIA H100", "utilization": 0.9,
                  "tensor_activity": 0.37, "memory_used_bytes": 2**30, "memory_total_bytes": 2**31,
                  "power_w": 500.0, "temperature_c": 90, "throttle_reasons": [], "lost": True}],
        "events": [],
    }  # fmt: skip
    (line,) = view.plain_lines(doc)
    assert "mfu=41.2%" in line and "tensor=37 %" in line and "LOST" in line
    assert "phases=backward:50%,forward:30%,data:20%" in line
    out = io.StringIO()
    Console(file=out, width=140, force_terminal=False).print(view.render([doc], "t", []))
    text = out.getvalue()
    assert "MFU 41.2 %" in text and "tensor 38 %" in text
    assert "backward" in text and "forward" in text and "LOST" in text


def test_live_never_breaks_the_application(tmp_path: Path) -> None:
    """A live directory that is not private: instrument() warns and runs on without it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    handle = otelgpu.instrument(
        live=True, live_dir=str(shared), exporters="none", gpu=False, frameworks="none"
    )
    try:
        with otelgpu.step(samples=1):
            pass
        assert protocol.discover(shared) == []
    finally:
        handle.shutdown()
    from otelgpu.report.live.provider import SpanRing

    ring = SpanRing()
    ring.on_end(object())  # not a span: ignored, never raised into span end
    assert not ring.steps and not ring.requests
