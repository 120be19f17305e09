"""Environment variables read by ``otelgpu.instrument()``.

Each constant is the name of one variable; its docstring says what it sets, its unit
and the accepted values. Precedence for every setting: keyword argument to
``instrument()`` > ``OTELGPU_*`` variable > the standard ``OTEL_*`` variable named in
the docstring (where one applies) > the default. The full table, with defaults, is in
``docs/configuration.md`` and in ``otelgpu._settings.SETTINGS``.
"""

from __future__ import annotations

OTELGPU_DISABLED = "OTELGPU_DISABLED"
"""``true``/``false``: turn otelgpu off entirely (falls back to ``OTEL_SDK_DISABLED``)."""

OTELGPU_SERVICE_NAME = "OTELGPU_SERVICE_NAME"
"""The ``service.name`` resource attribute (falls back to ``OTEL_SERVICE_NAME``)."""

OTELGPU_RESOURCE_ATTRIBUTES = "OTELGPU_RESOURCE_ATTRIBUTES"
"""Extra resource attributes, ``key=value,key2=value2`` (merged over OTEL_RESOURCE_ATTRIBUTES)."""

OTELGPU_EXPORTERS = "OTELGPU_EXPORTERS"
"""Comma-separated exporters: ``otlp``, ``console``, ``prometheus``, ``recording``, ``none``.

Default: ``otlp`` when an OTLP endpoint is configured (``OTELGPU_OTLP_ENDPOINT`` or any
``OTEL_EXPORTER_OTLP_*ENDPOINT``), else ``recording`` (a local OTLP JSON-lines file)."""

OTELGPU_OTLP_ENDPOINT = "OTELGPU_OTLP_ENDPOINT"
"""OTLP base endpoint, e.g. ``http://collector:4317`` (falls back to OTEL_EXPORTER_OTLP_ENDPOINT;
the signal-specific ``OTEL_EXPORTER_OTLP_{TRACES,METRICS,LOGS}_ENDPOINT`` are honoured by the
exporters when this is unset)."""

OTELGPU_OTLP_PROTOCOL = "OTELGPU_OTLP_PROTOCOL"
"""OTLP transport: ``grpc`` or ``http/protobuf`` (falls back to ``OTEL_EXPORTER_OTLP_PROTOCOL``;
default ``grpc``, as ``opentelemetry-instrument``)."""

OTELGPU_OTLP_HEADERS = "OTELGPU_OTLP_HEADERS"
"""OTLP request headers, ``key=value,...`` (falls back to ``OTEL_EXPORTER_OTLP_HEADERS``)."""

OTELGPU_OTLP_INSECURE = "OTELGPU_OTLP_INSECURE"
"""``true``: plaintext gRPC without TLS (falls back to ``OTEL_EXPORTER_OTLP_INSECURE``)."""

OTELGPU_OTLP_CERTIFICATE = "OTELGPU_OTLP_CERTIFICATE"
"""Path of a PEM CA bundle to verify the collector's TLS certificate (falls back to
``OTEL_EXPORTER_OTLP_CERTIFICATE``)."""

OTELGPU_OTLP_TIMEOUT_MS = "OTELGPU_OTLP_TIMEOUT_MS"
"""Deadline of one OTLP export including retries, milliseconds (default: the exporter's, 10 s,
which also honours ``OTEL_EXPORTER_OTLP_TIMEOUT``)."""

OTELGPU_METRIC_EXPORT_INTERVAL_MS = "OTELGPU_METRIC_EXPORT_INTERVAL_MS"
"""Period of metric export, milliseconds (falls back to ``OTEL_METRIC_EXPORT_INTERVAL``; 60000)."""

OTELGPU_TRACES_SAMPLER = "OTELGPU_TRACES_SAMPLER"
"""Trace sampler name as in ``OTEL_TRACES_SAMPLER`` (``always_on``, ``always_off``,
``traceidratio``, ``parentbased_always_on``, ``parentbased_always_off``,
``parentbased_traceidratio``)."""

