"""Scenario files: load, validate and normalize for the C library.

A scenario is a TOML document (``version = 1``; format in docs/simulator.md). Loading
validates every key and fails with :class:`ScenarioError`, whose message names the file,
the key and the accepted values. A valid scenario is turned into the simulator's
normalized text (:meth:`Scenario.to_config`), the only thing the C library parses.

This module is the public face of four modules, one per job:
``_scenario_keys`` (vocabulary and limits), ``_scenario_model`` (the data model and its
normalized text), ``_scenario_check`` (validation) and ``_scenario_load`` (files, names,
dicts).

Not thread-safe to mutate; a loaded :class:`Scenario` is treated as immutable.
"""

from __future__ import annotations

from otelgpu.sim._scenario_check import (
    parse_scenario,
)
from otelgpu.sim._scenario_keys import (
    EVENT_KINDS,
    FEATURES,
    FORMAT_VERSION,
    INIT_ERRORS,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_NESTING,
    MAX_PROCESSES,
    MAX_SCENARIO_BYTES,
    MAX_STEPS,
    THROTTLE_REASONS,
    ScenarioError,
)
from otelgpu.sim._scenario_load import (
    builtin_dir,
    list_scenarios,
    load_scenario,
    resolve_path,
)
from otelgpu.sim._scenario_model import (
    Event,
    Pattern,
    Process,
    Scenario,
)

__all__ = [
    "EVENT_KINDS",
    "FEATURES",
    "FORMAT_VERSION",
    "INIT_ERRORS",
    "MAX_EVENTS",
    "MAX_GPUS",
    "MAX_NESTING",
    "MAX_PROCESSES",
    "MAX_SCENARIO_BYTES",
    "MAX_STEPS",
    "THROTTLE_REASONS",
    "Event",
    "Pattern",
    "Process",
    "Scenario",
    "ScenarioError",
    "builtin_dir",
    "list_scenarios",
    "load_scenario",
    "parse_scenario",
    "resolve_path",
]
