"""Tolerant reading of vLLM's stats objects, whose shape vLLM calls unstable.

vLLM's ``SchedulerStats``, ``IterationStats`` and ``FinishedRequestStats`` change between
releases (fields are added, renamed, moved). The recorder never touches them directly;
it reads each field through ``FieldReader``:

* a field that exists and has a usable value is returned (``bool`` never counts as a number);
* a field that is missing, ``None`` where a number is expected, or of the wrong type yields the
  caller's default, and **one** WARNING is logged per ``(class, field)`` for the life of the
  reader -- so a vLLM upgrade that drops a field says so once, never once per step;
* fields we do not know are ignored; the first object of each class is compared against the
  fields we read and the extra ones are logged once at DEBUG (useful when porting to a new
  vLLM release).

Cost: one ``getattr`` plus an ``isinstance`` per field (~60 ns). Thread-safety: the
warn-once sets are only ever added to; a duplicate warning under a race is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

_logger = logging.getLogger("otelgpu.instrumentation.vllm")

_MISSING = object()


class FieldReader:
    """Reads numbers, sequences and objects from duck-typed stats, warning once per mismatch.

    Args:
        known_fields: per class name, the fields otelgpu reads (used only for the one DEBUG
            line listing the fields vLLM has and we ignore).
    """

    __slots__ = ("_known", "_seen_classes", "_warned", "mismatches")

    def __init__(self, known_fields: dict[str, frozenset[str]] | None = None) -> None:
        self._known = dict(known_fields or {})
        self._seen_classes: set[str] = set()
        self._warned: set[tuple[str, str]] = set()
        self.mismatches = 0
        """How many distinct ``(class, field)`` mismatches were reported (test hook)."""

    def inspect(self, obj: object) -> None:
        """Logs once per class, at DEBUG, the fields vLLM has that we do not read."""
        cls = type(obj).__name__
        if cls in self._seen_classes:
            return
        self._seen_classes.add(cls)
        known = self._known.get(cls)
        if known is None:
            return
        names: Iterable[str]
        try:
            names = vars(obj).keys()
        except TypeError:  # __slots__ objects: nothing to compare, nothing to say
            return
        extra = sorted(n for n in names if n not in known and not n.startswith("_"))
        if extra:
            _logger.debug("otelgpu: ignoring vLLM %s fields %s", cls, ", ".join(extra))

    def _warn(self, obj: object, name: str, problem: str) -> None:
        key = (type(obj).__name__, name)
        if key in self._warned:
            return
        self._warned.add(key)
        self.mismatches += 1
        _logger.warning(
            "otelgpu: vLLM %s.%s %s; the metrics that need it are skipped "
            "(supported vLLM versions: see docs/vllm.md)",
            key[0],
            name,
            problem,
        )

    def number(self, obj: object, name: str, default: float | None = None) -> float | None:
        """``obj.name`` as a float, or ``default`` (warned once) when absent or not a number."""
        value = self.child(obj, name)
        if value is None:  # missing (warned), or vLLM's "not measured": not a schema change
            return default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        self._warn(obj, name, f"is a {type(value).__name__}, not a number")
        return default

    def integer(self, obj: object, name: str, default: int = 0) -> int:
        """``obj.name`` as an int, or ``default`` (warned once) when absent or not an int."""
        value = self.child(obj, name)
        if value is None:  # missing (warned) or not measured
            return default
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        self._warn(obj, name, f"is a {type(value).__name__}, not an integer")
        return default

    def maybe_integer(self, obj: object, name: str) -> int | None:
        """Like :meth:`integer`, but ``None`` (not a default) when the value is unusable."""
        value = self.child(obj, name)  # None when missing (warned) or not measured
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value is not None:
            self._warn(obj, name, f"is a {type(value).__name__}, not an integer")
        return None

    def sequence(self, obj: object, name: str) -> Sequence[Any]:
        """``obj.name`` as a list/tuple, or ``()`` (warned once) when absent or not a sequence."""
        value = self.child(obj, name)
        if value is None:  # missing (warned) or not measured
            return ()
        if isinstance(value, (list, tuple)):
            return value
        self._warn(obj, name, f"is a {type(value).__name__}, not a list")
        return ()

    def child(self, obj: object, name: str, *, optional: bool = False) -> Any:
        """``obj.name`` (any object) or ``None``; a missing attribute warns unless ``optional``."""
        value = getattr(obj, name, _MISSING)
        if value is _MISSING:
            if not optional:
                self._warn(obj, name, "is missing")
            return None
        return value

    def text(self, obj: object, name: str, default: str) -> str:
        """``str(obj.name)``, or ``default`` (warned once) when absent.

        vLLM's ``FinishReason`` is an ``IntEnum`` whose ``str()`` is the lower-case name
        (``stop``, ``length``, ``abort``, ``error``, ``repetition``).
        """
        value = self.child(obj, name)
        if value is None:  # missing (warned) or not measured
            return default
        return str(value)
