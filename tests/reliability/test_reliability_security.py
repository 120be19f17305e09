"""Security: what otelgpu exposes on the network and the file system, and what it never
writes down (auth headers), and the simulator's boundaries."""

from __future__ import annotations

import io
import logging
import os
import stat
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import PYTHON, python_env
from fixtures.otlp_receiver import OtlpReceiver
from fixtures.processes import free_port

import otelgpu
from otelgpu.errors import ConfigurationError

pytestmark = [pytest.mark.reliability, pytest.mark.usefixtures("reset_otel_globals")]

SECRET = "S3CR3T-T0KEN-b1946ac9"


def test_pull_endpoint_binds_loopback(probe: Any) -> None:
    p = probe(
        "security",
        "pull endpoint on loopback",
        "instrument(exporters='prometheus') with default settings: the address it listens on",
    )
    port = free_port()
    handle = otelgpu.instrument(exporters="prometheus", prometheus_port=port, gpu=False)
    try:
        pipeline = handle.runtime.pipeline if handle.runtime else None
        address = pipeline.prometheus_address if pipeline else None
        sock = (
            getattr(
                getattr(pipeline.prometheus_server, "socket", None),
                "getsockname",
                lambda: None,
            )()
            if pipeline
            else None
        )
    finally:
        otelgpu.shutdown()
    host = (sock or address or ("?",))[0]
    p.result(host == "127.0.0.1", f"listens on {host}:{port} (default prometheus_host)")


def test_recordings_are_private(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "security",
        "recordings owner-only",
        "a new recording directory and file; a symlink planted at the predictable fallback "
        "directory in the shared temp dir; 30 old 1 MiB recordings and a 16 MiB directory cap",
    )
    rec_dir = tmp_path / "new" / "recordings"
    handle = otelgpu.instrument(exporters="recording", recording_dir=str(rec_dir), gpu=False)
    with otelgpu.step():
        pass
    path = handle.recording_path
    otelgpu.shutdown()
    assert path is not None
    file_mode = stat.S_IMODE(path.stat().st_mode)
    dir_mode = stat.S_IMODE(rec_dir.stat().st_mode)

    # the shared-temp fallback: a symlink planted where a per-user directory would go
    shared = tmp_path / "shared-tmp"
    victim = tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    (shared / f"otelgpu-recordings-{os.getuid()}").symlink_to(victim)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    old_tempdir = tempfile.tempdir
    tempfile.tempdir = str(shared)
    try:
        handle = otelgpu.instrument(
            exporters="recording", recording_dir=str(blocker / "x"), gpu=False
        )
        fallback = handle.recording_path
        otelgpu.shutdown()
    finally:
        tempfile.tempdir = old_tempdir
    assert fallback is not None
    fb_mode = stat.S_IMODE(fallback.parent.stat().st_mode)
    followed = any(victim.iterdir())

    # the directory cap: 30 old recordings of 1 MiB, cap 16 MiB
    capped = tmp_path / "capped"
    capped.mkdir()
    for i in range(30):
        old = capped / f"old-{i:02d}.otlp.jsonl"
        old.write_bytes(b"x" * (1 << 20))
        os.utime(old, (time.time() - 3600 + i, time.time() - 3600 + i))
    otelgpu.instrument(
        exporters="recording",
        recording_dir=str(capped),
        recording_dir_max_bytes=16 << 20,
        recording_max_bytes=4 << 20,
        gpu=False,
    )
    otelgpu.shutdown()
    left = sorted(f.name for f in capped.glob("old-*"))
    total = sum(f.stat().st_size for f in capped.iterdir())
    ok = (
        file_mode == 0o600
        and dir_mode == 0o700
        and fb_mode == 0o700
        and not followed
        and total <= 16 << 20
        and left[0] > "old-00"
    )
    p.result(
        ok,
        f"file {file_mode:o}, new directory {dir_mode:o}, fallback {fallback.parent.name} "
        f"{fb_mode:o}; planted symlink {'FOLLOWED' if followed else 'not followed'}; "
        f"directory cap: {30 - len(left)} oldest removed, {total / 2**20:.1f} MiB left",
    )


