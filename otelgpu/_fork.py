"""Fork hooks that do not keep their object alive.

``os.register_at_fork`` holds its callables for the life of the process; an object
registering its own bound method there could never be collected. :func:`after_fork_in_child`
registers a weak reference instead: once the object is gone, the hook does nothing.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

__all__ = ["after_fork_in_child"]


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Calls the bound ``method`` in every forked child while its object lives.

    Runs inside ``fork()``: ``method`` must not wait for a lock another thread of the
    parent may have held. No-op where the platform has no ``os.register_at_fork``.
    """
    if not hasattr(os, "register_at_fork"):
        return
    weak = weakref.WeakMethod(method)

    def _after_in_child() -> None:
        live = weak()
        if live is not None:
            live()

    os.register_at_fork(after_in_child=_after_in_child)
