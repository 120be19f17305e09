"""A scripted vLLM front end: request timelines pushed through vLLM's *real* stats classes.

Each :class:`ScriptedRequest` is a timeline on one clock (seconds): arrival, queueing,
scheduling, first token, one token per ``itl_s`` gap, finish. :func:`batches` replays all
of them the way ``AsyncLLM``'s output handler does -- one ``IterationStats`` per engine-core
output batch, filled by vLLM's own ``IterationStats.update_from_output`` and
``update_from_finished_request`` from ``EngineCoreOutput`` / ``EngineCoreEvent`` objects --
so every field the stat logger sees (TTFT list, ITL list, e2e, queue/prefill/decode times,
mean TPOT) is computed by vLLM's code, not by the test.

Engine-core timestamps are monotonic in vLLM; here they are ``wall - ENGINE_OFFSET_S``, a
different clock from the front end's, as in a real deployment.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

ENGINE_OFFSET_S = 1_000_000.0
"""Front-end wall clock minus engine-core monotonic clock in the script."""


@dataclass
class ScriptedRequest:
    """One request's timeline (wall-clock seconds) and outcome."""

    request_id: str
    arrival: float
    queue_s: float
    prefill_s: float
    itl_s: list[float]  # gaps after the first token; len = output tokens - 1
    finish_reason: str = "stop"  # stop | length | abort | error
    prompt_tokens: int = 128
    cached_tokens: int = 0
    scheduled: bool = True  # False: aborted while waiting (no token ever produced)
    trace_headers: dict[str, str] | None = None
    step_s: float = 0.0  # > 0: tokens come out on the engine's step grid, as in vLLM

    @property
    def queued(self) -> float:
        return self.arrival + 0.0002  # tokenisation before the engine queues it

    @property
    def token_times(self) -> list[float]:
        if not self.scheduled:
            return []
        raw = [self.queued + self.queue_s + self.prefill_s]
        for gap in self.itl_s:
            raw.append(raw[-1] + gap)
        if self.step_s <= 0:
            return raw
        step = self.step_s
        times: list[float] = []
        for t in raw:  # the end of the engine step the token was produced in
            q = math.ceil(t / step) * step
            times.append(q if not times or q > times[-1] else times[-1] + step)
        return times

    @property
    def first_token(self) -> float:
        return self.token_times[0]

    @property
    def end(self) -> float:
        times = self.token_times
        return times[-1] if times else self.queued + self.queue_s

    @property
    def e2e(self) -> float:
        return self.end - self.arrival

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)


@dataclass
class Batch:
    """What one ``StatLoggerBase.record`` call receives."""

    scheduler_stats: Any
    iteration_stats: Any
    requests_finished: list[ScriptedRequest] = field(default_factory=list)


def import_vllm() -> SimpleNamespace:
    """vLLM's real classes (one import per session: it takes seconds).

    vLLM picks its platform once, probing NVML: a simulated GPU active at that moment
    would look like CUDA (and vLLM would then fail to load its CUDA kernels). The probe
    therefore runs with any active simulator paused; vLLM settles on its CPU-less
    ``UnspecifiedPlatform``, as on a plain CPU host.
    """
    from otelgpu import sim

    paused = sim.active()
    if paused is not None:
        sim.deactivate(paused)
    try:
        import vllm
        from vllm import config, platforms, plugins
        from vllm.v1 import engine
        from vllm.v1.metrics import loggers, stats

        assert platforms.current_platform.device_type != "cuda"
    finally:
        if paused is not None:
            sim.activate(paused.scenario, clock=paused.clock)

    # The names tests use, each taken from its module under its own name.
    exports: dict[ModuleType, tuple[str, ...]] = {
        config: ("VllmConfig", "DeviceConfig", "ParallelConfig"),
        plugins: ("STAT_LOGGER_PLUGINS_GROUP", "load_plugins_by_group"),
        engine: ("EngineCoreEvent", "EngineCoreEventType", "EngineCoreOutput", "FinishReason"),
        loggers: (
            "PerEngineStatLoggerAdapter",
            "StatLoggerBase",
            "load_stat_logger_plugin_factories",
        ),
        stats: (
            "FinishedRequestStats",
            "IterationStats",
            "LoRARequestStates",
            "PrefillStats",
            "PrefixCacheStats",
            "RequestStateStats",
            "SchedulerStats",
        ),
    }
    found = {name: getattr(module, name) for module, names in exports.items() for name in names}
    return SimpleNamespace(vllm=vllm, **found)


def vllm_config(v: SimpleNamespace, tp: int = 1, pp: int = 1, dp: int = 1) -> Any:
    """A real ``VllmConfig`` for a CPU host (no model: the stat logger needs none)."""
    parallel = v.ParallelConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        data_parallel_size_local=dp,
    )
    return v.VllmConfig(device_config=v.DeviceConfig(device="cpu"), parallel_config=parallel)


