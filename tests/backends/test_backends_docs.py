"""docs/deployment.md stays true: its configurations parse, the Prometheus one passes
``promtool check config``, its PromQL parses, and every resource attribute it tells users
to keep or drop is one otelgpu actually sets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no PyYAML stubs in the test extras
from fixtures.backends import ROOT, RULES, promtool

pytestmark = pytest.mark.backend

DOC = ROOT / "docs" / "deployment.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.MULTILINE | re.DOTALL)


def _collector_configs() -> dict[str, dict[str, Any]]:
    configs = {}
    for block in _blocks("yaml"):
        first = block.splitlines()[0]
        if first.startswith("# otelcol-"):
            configs[first.split()[1]] = yaml.safe_load(block)
    return configs


def _resource_attributes() -> set[str]:
    """Every resource attribute otelgpu sets, with all optional ones switched on (call it
    with the simulator active: that adds the ``otelgpu.sim*`` marker)."""
    from otelgpu._settings import Settings
    from otelgpu.otel.resource import GpuInventory, build_resource, job_attributes

    inventory = GpuInventory(
        uuids=("GPU-1",), names=("H100",), driver_version="550", cuda_version="12.4"
    )
    keys = set(build_resource(Settings(service_name="x"), inventory).attributes)
    environ = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "j",
        "SLURM_CLUSTER_NAME": "c",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "POD_NAME": "p",
        "POD_NAMESPACE": "n",
        "NODE_NAME": "node",
        "POD_UID": "u",
    }
    keys |= set(job_attributes(environ))
    return keys


def _covered(name: str, known: set[str]) -> bool:
    if name.endswith(".*"):
        return any(k.startswith(name[:-1]) for k in known)
    return name in known


def test_backends_docs_collector_configs_are_consistent() -> None:
    configs = _collector_configs()
    assert sorted(configs) == ["otelcol-agent.yaml", "otelcol-gateway.yaml"]
    for name, config in configs.items():
        pipelines = config["service"]["pipelines"]
        assert set(pipelines) == {"metrics", "traces"}, name
        for extension in config["service"].get("extensions", []):
            assert extension in config["extensions"], (name, extension)
        for signal, pipeline in pipelines.items():
            for section in ("receivers", "processors", "exporters"):
                for component in pipeline[section]:
                    assert component in config[section], (name, signal, component)
            # memory_limiter first (refuse before buffering), batch last (after trimming).
            assert pipeline["processors"][0] == "memory_limiter", (name, signal)
            assert pipeline["processors"][-1] == "batch", (name, signal)
            assert pipeline["receivers"] == ["otlp"], (name, signal)
    agent = configs["otelcol-agent.yaml"]
    assert agent["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "127.0.0.1:4317"
    assert "resourcedetection" in agent["service"]["pipelines"]["metrics"]["processors"]
    queue = agent["exporters"]["otlp/gateway"]["sending_queue"]
    assert queue["storage"] in agent["extensions"]
    gateway = configs["otelcol-gateway.yaml"]
    assert gateway["exporters"]["prometheusremotewrite"]["resource_to_telemetry_conversion"] == {
        "enabled": True
    }


def test_backends_docs_name_only_attributes_otelgpu_sets(sim_gpu: Any) -> None:
    known = _resource_attributes() | {
        # Added by the SDK's Resource.create, not by otelgpu.
        "telemetry.sdk.name",
        "telemetry.sdk.language",
        "telemetry.sdk.version",
    }
    gateway = _collector_configs()["otelcol-gateway.yaml"]
    deleted = {a["key"] for a in gateway["processors"]["resource/metrics"]["attributes"]}
    assert deleted - known == set(), "the gateway deletes attributes otelgpu never sets"
    for keep in ("host.name", "otelgpu.dist.rank", "service.instance.id", "k8s.pod.name"):
        assert keep in known and keep not in deleted

    text = DOC.read_text()
    section = text.split("### Resource attributes", 1)[1].split("\n### ", 1)[0]
    named = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            named |= set(re.findall(r"`([a-z][\w.]*(?:\.\*)?)`", row.split("|")[1]))
    assert len(named) >= 15
    unknown = sorted(n for n in named if not _covered(n, known))
    assert unknown == [], "deployment.md names resource attributes otelgpu does not set"


def test_backends_docs_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks("yaml") if "scrape_configs" in b]
    config = yaml.safe_load(block)
    assert config["rule_files"] == ["otelgpu-rules.yml"]
    (tmp_path / "otelgpu-rules.yml").write_text(RULES.read_text())
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


def test_backends_docs_promql_examples_parse(tmp_path: Path) -> None:
    expressions = [
        line
        for block in _blocks("promql")
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(expressions) >= 2
    rules = {
        "groups": [
            {
                "name": "deployment-md",
                "rules": [
                    {"record": f"doc:example{i}", "expr": e} for i, e in enumerate(expressions)
                ],
            }
        ]
    }
    (tmp_path / "examples.yml").write_text(json.dumps(rules))
    result = promtool("check", "rules", str(tmp_path / "examples.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    # The histograms they query are otelgpu's sketch metrics (OTLP-translated names).
    from otelgpu.metrics import catalog
    from otelgpu.metrics.spec import Kind

    sketches = {m.name.replace(".", "_") + "_seconds" for m in catalog.ALL if m.kind is Kind.SKETCH}
    used = {n for e in expressions for n in re.findall(r"\b([a-z_]+_seconds)\b", e)}
    assert used and used <= sketches
