"""Settings of ``otelgpu.instrument()``: one table, one frozen dataclass.

Every setting has a keyword argument (the field name of :class:`Settings`) and an
``OTELGPU_*`` variable; many also fall back to a standard ``OTEL_*`` variable.
Precedence: keyword > ``OTELGPU_*`` > ``OTEL_*`` > default. Values are validated once,
in :func:`resolve`, which raises :class:`otelgpu.errors.ConfigurationError` naming the
setting (the keyword, or the variable the bad value came from) and what is accepted.
Nothing here is on a hot path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otelgpu import environment_variables as ev
from otelgpu._flags import parse_bool
from otelgpu.errors import ConfigurationError
from otelgpu.gpu_truth.peaks import DTYPES as MFU_DTYPES

_log = logging.getLogger("otelgpu")

EXPORTERS = ("otlp", "console", "prometheus", "recording", "none")
PROTOCOLS = ("grpc", "http/protobuf")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
ATTACH = ("auto", "never")
FRAMEWORKS = ("torch", "vllm", "none")
STEP_DEVICES = ("auto", "all", "none")

#: OTLP endpoint variables whose presence means "a collector is configured".
OTLP_ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one ``instrument()`` call (immutable)."""

    disabled: bool = False
    service_name: str | None = None
    resource_attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    exporters: tuple[str, ...] = ("recording",)
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    otlp_headers: Mapping[str, str] | None = None
    otlp_insecure: bool | None = None
    otlp_certificate: str | None = None
    otlp_timeout_ms: int | None = None
    metric_export_interval_ms: int = 60_000
    traces_sampler: str = "parentbased_always_on"
    traces_sampler_arg: float | None = None
    span_queue_size: int = 2048
    span_export_batch_size: int = 512
    span_schedule_delay_ms: int = 5000
    recording_dir: str = "otelgpu-recordings"
    recording_max_bytes: int = 64 * 1024 * 1024
    recording_backups: int = 3
    recording_dir_max_bytes: int = 1024 * 1024 * 1024
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9464
    gpu: bool = True
    devices: tuple[str, ...] | None = None
    step_devices: str | tuple[str, ...] = "auto"
    peak_flops: float | None = None
    mfu_dtype: str = "bf16"
    sample_interval_ms: int = 100
    sampler_history_s: float = 600.0
    gpu_startup_wait_ms: int = 500
    sketch_relative_accuracy: float = 0.01
    quantiles: tuple[float, ...] = (0.5, 0.95, 0.99)
    max_series: int = 1000
    attach: str = "auto"
    frameworks: tuple[str, ...] = ("torch",)
    attribute_value_length_limit: int = 4096
    live: bool = False
    live_dir: str | None = None
    traces_exporter: str = "default"
    metrics_exporter: str = "default"
    shutdown_timeout_ms: int = 3000
    flush_on_sigterm: bool = True
    gc_freeze: bool = True
    prometheus_rank_offset: bool = True
    step_spans_per_second: int = 100


# --------------------------------------------------------------------------- parsers
# Each parser takes a raw value (a string from the environment, or whatever the caller
# passed as a keyword) and returns the typed value or raises ValueError/TypeError.

_bool = parse_bool


