"""A host program for the reliability probes (run as a subprocess).

``python host.py '<json config>'`` runs a training-like loop under ``otelgpu.instrument()``
and prints one JSON line of what the host felt. Config keys (all optional):

* ``instrument``: keyword arguments of ``instrument()``;
* ``sim``: a scenario name or table, activated in-process (wall clock) before instrument;
* ``inject``: ``[{"at_s": 1.0, "kind": "xid", "gpu": 1, "code": 48, "repeat": 1}, ...]``;
* ``duration_s`` (3) or ``steps`` (a fixed number of steps instead of a duration);
* ``work_us`` (1000): busy work per step; ``mode``: ``step`` or ``request``;
* ``models`` (1): distinct model names cycled through by requests;
* ``model_prefix``: prefix of the model names; ``model_len``: pad model names to this length;
* ``rss_every`` (0): sample RSS every this many steps (0: start and end only);
* ``fsize_limit``: bytes; RLIMIT_FSIZE for the host (a full disk);
* ``shutdown`` (true): call ``otelgpu.shutdown()`` (timed) at the end.

Output: ``steps``, ``p50_ms``/``p99_ms``/``max_ms`` of the host's step time (instrumentation
included), ``rss_mb`` samples, ``per_call_us`` (wall) and ``per_call_cpu_us`` (the
process's CPU time, all threads; with ``steps``) per decile, ``shutdown_s``, ``dropped``,
``errors``, ``health`` (records on the ``otelgpu.health`` logger), ``warnings`` (on
``otelgpu``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import time
from typing import Any

_START = time.monotonic()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


def _busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _injector(gpu: Any, plan: list[dict[str, Any]], t0: float) -> None:
    for item in sorted(plan, key=lambda p: p["at_s"]):
        delay = t0 + item["at_s"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        params = {k: v for k, v in item.items() if k not in ("at_s", "repeat")}
        for _ in range(int(item.get("repeat", 1))):
            gpu.inject(**params)


def main(cfg: dict[str, Any]) -> dict[str, Any]:
    health, warnings = _Count(), _Count()
    logging.getLogger("otelgpu.health").addHandler(health)
    logging.getLogger("otelgpu").addHandler(warnings)
    logging.getLogger("otelgpu").setLevel(logging.INFO)
    if cfg.get("fsize_limit"):  # a full disk: writes past the limit fail with EFBIG
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize_limit"], cfg["fsize_limit"]))
    gpu = None
    if cfg.get("sim") is not None:
        from otelgpu import sim

        gpu = sim.activate(cfg["sim"], clock="wall")
    import otelgpu

    rss = [round(rss_mb(), 1)]
    t_inst = time.monotonic()
    handle = otelgpu.instrument(**cfg.get("instrument", {}))
    instrument_s = time.monotonic() - t_inst
    t0 = time.monotonic()
    if gpu is not None and cfg.get("inject"):
        threading.Thread(target=_injector, args=(gpu, cfg["inject"], t0), daemon=True).start()
    mode, work = cfg.get("mode", "step"), float(cfg.get("work_us", 1000))
    models = int(cfg.get("models", 1))
    prefix = cfg.get("model_prefix", "model")
    pad = int(cfg.get("model_len", 0))
    names = [f"{prefix}-{i}".ljust(pad, "x") for i in range(min(models, 1000))]
    steps_goal = cfg.get("steps")
    duration = float(cfg.get("duration_s", 3.0))
    rss_every = int(cfg.get("rss_every", 0))
    times: list[float] = []
    # process CPU time (every thread: the host's and otelgpu's) at each tenth's boundary,
    # with ``steps`` set: what the calls cost, whatever else loads the machine
    cpu_marks = [time.process_time()]
    tenth = int(steps_goal) // 10 if steps_goal else 0
    n = 0
    while (n < steps_goal) if steps_goal else (time.monotonic() - t0 < duration):
        s = time.perf_counter()
        if mode == "request":
            name = names[n % len(names)] if models <= 1000 else f"{prefix}-{n % models}"
            with otelgpu.request(model=name) as r:
                _busy(work)
                r.first_token()
                r.tokens(4)
        else:
            with otelgpu.step(samples=32):
                _busy(work)
        times.append(time.perf_counter() - s)
        n += 1
        if rss_every and n % rss_every == 0:
            rss.append(round(rss_mb(), 1))
        if tenth and n % tenth == 0:
            cpu_marks.append(time.process_time())
    rss.append(round(rss_mb(), 1))
    loop_s = time.monotonic() - _START
    ordered = sorted(times)

    def q(p: float) -> float:
        return round(ordered[min(int(p * len(ordered)), len(ordered) - 1)] * 1e3, 3)

    deciles = []
    for d in range(10):
        part = times[d * len(times) // 10 : (d + 1) * len(times) // 10]
        deciles.append(round(sum(part) / max(len(part), 1) * 1e6 - work, 2))
    return {
        "steps": n,
        "loop_s": round(loop_s, 3),
        "instrument_s": round(instrument_s, 3),
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "max_ms": round(ordered[-1] * 1e3, 3) if ordered else 0.0,
        "rss_mb": rss,
        "per_call_us": deciles,
        "per_call_cpu_us": [
            round((b - a) / tenth * 1e6 - work, 2) for a, b in itertools.pairwise(cpu_marks)
        ]
        if tenth
        else [],
        "health": health.records[:200],
        "health_count": len(health.records),
        "warnings": [w for w in warnings.records if not w.startswith("DEBUG")][:50],
        "recording": str(handle.recording_path) if handle.recording_path else None,
    }


def _counts(stats: Any) -> dict[str, Any]:
    dropped = {f"{s}/{r}": c for (s, r), c in (stats.dropped() if stats else {}).items()}
    return {"dropped": dropped, "errors": dict(stats.errors()) if stats else {}}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    result = main(config)
    import otelgpu
    from otelgpu import _api

    handle = _api._handle
    stats = handle.runtime.stats if handle is not None and handle.runtime is not None else None
    # first what the loop saw (in case shutdown never returns), then the shutdown
    print("HOST-RESULT " + json.dumps({**result, **_counts(stats)}), flush=True)
    t_shut = time.monotonic()
    if config.get("shutdown", True):
        otelgpu.shutdown()
    shutdown_s = round(time.monotonic() - t_shut, 3)
    print("HOST-SHUTDOWN " + json.dumps({"shutdown_s": shutdown_s, **_counts(stats)}), flush=True)
