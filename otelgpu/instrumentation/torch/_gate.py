"""Process-wide on/off switch for every torch hook, and fork safety.

Each wrapper installed by this package reads ``GATE.on`` first and, when it is False,
calls straight through to the original. ``GATE.on`` is False before ``instrument()``,
after ``uninstrument()`` and in a forked child (a DataLoader worker) from the moment of
the fork: the child must record and export nothing of the parent's (it inherits the
parent's patches and state, but none of its threads); the instrumentor then also removes
the inherited patches in the child. Only an explicit ``instrument()`` in the child turns
hooks on again.

Thread-safety: one bool attribute, written rarely, read without a lock.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["GATE", "TLS"]


class _Gate:
    __slots__ = ("forked", "on", "pid")

    def __init__(self) -> None:
        self.on = False
        self.forked = False
        self.pid = os.getpid()

    def enable(self) -> None:
        """Turns the hooks on (an explicit ``instrument()``, also in a forked child)."""
        self.forked = False
        self.on = True

    def disable(self) -> None:
        """Turns the hooks off; wrappers become pass-throughs."""
        self.on = False

    def _after_fork_in_child(self) -> None:
        self.forked = True
        self.on = False


class _Local(threading.local):
    """Per-thread re-entrancy depths."""

    def __init__(self) -> None:
        self.comm_depth = 0
        self.ckpt_depth = 0
        self.data_depth = 0
        self.backward_depth = 0
        self.compiled: Any = None  # the outermost torch.compile'd call in progress
        self.consumer_depth = 0  # inside a fetch-ahead loader's __iter__ (samples counted there)


GATE = _Gate()
TLS = _Local()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GATE._after_fork_in_child)
