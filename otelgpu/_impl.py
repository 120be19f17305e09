"""The one switch between the native (Cython/C) core and its pure-Python twins.

Every native module has a pure-Python twin with the same API. Which one is used is
decided once, here, at import time:

* ``OTELGPU_NO_EXTENSIONS=1`` (any value but empty, ``0``, ``false``, ``no``, ``off``:
  ``otelgpu._flags.env_flag``, the parser ``setup.py`` uses too) forces the pure-Python
  twins;
* otherwise each native module is imported, and a failed import falls back to the
  twin -- never silently: the failure is logged once at WARNING and
  ``otelgpu.NATIVE`` becomes ``False``. The test suite has a guard test that fails
  when a native module did not load although extensions were not disabled.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

from otelgpu import environment_variables
from otelgpu._flags import env_flag

_logger = logging.getLogger(__name__)


NO_EXTENSIONS: bool = (
    env_flag(environment_variables.OTELGPU_NO_EXTENSIONS) or sys.implementation.name != "cpython"
)
"""True when the pure-Python twins are forced (env var or a non-CPython interpreter)."""

#: Native modules that make up "the native core". ``NATIVE`` is true only if all load.
NATIVE_MODULES: tuple[str, ...] = (
    "otelgpu.sketch._sketch_c",
    "otelgpu.sampler._sampler_c",
    "otelgpu.otel._otlp_c",
)

#: Native twins inside an instrumentation package, loaded when that instrumentation is
#: imported (``import otelgpu`` importing them would import the whole package: ~100 ms
#: more for every process). Not part of ``NATIVE``; :func:`native_status` (``otelgpu
#: doctor``, the suite's guard test) reports them with the core.
INSTRUMENTATION_NATIVE_MODULES: tuple[str, ...] = ("otelgpu.instrumentation.torch._steps_c",)

_loaded: dict[str, ModuleType | None] = {}
_errors: dict[str, str] = {}


def native_module(name: str) -> ModuleType | None:
    """Import the native module ``name``, or return ``None`` to select the twin.

    Thread-safe enough for import time (Python's import lock serialises it).
    """
    if NO_EXTENSIONS:
        return None
    if name in _loaded:
        return _loaded[name]
    try:
        module: ModuleType | None = importlib.import_module(name)
    except ImportError as exc:
        module = None
        _errors[name] = f"{type(exc).__name__}: {exc}"
        _logger.warning(
            "otelgpu: native module %s is unavailable (%s); using the pure-Python twin",
            name,
            exc,
        )
    _loaded[name] = module
    return module


def native_status() -> dict[str, str]:
    """Per native module: ``"native"``, ``"disabled"`` or the import error text."""
    status: dict[str, str] = {}
    for name in (*NATIVE_MODULES, *INSTRUMENTATION_NATIVE_MODULES):
        if NO_EXTENSIONS:
            status[name] = "disabled (OTELGPU_NO_EXTENSIONS)"
        elif native_module(name) is not None:
            status[name] = "native"
        else:
            status[name] = _errors.get(name, "unavailable")
    return status


def native_loaded() -> bool:
    """True when every module of the native core is in use."""
    return not NO_EXTENSIONS and all(native_module(n) is not None for n in NATIVE_MODULES)
