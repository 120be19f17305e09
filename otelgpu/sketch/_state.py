"""The plain-data snapshot of a sketch that both twins export and import.

Serialization (``_codec``) and OTLP conversion (``_otlp``) work on this snapshot, so
they are written once and produce identical results for both twins.
"""

from __future__ import annotations

from typing import NamedTuple


class SketchState(NamedTuple):
    """Everything a sketch holds. Bucket lists are dense, from ``*_offset`` upwards.

    ``min``/``max`` are ``+inf``/``-inf`` when the sketch is empty. The first and last
    entries of a non-empty bucket list are non-zero.
    """

    scale: int
    max_buckets: int
    sum: float
    min: float
    max: float
    zero_count: int
    rejected: int
    positive_offset: int
    positive: list[int]
    negative_offset: int
    negative: list[int]

    @property
    def value_count(self) -> int:
        """Number of stored values (zero, positive and negative buckets)."""
        return self.zero_count + sum(self.positive) + sum(self.negative)