def test_headers_never_shown(
    probe: Any,
    otlp_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    from otelgpu.commands import doctor

    p = probe(
        "security",
        "OTLP headers never shown",
        "an auth header in OTEL_EXPORTER_OTLP_HEADERS: searched for in every log record "
        "(DEBUG), otelgpu doctor, the recording, and the error for a malformed header value",
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{SECRET}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    places: dict[str, str] = {}
    with caplog.at_level(logging.DEBUG):
        otelgpu.instrument(
            exporters="otlp,recording",
            recording_dir=str(tmp_path),
            gpu=False,
            span_schedule_delay_ms=50,
        )
        with otelgpu.step():
            pass
        out = io.StringIO()
        doctor.report(out)
        places["doctor"] = out.getvalue()
        otelgpu.shutdown()
    places["logs"] = "\n".join(r.getMessage() for r in caplog.records)
    places["recording"] = "".join(f.read_text() for f in tmp_path.glob("*.otlp.jsonl*"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"{SECRET}-no-equals-sign")
    try:
        otelgpu.instrument(gpu=False)
        places["error"] = "(accepted)"
    except ConfigurationError as exc:
        places["error"] = str(exc)
    finally:
        otelgpu.shutdown()
    delivered = any(
        h.get("authorization") == f"Bearer {SECRET}" for h in otlp_receiver.http_headers
    )
    leaks = [where for where, text in places.items() if SECRET in text]
    p.result(
        delivered and not leaks and "authorization" in places["doctor"],
        f"header delivered to the collector: {delivered}; secret found in: "
        f"{leaks or 'nowhere'} (doctor shows the name only; error: {places['error'][:70]}…)",
    )


def _run(code: str, **env: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=python_env(**env),
        timeout=120,
    )


def test_simulator_only_when_asked(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "security",
        "simulated NVML only when asked",
        "instrument() with default settings and no OTELGPU_SIM: is the simulator's "
        "libnvidia-ml mapped into the process?",
    )
    proc = _run(
        f"""
        import otelgpu
        from otelgpu import sim
        otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r})
        with otelgpu.step():
            pass
        maps = open("/proc/self/maps").read()
        print("MAPPED", "otelgpu/sim/lib" in maps, "ACTIVE", sim.active() is not None)
        otelgpu.shutdown()
        """
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("MAPPED")), "")
    p.result(
        line == "MAPPED False ACTIVE False" and proc.returncode == 0,
        f"{line or proc.stderr[-200:]} (no real driver on this machine: NVML absent, no "
        "simulator substituted)",
    )


def test_everything_simulated_is_marked(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "security",
        "otelgpu.sim=true on simulated data",
        "a run on the simulator: every resource in the recording (spans and metrics) carries "
        "otelgpu.sim=true",
    )
    proc = _run(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from fixtures.sim import SMALL_SCENARIO
        from otelgpu import sim
        import otelgpu
        sim.activate(SMALL_SCENARIO, clock="wall")
        otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r},
                           metric_export_interval_ms=200)
        for _ in range(20):
            with otelgpu.step():
                pass
        import time; time.sleep(0.5)
        otelgpu.shutdown()
        """
    )
    from otelgpu.otel.recording_reader import read_recording

    resources = marked = 0
    for f in tmp_path.glob("*.otlp.jsonl*"):
        for message in read_recording(f):
            for rs in [
                *getattr(message, "resource_spans", ()),
                *getattr(message, "resource_metrics", ()),
            ]:
                resources += 1
                attrs = {kv.key: kv.value for kv in rs.resource.attributes}
                marked += "otelgpu.sim" in attrs and attrs["otelgpu.sim"].bool_value
    p.result(
        proc.returncode == 0 and resources > 0 and marked == resources,
        f"{marked} of {resources} exported resources carry otelgpu.sim=true",
    )
