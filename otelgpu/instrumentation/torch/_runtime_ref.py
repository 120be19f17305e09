"""The otelgpu runtime as the torch instrumentation sees it: looked up lazily.

The instrumentor may be installed before ``instrument()`` runs, and a runtime may be
closed and replaced while torch stays instrumented: :meth:`RuntimeRef.current` returns
the live runtime or None, and our own errors go to it (logged at debug level while
there is none).

Thread-safety: any thread; a lookup racing a replacement returns either runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otelgpu.runtime.api import RuntimeAPI

__all__ = ["RuntimeRef"]

_logger = logging.getLogger("otelgpu.torch")


def _current_runtime() -> RuntimeAPI | None:
    from otelgpu import _runtime

    return _runtime.current()


class RuntimeRef:
    """The current runtime, resolved on demand.

    Args:
        source: a zero-argument callable returning the runtime, or None; default
            ``otelgpu._runtime.current``.
    """

    def __init__(self, source: Callable[[], RuntimeAPI | None] | None = None) -> None:
        self._source = source or _current_runtime
        self._last: RuntimeAPI | None = None

    def current(self) -> RuntimeAPI | None:
        """The runtime (resolved once, again when closed); None while none is live."""
        rt = self._last
        if rt is not None and not rt.closed:
            return rt
        rt = self._source()
        if rt is not None and rt.closed:
            rt = None
        if rt is not None:
            self._last = rt
        return rt

    @property
    def last(self) -> RuntimeAPI | None:
        """The runtime last resolved (possibly closed since), without a lookup."""
        return self._last

    def report(self, where: str, exc: BaseException) -> None:
        """Reports to the runtime last resolved, without a lookup (never raises there)."""
        rt = self._last
        if rt is not None:
            rt.report_error(where, exc)
        else:
            _logger.debug("otelgpu torch: error in %s: %r", where, exc)

    def error(self, where: str, exc: BaseException) -> None:
        """Reports one of our own failures to the current runtime (never raises)."""
        try:
            if self.current() is None:
                _logger.debug("otelgpu torch: error in %s: %r", where, exc)
            else:
                self.report(where, exc)
        except Exception:  # noqa: BLE001 - the last line of defence
            return
