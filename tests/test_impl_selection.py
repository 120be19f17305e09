"""The native core must load unless disabled: a silent fallback fails the suite."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("value", ["", "0", "1", "2", "false", "FALSE", "no", "off", "yes", "on"])
def test_build_and_import_read_no_extensions_alike(value: str) -> None:
    """setup.py and otelgpu._impl share one flag parser (otelgpu/_flags.py)."""
    import subprocess
    import sys
    from pathlib import Path

    from otelgpu._flags import env_flag

    root = Path(__file__).resolve().parents[1]
    code = (
        "__file__ = 'setup.py'\n"
        "exec(open('setup.py').read().split('def cython_extensions')[0])\n"
        "print(NO_EXTENSIONS)\n"
    )
    env = {**os.environ, "OTELGPU_NO_EXTENSIONS": value}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    expected = env_flag("OTELGPU_NO_EXTENSIONS", {"OTELGPU_NO_EXTENSIONS": value})
    assert out.stdout.strip() == str(expected)
    assert expected is (value.lower() not in ("", "0", "false", "no", "off"))


def test_import_otelgpu_leaves_the_instrumentation_packages_unloaded() -> None:
    """The native core loads with ``import otelgpu``; the torch step tracker's native twin
    loads with the torch instrumentation (importing it earlier would import that package,
    and OpenTelemetry's instrumentation base, into every process)."""
    code = (
        "import sys, otelgpu\n"
        "print(otelgpu.NATIVE, sorted(m for m in sys.modules if m.startswith("
        "'otelgpu.instrumentation.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == f"{not _impl.NO_EXTENSIONS} []"
