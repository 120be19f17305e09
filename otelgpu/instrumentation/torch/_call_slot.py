"""Wrappers chained in a module's ``_compiled_call_impl`` slot, instead of forward hooks.

``Module.__call__`` calls ``module._compiled_call_impl`` when it is set (where
``module.compile()`` puts its compiled call), else ``module._call_impl``. A forward hook,
even one that does nothing, sends every call of its module down ``_call_impl``'s slow
path (hook dictionaries, a closure per call: ~4 µs more per call of a small model on the
2-core VM, torch 2.13); a callable in the slot costs one Python frame. Hooks are also
module state that ``copy.deepcopy(model)`` and ``torch.save(model)`` have to carry,
while torch leaves the slot out of the pickled and copied state (checked by
:func:`has_slot`, not assumed from the version).

Several of otelgpu's parts wrap the same root module (the step phases' forward timing,
the FLOP counter's shape signature). Each wrapper keeps the callable it wraps in a
one-element *box* (``[next]``; ``None``: ``module._call_impl``), so any of them can leave
the chain -- :func:`unlink` -- without unwrapping the others, in any order. Someone else's
callable put in the slot (``module.compile()``) ends the chain: :func:`linked` is then
False for the wrappers it dropped, and their owner may :func:`link` again on top of it.

Not thread-safe: link and unlink from one thread at a time (install, discovery, undo).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Box", "has_slot", "link", "linked", "unlink"]

SLOT = "_compiled_call_impl"
_NEXT = "_otelgpu_next"

Box = list[Any]
"""``[the callable a wrapper calls next]``; ``[None]``: the module's own ``_call_impl``."""


def has_slot() -> bool:
    """Whether ``Module.__call__`` consults ``_compiled_call_impl`` and pickling drops it."""
    try:
        import torch

        module = torch.nn.Module()
        if SLOT not in vars(torch.nn.Module):
            return False
        setattr(module, SLOT, len)
        return SLOT not in module.__getstate__()  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - a different Module: hooks instead
        return False


def link(module: Any, make: Callable[[Box], Callable[..., Any]]) -> Callable[..., Any]:
    """Puts ``make(box)`` in ``module``'s slot, ``box`` holding what the slot held (the
    wrapper calls ``box[0]``, or ``module._call_impl`` when that is None); returns it."""
    box: Box = [vars(module).get(SLOT)]
    call = make(box)
    setattr(call, _NEXT, box)
    setattr(module, SLOT, call)
    return call


def linked(module: Any, call: Callable[..., Any]) -> bool:
    """Whether ``call`` is still in ``module``'s chain (not dropped by a replacement)."""
    current = vars(module).get(SLOT)
    while current is not None:
        if current is call:
            return True
        box = getattr(current, _NEXT, None)
        if box is None:  # someone else's callable: the chain ends there
            return False
        current = box[0]
    return False


def unlink(module: Any, call: Callable[..., Any]) -> bool:
    """Takes ``call`` out of ``module``'s chain (the slot, or the box of the wrapper in
    front of it, gets what ``call`` wrapped); False if it is no longer in the chain (then
    it stays a pass-through where it is)."""
    box: Box = getattr(call, _NEXT)
    state = vars(module)
    current = state.get(SLOT)
    if current is call:
        if box[0] is None:
            del state[SLOT]  # back to the class's None
        else:
            setattr(module, SLOT, box[0])
        return True
    while current is not None:
        ahead = getattr(current, _NEXT, None)
        if ahead is None:
            return False
        if ahead[0] is call:
            ahead[0] = box[0]
            return True
        current = ahead[0]
    return False
