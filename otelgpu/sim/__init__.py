"""otelgpu's simulated GPU: a drop-in ``libnvidia-ml.so.1`` driven by scenarios.

The C library (``src_ext/sim``, installed as ``otelgpu/sim/lib/libnvidia-ml.so.1``)
implements NVML for 1-16 simulated GPUs whose load, faults and events come from a TOML
scenario (docs/simulator.md). Any NVML client -- pynvml, gpustat, nvitop, otelgpu's
own sampler -- reads it unmodified.

Quick use::

    from otelgpu import sim
    gpu = sim.activate("healthy-8xh100", clock="virtual")   # before NVML initialises
    import pynvml; pynvml.nvmlInit()                        # sees 8 simulated H100s
    gpu.advance(30.0)                                       # move the virtual clock
    gpu.inject("xid", gpu=3, code=79)                       # fault now

Child processes: ``otelgpu sim run SCENARIO -- COMMAND`` or :func:`env_for`.
"""

from __future__ import annotations

from otelgpu.sim._library import SimLibraryError, library_dir, library_path
from otelgpu.sim._runtime import (
    CLOCKS,
    ENV_CLOCK,
    ENV_CONFIG,
    ENV_NVML_LIBRARY,
    ENV_SIM,
    SimGpu,
    activate,
    activate_from_env,
    activate_from_settings,
    active,
    deactivate,
    env_for,
    resource_attributes,
)
from otelgpu.sim.scenario import (
    Event,
    Pattern,
    Process,
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
)

__all__ = [
    "CLOCKS",
    "ENV_CLOCK",
    "ENV_CONFIG",
    "ENV_NVML_LIBRARY",
    "ENV_SIM",
    "Event",
    "Pattern",
    "Process",
    "Scenario",
    "ScenarioError",
    "SimGpu",
    "SimLibraryError",
    "activate",
    "activate_from_env",
    "activate_from_settings",
    "active",
    "deactivate",
    "env_for",
    "library_dir",
    "library_path",
    "list_scenarios",
    "load_scenario",
    "resource_attributes",
]
