"""Environment variables of the diagnosis package (read once, at ``instrument()``).

Keyword arguments of ``TorchInstrumentor().instrument(...)`` (and ``otelgpu.instrument``'s
framework keywords) take precedence. Invalid values fail fast with
:class:`otelgpu.errors.ConfigurationError` naming the variable and the accepted values.
"""

from __future__ import annotations

OTELGPU_DIAGNOSIS = "OTELGPU_DIAGNOSIS"
"""``true``/``false`` (default ``true``): step phases (forward/backward hooks on the
outermost modules and ``torch.autograd.backward``), drift and creep detectors, the rank
exchange and the end-of-run verdict. Keyword: ``diagnosis``."""

OTELGPU_DIAGNOSIS_EXCHANGE_EVERY = "OTELGPU_DIAGNOSIS_EXCHANGE_EVERY"
"""Integer >= 0 (default 50): every this many steps the ranks of a ``torch.distributed`` job
exchange their phase summaries (over the job's store, on a background thread) to find
stragglers; ``0`` turns the exchange off (the Prometheus rules in
``docs/alerts/otelgpu-diagnosis-rules.yml`` then give the fleet view). Keyword:
``exchange_every``."""

OTELGPU_DIAGNOSIS_STRAGGLER_THRESHOLD = "OTELGPU_DIAGNOSIS_STRAGGLER_THRESHOLD"
"""Number > 0 (default 0.10): a rank whose time beyond the other ranks' is at least this
fraction of the median step, in two exchange windows in a row, is reported as a straggler.
Keyword: ``straggler_threshold``."""

OTELGPU_DIAGNOSIS_VERDICT = "OTELGPU_DIAGNOSIS_VERDICT"
"""``true``/``false`` (default ``true``): log the end-of-run verdict (``otelgpu.diagnosis``
logger, INFO) at shutdown. The verdict span is written to the recording either way.
Keyword: ``verdict_log``."""
