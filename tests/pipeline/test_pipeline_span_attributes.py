"""``otelgpu.otel.span_attributes.set_attributes`` leaves a span exactly as the SDK's
``Span.set_attributes`` would: same keys, values, order and dropped count, for every kind
of value and every span limit -- the fast path and the fallback alike, with either twin of
``plain_values`` (the native one where this run has the native core)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from fixtures.function_twins import twin_params, use_twin
from fixtures.generated_metrics import IntCode, TextSubclass
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otelgpu import _impl
from otelgpu.otel import span_attributes

_NATIVE = _impl.native_module("otelgpu.otel._otlp_c")


@pytest.fixture(
    params=twin_params(span_attributes.py_plain_values, "otelgpu.otel._otlp_c", "plain_values")
)
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``span_attributes`` with one twin of ``plain_values`` in use."""
    return use_twin(request, monkeypatch, span_attributes, "plain_values")


_START: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "m",
    "server.port": 8000,
}

CASES: dict[str, Mapping[Any, Any]] = {
    "numbers and strings": {"a.f": 0.5, "a.i": 7, "a.b": True, "a.s": "x", "a.big": 1 << 70},
    "none and bytes": {"a.none": None, "a.bytes": b"\x00\x01"},
    "lists become tuples": {"a.ids": ["u1", "u2"], "a.xids": [79, 48], "a.t": ("x", 1.5)},
    "existing keys move to the end": {"gen_ai.request.model": "m2", "a.new": 1},
    "empty key": {"": 1, "a.ok": 2},
    "key not a string": {5: 1, "a.ok": 2},
    "nested mapping": {"a.map": {"k": [1, 2]}, "a.ok": 2},
    "nested list": {"a.nested": [[1, 2], [3]]},
    "subclass values": {"a.enum": IntCode.A, "a.text": TextSubclass("x")},
    "object value": {"a.obj": object()},
    "long string": {"a.s": "x" * 40, "a.ok": 1},
    "long string in a list": {"a.l": ["y" * 40, "z"]},
    "empty": {},
}

LIMITS = {
    "default": SpanLimits(),
    "value length 8": SpanLimits(max_span_attribute_length=8),
    "count 5": SpanLimits(max_span_attributes=5),
    "count 0": SpanLimits(max_span_attributes=0),
}


def _spans(limits: SpanLimits) -> tuple[Any, Any]:
    tracer = TracerProvider(span_limits=limits).get_tracer("t")
    return tracer.start_span("s", attributes=_START), tracer.start_span("s", attributes=_START)


def _state(span: Any) -> tuple[list[tuple[str, Any]], int]:
    return [(k, span.attributes[k]) for k in span.attributes], span.dropped_attributes


@pytest.mark.parametrize("limits", LIMITS.values(), ids=list(LIMITS))
@pytest.mark.parametrize("attributes", CASES.values(), ids=list(CASES))
def test_same_result_as_the_sdk(
    attributes: Mapping[Any, Any], limits: SpanLimits, twin: Any
) -> None:
    ours, sdk = _spans(limits)
    span_attributes.set_attributes(ours, attributes)
    sdk.set_attributes(attributes)
    ours.end()
    sdk.end()
    assert _state(ours) == _state(sdk)


def test_plain_values_take_the_fast_path(monkeypatch: pytest.MonkeyPatch, twin: Any) -> None:
    """A request span's own attributes never reach the SDK's cleaning; other values do."""
    ours, _ = _spans(SpanLimits())
    cleaned: list[Any] = []
    sdk_set = type(ours).set_attributes

    def spy(span: Any, attributes: Mapping[str, Any]) -> None:
        cleaned.append(dict(attributes))
        sdk_set(span, attributes)

    monkeypatch.setattr(type(ours), "set_attributes", spy)
    span_attributes.set_attributes(ours, CASES["numbers and strings"])
    span_attributes.set_attributes(ours, CASES["lists become tuples"])
    assert cleaned == []
    assert ours.attributes["a.ids"] == ("u1", "u2")
    span_attributes.set_attributes(ours, CASES["nested mapping"])
    assert cleaned == [CASES["nested mapping"]]


def test_ended_span_is_left_alone_with_the_sdks_warning(
    caplog: pytest.LogCaptureFixture, twin: Any
) -> None:
    ours, _ = _spans(SpanLimits())
    ours.end()
    with caplog.at_level(logging.WARNING):
        span_attributes.set_attributes(ours, {"a.late": 1})
    assert "a.late" not in ours.attributes
    assert "ended span" in caplog.text


def test_span_of_another_implementation_gets_its_own_set_attributes() -> None:
    span = NonRecordingSpan(SpanContext(1, 2, False))
    span_attributes.set_attributes(span, {"a.f": 1.0})  # no error, nothing recorded
    assert not span.is_recording()


@pytest.mark.parametrize("limit", [None, 0, 8])
@pytest.mark.parametrize("attributes", CASES.values(), ids=list(CASES))
def test_twins_agree_on_plain_values(attributes: Mapping[Any, Any], limit: int | None) -> None:
    if _NATIVE is None:
        pytest.skip("pure-Python run (OTELGPU_NO_EXTENSIONS): no native twin")
    ours = _NATIVE.plain_values(attributes, limit)
    theirs = span_attributes.py_plain_values(attributes, limit)
    assert ours == theirs
    if ours is not None and theirs is not None:
        assert [type(v) for v in ours.values()] == [type(v) for v in theirs.values()]


def test_the_native_twin_is_used_where_it_loaded() -> None:
    expected = span_attributes.py_plain_values if _NATIVE is None else _NATIVE.plain_values
    assert span_attributes.plain_values is expected
