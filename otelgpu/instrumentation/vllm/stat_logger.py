"""The vLLM stat logger: a thin shim over :mod:`._recorder` (this module imports vLLM).

vLLM finds it through the ``vllm.stat_logger_plugins`` entry point (``otelgpu``) in every
``AsyncLLM`` -- ``vllm serve``, the gRPC server, programmatic ``AsyncLLM`` -- and builds one
instance per data-parallel engine in the front-end process. Code that builds engines itself
adds it explicitly::

    from otelgpu.instrumentation.vllm import OtelGpuStatLogger
    engine = LLMEngine.from_engine_args(args, stat_loggers=[OtelGpuStatLogger])

vLLM's loader requires a real ``StatLoggerBase`` subclass, hence the import of vLLM here;
nothing else in otelgpu imports this module except on request.

Contract with vLLM (0.10 - 0.34): ``record()`` runs inline on the serving event loop once per
engine-core output batch; it never raises and costs a few microseconds plus one span per
finished request (``benchmarks/results/vllm.md``). A second instance for the same config and
engine (the plugin *and* an explicit ``stat_loggers=``) records nothing, so nothing is
counted twice.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.vllm._recorder import EngineRecorder

_logger = logging.getLogger("otelgpu.instrumentation.vllm")

_active_lock = threading.Lock()
# id(vllm_config) -> (weak reference to it, engine indexes already recorded). Keyed by id:
# VllmConfig is an unhashable (mutable) dataclass; the weak reference's callback drops the
# entry when the config dies, so an id reused later starts afresh.
_active: dict[int, tuple[weakref.ref[Any], set[int]]] = {}


def _on_collected(config_id: int, _ref: object) -> None:
    with _active_lock:
        _active.pop(config_id, None)


def _claim(vllm_config: object, engine_index: int) -> bool:
    """True the first time ``(vllm_config, engine_index)`` is seen."""
    key = id(vllm_config)
    with _active_lock:
        entry = _active.get(key)
        if entry is None or entry[0]() is not vllm_config:
            try:
                ref = weakref.ref(vllm_config, functools.partial(_on_collected, key))
            except TypeError:  # not weak-referenceable: cannot deduplicate, record anyway
                return True
            entry = (ref, set())
            _active[key] = entry
        if engine_index in entry[1]:
            return False
        entry[1].add(engine_index)
        return True


class OtelGpuStatLogger(StatLoggerBase):
    """Per-engine vLLM stat logger exporting otelgpu metrics and request spans.

    Args:
        vllm_config: the engine's ``VllmConfig`` (parallel sizes, served model name).
        engine_index: the data-parallel engine index.

    Raises:
        ConfigurationError: an ``OTELGPU_VLLM_*`` variable is invalid (at engine start).
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.recorder: EngineRecorder | None = None
        if not _claim(vllm_config, engine_index):
            _logger.debug(
                "otelgpu: engine %d already has an otelgpu stat logger; this one is idle",
                engine_index,
            )
            return
        try:
            from otelgpu.instrumentation.vllm._setup import build_recorder

            self.recorder = build_recorder(vllm_config, engine_index)
        except ConfigurationError:
            raise
        except Exception as exc:  # the engine must start even if otelgpu cannot
            _logger.warning("otelgpu: vLLM stat logger disabled: %r", exc, exc_info=True)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
        **kwargs: Any,
    ) -> None:
        """Records one output batch (vLLM's event loop; never raises)."""
        recorder = self.recorder
        if recorder is not None:
            recorder.record(scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        """Records the engine's cold-start time and span."""
        recorder = self.recorder
        if recorder is not None:
            recorder.engine_initialized()

    def log(self) -> None:
        """vLLM's periodic log hook: nothing to do, export runs on otelgpu's own schedule."""

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        """Sleep mode is not reported (yet)."""