OTELGPU_TRACES_SAMPLER_ARG = "OTELGPU_TRACES_SAMPLER_ARG"
"""Sampling ratio in [0, 1] for the ``*traceidratio`` samplers (falls back to
``OTEL_TRACES_SAMPLER_ARG``)."""

OTELGPU_SPAN_QUEUE_SIZE = "OTELGPU_SPAN_QUEUE_SIZE"
"""Bound of the span export queue; spans beyond it are dropped and counted
(falls back to ``OTEL_BSP_MAX_QUEUE_SIZE``; 2048)."""

OTELGPU_SPAN_EXPORT_BATCH_SIZE = "OTELGPU_SPAN_EXPORT_BATCH_SIZE"
"""Spans per export request (falls back to ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``; 512)."""

OTELGPU_SPAN_SCHEDULE_DELAY_MS = "OTELGPU_SPAN_SCHEDULE_DELAY_MS"
"""Delay between span exports, milliseconds (falls back to ``OTEL_BSP_SCHEDULE_DELAY``; 5000)."""

OTELGPU_RECORDING_DIR = "OTELGPU_RECORDING_DIR"
"""Directory of the local recording (OTLP JSON lines), default ``./otelgpu-recordings``."""

OTELGPU_RECORDING_MAX_BYTES = "OTELGPU_RECORDING_MAX_BYTES"
"""Size at which the recording file is rotated, bytes (default 64 MiB)."""

OTELGPU_RECORDING_BACKUPS = "OTELGPU_RECORDING_BACKUPS"
"""Rotated recording files kept besides the current one (default 3)."""

OTELGPU_RECORDING_DIR_MAX_BYTES = "OTELGPU_RECORDING_DIR_MAX_BYTES"
"""Total bytes of recordings kept in one recording directory (default 1 GiB): when a process
starts a recording file or rotates one, the oldest recording files there are removed until
the total fits."""

OTELGPU_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTELGPU_ATTRIBUTE_VALUE_LENGTH_LIMIT"
"""Longest string attribute value, in characters, on spans and metric series (default 4096;
falls back to ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``). Longer values are truncated, so one
huge value (a 10 MB model name) can never make a whole export batch too large to send."""

OTELGPU_PROMETHEUS_HOST = "OTELGPU_PROMETHEUS_HOST"
"""Address of the Prometheus pull endpoint (falls back to ``OTEL_EXPORTER_PROMETHEUS_HOST``;
default ``127.0.0.1``: never all interfaces unless asked)."""

OTELGPU_PROMETHEUS_PORT = "OTELGPU_PROMETHEUS_PORT"
"""Port of the Prometheus pull endpoint (falls back to ``OTEL_EXPORTER_PROMETHEUS_PORT``; 9464)."""

OTELGPU_GPU = "OTELGPU_GPU"
"""``true``/``false``: sample the GPUs (GPU context on spans, ``hw.*`` metrics); default true."""

OTELGPU_DEVICES = "OTELGPU_DEVICES"
"""GPUs to sample: ``all`` or a comma list of indices or UUIDs (default: all visible)."""

OTELGPU_STEP_DEVICES = "OTELGPU_STEP_DEVICES"
"""GPUs whose context (utilization, memory, energy, throttling, XIDs) training step spans carry:
``auto`` (default: the CUDA devices the process uses -- those holding its tensors, else torch's
current device; none while torch has not initialised CUDA, e.g. a CPU-only run), ``all`` (every
sampled GPU), ``none``, or a comma list of CUDA indices or GPU UUIDs."""

OTELGPU_PEAK_FLOPS = "OTELGPU_PEAK_FLOPS"
"""Peak FLOP/s of one GPU, the denominator of ``otelgpu.train.mfu`` (a number > 0, e.g.
``989e12``). Default: the documented table of ``otelgpu.gpu_truth.peaks`` for the GPU's model
and ``OTELGPU_MFU_DTYPE``; set it for a GPU the table lacks or a different clock."""

