"""Flush on SIGTERM: what was recorded before a polite kill reaches the backend.

Schedulers, ``torchrun``'s elastic agent, Kubernetes and systemd stop a process with
SIGTERM. Its default disposition kills the process at once: ``atexit`` never runs, so every
span and metric still queued is lost. ``install()`` puts a handler in its place that runs
the given flush (otelgpu's ``shutdown()``, itself bounded by ``shutdown_timeout_ms``; the
handler waits for it at most a given bound, so a flush stuck behind a lock the interrupted
main thread holds cannot keep the process alive), then restores the default disposition
and re-raises SIGTERM, so the process still dies *of* SIGTERM (exit status 143 in a shell,
``-15`` to ``subprocess``) as its supervisor expects.

Only the default disposition is ever replaced: a handler the application (or a framework)
installed is left alone, and so is an ignored SIGTERM. ``install()`` works only on the main
thread (Python's rule for signal handlers); elsewhere it does nothing.

Thread-safety: ``install``/``uninstall`` are called under ``otelgpu._api``'s lock; the
handler runs on the main thread between bytecodes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

_logger = logging.getLogger("otelgpu")

_flush: Callable[[], None] | None = None
#: How long the handler waits for the flush (set by ``install``).
_bound_s = 4.0


def _flush_quietly(flush: Callable[[], None]) -> None:
    try:
        flush()
    except Exception as exc:  # noqa: BLE001 - the process is being stopped either way
        _logger.warning("otelgpu: error flushing on SIGTERM: %r", exc)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    flush, bound_s = _flush, _bound_s
    _restore_default()
    try:
        if flush is not None:
            # On its own thread, waited for at most bound_s: the signal may have arrived
            # while this (main) thread held a lock the flush needs (inside a span's end,
            # inside instrument()); the process must still die promptly then.
            worker = threading.Thread(
                target=_flush_quietly, args=(flush,), name="otelgpu-sigterm-flush", daemon=True
            )
            worker.start()
            worker.join(bound_s)
    finally:
        # The default disposition again: the process ends "killed by SIGTERM".
        os.kill(os.getpid(), signal.SIGTERM)


def _restore_default() -> None:
    global _flush
    _flush = None
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread / interpreter shutting down
        pass


def install(flush: Callable[[], None], bound_s: float) -> bool:
    """Run ``flush`` on SIGTERM (waiting at most ``bound_s`` seconds for it), then die of
    SIGTERM; True when the handler is in place.

    Does nothing (False) off the main thread or when SIGTERM's disposition is not the
    default (someone else owns it).
    """
    global _flush, _bound_s
    _bound_s = bound_s
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            _flush = flush
            return True
        if current is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError) as exc:
        _logger.debug("otelgpu: SIGTERM flush not installed: %r", exc)
        return False
    _flush = flush
    return True


def uninstall() -> None:
    """Give SIGTERM back its default disposition if our handler is still the one in place
    (a handler installed after ours is left alone)."""
    _restore_default()


def installed() -> bool:
    """Whether our handler is SIGTERM's disposition now."""
    try:
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    except (ValueError, OSError):
        return False


def after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has nothing of ours to flush: it gets the
    default disposition back, as it would have had without otelgpu."""
    _restore_default()
