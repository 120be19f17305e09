"""Settings: precedence (kwarg > OTELGPU_* > OTEL_* > default), validation, documentation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import otelgpu
from otelgpu import _settings, environment_variables
from otelgpu._settings import SETTINGS, Settings, resolve
from otelgpu.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_defaults_without_environment() -> None:
    s = resolve({}, {})
    assert s == Settings()
    assert s.exporters == ("recording",)
    assert s.prometheus_host == "127.0.0.1"


def test_pipeline_precedence_kwarg_then_otelgpu_then_otel() -> None:
    env = {"OTELGPU_SERVICE_NAME": "from-otelgpu", "OTEL_SERVICE_NAME": "from-otel"}
    assert resolve({}, {"OTEL_SERVICE_NAME": "from-otel"}).service_name == "from-otel"
    assert resolve({}, env).service_name == "from-otelgpu"
    assert resolve({"service_name": "from-kwarg"}, env).service_name == "from-kwarg"
    # None means "not given".
    assert resolve({"service_name": None}, env).service_name == "from-otelgpu"


def test_pipeline_otlp_endpoint_switches_default_exporter() -> None:
    assert resolve({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}).exporters == ("otlp",)
    assert resolve({}, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c"}).exporters == ("otlp",)
    assert resolve({"otlp_endpoint": "http://c:4317"}, {}).exporters == ("otlp",)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTELGPU_EXPORTERS": "console"}
    assert resolve({}, env).exporters == ("console",)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("otlp,console", ("otlp", "console")),
        (" recording , otlp ", ("recording", "otlp")),
        ("none", ()),
        (["prometheus"], ("prometheus",)),
    ],
)
def test_pipeline_exporters_parse(raw: object, expected: tuple[str, ...]) -> None:
    assert resolve({"exporters": raw}, {}).exporters == expected


@pytest.mark.parametrize(
    ("kwargs", "env", "setting"),
    [
        ({"exporters": "otlp,zipkin"}, {}, "exporters"),
        ({"exporters": "none,otlp"}, {}, "exporters"),
        ({}, {"OTELGPU_OTLP_PROTOCOL": "http/json"}, "OTELGPU_OTLP_PROTOCOL"),
        ({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"metric_export_interval_ms": 0}, {}, "metric_export_interval_ms"),
        ({}, {"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"sketch_relative_accuracy": 0.7}, {}, "sketch_relative_accuracy"),
        ({"quantiles": "0.5,1.5"}, {}, "quantiles"),
        ({"gpu": "maybe"}, {}, "gpu"),
        ({}, {"OTELGPU_DISABLED": "perhaps"}, "OTELGPU_DISABLED"),
        ({"prometheus_port": 70000}, {}, "prometheus_port"),
        ({"traces_sampler": "sometimes"}, {}, "traces_sampler"),
        ({"traces_sampler_arg": 2}, {}, "traces_sampler_arg"),
        ({"resource_attributes": "novalue"}, {}, "resource_attributes"),
        ({"sample_interval_ms": True}, {}, "sample_interval_ms"),
        ({"no_such_setting": 1}, {}, "no_such_setting"),
    ],
)
def test_pipeline_invalid_values_name_the_setting(
    kwargs: dict[str, object], env: dict[str, str], setting: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve(kwargs, env)
    assert info.value.setting == setting
    assert setting in str(info.value)
    assert "expected" in str(info.value)


def test_pipeline_instrument_rejects_bad_setting(reset_otel_globals: None) -> None:
    with pytest.raises(ConfigurationError, match="otlp_protocol"):
        otelgpu.instrument(otlp_protocol="carrier-pigeon")
    from otelgpu import _runtime

    assert _runtime.current() is None


def test_pipeline_typed_values() -> None:
    s = resolve(
        {},
        {
            "OTELGPU_RESOURCE_ATTRIBUTES": "team=ml,job%20kind=train",
            "OTELGPU_DEVICES": "0,GPU-abc",
            "OTELGPU_QUANTILES": "0.99,0.5",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
            "OTEL_SDK_DISABLED": "true",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "9999",
        },
    )
    assert s.resource_attributes == {"team": "ml", "job kind": "train"}
    assert s.devices == ("0", "GPU-abc")
    assert s.quantiles == (0.5, 0.99)
    assert s.traces_sampler == "parentbased_traceidratio"
    assert s.traces_sampler_arg == 0.25
    assert s.disabled is True
    assert s.prometheus_port == 9999
    assert resolve({"devices": "all"}, {}).devices is None


def test_pipeline_every_setting_has_a_variable_and_docs() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert {s.name for s in SETTINGS} == fields
    variables = {
        getattr(environment_variables, n)
        for n in dir(environment_variables)
        if n.startswith("OTELGPU_")
    }
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for s in SETTINGS:
        assert s.env in variables, s.env
        assert s.env.startswith("OTELGPU_")
        assert f"`{s.name}`" in doc, s.name
        assert f"`{s.env}`" in doc, s.env
        if s.otel_env:
            assert f"`{s.otel_env}`" in doc, s.otel_env
    assert _settings.describe(Settings())[0][0] == "disabled"


def test_pipeline_every_otelgpu_variable_is_named_in_environment_variables() -> None:
    """No stray ``OTELGPU_*`` literal: each one the code reads is a constant of an
    ``environment_variables`` module (otelgpu's, or one of an instrumentation package)."""
    import importlib
    import re

    modules = [
        importlib.import_module(path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."))
        for path in (ROOT / "otelgpu").rglob("environment_variables.py")
    ]
    assert environment_variables in modules
    named = {getattr(m, n) for m in modules for n in dir(m) if n.startswith("OTELGPU_")}
    sources = [*(ROOT / "otelgpu").rglob("*.py"), ROOT / "setup.py"]
    literals = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in sources
        for name in re.findall(r"[\"'](OTELGPU_[A-Z0-9_]+)[\"']", path.read_text())
    }
    assert literals
    assert {(p, n) for p, n in literals if n not in named} == set()