OTELGPU_MFU_DTYPE = "OTELGPU_MFU_DTYPE"
"""Dtype column of the peak FLOP/s table MFU divides by: ``bf16`` (default), ``fp16``, ``fp8``,
``tf32`` or ``fp32``."""

OTELGPU_SAMPLE_INTERVAL_MS = "OTELGPU_SAMPLE_INTERVAL_MS"
"""GPU sampling period, milliseconds (default 100)."""

OTELGPU_SAMPLER_HISTORY_S = "OTELGPU_SAMPLER_HISTORY_S"
"""How far back the sampler's ring buffers reach, seconds (default 600)."""

OTELGPU_GPU_STARTUP_WAIT_MS = "OTELGPU_GPU_STARTUP_WAIT_MS"
"""How long ``instrument()`` waits for GPU discovery, milliseconds (default 500); discovery
runs off the caller's thread and GPU metrics appear when it finishes."""

OTELGPU_SKETCH_RELATIVE_ACCURACY = "OTELGPU_SKETCH_RELATIVE_ACCURACY"
"""Relative accuracy of the quantile sketches, in (0, 0.5) (default 0.01)."""

OTELGPU_QUANTILES = "OTELGPU_QUANTILES"
"""Quantiles exported as gauges next to each histogram, comma list in (0, 1) (default
``0.5,0.95,0.99``)."""

OTELGPU_MAX_SERIES = "OTELGPU_MAX_SERIES"
"""Attribute sets per sketch metric before new ones fold into an overflow series (default 1000)."""

OTELGPU_ATTACH = "OTELGPU_ATTACH"
"""``auto``: use tracer/meter providers the application already set globally;
``never``: always build otelgpu's own (default ``auto``)."""

OTELGPU_FRAMEWORKS = "OTELGPU_FRAMEWORKS"
"""Framework instrumentors ``instrument()`` turns on when installed: comma list of ``torch``,
``vllm``, or ``none`` (default ``torch``; vLLM is usually reached through its stat-logger
plugin). A missing framework is skipped, never an error."""

OTELGPU_LIVE = "OTELGPU_LIVE"
"""``true``/``false``: serve read-only snapshots for ``otelgpu top`` on a local Unix socket
(``<live dir>/<pid>.sock``, mode 0600 in a 0700 directory owned by the user); default false."""

OTELGPU_LIVE_DIR = "OTELGPU_LIVE_DIR"
"""Directory of the live-view sockets (default ``$XDG_RUNTIME_DIR/otelgpu``, else
``/tmp/otelgpu-<uid>``); created 0700, refused when another user owns it or it is
readable by others."""

OTELGPU_SIM = "OTELGPU_SIM"
"""Scenario of the simulated GPU to activate (read by ``otelgpu.sim.activate_from_env``)."""

OTELGPU_NO_EXTENSIONS = "OTELGPU_NO_EXTENSIONS"
"""Force the pure-Python twins of the native core: at build time (``setup.py`` skips the
Cython extensions) and at import time (``otelgpu._impl``). On unless unset, empty, ``0``,
``false``, ``no`` or ``off`` (one parser for both: ``otelgpu._flags.env_flag``)."""

OTELGPU_DEBUG = "OTELGPU_DEBUG"
"""Build time only: compile the native core with ``-O0 -g`` instead of ``-O3`` (same rule
as ``OTELGPU_NO_EXTENSIONS``)."""

OTELGPU_SIM_CLOCK = "OTELGPU_SIM_CLOCK"
"""With ``OTELGPU_SIM``: ``wall`` (default) or ``virtual`` (the simulator's clock)."""

OTELGPU_SIM_CONFIG = "OTELGPU_SIM_CONFIG"
"""Set by ``otelgpu sim run``: the normalized scenario file the simulated libnvidia-ml reads
at ``nvmlInit`` (not meant to be set by hand)."""

