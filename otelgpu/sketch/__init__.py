"""Streaming quantile sketch whose buckets are OTLP exponential-histogram buckets.

``QuantileSketch`` is the native (Cython) implementation when it loaded, else the
pure-Python twin ``otelgpu.sketch._sketch_py.QuantileSketch``; both have the same
API and produce bit-identical bucket counts.

* **Buckets:** at scale ``s`` (base ``2 ** (2 ** -s)``) bucket ``i`` covers
  ``(base**i, base**(i+1)]``, indexed exactly as the OpenTelemetry SDK does
  (``_mapping``), so ``to_data_point()`` copies counts into an
  ``ExponentialHistogramDataPoint`` without re-binning. Negative values have their own
  buckets, zeros a counter, NaN/+-inf are counted in ``rejected`` and never raise.
* **Accuracy:** ``relative_accuracy=0.01`` (default) picks scale 6 -- 0.54 % worst-case
  relative error for every quantile (scale 5 would be 1.08 %).
* **Bounded memory, by collapsing the lowest buckets** (not by down-scaling): at most
  ``max_buckets`` consecutive buckets per sign (default 32 binades = 2048 at scale 6,
  i.e. 1 us .. 4295 s at full accuracy). Beyond that the smallest magnitudes merge into
  the lowest kept bucket, so the tail quantiles that latency and step-time users watch
  keep their guaranteed accuracy, whereas down-scaling would double every quantile's
  error; and collapsing is order-independent, so merges stay exact and associative.
  Merging sketches of different scales does down-scale (exactly: OTLP buckets nest).
* **Threads:** ``add`` and every other method may be called from many threads; nothing
  is lost (see each twin's docstring for how).
* **Bytes:** ``to_bytes()`` is a versioned, CRC-checked varint encoding (``_codec``);
  a million lognormal latencies take about 1.1 KiB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otelgpu import _impl
from otelgpu.sketch._sketch_py import QuantileSketch as PyQuantileSketch

if TYPE_CHECKING:
    QuantileSketch = PyQuantileSketch
else:
    _native = _impl.native_module("otelgpu.sketch._sketch_c")
    QuantileSketch = _native.QuantileSketch if _native is not None else PyQuantileSketch

__all__ = ["PyQuantileSketch", "QuantileSketch"]
