"""Constructor-argument validation shared by both sketch twins (same errors, same text)."""

from __future__ import annotations

from otelgpu.errors import ConfigurationError
from otelgpu.sketch import _mapping

MAX_BUCKETS_LIMIT = 1 << 24  # 128 MiB of counters per sign in the native twin


def resolve(relative_accuracy: object, scale: object, max_buckets: object) -> tuple[int, int]:
    """``(scale, max_buckets)`` from the constructor arguments, or ``ConfigurationError``.

    ``scale`` wins over ``relative_accuracy`` when given; ``max_buckets=None`` means
    ``_mapping.default_max_buckets(scale)``.
    """
    if scale is None:
        if isinstance(relative_accuracy, bool) or not (
            isinstance(relative_accuracy, (int, float)) and 0.0 < relative_accuracy < 1.0
        ):
            raise ConfigurationError(
                "relative_accuracy", relative_accuracy, "a number in (0, 1), e.g. 0.01"
            )
        scale = _mapping.scale_for_accuracy(float(relative_accuracy))
    elif (
        isinstance(scale, bool)
        or not isinstance(scale, int)
        or not _mapping.MIN_SCALE <= scale <= _mapping.MAX_SCALE
    ):
        raise ConfigurationError(
            "scale", scale, f"an int in {_mapping.MIN_SCALE}..{_mapping.MAX_SCALE}, or None"
        )
    if max_buckets is None:
        max_buckets = _mapping.default_max_buckets(scale)
    elif isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 2:
        raise ConfigurationError("max_buckets", max_buckets, "an int >= 2, or None")
    elif max_buckets > MAX_BUCKETS_LIMIT:
        raise ConfigurationError(
            "max_buckets", max_buckets, f"an int <= {MAX_BUCKETS_LIMIT}, or None"
        )
    return scale, max_buckets