OTELGPU_NVML_LIBRARY = "OTELGPU_NVML_LIBRARY"
"""Path of the NVML library the sampler loads (default: ``libnvidia-ml.so.1`` by soname;
the simulator sets it to its own library)."""

# --- diagnosis (otelgpu.diagnosis; torch keywords: diagnosis, exchange_every,
# straggler_threshold, verdict_log, baseline)

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

OTELGPU_BASELINE = "OTELGPU_BASELINE"
"""Path of a baseline file (``otelgpu baseline learn --recording ...``; format in
``docs/baseline.md``). When set, the drift detectors (training step time; serving TTFT
and request duration) compare each window with the file's recorded distributions instead
of the run's own start. A file that cannot be read or holds no recorded distribution fails
``instrument()``. Keyword: ``baseline``."""

# --- export path (otelgpu.otel)

OTELGPU_TRACES_EXPORTER = "OTELGPU_TRACES_EXPORTER"
"""``none``: otelgpu exports no spans at all, the local recording included (falls back to
``OTEL_TRACES_EXPORTER``; any other value leaves spans to ``OTELGPU_EXPORTERS``)."""

OTELGPU_METRICS_EXPORTER = "OTELGPU_METRICS_EXPORTER"
"""``none``: otelgpu exports no metrics at all, the local recording and the Prometheus pull
endpoint included (falls back to ``OTEL_METRICS_EXPORTER``)."""

OTELGPU_SHUTDOWN_TIMEOUT_MS = "OTELGPU_SHUTDOWN_TIMEOUT_MS"
"""Milliseconds ``shutdown()`` (and the flush at interpreter exit) may take, 0 to 600000;
default 3000. Telemetry not delivered by then is counted in ``otelgpu.internal.dropped``
(reason ``shutdown_timeout``) and reported in one warning line."""

OTELGPU_FLUSH_ON_SIGTERM = "OTELGPU_FLUSH_ON_SIGTERM"
"""``true`` (default): when SIGTERM still has its default disposition, ``instrument()`` (on
the main thread) installs a handler that flushes within ``OTELGPU_SHUTDOWN_TIMEOUT_MS``, then
restores the default and re-raises SIGTERM (the process still dies of it, status 143). A
handler the application set is never replaced. ``false``: leave SIGTERM alone."""

OTELGPU_GC_FREEZE = "OTELGPU_GC_FREEZE"
"""``true`` (default): once ``instrument()`` has run its one full garbage collection (start-up
made tens of thousands of long-lived objects), it calls ``gc.freeze()``: the objects that
exist then move to the interpreter's permanent generation, so a later full collection scans
only newer objects (~0.1 ms instead of 6-16 ms with the GIL held, or far more in a process
with torch). Frozen objects are still freed by reference counting; only reference cycles
among them that become garbage later are never collected. ``false``: leave the collector
alone (an application that manages ``gc.freeze()`` itself, e.g. before forking workers)."""

OTELGPU_PROMETHEUS_RANK_OFFSET = "OTELGPU_PROMETHEUS_RANK_OFFSET"
"""``true`` (default): the Prometheus pull endpoint listens on ``prometheus_port +
LOCAL_RANK`` so the ranks of one node never clash (rank 0 on 9464, rank 1 on 9465, ...).
``false``: every rank asks for ``prometheus_port`` itself."""

OTELGPU_STEP_SPANS_PER_SECOND = "OTELGPU_STEP_SPANS_PER_SECOND"
"""Most ordinary ``otelgpu.train.step`` spans exported per second (default 100; ``0``: all).
Failed steps, slow steps (over twice the running mean) and steps with a GPU health event
or flag are always exported (also when the sampler publishes the event after the step was
decided: sampled-out steps are held about two sampling intervals for it); above the budget
1 in N of the rest are, evenly spaced.
Metrics are exact regardless; sampled-out spans count in ``otelgpu.internal.dropped``
(reason ``tail_sampled``)."""