def batches(
    v: SimpleNamespace,
    requests: list[ScriptedRequest],
    *,
    with_scheduler_stats: bool = True,
    ipc_s: float = 0.0003,
) -> list[Batch]:
    """The output batches of ``requests``, in time order (see the module docstring).

    A batch is emitted at every instant at which some request produces a token or ends;
    the front end stamps it ``ipc_s`` after the engine produced it.
    """
    reason_of = {
        "stop": v.FinishReason.STOP,
        "length": v.FinishReason.LENGTH,
        "abort": v.FinishReason.ABORT,
        "error": v.FinishReason.ERROR,
    }
    # instant -> [(request, token index or -1 for "ends without a token")]
    timeline: dict[float, list[tuple[ScriptedRequest, int]]] = {}
    for r in requests:
        times = r.token_times
        if not times:
            timeline.setdefault(round(r.end, 9), []).append((r, -1))
        for i, t in enumerate(times):
            timeline.setdefault(round(t, 9), []).append((r, i))
    states: dict[str, Any] = {}
    lora = v.LoRARequestStates(log_stats=False)
    out: list[Batch] = []
    arrived = sorted(requests, key=lambda r: r.arrival)
    for instant in sorted(timeline):
        it = v.IterationStats()
        it.iteration_timestamp = instant + ipc_s
        engine_ts = instant - ENGINE_OFFSET_S
        finished: list[ScriptedRequest] = []
        for r, i in timeline[instant]:
            st = states.get(r.request_id)
            if st is None:
                st = states[r.request_id] = v.RequestStateStats(arrival_time=r.arrival)
            if i >= 0:
                events = None
                prefill = None
                if i == 0:
                    events = [
                        v.EngineCoreEvent(v.EngineCoreEventType.QUEUED, r.queued - ENGINE_OFFSET_S),
                        v.EngineCoreEvent(
                            v.EngineCoreEventType.SCHEDULED,
                            r.queued + r.queue_s - ENGINE_OFFSET_S,
                        ),
                    ]
                    prefill = v.PrefillStats()
                    prefill.set(r.prompt_tokens, r.cached_tokens, 0)
                output = v.EngineCoreOutput(
                    request_id=r.request_id,
                    new_token_ids=[7],
                    events=events,
                    prefill_stats=prefill,
                )
                it.update_from_output(output, engine_ts, i == 0, st, lora, None)
            else:
                # Aborted while waiting: vLLM saw the QUEUED event, nothing else.
                st.queued_ts = r.queued - ENGINE_OFFSET_S
            if i == -1 or i == r.output_tokens - 1:
                it.update_from_finished_request(
                    finish_reason=reason_of[r.finish_reason],
                    request_id=r.request_id,
                    num_prompt_tokens=r.prompt_tokens,
                    max_tokens_param=256,
                    req_stats=st,
                    num_cached_tokens=r.cached_tokens,
                )
                finished.append(r)
        sched = None
        if with_scheduler_stats:
            running = sum(
                1 for r in arrived if r.scheduled and r.queued + r.queue_s <= instant <= r.end
            )
            waiting = sum(1 for r in arrived if r.arrival <= instant < r.queued + r.queue_s)
            prefix = v.PrefixCacheStats()
            for r, i in timeline[instant]:
                if i == 0:
                    prefix.record(r.prompt_tokens, r.cached_tokens, preempted=False)
            sched = v.SchedulerStats(
                num_running_reqs=running,
                num_waiting_reqs=waiting,
                kv_cache_usage=min(1.0, running / 64),
                prefix_cache_stats=prefix,
            )
        out.append(Batch(sched, it, finished))
    return out


def burst(
    n: int = 2000,
    *,
    seed: int = 11,
    start: float = 1_700_000_000.0,
    qps: float = 200.0,
    abort_rate: float = 0.03,
    error_rate: float = 0.01,
    slow_rate: float = 0.05,
    step_s: float = 0.005,
) -> list[ScriptedRequest]:
    """A burst of ``n`` requests: log-normal latencies, a slow tail, some aborts and errors.

    ``slow_rate`` of the requests queue 10-40x longer (the tail that p99 must catch).
    """
    rng = random.Random(seed)
    out = []
    t = start
    for k in range(n):
        t += rng.expovariate(qps)
        slow = rng.random() < slow_rate
        queue = rng.lognormvariate(math.log(0.02), 0.5) * (rng.uniform(10, 40) if slow else 1)
        prefill = rng.lognormvariate(math.log(0.05), 0.3)
        tokens = rng.randint(1, 32)
        itl = [rng.lognormvariate(math.log(0.02), 0.25) for _ in range(tokens - 1)]
        u = rng.random()
        reason = "abort" if u < abort_rate else "error" if u < abort_rate + error_rate else "stop"
        scheduled = not (reason == "abort" and rng.random() < 0.3)
        if reason == "stop" and tokens == 32:
            reason = "length"
        out.append(
            ScriptedRequest(
                request_id=f"req-{k}",
                arrival=t,
                queue_s=queue,
                prefill_s=prefill,
                itl_s=itl,
                finish_reason=reason,
                prompt_tokens=rng.randint(16, 512),
                cached_tokens=rng.choice((0, 0, 16)),
                scheduled=scheduled,
                step_s=step_s,
            )
        )
    return out
