"""The local recording survives its file or directory vanishing, and rotates with backups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otelgpu.otel.recording import RecordingFile

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


# ------------------------------------------------------------------ recording


def _lines(path: Path) -> list[str]:
    return [json.loads(x)["n"] for x in path.read_text().splitlines()] if path.exists() else []


def test_pipeline_recording_survives_its_file_being_removed(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=2)
    rec.write_line(json.dumps({"n": "a", "pad": "x" * 3000}))
    path.unlink()  # a tmp cleaner, logrotate or a user removed the file
    rec.write_line(json.dumps({"n": "b", "pad": "x" * 3000}))  # rotates: used to raise
    rec.write_line(json.dumps({"n": "c"}))  # ... and every later write was lost
    rec.close()
    assert _lines(path) == ["b", "c"]
    assert rec.rotations == 1 and rec.lines_written == 3


def test_pipeline_recording_retries_after_its_directory_vanished(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    path = directory / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=1)
    rec.write_line(json.dumps({"n": "a", "pad": "x" * 3000}))
    path.unlink()
    directory.rmdir()
    rec.write_line(json.dumps({"n": "b", "pad": "x" * 3000}))  # recreates the directory
    rec.write_line(json.dumps({"n": "c"}))
    rec.close()
    rec.write_line(json.dumps({"n": "after close"}))  # closed on purpose: ignored
    assert _lines(path) == ["b", "c"]


def test_pipeline_recording_rotation_keeps_backups(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=2)
    for n in "abcd":
        rec.write_line(json.dumps({"n": n, "pad": "x" * 3000}))
    rec.close()
    assert _lines(path) == ["d"]
    assert _lines(path.with_name("rec.jsonl.1")) == ["c"]
    assert _lines(path.with_name("rec.jsonl.2")) == ["b"]
    assert not path.with_name("rec.jsonl.3").exists()
