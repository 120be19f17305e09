"""Activation of the simulated GPU in this process or in child processes.

In-process (:func:`activate`): the simulator library is loaded ``RTLD_GLOBAL`` by
absolute path, so any later ``dlopen("libnvidia-ml.so.1")`` (pynvml, the native
sampler) gets the same object by soname and sees the scenario. This must happen before
a real NVML is loaded into the process; :func:`activate` refuses otherwise.

Child processes (:func:`env_for`): ``LD_LIBRARY_PATH`` points at the library's
directory and ``OTELGPU_SIM_CONFIG`` names a normalized scenario file that the library
reads at ``nvmlInit``. All processes started from one ``env_for`` share a timeline
(scenario t = 0 is the wall time recorded in the file).

Clocks: ``"virtual"`` (time moves only through :meth:`SimGpu.advance` /
:meth:`SimGpu.set_time`; every value is then a pure function of the scenario and the
virtual time) or ``"wall"`` (scenario time = wall time since activation).

Thread-safety: the module-level state is guarded by a lock; the C library is
thread-safe on its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otelgpu.errors import ConfigurationError
from otelgpu.sim import _library
from otelgpu.sim._scenario_check import _Checker, _event_params, _gpu_ref
from otelgpu.sim._scenario_keys import _EVENT_KEYS
from otelgpu.sim.scenario import (
    Event,
    Scenario,
    ScenarioError,
    list_scenarios,
    load_scenario,
)

#: Environment variables of the simulator.
ENV_SIM = "OTELGPU_SIM"  # scenario name or path: otelgpu uses the simulator
ENV_CLOCK = "OTELGPU_SIM_CLOCK"  # "wall" (default) or "virtual" for OTELGPU_SIM
ENV_CONFIG = "OTELGPU_SIM_CONFIG"  # normalized scenario file the C library reads at nvmlInit
ENV_NVML_LIBRARY = "OTELGPU_NVML_LIBRARY"  # the NVML library otelgpu's sampler loads

CLOCKS = ("virtual", "wall")

_lock = threading.RLock()
_active: SimGpu | None = None
_warned = False
_logger = logging.getLogger("otelgpu.sim")


class SimGpu:
    """Handle on the simulated GPUs of this process.

    Times are seconds of scenario time (t = 0 at activation). ``epoch_ns`` is the wall
    time of t = 0, so ``epoch_ns + now_ns()`` is what NVML timestamps report.
    """

    def __init__(self, scenario: Scenario, clock: str, configured: bool = True) -> None:
        self.scenario = scenario
        self.clock = clock
        self._configured = configured
        self._lib = _library.load()

    # -- clock ---------------------------------------------------------------------
    @property
    def virtual(self) -> bool:
        return self.clock == "virtual"

    @property
    def epoch_ns(self) -> int:
        """Wall time (ns since 1970) of scenario t = 0."""
        return int(self._lib.otelgpu_sim_epoch_ns())

    def now_ns(self) -> int:
        """Scenario time in nanoseconds."""
        return int(self._lib.otelgpu_sim_now_ns())

    def now_s(self) -> float:
        """Scenario time in seconds."""
        return self.now_ns() / 1e9

    def time_ns(self) -> int:
        """The wall-clock-compatible timestamp (``time.time_ns()`` scale) of "now"."""
        return self.epoch_ns + self.now_ns()

    def advance(self, seconds: float) -> float:
        """Move the virtual clock forward by ``seconds`` (>= 0); returns the new time."""
        if seconds < 0:
            raise ConfigurationError("advance(seconds)", seconds, "a number >= 0")
        _library.check(self._lib.otelgpu_sim_advance_ns(round(seconds * 1e9)), self._lib, "advance")
        return self.now_s()

    def set_time(self, seconds: float) -> None:
        """Set the virtual clock (may go back: counters are then re-integrated from 0)."""
        if seconds < 0:
            raise ConfigurationError("set_time(seconds)", seconds, "a number >= 0")
        _library.check(
            self._lib.otelgpu_sim_set_time_ns(round(seconds * 1e9)), self._lib, "set_time"
        )

    # -- faults ----------------------------------------------------------------------
    def inject(self, kind: str, gpu: int | str = 0, **params: Any) -> Event:
        """Inject a fault now (scenario time of the call), e.g.
        ``inject("xid", gpu=1, code=48)``, ``inject("gpu_lost", gpu=0)``,
        ``inject("throttle", reason="hw_thermal", duration_s=5)``,
        ``inject("ecc", corrected=10)``, ``inject("slow", latency_ms=50, duration_s=2)``.
        Parameters are those of a scenario ``[[event]]`` (without ``at_s``)."""
        c = _Checker("inject()")
        table = {"kind": kind, "gpu": gpu, **params}
        if kind not in _event_kinds():
            c.choice("kind", kind, _event_kinds())
        gpu_index = _gpu_ref(c, "gpu", gpu, self.scenario.gpu_count, allow_all=True)
        c.keys("", table, ("kind", "gpu", *_event_keys(kind)))
        event = Event(kind, self.now_s(), gpu_index, _event_params(c, "inject", kind, table))
        line = event.to_config(start_ns="now")
        _library.check(self._lib.otelgpu_sim_inject(line.encode()), self._lib, "inject")
        return event

    # -- diagnostics -------------------------------------------------------------------
    def calls(self) -> int:
        """NVML calls the simulator served in this process."""
        return int(self._lib.otelgpu_sim_calls())

    def nvml_refcount(self) -> int:
        """How many nvmlInit calls are not yet matched by nvmlShutdown."""
        return int(self._lib.otelgpu_sim_refcount())

    def resource_attributes(self) -> dict[str, Any]:
        return {
            "otelgpu.sim": True,
            "otelgpu.sim.scenario": self.scenario.name,
            "otelgpu.sim.clock": self.clock,
        }

    def deactivate(self) -> None:
        """Unload the scenario: NVML calls fail until the next activation."""
        deactivate(self)

    def __repr__(self) -> str:
        return (
            f"SimGpu(scenario={self.scenario.name!r}, clock={self.clock!r}, "
            f"gpus={self.scenario.gpu_count})"
        )


def _event_kinds() -> tuple[str, ...]:
    from otelgpu.sim.scenario import EVENT_KINDS

    return tuple(EVENT_KINDS)


def _event_keys(kind: str) -> tuple[str, ...]:
    return _EVENT_KEYS[kind]


def _foreign_nvml() -> str | None:
    """Path of an NVML library mapped into this process that is not the simulator."""
    ours = os.path.realpath(_library.library_path())
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and "libnvidia-ml" in parts[5]:
            path = parts[5].strip()
            if os.path.realpath(path) != ours:
                return path
    return None


#: Frameworks that take "NVML lists GPUs" for "a CUDA driver is here" (vLLM's platform
#: detection counts GPUs through NVML, then loads libcuda.so.1), and the setting that
#: makes them use the CPU. Applied only where no CUDA driver exists, never overriding
#: the user's own value: simulated GPUs have no CUDA behind them.
FRAMEWORK_CPU_SETTINGS = {"VLLM_TARGET_DEVICE": "cpu"}


def cuda_driver_present() -> bool:
    """True when a CUDA driver library (``libcuda.so.1``) can be found on this machine."""
    import ctypes.util

    try:
        return ctypes.util.find_library("cuda") is not None
    except Exception:  # noqa: BLE001 - no ldconfig, odd platform: assume a driver
        return True


def framework_guard(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """Make CUDA frameworks in a simulated process use the CPU when there is no CUDA driver.

    Applied by the launchers (``OTELGPU_SIM``: ``otelgpu run``, ``opentelemetry-instrument``,
    plain ``python``; ``otelgpu sim run`` through :func:`env_for`), which activate the
    simulator before the program imports its framework; a program calling :func:`activate`
    itself decides on its own.

    Sets :data:`FRAMEWORK_CPU_SETTINGS` in ``env`` where they are unset; returns what it set.
    NVML clients (pynvml, nvitop, gpustat, otelgpu's sampler) still see the simulated GPUs.
    """
    if cuda_driver_present():
        return {}
    added = {k: v for k, v in FRAMEWORK_CPU_SETTINGS.items() if not env.get(k, "").strip()}
    for key, value in added.items():
        env[key] = value
    return added


def _check_clock(clock: str) -> None:
    if clock not in CLOCKS:
        raise ConfigurationError("clock", clock, "'virtual' or 'wall'")


def activate(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    clock: str = "virtual",
    *,
    epoch_ns: int | None = None,
) -> SimGpu:
    """Load ``scenario`` into the simulator of this process and return its handle.

    Call before any NVML client initialises. Re-activation (any scenario) resets every
    counter, clock and event set. Sets ``OTELGPU_NVML_LIBRARY`` to the simulator.
    Raises :class:`~otelgpu.sim.scenario.ScenarioError` for an invalid scenario and
    :class:`~otelgpu.sim._library.SimLibraryError` when a real NVML is already loaded
    or the library is not built.
    """
    global _active
    _check_clock(clock)
    sc = load_scenario(scenario)
    with _lock:
        foreign = _foreign_nvml()
        if foreign is not None:
            raise _library.SimLibraryError(
                f"a real NVML library ({foreign}) is already loaded in this process; activate the "
                "simulator before any NVML client initialises, or start the program with "
                "`otelgpu sim run SCENARIO -- COMMAND`"
            )
        lib = _library.load()
        text = sc.to_config(clock, epoch_ns if epoch_ns is not None else time.time_ns())
        _library.check(lib.otelgpu_sim_configure(text.encode()), lib, f"scenario {sc.name}")
        os.environ[ENV_NVML_LIBRARY] = _library.library_path()
        _active = SimGpu(sc, clock)
        return _active


def deactivate(sim: SimGpu | None = None) -> None:
    """Unload the active scenario (only if it is ``sim`` when given)."""
    global _active
    with _lock:
        if _active is None or (sim is not None and sim is not _active):
            return
        lib = _library.loaded()
        if lib is not None:
            lib.otelgpu_sim_unconfigure()
        _active = None


def active() -> SimGpu | None:
    """The active simulator of this process, or ``None``."""
    return _active


def write_config(scenario: Scenario, clock: str = "wall", epoch_ns: int | None = None) -> Path:
    """Write the normalized scenario to a private temporary file and return its path."""
    _check_clock(clock)
    text = scenario.to_config(clock, epoch_ns if epoch_ns is not None else time.time_ns())
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"otelgpu-sim-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"{scenario.name}-{digest}.conf"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


def env_for(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    clock: str = "wall",
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a child process that should see the simulated GPUs.

    Returns a full environment (``base``, default ``os.environ``, plus the simulator's
    variables). Unmodified NVML clients (pynvml, gpustat, nvidia-smi-like C tools) find
    the simulator through ``LD_LIBRARY_PATH``.
    """
    sc = load_scenario(scenario)
    env = dict(os.environ if base is None else base)
    lib_dir = str(_library.library_dir())
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = lib_dir + (os.pathsep + old if old else "")
    env[ENV_CONFIG] = str(write_config(sc, clock))
    env[ENV_NVML_LIBRARY] = _library.library_path()
    env[ENV_SIM] = str(scenario) if isinstance(scenario, (str, Path)) else sc.name
    env[ENV_CLOCK] = clock
    framework_guard(env)
    return env


def activate_from_env() -> SimGpu | None:
    """Use the simulator if ``OTELGPU_SIM`` is set (called by otelgpu's pipeline).

    Under ``otelgpu sim run`` (``OTELGPU_SIM_CONFIG`` set) the shared timeline of the
    run is kept: the library reads that file at nvmlInit. Otherwise the scenario is
    activated in-process with ``OTELGPU_SIM_CLOCK`` (default ``wall``). Returns
    ``None`` when ``OTELGPU_SIM`` is unset; an already active simulator is returned as
    is.
    """
    global _active
    name = os.environ.get(ENV_SIM, "").strip()
    if not name:
        return None
    with _lock:
        if _active is not None:
            return _active
        clock = os.environ.get(ENV_CLOCK, "wall").strip() or "wall"
        if clock not in CLOCKS:
            raise ConfigurationError(ENV_CLOCK, clock, "'virtual' or 'wall'")
        config = os.environ.get(ENV_CONFIG, "").strip()
        if config:
            sc = load_scenario(name)
            lib = _library.load()
            os.environ[ENV_NVML_LIBRARY] = _library.library_path()
            if not lib.otelgpu_sim_gpu_count():
                text = Path(config).read_text(encoding="utf-8")
                _library.check(lib.otelgpu_sim_configure(text.encode()), lib, f"scenario {config}")
            framework_guard(os.environ)
            _active = SimGpu(sc, clock)
            return _active
    sim = activate(name, clock=clock)
    framework_guard(os.environ)
    return sim


def _warn_once(sim: SimGpu) -> None:
    """One loud line per process: the simulator replaces NVML for every client in it."""
    global _warned
    if _warned:
        return
    _warned = True
    sc = sim.scenario
    _logger.warning(
        "otelgpu: SIMULATED GPUs -- %s=%s replaces libnvidia-ml.so.1 for this whole process: "
        "every NVML client (pynvml, torch, this sampler) sees %d simulated %s GPU(s) of "
        "scenario %r, clock %s; all telemetry is marked otelgpu.sim=true. Unset %s on a "
        "real GPU node.",
        ENV_SIM,
        os.environ.get(ENV_SIM, sc.name),
        sc.gpu_count,
        _model_name(sc),
        sc.name,
        sim.clock,
        ENV_SIM,
    )


def _model_name(sc: Scenario) -> str:
    names = {str(d.get("name", "?")) for d in sc.devices}
    return ", ".join(sorted(names)) if names else "?"


def activate_from_settings() -> SimGpu | None:
    """``OTELGPU_SIM`` for ``instrument()``: :func:`activate_from_env`, failing fast on a
    scenario that does not exist or does not validate, and announcing the simulator once.

    Raises:
        ConfigurationError: names ``OTELGPU_SIM`` (or ``OTELGPU_SIM_CLOCK``) and the
            accepted values (the built-in scenarios).
    """
    try:
        sim = activate_from_env()
    except ScenarioError as exc:
        name = os.environ.get(ENV_SIM, "").strip()
        available = ", ".join(list_scenarios())
        if exc.setting.endswith(": name") or exc.setting.endswith(": file"):
            raise ConfigurationError(
                ENV_SIM, name, f"a built-in scenario ({available}) or a path to a .toml file"
            ) from None
        raise ConfigurationError(
            ENV_SIM, name, f"a valid scenario ({exc}); built-in ones: {available}"
        ) from None
    except ConfigurationError:
        raise  # OTELGPU_SIM_CLOCK
    except Exception as exc:  # noqa: BLE001 - e.g. a real NVML already loaded: run without it
        _logger.warning("otelgpu: could not activate the simulated GPU: %s", exc)
        return None
    if sim is not None:
        _warn_once(sim)
    return sim


def resource_attributes() -> dict[str, Any]:
    """Resource attributes marking telemetry produced under simulation ({} otherwise)."""
    sim = _active
    if sim is not None:
        return sim.resource_attributes()
    name = os.environ.get(ENV_SIM, "").strip()
    if name:
        return {
            "otelgpu.sim": True,
            "otelgpu.sim.scenario": Path(name).stem if name.endswith(".toml") else name,
            "otelgpu.sim.clock": os.environ.get(ENV_CLOCK, "wall"),
        }
    return {}
