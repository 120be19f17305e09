"""Scenario validation: every key checked, every failure a :class:`ScenarioError` naming
the source, the dotted key and the accepted values.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otelgpu.sim._scenario_keys import (
    _DEFAULT_LIMIT,
    _DEVICE_KEYS,
    _DEVICE_LIMITS,
    _DRIVER_KEYS,
    _EVENT_COMMON,
    _EVENT_KEYS,
    _GIB,
    _MIB,
    _PATTERN_KEYS,
    _PATTERN_OPTIONAL,
    _PROCESS_KEYS,
    _TOP_KEYS,
    EVENT_KINDS,
    FEATURES,
    FORMAT_VERSION,
    INIT_ERRORS,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_PROCESSES,
    MAX_STEPS,
    THROTTLE_REASONS,
    ScenarioError,
)
from otelgpu.sim._scenario_model import Event, Pattern, Process, Scenario, _num
from otelgpu.sim.models import ARCHITECTURES, HGX_BUSES, model_defaults, model_names


class _Checker:
    """Validation helpers bound to one source (for error messages)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, value: object, accepted: str) -> ScenarioError:
        return ScenarioError(self.source, key, value, accepted)

    def table(self, key: str, value: object) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key, value, "a table")
        return value

    def keys(
        self, key: str, table: Mapping[str, Any], allowed: tuple[str, ...] | list[str]
    ) -> None:
        for k in table:
            if k not in allowed:
                where = f"{key}.{k}" if key else k
                raise self.fail(where, table[k], f"one of the keys {', '.join(allowed)}")

    def number(
        self,
        key: str,
        value: object,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        integer: bool = False,
    ) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
            what = "an integer" if integer else "a number"
            raise self.fail(key, value, _range_text(what, lo, hi, lo_open))
        # Integers are compared as integers: float(2**63 - 1) rounds up past the bound.
        v: float = value if integer else float(value)  # type: ignore[assignment,arg-type]
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
            what = "an integer" if integer else "a number"
            raise self.fail(key, value, _range_text(what, lo, hi, lo_open))
        return v

    def string(self, key: str, value: object, max_len: int = 95) -> str:
        if not isinstance(value, str) or not value or len(value) > max_len or "\n" in value:
            raise self.fail(
                key, value, f"a non-empty single-line string of at most {max_len} characters"
            )
        return value

    def boolean(self, key: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    def choice(self, key: str, value: object, choices: list[str] | tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.fail(key, value, f"one of {', '.join(repr(c) for c in choices)}")
        return value

    def pattern(self, key: str, value: object, *, lo: float | None, hi: float | None) -> Pattern:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.number(key, value, lo=lo, hi=hi)
            return Pattern("constant", {"value": float(value)})
        if not isinstance(value, Mapping):
            raise self.fail(
                key,
                value,
                f"{_range_text('a number', lo, hi, False)} or a pattern table {{kind = ...}}",
            )
        table = value
        kind = self.choice(f"{key}.kind", table.get("kind"), tuple(_PATTERN_KEYS))
        allowed = _PATTERN_KEYS[kind]
        self.keys(key, table, ("kind", *allowed))
        params: dict[str, Any] = {}
        for name in allowed:
            sub = f"{key}.{name}"
            if name not in table:
                if name in _PATTERN_OPTIONAL:
                    params[name] = _PATTERN_OPTIONAL[name]
                    continue
                raise self.fail(sub, None, f"a value (required for kind = {kind!r})")
            v = table[name]
            if name == "points":
                params[name] = self._points(sub, v, lo, hi)
            elif name == "seed":
                params[name] = int(self.number(sub, v, lo=0, hi=2**63 - 1, integer=True))
            elif name in ("period_s",):
                params[name] = self.number(sub, v, lo=0, lo_open=True)
            elif name.endswith("_s"):
                params[name] = self.number(sub, v, lo=0)
            else:
                params[name] = self.number(sub, v, lo=lo, hi=hi)
        if kind == "square" and params["low_s"] > params["period_s"]:
            raise self.fail(
                f"{key}.low_s", params["low_s"], f"a number <= period_s ({params['period_s']})"
            )
        if kind == "bursts" and params["burst_s"] > params["period_s"]:
            raise self.fail(
                f"{key}.burst_s", params["burst_s"], f"a number <= period_s ({params['period_s']})"
            )
        return Pattern(kind, params)

    def _points(
        self, key: str, value: object, lo: float | None, hi: float | None
    ) -> list[tuple[float, float]]:
        accepted = f"a list of 1 to {MAX_STEPS} [time_s, value] pairs with increasing times"
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_STEPS:
            raise self.fail(key, value, accepted)
        points: list[tuple[float, float]] = []
        for i, item in enumerate(value):
            if not isinstance(item, list) or len(item) != 2:
                raise self.fail(f"{key}[{i}]", item, accepted)
            t = self.number(f"{key}[{i}][0]", item[0], lo=0)
            v = self.number(f"{key}[{i}][1]", item[1], lo=lo, hi=hi)
            if points and t <= points[-1][0]:
                raise self.fail(f"{key}[{i}][0]", item[0], accepted)
            points.append((t, v))
        return points


def _range_text(what: str, lo: float | None, hi: float | None, lo_open: bool) -> str:
    if lo is not None and hi is not None:
        if lo_open:
            return f"{what} > {_num(lo)} and at most {_num(hi)}"
        return f"{what} in [{_num(lo)}, {_num(hi)}]"
    if lo is not None:
        return f"{what} {'>' if lo_open else '>='} {_num(lo)}"
    return what


def _check_device_key(c: _Checker, key: str, name: str, value: Any) -> Any:
    kind = _DEVICE_KEYS[name]
    if kind == "model":
        names = model_names()
        return c.choice(key, value, names)
    if kind == "str":  # lengths: the NVML buffers (serial 30, busId 32, name/UUID 96)
        return c.string(key, value, {"serial": 29, "pci_bus_id": 31}.get(name, 95))
    hi = _DEVICE_LIMITS.get(name, _DEFAULT_LIMIT)
    if kind == "uint":
        return int(c.number(key, value, lo=0, hi=hi, integer=True))
    if kind == "pos":
        return c.number(key, value, lo=0, lo_open=True, hi=hi)
    if kind == "nonneg":
        return c.number(key, value, lo=0, hi=hi)
    if kind == "float":
        return c.number(key, value, lo=-hi, hi=hi)
    if kind == "fraction":
        return c.number(key, value, lo=0, hi=1, lo_open=True)
    if kind == "bool":
        return c.boolean(key, value)
    if kind == "arch":
        return c.choice(key, value, tuple(ARCHITECTURES))
    if kind == "cc":
        if (
            isinstance(value, str)
            and value.count(".") == 1
            and all(p.isdigit() for p in value.split("."))
        ):
            major, minor = value.split(".")
            return (int(major), int(minor))
        raise c.fail(key, value, 'a "major.minor" string such as "9.0"')
    if kind == "features":
        if not isinstance(value, list):
            raise c.fail(key, value, f"a list of features from {', '.join(FEATURES)}")
        return [c.choice(f"{key}[{i}]", f, tuple(FEATURES)) for i, f in enumerate(value)]
    if kind == "percent_pattern":
        return c.pattern(key, value, lo=0, hi=100)
    return c.pattern(key, value, lo=0, hi=hi)  # "pattern": non-negative values


def _device_overrides(
    c: _Checker, key: str, table: Mapping[str, Any], extra: tuple[str, ...]
) -> dict[str, Any]:
    c.keys(key, table, (*extra, *_DEVICE_KEYS))
    return {
        name: _check_device_key(c, f"{key}.{name}" if key else name, name, v)
        for name, v in table.items()
        if name in _DEVICE_KEYS
    }


def parse_scenario(
    data: Mapping[str, Any], source: str = "<dict>", name: str | None = None
) -> Scenario:
    """Validate a scenario document (the parsed TOML) and resolve its devices."""
    c = _Checker(source)
    c.table("", data)
    c.keys("", data, _TOP_KEYS)
    if "version" not in data:
        raise c.fail("version", None, f"version = {FORMAT_VERSION}")
    if data["version"] != FORMAT_VERSION or isinstance(data["version"], bool):
        raise c.fail("version", data["version"], f"{FORMAT_VERSION} (the only format version)")
    sc_name = c.string("name", data.get("name", name or Path(source).stem or "scenario"))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise c.fail("description", description, "a string")
    duration = data.get("duration_s")
    if duration is not None:
        duration = c.number("duration_s", duration, lo=0, lo_open=True)

    driver_in = c.table("driver", data.get("driver", {}))
    c.keys("driver", driver_in, _DRIVER_KEYS)
    driver = {
        "version": c.string("driver.version", driver_in.get("version", "550.54.15"), 79),
        "nvml_version": "",
        "cuda_version": 12040,
        "init_error": None,
        "latency_ms": c.number(
            "driver.latency_ms", driver_in.get("latency_ms", 0.0), lo=0, hi=10000
        ),
    }
    driver["nvml_version"] = c.string(
        "driver.nvml_version", driver_in.get("nvml_version", f"12.{driver['version']}"), 79
    )
    cuda = driver_in.get("cuda_version", "12.4")
    if not (
        isinstance(cuda, str) and cuda.count(".") == 1 and all(p.isdigit() for p in cuda.split("."))
    ):
        raise c.fail("driver.cuda_version", cuda, 'a "major.minor" string such as "12.4"')
    major, minor = (int(p) for p in cuda.split("."))
    driver["cuda_version"] = major * 1000 + minor * 10
    if "init_error" in driver_in:
        driver["init_error"] = c.choice(
            "driver.init_error", driver_in["init_error"], tuple(INIT_ERRORS)
        )

    gpus_in = c.table("gpus", data.get("gpus", {}))
    count = int(c.number("gpus.count", gpus_in.get("count", 1), lo=1, hi=MAX_GPUS, integer=True))
    common = _device_overrides(c, "gpus", gpus_in, ("count",))
    per_gpu: dict[int, dict[str, Any]] = {}
    gpu_list = data.get("gpu", [])
    if not isinstance(gpu_list, list):
        raise c.fail("gpu", gpu_list, "an array of tables ([[gpu]])")
    for i, entry in enumerate(gpu_list):
        key = f"gpu[{i}]"
        entry = c.table(key, entry)
        if "index" not in entry:
            raise c.fail(f"{key}.index", None, f"an integer in [0, {count - 1}]")
        idx = int(c.number(f"{key}.index", entry["index"], lo=0, hi=count - 1, integer=True))
        if idx in per_gpu:
            raise c.fail(f"{key}.index", idx, "an index not already used by another [[gpu]] entry")
        per_gpu[idx] = _device_overrides(c, key, entry, ("index",))

    devices = tuple(
        _resolve_device(c, sc_name, i, common, per_gpu.get(i, {})) for i in range(count)
    )
    uuids = [d["uuid"] for d in devices]
    if len(set(uuids)) != len(uuids):
        raise c.fail("gpu.uuid", uuids, "a different UUID for every GPU")
    buses = [d["pci_bus_id"] for d in devices]
    if len(set(buses)) != len(buses):
        raise c.fail("gpu.pci_bus_id", buses, "a different PCI bus id for every GPU")

    processes = _parse_processes(c, data.get("process", []), devices)
    events = _parse_events(c, data.get("event", []), count)
    return Scenario(
        name=sc_name,
        description=description,
        source=source,
        driver=driver,
        devices=devices,
        processes=processes,
        events=events,
        duration_s=duration,
        raw=data,
    )


def _resolve_device(
    c: _Checker, sc_name: str, index: int, common: Mapping[str, Any], own: Mapping[str, Any]
) -> dict[str, Any]:
    model = own.get("model", common.get("model", "H100-SXM"))
    defaults = model_defaults(model)
    assert defaults is not None  # the key was validated
    # model tables use the scenario's own spelling: normalize them the same way
    dev = {k: _check_device_key(c, f"model {model}.{k}", k, v) for k, v in defaults.items()}
    dev.update({k: v for k, v in common.items() if k != "model"})
    dev.update({k: v for k, v in own.items() if k != "model"})
    dev["model"] = model
    where = f"gpu[{index}]"
    if "uuid" not in dev:
        dev["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"otelgpu-sim/{sc_name}/{index}"))
    if "serial" not in dev:
        dev["serial"] = f"165492{index:07d}"
    if "pci_bus_id" not in dev:
        bus = HGX_BUSES[index] if index < len(HGX_BUSES) else 0xE0 + index
        dev["pci_bus_id"] = f"00000000:{bus:02X}:00.0"
    if not dev["uuid"].startswith("GPU-"):
        raise c.fail(f"{where}.uuid", dev["uuid"], 'a string starting with "GPU-"')
    parts = dev["pci_bus_id"].replace(".", ":").split(":")
    if len(parts) != 4 or not all(
        p and all(ch in "0123456789abcdefABCDEF" for ch in p) for p in parts
    ):
        raise c.fail(
            f"{where}.pci_bus_id", dev["pci_bus_id"], 'a "DDDDDDDD:BB:DD.F" hexadecimal PCI address'
        )
    if dev["reserved_mib"] * _MIB >= dev["memory_gib"] * _GIB:
        raise c.fail(f"{where}.reserved_mib", dev["reserved_mib"], "less than the memory size")
    lo, hi = dev["min_power_limit_w"], dev["max_power_limit_w"]
    for k in ("power_limit_w", "default_power_limit_w"):
        if not lo <= dev[k] <= hi:
            raise c.fail(
                f"{where}.{k}",
                dev[k],
                f"a number in [min_power_limit_w, max_power_limit_w] = [{_num(lo)}, {_num(hi)}]",
            )
    if dev["idle_power_w"] > dev["max_power_w"]:
        raise c.fail(
            f"{where}.idle_power_w",
            dev["idle_power_w"],
            f"a number <= max_power_w ({_num(dev['max_power_w'])})",
        )
    if "utilization" not in dev:
        dev["utilization"] = Pattern("constant", {"value": 0.0})
    if dev["ecc"] is False and "ecc" not in dev["unsupported"]:
        dev["unsupported"] = [*dev["unsupported"], "ecc"]
    return dev


def _gpu_ref(c: _Checker, key: str, value: object, count: int, allow_all: bool) -> int | None:
    if allow_all and value == "all":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count:
        return value
    accepted = f"an integer in [0, {count - 1}]" + (' or "all"' if allow_all else "")
    raise c.fail(key, value, accepted)


def _parse_processes(
    c: _Checker, items: object, devices: tuple[Mapping[str, Any], ...]
) -> tuple[Process, ...]:
    if not isinstance(items, list):
        raise c.fail("process", items, "an array of tables ([[process]])")
    out: list[Process] = []
    pids: set[tuple[int, int]] = set()
    for i, item in enumerate(items):
        key = f"process[{i}]"
        t = c.table(key, item)
        c.keys(key, t, _PROCESS_KEYS)
        for req in ("gpu", "pid", "memory_gib"):
            if req not in t:
                raise c.fail(f"{key}.{req}", None, "a value (required)")
        gpus = _gpu_ref(c, f"{key}.gpu", t["gpu"], len(devices), allow_all=True)
        pid = int(c.number(f"{key}.pid", t["pid"], lo=1, hi=2**31 - 1, integer=True))
        mem = c.number(f"{key}.memory_gib", t["memory_gib"], lo=0)
        start = c.number(f"{key}.start_s", t.get("start_s", 0.0), lo=0)
        end = t.get("end_s")
        if end is not None:
            end = c.number(f"{key}.end_s", end, lo=start, lo_open=True)
        sm = t.get("sm_util")
        if sm is not None:
            sm = c.number(f"{key}.sm_util", sm, lo=0, hi=100)
        ptype = c.choice(f"{key}.type", t.get("type", "compute"), ("compute", "graphics"))
        name = c.string(f"{key}.name", t.get("name", f"process-{pid}"), 127)
        for g in range(len(devices)) if gpus is None else [gpus]:
            if (g, pid) in pids:
                raise c.fail(f"{key}.pid", pid, "a pid not already running on that GPU")
            pids.add((g, pid))
            if mem * _GIB > devices[g]["memory_gib"] * _GIB:
                raise c.fail(
                    f"{key}.memory_gib",
                    mem,
                    f"at most the GPU's memory ({devices[g]['memory_gib']} GiB)",
                )
            out.append(Process(g, pid, name, mem, start, end, sm, ptype))
    if len(out) > MAX_PROCESSES:
        raise c.fail(
            "process", f"{len(out)} processes", f"at most {MAX_PROCESSES} (per GPU, summed)"
        )
    return tuple(out)


def _parse_events(c: _Checker, items: object, count: int) -> tuple[Event, ...]:
    if not isinstance(items, list):
        raise c.fail("event", items, "an array of tables ([[event]])")
    if len(items) > MAX_EVENTS:
        raise c.fail("event", f"{len(items)} events", f"at most {MAX_EVENTS}")
    events: list[tuple[int, Event]] = []
    for i, item in enumerate(items):
        key = f"event[{i}]"
        t = c.table(key, item)
        kind = c.choice(f"{key}.kind", t.get("kind"), tuple(EVENT_KINDS))
        c.keys(key, t, (*_EVENT_COMMON, *_EVENT_KEYS[kind]))
        if "at_s" not in t:
            raise c.fail(f"{key}.at_s", None, "a number >= 0 (required)")
        at = c.number(f"{key}.at_s", t["at_s"], lo=0)
        gpu = _gpu_ref(c, f"{key}.gpu", t.get("gpu", 0), count, allow_all=True)
        params = _event_params(c, key, kind, t)
        events.append((i, Event(kind, at, gpu, params)))
    _check_overlaps(c, events)
    return tuple(ev for _, ev in sorted(events, key=lambda p: (p[1].at_s, p[0])))


def _event_params(c: _Checker, key: str, kind: str, t: Mapping[str, Any]) -> dict[str, Any]:
    p: dict[str, Any] = {}
    if kind == "xid":
        if "code" not in t:
            raise c.fail(f"{key}.code", None, "an Xid number in [1, 999] (required)")
        p["code"] = int(c.number(f"{key}.code", t["code"], lo=1, hi=999, integer=True))
        # Xid 48 only: what a real Ampere+ board raises with it (docs/simulator.md)
        p["contained"] = c.boolean(f"{key}.contained", t.get("contained", True))
        p["companions"] = c.boolean(f"{key}.companions", t.get("companions", True))
    elif kind == "ecc":
        p["corrected"] = int(
            c.number(f"{key}.corrected", t.get("corrected", 0), lo=0, integer=True)
        )
        p["uncorrected"] = int(
            c.number(f"{key}.uncorrected", t.get("uncorrected", 0), lo=0, integer=True)
        )
        p["duration_s"] = c.number(f"{key}.duration_s", t.get("duration_s", 0.0), lo=0)
        if p["corrected"] == 0 and p["uncorrected"] == 0:
            raise c.fail(f"{key}.corrected", 0, "corrected or uncorrected > 0")
    elif kind == "throttle":
        reason = t.get("reason")
        reasons = reason if isinstance(reason, list) else [reason]
        if not reasons:
            raise c.fail(
                f"{key}.reason", reason, f"one of {', '.join(THROTTLE_REASONS)} (or a list)"
            )
        p["reason"] = [c.choice(f"{key}.reason", r, tuple(THROTTLE_REASONS)) for r in reasons]
        if "duration_s" not in t:
            raise c.fail(f"{key}.duration_s", None, "a number > 0 (required)")
        p["duration_s"] = c.number(f"{key}.duration_s", t["duration_s"], lo=0, lo_open=True)
        p["clock_factor"] = c.number(
            f"{key}.clock_factor", t.get("clock_factor", 0.6), lo=0, hi=1, lo_open=True
        )
        p["power_cap_w"] = c.number(f"{key}.power_cap_w", t.get("power_cap_w", 0.0), lo=0)
    elif kind == "remap":
        p["correctable"] = int(
            c.number(f"{key}.correctable", t.get("correctable", 0), lo=0, integer=True)
        )
        p["uncorrectable"] = int(
            c.number(f"{key}.uncorrectable", t.get("uncorrectable", 0), lo=0, integer=True)
        )
        p["pending"] = c.boolean(f"{key}.pending", t.get("pending", False))
        p["failure"] = c.boolean(f"{key}.failure", t.get("failure", False))
    elif kind == "slow":
        if "latency_ms" not in t:
            raise c.fail(f"{key}.latency_ms", None, "a number in [0, 10000] (required)")
        p["latency_ms"] = c.number(f"{key}.latency_ms", t["latency_ms"], lo=0, hi=10000)
        if "duration_s" not in t:
            raise c.fail(f"{key}.duration_s", None, "a number > 0 (required)")
        p["duration_s"] = c.number(f"{key}.duration_s", t["duration_s"], lo=0, lo_open=True)
    return p


def _check_overlaps(c: _Checker, events: list[tuple[int, Event]]) -> None:
    """Windows of the same kind on the same GPU must not overlap; a GPU is lost once.

    A sweep by start time per kind: only windows still open are compared, so a
    scenario with thousands of events validates in linear-ish time."""
    windowed = ("throttle", "slow", "ecc")
    by_kind: dict[str, list[tuple[int, Event]]] = {}
    for i, e in events:
        if e.kind == "gpu_lost" or (e.kind in windowed and e.end_s > e.at_s):
            by_kind.setdefault(e.kind, []).append((i, e))
    for kind, items in by_kind.items():
        items.sort(key=lambda p: (p[1].at_s, p[0]))
        open_: list[tuple[int, Event]] = []
        for i, a in items:
            if kind != "gpu_lost":
                open_ = [(j, b) for j, b in open_ if b.end_s > a.at_s]
            for j, b in open_:
                if a.gpu is not None and b.gpu is not None and a.gpu != b.gpu:
                    continue
                (late, x), (early, y) = ((i, a), (j, b)) if i > j else ((j, b), (i, a))
                if kind == "gpu_lost":
                    raise c.fail(
                        f"event[{late}]",
                        "gpu_lost",
                        f"at most one gpu_lost per GPU (event[{early}] already drops it)",
                    )
                other = f"{y.kind} [{_num(y.at_s)}, {_num(y.end_s)}) s on the same GPU"
                raise c.fail(
                    f"event[{late}]",
                    f"{x.kind} [{_num(x.at_s)}, {_num(x.end_s)}) s",
                    f"a window that does not overlap event[{early}] ({other})",
                )
            open_.append((i, a))
