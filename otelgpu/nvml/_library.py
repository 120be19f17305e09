"""Where the NVML library comes from, and pynvml bound to that same library.

Both sampler twins load the same ``libnvidia-ml.so.1``: the native twin through
``dlopen``/``dlsym`` (``src_ext/sampler/otg_nvml.h``), the pure twin and device
discovery through pynvml. :func:`library_path` is the single rule for which file
that is:

1. an explicit ``nvml_library=`` argument;
2. else ``OTELGPU_NVML_LIBRARY``;
3. else the bare soname ``libnvidia-ml.so.1`` (normal loader search, as pynvml does).

pynvml has no library-path setting (it dlopens the bare soname), so :func:`pynvml_module` pre-seeds
``pynvml.nvmlLib`` with a ``ctypes.CDLL`` of the chosen path before pynvml's first
``nvmlInit``. glibc matches a later ``dlopen("libnvidia-ml.so.1")`` to that object by
its soname, so pynvml and the native twin share one library (and one simulator state).

Thread-safety: every function here may be called from any thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from types import ModuleType
from typing import cast

from otelgpu.errors import ConfigurationError, OtelGpuError

_logger = logging.getLogger(__name__)

ENV_NVML_LIBRARY = "OTELGPU_NVML_LIBRARY"
"""Environment variable: path of the NVML library to load instead of ``libnvidia-ml.so.1``."""

DEFAULT_LIBRARY = "libnvidia-ml.so.1"
"""The soname every NVML client loads (pynvml, go-nvml, torch)."""

_lock = threading.Lock()
_warned_mismatch: set[str] = set()


class NvmlUnavailableError(OtelGpuError, RuntimeError):
    """NVML could not be loaded or initialised (no driver, bad library, init failure).

    Never raised into application code by the sampler: it is caught, logged once and
    reported through ``GpuSampler.error``.
    """


def library_path(explicit: str | os.PathLike[str] | None = None) -> str:
    """Return the NVML library to load (see the module docstring for the order).

    Raises:
        ConfigurationError: an explicit or ``OTELGPU_NVML_LIBRARY`` value names a path
            (contains ``/``) that does not exist.
    """
    if explicit is not None and os.fspath(explicit).strip():
        value, setting = os.fspath(explicit).strip(), "nvml_library"
    else:
        value, setting = os.environ.get(ENV_NVML_LIBRARY, "").strip(), ENV_NVML_LIBRARY
    if not value:
        return DEFAULT_LIBRARY
    if "/" in value and not os.path.exists(value):
        raise ConfigurationError(
            setting, value, "the path of an existing NVML library (libnvidia-ml.so.1)"
        )
    return value


def pynvml_module(library: str) -> ModuleType:
    """Import pynvml bound to ``library`` (not yet initialised).

    Raises:
        NvmlUnavailableError: the library cannot be loaded.
    """
    import pynvml

    with _lock:
        if pynvml.nvmlLib is None:
            if library != DEFAULT_LIBRARY:
                try:
                    pynvml.nvmlLib = ctypes.CDLL(library)
                except OSError as exc:
                    raise NvmlUnavailableError(f"cannot load {library}: {exc}") from exc
        else:
            loaded = str(getattr(pynvml.nvmlLib, "_name", ""))
            if library not in (DEFAULT_LIBRARY, loaded) and library not in _warned_mismatch:
                _warned_mismatch.add(library)
                _logger.warning(
                    "otelgpu: pynvml already uses %s; %s is used only by the native sampler",
                    loaded,
                    library,
                )
    return cast(ModuleType, pynvml)


def pynvml_init(library: str) -> ModuleType:
    """Load (see :func:`pynvml_module`) and ``nvmlInit()`` pynvml; pair with ``nvmlShutdown()``.

    Raises:
        NvmlUnavailableError: loading or ``nvmlInit`` failed.
    """
    pynvml = pynvml_module(library)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailableError(f"nvmlInit failed: {exc}") from exc
    return pynvml
