"""The native core must load unless disabled: a silent fallback fails the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

import otelgpu
from otelgpu import _impl


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="this run forces the pure-Python twins")
def test_native_core_loaded() -> None:
    status = _impl.native_status()
    assert all(v == "native" for v in status.values()), status
    assert otelgpu.NATIVE is True


@pytest.mark.skipif(not _impl.NO_EXTENSIONS, reason="this run uses the native core")
def test_pure_python_forced() -> None:
    assert otelgpu.NATIVE is False
    from otelgpu.sketch import QuantileSketch

    assert QuantileSketch.__module__ == "otelgpu.sketch._sketch_py"


def test_env_var_forces_pure_python_in_a_fresh_interpreter() -> None:
    code = "import otelgpu, otelgpu.sketch as s; print(otelgpu.NATIVE, s.QuantileSketch.__module__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "OTELGPU_NO_EXTENSIONS": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["False", "otelgpu.sketch._sketch_py"]
