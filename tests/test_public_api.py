"""The public names of every package, pinned: adding or removing one is a deliberate,
reviewed change (update this table with the docs), never an accident of a refactor."""

from __future__ import annotations

import importlib

import pytest

# module: its __all__ (continuation lines are indented)
PINNED = """
otelgpu: NATIVE __version__ instrument request shutdown step
otelgpu.sketch: PyQuantileSketch QuantileSketch
otelgpu.sampler: BaseGpuSampler GpuEvent GpuSample GpuSampler NativeGpuSampler PyGpuSampler
    SamplerStats WindowStats
otelgpu.sim: CLOCKS ENV_CLOCK ENV_CONFIG ENV_NVML_LIBRARY ENV_SIM Event Pattern Process
    Scenario ScenarioError SimGpu SimLibraryError activate activate_from_env
    activate_from_settings active
    deactivate env_for library_dir library_path list_scenarios load_scenario
    resource_attributes
otelgpu.nvml: DEFAULT_LIBRARY DeviceDetails DeviceInfo DeviceSpec ENV_NVML_LIBRARY MigInstance
    NvmlUnavailableError PhysicalGpu cuda_order discover inventory library_path pynvml_init
    pynvml_module resolve_explicit select_devices visible_devices
otelgpu.metrics: ALL Area BY_NAME GPU_METRICS Kind MetricSpec SAMPLER_METRICS Status
otelgpu.diagnosis: active verdict
otelgpu.instrumentation.gpu: GpuMetricsInstrumentor
otelgpu.instrumentation.torch: TorchInstrumentor flush record_batch
otelgpu.instrumentation.vllm: OtelGpuStatLogger VllmInstrumentor
otelgpu.runtime.api: RuntimeAPI
otelgpu.runtime.records: DEFAULT_OPERATION DEFAULT_PROVIDER OUTCOMES RequestRecord
    StepRecord
"""


def _pinned() -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    module = ""
    for line in PINNED.strip().splitlines():
        if not line.startswith(" "):
            module, line = line.split(":", 1)
            table[module] = set()
        table[module].update(line.split())
    return table


PUBLIC = _pinned()


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_all_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    exported = set(mod.__all__)
    assert exported == PUBLIC[module], (
        f"{module}.__all__ changed: added {sorted(exported - PUBLIC[module])}, "
        f"removed {sorted(PUBLIC[module] - exported)}; update tests/test_public_api.py "
        "and the docs together"
    )
    for name in exported:
        assert hasattr(mod, name), f"{module}.__all__ names {name!r}, which does not exist"


def test_lazy_api_names_resolve_once_to_the_api_functions() -> None:
    """``import otelgpu`` defers the pipeline's import; a name resolved once is then a plain
    module attribute (no module ``__getattr__`` call per ``otelgpu.request(...)``)."""
    import otelgpu
    from otelgpu import _api

    for name in ("instrument", "shutdown", "step", "request"):
        assert getattr(otelgpu, name) is getattr(_api, name)
        assert vars(otelgpu)[name] is getattr(_api, name)
