"""ctypes binding of the simulator's control entry points (``otelgpu_sim_*``).

The library is loaded once per process with ``RTLD_GLOBAL`` so that a later
``dlopen("libnvidia-ml.so.1")`` -- by pynvml or the native sampler -- resolves to the
same object by its soname and therefore shares its state. Thread-safe: the C side
takes its own lock; loading is guarded here.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

LIBRARY_NAME = "libnvidia-ml.so.1"

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class SimLibraryError(RuntimeError):
    """The simulator library is missing, or refused a control call."""


def library_dir() -> Path:
    """Directory holding ``libnvidia-ml.so.1`` (what goes on ``LD_LIBRARY_PATH``)."""
    return Path(__file__).resolve().parent / "lib"


def library_path() -> str:
    """Absolute path of the simulated ``libnvidia-ml.so.1`` (built by ``make ext``)."""
    return str(library_dir() / LIBRARY_NAME)


def _bind(lib: ctypes.CDLL) -> None:
    ll, i, ull, cp = ctypes.c_longlong, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_char_p
    for name, res, args in [
        ("otelgpu_sim_configure", i, [cp]),
        ("otelgpu_sim_unconfigure", i, []),
        ("otelgpu_sim_last_error", cp, []),
        ("otelgpu_sim_now_ns", ll, []),
        ("otelgpu_sim_epoch_ns", ll, []),
        ("otelgpu_sim_set_time_ns", i, [ll]),
        ("otelgpu_sim_advance_ns", i, [ll]),
        ("otelgpu_sim_inject", i, [cp]),
        ("otelgpu_sim_is_virtual", i, []),
        ("otelgpu_sim_gpu_count", i, []),
        ("otelgpu_sim_refcount", i, []),
        ("otelgpu_sim_calls", ull, []),
        ("otelgpu_sim_features", cp, []),
    ]:
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def load() -> ctypes.CDLL:
    """The simulator library, loaded ``RTLD_GLOBAL`` on first use."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not os.path.exists(path):
                raise SimLibraryError(
                    f"the simulated NVML library is not built ({path} is missing); run `make ext`"
                )
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            _bind(lib)
            _lib = lib
        return _lib


def loaded() -> ctypes.CDLL | None:
    """The library if this process loaded it, else ``None`` (never loads it)."""
    return _lib


def check(rc: int, lib: ctypes.CDLL, what: str) -> None:
    """Raise :class:`SimLibraryError` with the C side's message when ``rc`` != 0."""
    if rc != 0:
        msg = lib.otelgpu_sim_last_error()
        text = msg.decode("utf-8", "replace") if msg else "unknown error"
        raise SimLibraryError(f"{what}: {text}")