def _str(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(raw)
    return raw.strip()


def _int_range(lo: int, hi: int | None = None) -> Callable[[object], int]:
    def parse(raw: object) -> int:
        if isinstance(raw, bool):
            raise TypeError(raw)
        value = int(raw.strip()) if isinstance(raw, str) else raw
        if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ValueError(raw)
        return value

    return parse


def _float_range(
    lo: float, hi: float, *, lo_open: bool, hi_open: bool
) -> Callable[[object], float]:
    def parse(raw: object) -> float:
        if isinstance(raw, bool):
            raise TypeError(raw)
        if isinstance(raw, str):
            value = float(raw.strip())
        elif isinstance(raw, int | float):
            value = float(raw)
        else:
            raise TypeError(raw)
        if not (value > lo if lo_open else value >= lo) or not (
            value < hi if hi_open else value <= hi
        ):
            raise ValueError(raw)
        return value

    return parse


def _choice(choices: tuple[str, ...]) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        value = _str(raw).lower()
        if value not in choices:
            raise ValueError(raw)
        return value

    return parse


def _split(raw: object) -> list[str]:
    if isinstance(raw, str):
        return [p.strip() for p in raw.split(",") if p.strip()]
    if isinstance(raw, list | tuple):
        return [_str(p) for p in raw]
    raise TypeError(raw)


def _names_of(vocabulary: tuple[str, ...]) -> Callable[[object], tuple[str, ...]]:
    """A parser of a comma list of names from ``vocabulary``, deduplicated in order;
    ``none`` (alone) is the empty tuple."""

    def parse(raw: object) -> tuple[str, ...]:
        values = [v.lower() for v in _split(raw)]
        if not values or any(v not in vocabulary for v in values):
            raise ValueError(raw)
        if "none" in values:
            if len(values) > 1:
                raise ValueError(raw)
            return ()
        return tuple(dict.fromkeys(values))

    return parse


_exporters = _names_of(EXPORTERS)
_frameworks = _names_of(FRAMEWORKS)


def _key_values(raw: object) -> dict[str, str]:
    """``k=v,k2=v2`` (values may be percent-encoded, as in OTEL_RESOURCE_ATTRIBUTES)."""
    if isinstance(raw, Mapping):
        return {_str(k): str(v) for k, v in raw.items()}
    from urllib.parse import unquote

    out: dict[str, str] = {}
    for part in _split(raw):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(raw)
        out[unquote(key.strip())] = unquote(value.strip())
    return out


def _signal_exporter(raw: object) -> str:
    """``none`` (the signal is not exported) or ``default`` (the ``exporters`` setting applies).

    Any other exporter name (``otlp``, ``console``...) leaves the signal to ``exporters``:
    these variables are the OpenTelemetry distro's, and only their ``none`` concerns otelgpu.
    """
    values = [v.lower() for v in _split(raw)]
    if not values:
        raise ValueError(raw)
    return "none" if values == ["none"] else "default"


def _devices(raw: object) -> tuple[str, ...] | None:
    values = _split(raw)
    if not values:
        raise ValueError(raw)
    if [v.lower() for v in values] == ["all"]:
        return None
    return tuple(values)


def _step_devices(raw: object) -> str | tuple[str, ...]:
    """``auto``, ``all``, ``none``, or GPU indices/UUIDs (a comma list, or a sequence)."""
    if isinstance(raw, str):
        values = _split(raw)
    elif isinstance(raw, list | tuple):
        values = [str(v).strip() for v in raw if not isinstance(v, bool)]
        if len(values) != len(raw) or not all(values):
            raise ValueError(raw)
    else:
        raise TypeError(raw)
    lowered = [v.lower() for v in values]
    if len(values) == 1 and lowered[0] in STEP_DEVICES:
        return lowered[0]
    if not values or any(v in STEP_DEVICES for v in lowered):
        raise ValueError(raw)
    return tuple(values)


def _quantiles(raw: object) -> tuple[float, ...]:
    parse = _float_range(0.0, 1.0, lo_open=True, hi_open=True)
    values = [parse(v) for v in (_split(raw) if isinstance(raw, str) else list(raw))]  # type: ignore[call-overload]
    if not values:
        raise ValueError(raw)
    return tuple(sorted(set(values)))


def _path(raw: object) -> str:
    return os.fspath(raw) if isinstance(raw, os.PathLike) else _str(raw)


def _pem_file(raw: object) -> str:
    """An existing, readable file: a missing CA bundle fails at instrument(), not at the
    first export (gRPC would raise FileNotFoundError from instrument(), HTTP would fail
    every export)."""
    path = _path(raw)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ValueError(raw)
    return path


#: Upper bounds of the time and size settings. Beyond them a value is a typo or an attack,
#: never a configuration: a 1e23 ms export interval used to overflow the export thread's
#: wait and end it, so nothing was ever exported.
_DAY_MS = 86_400_000
_HOUR_MS = 3_600_000
_MAX_QUEUE = 10_000_000
_TIB = 1 << 40

REDACTED = "<redacted>"


def redact_key_values(raw: object) -> str:
    """``k=<redacted>,...`` for a header value: names are kept, values never shown."""
    if isinstance(raw, Mapping):
        names = [str(k) for k in raw]
    elif isinstance(raw, str):
        # a part without "=" may be a bare token: it is not a name, show nothing of it
        parts = [p for p in raw.split(",") if p.strip()]
        names = [p.partition("=")[0].strip() if "=" in p else "" for p in parts]
    else:
        return REDACTED
    return ",".join(f"{name}={REDACTED}" if name else REDACTED for name in names) or REDACTED


def redact_url(url: str) -> str:
    """``url`` without a password in its user-info part (``http://user:<redacted>@host``)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))


@dataclass(frozen=True)
class Setting:
    """One row of the settings table."""

    name: str
    env: str
    otel_env: str | None
    parse: Callable[[object], Any]
    accepted: str
    doc: str
    #: Values are secrets (auth headers): never echoed in errors, ``doctor`` or logs.
    secret: bool = False


SETTINGS: tuple[Setting, ...] = (
    Setting("disabled", ev.OTELGPU_DISABLED, "OTEL_SDK_DISABLED", _bool, "true or false",
            "Turn otelgpu off: no providers, no threads; step()/request() become no-ops."),
    Setting("service_name", ev.OTELGPU_SERVICE_NAME, "OTEL_SERVICE_NAME", _str,
            "a non-empty string",
            "The service.name resource attribute."),
    Setting("resource_attributes", ev.OTELGPU_RESOURCE_ATTRIBUTES, None, _key_values,
            "a mapping or 'key=value,...'",
            "Extra resource attributes (merged over OTEL_RESOURCE_ATTRIBUTES)."),
    Setting("exporters", ev.OTELGPU_EXPORTERS, None, _exporters,
            "a comma list of " + ", ".join(EXPORTERS),
            "Where telemetry goes (default: otlp with an OTLP endpoint, else recording)."),
    Setting("otlp_endpoint", ev.OTELGPU_OTLP_ENDPOINT, "OTEL_EXPORTER_OTLP_ENDPOINT", _str,
            "a URL such as http://host:4317",
            "OTLP base endpoint (HTTP appends /v1/traces, /v1/metrics, /v1/logs)."),
    Setting("otlp_protocol", ev.OTELGPU_OTLP_PROTOCOL, "OTEL_EXPORTER_OTLP_PROTOCOL",
            _choice(PROTOCOLS), " or ".join(PROTOCOLS), "OTLP transport."),
    Setting("otlp_headers", ev.OTELGPU_OTLP_HEADERS, "OTEL_EXPORTER_OTLP_HEADERS", _key_values,
            "a mapping or 'key=value,...'", "Headers sent with every OTLP request (values are "
            "never shown by errors, logs or doctor).", secret=True),
    Setting("otlp_insecure", ev.OTELGPU_OTLP_INSECURE, "OTEL_EXPORTER_OTLP_INSECURE", _bool,
            "true or false", "Plaintext gRPC (no TLS)."),
    Setting("otlp_certificate", ev.OTELGPU_OTLP_CERTIFICATE, "OTEL_EXPORTER_OTLP_CERTIFICATE",
            _pem_file,
            "a path to a readable PEM file", "CA bundle used to verify the collector."),
    Setting("otlp_timeout_ms", ev.OTELGPU_OTLP_TIMEOUT_MS, None, _int_range(1, _HOUR_MS),
            "an integer in [1, 3600000] (milliseconds)",
            "Deadline of one OTLP export, retries included."),
    Setting("metric_export_interval_ms", ev.OTELGPU_METRIC_EXPORT_INTERVAL_MS,
            "OTEL_METRIC_EXPORT_INTERVAL", _int_range(1, _DAY_MS),
            "an integer in [1, 86400000] (milliseconds)", "Period of metric export."),
    Setting("traces_sampler", ev.OTELGPU_TRACES_SAMPLER, "OTEL_TRACES_SAMPLER", _choice(SAMPLERS),
            "one of " + ", ".join(SAMPLERS), "Trace sampler."),
    Setting("traces_sampler_arg", ev.OTELGPU_TRACES_SAMPLER_ARG, "OTEL_TRACES_SAMPLER_ARG",
            _float_range(0.0, 1.0, lo_open=False, hi_open=False), "a number in [0, 1]",
            "Sampling ratio of the *traceidratio samplers."),
    Setting("span_queue_size", ev.OTELGPU_SPAN_QUEUE_SIZE, "OTEL_BSP_MAX_QUEUE_SIZE",
            _int_range(1, _MAX_QUEUE), "an integer in [1, 10000000]",
            "Bound of the span export queue (overflow is dropped and counted)."),
    Setting("span_export_batch_size", ev.OTELGPU_SPAN_EXPORT_BATCH_SIZE,
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _int_range(1, _MAX_QUEUE),
            "an integer in [1, 10000000]",
            "Spans per export request."),
    Setting("span_schedule_delay_ms", ev.OTELGPU_SPAN_SCHEDULE_DELAY_MS, "OTEL_BSP_SCHEDULE_DELAY",
            _int_range(1, _HOUR_MS), "an integer in [1, 3600000] (milliseconds)",
            "Delay between span exports."),
    Setting("recording_dir", ev.OTELGPU_RECORDING_DIR, None, _path, "a directory path",
            "Directory of the local recording (OTLP JSON lines)."),
    Setting("recording_max_bytes", ev.OTELGPU_RECORDING_MAX_BYTES, None, _int_range(4096, _TIB),
            "an integer in [4096, 2**40] (bytes)", "Size at which the recording rotates."),
    Setting("recording_backups", ev.OTELGPU_RECORDING_BACKUPS, None, _int_range(0, 100),
            "an integer in [0, 100]", "Rotated recording files kept."),
    Setting("recording_dir_max_bytes", ev.OTELGPU_RECORDING_DIR_MAX_BYTES, None,
            _int_range(4096, _TIB), "an integer in [4096, 2**40] (bytes)",
            "Total size of the recordings in one directory; the oldest files are removed "
            "when a new file starts or rotates."),
    Setting("prometheus_host", ev.OTELGPU_PROMETHEUS_HOST, "OTEL_EXPORTER_PROMETHEUS_HOST", _str,
            "a host name or address", "Bind address of the Prometheus pull endpoint."),
    Setting("prometheus_port", ev.OTELGPU_PROMETHEUS_PORT, "OTEL_EXPORTER_PROMETHEUS_PORT",
            _int_range(0, 65535), "an integer in [0, 65535]", "Port of the Prometheus endpoint."),
    Setting("gpu", ev.OTELGPU_GPU, None, _bool, "true or false",
            "Sample the GPUs (GPU context on spans, hw.* metrics)."),
    Setting("devices", ev.OTELGPU_DEVICES, None, _devices,
            "'all' or a comma list of GPU indices or UUIDs", "GPUs to sample."),
    Setting("step_devices", ev.OTELGPU_STEP_DEVICES, None, _step_devices,
            "auto, all, none, or a comma list of CUDA indices or GPU UUIDs",
            "GPUs whose context training step spans carry (auto: those the process uses)."),
    Setting("peak_flops", ev.OTELGPU_PEAK_FLOPS, None,
            _float_range(0.0, 1e21, lo_open=True, hi_open=False),
            "a number of FLOP/s per GPU in (0, 1e21]",
            "Peak FLOP/s of one GPU for MFU (default: the table for the GPU's model)."),
    Setting("mfu_dtype", ev.OTELGPU_MFU_DTYPE, None, _choice(MFU_DTYPES), " or ".join(MFU_DTYPES),
            "Dtype column of the peak FLOP/s table MFU divides by."),
    Setting("sample_interval_ms", ev.OTELGPU_SAMPLE_INTERVAL_MS, None, _int_range(1, 60_000),
            "an integer in [1, 60000] (milliseconds)", "GPU sampling period."),
    Setting("sampler_history_s", ev.OTELGPU_SAMPLER_HISTORY_S, None,
            _float_range(1.0, 86_400.0, lo_open=False, hi_open=False),
            "a number in [1, 86400] (seconds)", "Depth of the sampler's ring buffers."),
    Setting("gpu_startup_wait_ms", ev.OTELGPU_GPU_STARTUP_WAIT_MS, None, _int_range(0, 60_000),
            "an integer in [0, 60000] (milliseconds)",
            "How long instrument() waits for GPU discovery (done off the caller's thread); "
            "later, GPU metrics appear when it finishes."),
    Setting("sketch_relative_accuracy", ev.OTELGPU_SKETCH_RELATIVE_ACCURACY, None,
            _float_range(0.0, 0.5, lo_open=True, hi_open=True), "a number in (0, 0.5)",
            "Relative accuracy of the quantile sketches."),
    Setting("quantiles", ev.OTELGPU_QUANTILES, None, _quantiles,
            "a comma list of numbers in (0, 1)", "Quantiles exported as gauges."),
    Setting("max_series", ev.OTELGPU_MAX_SERIES, None, _int_range(1, 1_000_000),
            "an integer in [1, 1000000]", "Attribute sets per sketch metric before overflow."),
    Setting("attach", ev.OTELGPU_ATTACH, None, _choice(ATTACH), " or ".join(ATTACH),
            "Use providers the application already installed (auto) or never."),
    Setting("frameworks", ev.OTELGPU_FRAMEWORKS, None, _frameworks,
            "a comma list of torch, vllm, or none",
            "Framework instrumentors instrument() turns on when the framework is installed."),
    Setting("attribute_value_length_limit", ev.OTELGPU_ATTRIBUTE_VALUE_LENGTH_LIMIT,
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", _int_range(16, 1 << 24),
            "an integer in [16, 16777216] (characters)",
            "Longest string attribute value on spans and metrics; longer ones are truncated."),
    Setting("live", ev.OTELGPU_LIVE, None, _bool, "true or false",
            "Serve read-only live snapshots on an owner-only Unix socket (otelgpu top)."),
    Setting("live_dir", ev.OTELGPU_LIVE_DIR, None, _path, "a directory path",
            "Directory of the live-view sockets (owner-only, 0700)."),
    Setting("traces_exporter", ev.OTELGPU_TRACES_EXPORTER, "OTEL_TRACES_EXPORTER",
            _signal_exporter, "none, or an exporter list (then `exporters` applies)",
            "none: export no spans (recording included), whatever `exporters` says."),
    Setting("metrics_exporter", ev.OTELGPU_METRICS_EXPORTER, "OTEL_METRICS_EXPORTER",
            _signal_exporter, "none, or an exporter list (then `exporters` applies)",
            "none: export no metrics (recording and pull endpoint included)."),
    Setting("shutdown_timeout_ms", ev.OTELGPU_SHUTDOWN_TIMEOUT_MS, None, _int_range(0, 600_000),
            "an integer in [0, 600000] (milliseconds)",
            "Bound of shutdown() and of the exit flush; what is not sent by then is counted as "
            "dropped."),
    Setting("flush_on_sigterm", ev.OTELGPU_FLUSH_ON_SIGTERM, None, _bool, "true or false",
            "On SIGTERM (default disposition only), flush within shutdown_timeout_ms, then "
            "die of SIGTERM."),
    Setting("gc_freeze", ev.OTELGPU_GC_FREEZE, None, _bool, "true or false",
            "After instrument()'s start-up collection, gc.freeze() the objects that exist: "
            "full collections no longer scan them (milliseconds of GIL per collection)."),
    Setting("prometheus_rank_offset", ev.OTELGPU_PROMETHEUS_RANK_OFFSET, None, _bool,
            "true or false",
            "Pull endpoint on prometheus_port + LOCAL_RANK (one port per rank of a node)."),
    Setting("step_spans_per_second", ev.OTELGPU_STEP_SPANS_PER_SECOND, None,
            _int_range(0, 1_000_000), "an integer in [0, 1000000] (0: export every step span)",
            "Budget of ordinary step spans exported per second; failed, slow and GPU-health "
            "steps are always exported, metrics stay exact."),
)  # fmt: skip

_BY_NAME = {s.name: s for s in SETTINGS}
assert set(_BY_NAME) == {f.name for f in dataclasses.fields(Settings)}


def _parse(setting: Setting, label: str, raw: object) -> Any:
    try:
        return setting.parse(raw)
    except (ValueError, TypeError, OverflowError):
        shown = redact_key_values(raw) if setting.secret else raw
        raise ConfigurationError(label, shown, setting.accepted) from None


def _lenient_otel_bool(setting: Setting, var: str, raw: str) -> bool | None:
    """An ``OTEL_*`` boolean as the OpenTelemetry specification reads it.

    The spec: ``true``/``false`` (any case) are valid; anything else is logged as a warning
    and the default is used. (otelgpu also keeps reading 1/0, yes/no, on/off as it always
    did; ``OTELGPU_*`` variables keep otelgpu's rule: a bad value fails fast.)
    """
    try:
        return parse_bool(raw)
    except ValueError:
        pass
    _log.warning(
        "otelgpu: ignoring %s=%r (expected true or false, as the OpenTelemetry specification "
        "requires); using the default for %s",
        var,
        raw[:64],
        setting.name,
    )
    return None


def resolve_table(
    rows: tuple[Setting, ...],
    overrides: Mapping[str, object],
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """Values of ``rows`` given: keyword > ``env`` variable > ``otel_env`` variable.

    The settings mechanism shared by ``instrument()`` and the framework instrumentors
    (torch, vLLM): a row not given anywhere is absent (its default applies). A keyword
    whose value is ``None`` counts as not given; an empty variable likewise. Raises
    :class:`ConfigurationError` naming the keyword or the variable of a bad value.
    """
    values: dict[str, Any] = {}
    for setting in rows:
        raw = overrides.get(setting.name)
        if raw is not None:
            values[setting.name] = _parse(setting, setting.name, raw)
            continue
        for var in (setting.env, setting.otel_env):
            if var and environ.get(var, "").strip():
                if var == setting.otel_env and setting.parse is _bool:
                    lenient = _lenient_otel_bool(setting, var, environ[var])
                    if lenient is not None:
                        values[setting.name] = lenient
                    break
                values[setting.name] = _parse(setting, var, environ[var])
                break
    return values


def resolve(overrides: Mapping[str, object] | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:  # fmt: skip
    """Resolve keyword overrides and the environment into :class:`Settings`.

    A keyword whose value is ``None`` counts as not given. Unknown keywords and invalid
    values raise :class:`ConfigurationError`.
    """
    env = os.environ if environ is None else environ
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - set(_BY_NAME))
    if unknown:
        raise ConfigurationError(
            unknown[0], given[unknown[0]], "one of the settings " + ", ".join(_BY_NAME)
        )
    values = resolve_table(SETTINGS, given, env)
    if "exporters" not in values:
        configured = "otlp_endpoint" in values or any(
            env.get(v, "").strip() for v in OTLP_ENDPOINT_VARIABLES
        )
        values["exporters"] = ("otlp",) if configured else ("recording",)
    settings = Settings(**values)
    _check_sdk_variables(settings, env)
    return settings


#: ``OTEL_*`` variables the OpenTelemetry SDK reads itself while otelgpu builds the pipeline,
#: and what they accept. The SDK raises a bare ValueError (or its own exception) for a bad
#: value deep inside instrument(); checked here, they fail like every other setting.
_SDK_SPAN_LIMITS = (
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
)
_SDK_OTLP_SIGNALS = ("", "TRACES_", "METRICS_", "LOGS_")
_COMPRESSIONS = ("gzip", "deflate", "none")


def _check_sdk_variables(settings: Settings, env: Mapping[str, str]) -> None:
    for var in _SDK_SPAN_LIMITS:
        raw = env.get(var, "").strip()
        if raw and not raw.isdigit():
            raise ConfigurationError(var, raw, "a non-negative integer")
    if "otlp" not in settings.exporters:
        return
    for signal in _SDK_OTLP_SIGNALS:
        var = f"OTEL_EXPORTER_OTLP_{signal}TIMEOUT"
        raw = env.get(var, "").strip()
        if raw:
            try:
                _float_range(0.0, 3_600_000.0, lo_open=True, hi_open=False)(raw)
            except (ValueError, TypeError):
                raise ConfigurationError(var, raw, "a number in (0, 3600000]") from None
        var = f"OTEL_EXPORTER_OTLP_{signal}COMPRESSION"
        raw = env.get(var, "").strip()
        if raw and raw.lower() not in _COMPRESSIONS:
            raise ConfigurationError(var, raw, "gzip, deflate or none")


def describe(settings: Settings) -> list[tuple[str, str, str]]:
    """(name, value, variable) rows for ``otelgpu doctor``."""
    rows = []
    for s in SETTINGS:
        value = getattr(settings, s.name)
        if s.secret and value is not None:
            shown = repr({str(k): REDACTED for k in value})
        elif s.name == "otlp_endpoint" and value is not None:
            shown = repr(redact_url(value))
        else:
            shown = repr(value)
        rows.append((s.name, shown, s.env))
    return rows
