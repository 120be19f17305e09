"""Bad input: garbage settings, hostile scenario TOML, corrupted recordings, and NaN / inf /
negative / huge values handed to the public API."""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import PYTHON, python_env
from fixtures.otlp_receiver import OtlpReceiver

import otelgpu
from otelgpu import _settings
from otelgpu.errors import ConfigurationError

pytestmark = [pytest.mark.reliability, pytest.mark.usefixtures("reset_otel_globals")]

GARBAGE = [
    "garbage",
    "-1",
    "0",
    "1e23",
    "100000000000000000000000",
    "nan",
    "inf",
    " ,,, ",
    "\u2603",
]

#: OTEL_* variables the OpenTelemetry SDK reads itself when otelgpu builds its pipeline.
SDK_VARIABLES = [
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
]


def _instrument_otlp_grpc(receiver: OtlpReceiver, **settings: Any) -> None:
    """instrument() exporting over plaintext OTLP/gRPC to ``receiver``, no GPU."""
    otelgpu.instrument(
        exporters="otlp",
        otlp_endpoint=receiver.grpc_endpoint,
        otlp_insecure=True,
        gpu=False,
        **settings,
    )


def _attrs(point: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def _absurd(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 10**12


def test_every_setting_with_garbage(probe: Any, caplog: pytest.LogCaptureFixture) -> None:
    variables = [(s, v) for s in _settings.SETTINGS for v in (s.env, s.otel_env) if v]
    p = probe(
        "bad input",
        "every setting with garbage",
        f"{len(variables)} OTELGPU_*/OTEL_* variables x {len(GARBAGE)} garbage values "
        "(1e23, nan, -1, …) through the settings resolver instrument() uses",
    )
    outcomes = {"rejected naming the variable": 0, "accepted": 0, "warned, default used": 0}
    bad: list[str] = []
    for setting, var in variables:
        for value in GARBAGE:
            caplog.clear()
            try:
                with caplog.at_level(logging.WARNING, logger="otelgpu"):
                    resolved = _settings.resolve(environ={var: value})
            except ConfigurationError as exc:
                if var in str(exc):
                    outcomes["rejected naming the variable"] += 1
                else:
                    bad.append(f"{var}={value!r}: error does not name it: {exc}")
                continue
            except Exception as exc:
                bad.append(f"{var}={value!r}: {type(exc).__name__}: {exc}")
                continue
            if any(var in r.getMessage() for r in caplog.records):
                outcomes["warned, default used"] += 1
                continue
            got = getattr(resolved, setting.name)
            if _absurd(got):
                bad.append(f"{var}={value!r} accepted as {got!r}")
            else:
                outcomes["accepted"] += 1
    p.result(
        not bad,
        "; ".join(f"{n} {k}" for k, n in outcomes.items())
        + (f"; WRONG: {bad[:3]}" if bad else "; nothing else"),
    )


def test_sdk_read_variables_with_garbage(
    probe: Any, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = probe(
        "bad input",
        "SDK-read OTEL_* with garbage",
        f"instrument() with each of {len(SDK_VARIABLES)} OTEL_* variables the SDK reads itself "
        "set to garbage: instrument() succeeds (SDK fallback) or fails naming the variable",
    )
    bad: list[str] = []
    for var in SDK_VARIABLES:
        monkeypatch.setenv(var, "garbage=1e23,%%%")
        try:
            otelgpu.instrument(
                exporters="otlp", otlp_endpoint=otlp_receiver.grpc_endpoint, gpu=False
            )
            with otelgpu.step():
                pass
        except ConfigurationError as exc:
            if var not in str(exc):
                bad.append(f"{var}: {exc}")
        except Exception as exc:
            bad.append(f"{var}: {type(exc).__name__}: {str(exc)[:80]}")
        finally:
            otelgpu.shutdown()
            monkeypatch.delenv(var)
    p.result(
        not bad,
        f"{len(SDK_VARIABLES) - len(bad)} of {len(SDK_VARIABLES)} handled"
        + (f"; raised: {bad}" if bad else ""),
    )


def test_huge_export_interval(probe: Any) -> None:
    p = probe(
        "bad input",
        "export interval 1e23 ms",
        "OTEL_METRIC_EXPORT_INTERVAL=1e23 (and 10**23 as a keyword): used to be accepted and "
        "end the export thread",
    )
    errors = []
    for overrides, environ in (
        ({}, {"OTEL_METRIC_EXPORT_INTERVAL": "100000000000000000000000"}),
        ({"metric_export_interval_ms": 10**23}, {}),
        ({"span_schedule_delay_ms": 10**23}, {}),
        ({"otlp_timeout_ms": 10**23}, {}),
    ):
        try:
            _settings.resolve(overrides, environ)
            errors.append(f"{overrides or environ}: accepted")
        except ConfigurationError as exc:
            errors.append(str(exc))
    ok = all("expected an integer in [" in e for e in errors)
    p.result(ok, f"rejected at instrument(): {errors[0]}")


def test_otel_sdk_disabled_garbage(probe: Any, caplog: pytest.LogCaptureFixture) -> None:
    p = probe(
        "bad input",
        "OTEL_SDK_DISABLED=garbage",
        "the OpenTelemetry rule for boolean variables: warn and use the default",
    )
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        resolved = _settings.resolve(environ={"OTEL_SDK_DISABLED": "garbage"})
    warned = [r.getMessage() for r in caplog.records if "OTEL_SDK_DISABLED" in r.getMessage()]
    p.result(
        resolved.disabled is False and len(warned) == 1,
        f"disabled={resolved.disabled} (default), {len(warned)} warning: {warned[:1]}",
    )


def test_ten_megabyte_model_name(probe: Any, otlp_receiver: OtlpReceiver) -> None:
    p = probe(
        "bad input",
        "10 MB model name",
        "one request() with a 10 MB model name among 20 normal ones, OTLP/gRPC (4 MiB message "
        "limit): every span and the request metrics still arrive",
    )
    _instrument_otlp_grpc(otlp_receiver, span_schedule_delay_ms=100)
    for i in range(21):
        with otelgpu.request(model="m" * 10_000_000 if i == 10 else "llama") as r:
            r.tokens(3)
    otelgpu.shutdown()
    spans = otlp_receiver.spans()
    names = [s.name for _, _, s in spans]
    longest = max((len(n) for n in names), default=0)
    lengths = sorted(
        len(_attrs(pt).get("gen_ai.request.model", ""))
        for _, _, m in otlp_receiver.metrics()
        if m.name == "gen_ai.server.request.duration"
        for pt in m.exponential_histogram.data_points
    )
    p.result(
        len(spans) == 21 and longest <= 4096 + 20 and 4096 in lengths,
        f"{len(spans)}/21 spans delivered; longest span name {longest:,} characters; "
        f"request-duration series with model names of {sorted(set(lengths))} characters",
    )


HOSTILE_TOML: dict[str, bytes] = {
    "non-UTF-8 bytes": b'name = "\xff\xfe"\n[gpus]\ncount = 2\n',
    "deep nesting": b"a = " + b"[" * 50_000 + b"]" * 50_000 + b"\n",
    "memory_gib = 1e300": b'version = 1\n[gpus]\ncount = 2\nmodel = "H100-SXM"\n'
    b"memory_used_gib = 1e300\n",
    "count = 10**30": b"version = 1\n[gpus]\ncount = 1000000000000000000000000000000\n",
    "NUL bytes": b"version = 1\x00\n",
    "empty": b"",
}


def test_hostile_scenario_toml(probe: Any, tmp_path: Path) -> None:
    from otelgpu import sim

    p = probe(
        "bad input",
        "hostile scenario TOML",
        f"{len(HOSTILE_TOML)} hostile scenario files ({', '.join(HOSTILE_TOML)}) to "
        "sim.load_scenario: a ScenarioError naming the problem each, never a traceback",
    )
    bad = []
    for label, data in HOSTILE_TOML.items():
        path = tmp_path / f"{label.replace(' ', '_').replace('*', '')}.toml"
        path.write_bytes(data)
        try:
            sim.load_scenario(path)
            bad.append(f"{label}: accepted")
        except sim.ScenarioError:
            pass
        except BaseException as exc:
            bad.append(f"{label}: {type(exc).__name__}")
    p.result(
        not bad,
        f"{len(HOSTILE_TOML) - len(bad)}/{len(HOSTILE_TOML)} rejected cleanly"
        + (f"; {bad}" if bad else ""),
    )


def _good_recording(tmp_path: Path) -> Path:
    otelgpu.instrument(exporters="recording", recording_dir=str(tmp_path / "rec"), gpu=False)
    for _ in range(5):
        with otelgpu.step():
            pass
    with otelgpu.request(model="llama") as r:
        r.tokens(2)
    handle = otelgpu.instrument()
    path = handle.recording_path
    otelgpu.shutdown()
    assert path is not None
    return path


def _report(path: str, timeout: float = 30) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [PYTHON, "-m", "otelgpu", "report", path],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return -9, "", "TIMEOUT", time.monotonic() - t0
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


def test_corrupted_recordings_to_report(probe: Any, tmp_path: Path) -> None:
    p = probe(
        "bad input",
        "corrupted recordings to otelgpu report",
        "one bad UTF-8 byte, a null line, a truncated last line, bit flips, 64 MiB+ line, "
        "random bytes, /dev/zero",
    )
    good = _good_recording(tmp_path)
    lines = good.read_bytes().splitlines(keepends=True)
    rng = random.Random(7)
    flipped = bytearray(b"".join(lines))
    for _ in range(20):  # in the first line: the others must still be read
        flipped[rng.randrange(len(lines[0]) - 1)] ^= 1 << rng.randrange(8)
    cases: dict[str, bytes | str] = {
        "bad UTF-8 byte": lines[0][:40] + b"\xff" + lines[0][40:] + b"".join(lines[1:]),
        "null line": b"null\n" + b"".join(lines),
        "truncated": b"".join(lines)[:-37],
        "bit flips": bytes(flipped),
        "huge line": b"".join(lines) + b"x" * (65 * 1024 * 1024) + b"\n" + lines[-1],
        "random bytes": rng.randbytes(1 << 20),
        "/dev/zero": "/dev/zero",
    }
    results = []
    bad = []
    for label, data in cases.items():
        if isinstance(data, str):
            target = data
        else:
            target = str(tmp_path / f"{label.replace(' ', '_').replace('/', '')}.jsonl")
            Path(target).write_bytes(data)
        code, out, err, took = _report(target)
        summary_ok = "export requests" in out
        if label in ("random bytes", "/dev/zero"):
            ok = code == 1 and "Traceback" not in err and took < 20 and bool(err.strip() or out)
        else:
            ok = code == 0 and summary_ok and "Traceback" not in err
        if not ok:
            bad.append(f"{label}: exit {code}, {err.strip()[-120:]}")
        results.append(f"{label} {took:.1f} s")
    p.result(
        not bad,
        f"{len(cases) - len(bad)}/{len(cases)} handled ("
        + ", ".join(results)
        + ")"
        + (f"; FAILED {bad}" if bad else ""),
    )


def test_hostile_values_to_the_api(probe: Any, otlp_receiver: OtlpReceiver) -> None:
    p = probe(
        "bad input",
        "NaN/inf/negative/huge values to the API",
        "step(samples=nan/inf/-1/2**63/10**30), request tokens -1/2**64/nan, then 10 normal "
        "steps: nothing raised into the host, the next export still succeeds",
    )
    _instrument_otlp_grpc(otlp_receiver, metric_export_interval_ms=200)
    raised = []
    for value in (math.nan, math.inf, -math.inf, -1, 2**63, 10**30, 1e308):
        try:
            with otelgpu.step(samples=value, tokens=value):  # type: ignore[arg-type]
                pass
        except Exception as exc:
            raised.append(f"step({value!r}): {type(exc).__name__}")
    for value in (-1, 2**64, math.nan, math.inf):
        try:
            with otelgpu.request(model="m") as r:
                r.tokens(value)  # type: ignore[arg-type]
                r.input_tokens(value)  # type: ignore[arg-type]
        except Exception as exc:
            raised.append(f"tokens({value!r}): {type(exc).__name__}")
    for _ in range(10):
        with otelgpu.step(samples=32):
            pass
    handle = otelgpu.instrument()
    stats = handle.runtime.stats if handle.runtime else None
    otlp_receiver.clear()
    handle.force_flush()
    time.sleep(0.5)
    handle.force_flush()
    samples = otlp_receiver.last_metric("otelgpu.train.samples")
    exported: float | None = None
    if samples is not None:
        pts = samples.sum.data_points
        exported = max((pt.as_int or pt.as_double for pt in pts), default=None)
    errors = dict(stats.errors()) if stats else {}
    otelgpu.shutdown()
    exported_ok = exported is not None and math.isfinite(exported) and exported < 2**62
    p.result(
        not raised and exported_ok,
        f"raised into the host: {raised or 'nothing'}; otelgpu.train.samples exported after: "
        f"{exported!r}; internal errors {json.dumps(errors)[:160]}",
    )
