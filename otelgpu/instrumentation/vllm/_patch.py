"""Reversible wrappers around vLLM entry points (``wrapt``), applied lazily.

Nothing here imports vLLM: each wrapper is applied when its module is already imported, or
by a post-import hook the moment vLLM imports it -- so ``opentelemetry-instrument python
train.py`` on a machine that merely *has* vLLM installed never pays vLLM's multi-second
import.

* ``add_request`` (``AsyncLLM`` and ``LLMEngine``): remembers the request's incoming trace
  context in :data:`otelgpu.instrumentation.vllm._context.REGISTRY` before vLLM sees it
  (``AsyncLLM`` drops ``trace_headers`` when its own tracing is off).
* ``LLMEngine.from_engine_args`` / ``from_vllm_config`` (the offline ``LLM`` class and
  direct ``LLMEngine`` users, which never load stat-logger plugins): turn stats on and add
  :class:`OtelGpuStatLogger`. Opt-in through ``VllmInstrumentor().instrument()``.

Wrappers never raise anything of their own: a failure to inspect the arguments leaves the
call untouched.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import wrapt

from otelgpu.instrumentation.vllm._context import REGISTRY, TraceContextRegistry

ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"
LLM_ENGINE_MODULE = "vllm.v1.engine.llm_engine"

# (module, class, method): add_request takes request_id first and trace_headers seventh.
TRACE_CONTEXT_TARGETS: tuple[tuple[str, str, str], ...] = (
    (ASYNC_LLM_MODULE, "AsyncLLM", "add_request"),
    (LLM_ENGINE_MODULE, "LLMEngine", "add_request"),
)
OFFLINE_TARGETS: tuple[tuple[str, str, str], ...] = (
    (LLM_ENGINE_MODULE, "LLMEngine", "from_engine_args"),
    (LLM_ENGINE_MODULE, "LLMEngine", "from_vllm_config"),
)
_TRACE_HEADERS_POSITION = 6

_lock = threading.Lock()
_wanted: dict[tuple[str, str, str], Callable[..., Any]] = {}
_applied: set[tuple[str, str, str]] = set()
_hooked_modules: set[str] = set()


def add_request(registry: TraceContextRegistry) -> Callable[..., Any]:
    """Wrapper factory for ``AsyncLLM.add_request`` / ``LLMEngine.add_request``."""

    def traced_add_request(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            # Called through the class with an explicit, foreign self: skip it.
            explicit_self = instance is None and args and not isinstance(args[0], str)
            args_ = args[1:] if explicit_self else args
            request_id = args_[0] if args_ else kwargs.get("request_id")
            if "trace_headers" in kwargs:
                headers = kwargs["trace_headers"]
            elif len(args_) > _TRACE_HEADERS_POSITION:
                headers = args_[_TRACE_HEADERS_POSITION]
            else:
                headers = None
            registry.capture(request_id, headers)
        except Exception:  # noqa: BLE001 - our bookkeeping must never fail a request
            pass
        return wrapped(*args, **kwargs)

    return traced_add_request


def llm_engine_factory(resolve: Callable[[], Any]) -> Callable[..., Any]:
    """Wrapper factory for ``LLMEngine.from_engine_args`` / ``from_vllm_config``.

    Adds the stat logger class ``resolve()`` returns (resolved at call time, when vLLM is
    imported anyway) to ``stat_loggers=`` (unless present) and turns vLLM's stats on
    (``disable_log_stats``), which the offline ``LLM`` class turns off by default.
    """

    def instrumented_factory(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            stat_logger = resolve()
            if len(args) > 2:  # (config or args, usage_context, stat_loggers, ...)
                loggers = list(args[2] or ())
                if stat_logger not in loggers:
                    loggers.append(stat_logger)
                args = (*args[:2], loggers, *args[3:])
            else:
                loggers = list(kwargs.get("stat_loggers") or ())
                if stat_logger not in loggers:
                    loggers.append(stat_logger)
                kwargs["stat_loggers"] = loggers
            first = args[0] if args else kwargs.get("engine_args", kwargs.get("vllm_config"))
            if first is not None and getattr(first, "disable_log_stats", False) is True:
                first.disable_log_stats = False  # EngineArgs (from_engine_args)
            if kwargs.get("disable_log_stats") is True:
                kwargs["disable_log_stats"] = False  # from_vllm_config
        except Exception:  # noqa: BLE001 - leave the call untouched rather than fail it
            pass
        return wrapped(*args, **kwargs)

    return instrumented_factory


def _apply(target: tuple[str, str, str], module: ModuleType) -> None:
    with _lock:
        wrapper = _wanted.get(target)
        if wrapper is None or target in _applied:
            return
        _, cls_name, method = target
        cls = getattr(module, cls_name, None)
        if cls is None or not hasattr(cls, method):
            return  # this vLLM has no such entry point; nothing to wrap
        wrapt.wrap_function_wrapper(cls, method, wrapper)
        _applied.add(target)


def _on_import(module: ModuleType) -> None:
    for target in list(_wanted):
        if target[0] == module.__name__:
            _apply(target, module)


def wrap(target: tuple[str, str, str], wrapper: Callable[..., Any]) -> None:
    """Wraps ``target`` now if its module is imported, else when it gets imported."""
    module_name = target[0]
    with _lock:
        _wanted[target] = wrapper
        hook_needed = module_name not in _hooked_modules
        _hooked_modules.add(module_name)
    module = sys.modules.get(module_name)
    if module is not None:
        _apply(target, module)
    elif hook_needed:
        wrapt.register_post_import_hook(_on_import, module_name)


def unwrap_target(target: tuple[str, str, str]) -> None:
    """Removes the wrapper of ``target`` (and forgets a pending one)."""
    with _lock:
        _wanted.pop(target, None)
        applied = target in _applied
        _applied.discard(target)
    module = sys.modules.get(target[0])
    if applied and module is not None:
        cls = getattr(module, target[1], None)
        # Read the class __dict__, not getattr: for a classmethod getattr returns a bound
        # proxy, and restoring its __wrapped__ would replace the classmethod descriptor.
        current = vars(cls).get(target[2]) if cls is not None else None
        if isinstance(current, wrapt.FunctionWrapper):
            setattr(cls, target[2], current.__wrapped__)


def is_applied(target: tuple[str, str, str]) -> bool:
    with _lock:
        return target in _applied


def _wrap_all(
    targets: Iterable[tuple[str, str, str]], make_wrapper: Callable[[], Callable[..., Any]]
) -> None:
    """Wraps each of ``targets`` not wrapped yet with a new ``make_wrapper()`` (idempotent)."""
    for target in targets:
        with _lock:
            present = target in _wanted
        if not present:
            wrap(target, make_wrapper())


def install_trace_context(registry: TraceContextRegistry = REGISTRY) -> None:
    """Wraps every ``add_request`` (idempotent)."""
    _wrap_all(TRACE_CONTEXT_TARGETS, functools.partial(add_request, registry))


def uninstall_trace_context() -> None:
    for target in TRACE_CONTEXT_TARGETS:
        unwrap_target(target)


def install_offline(resolve: Callable[[], Any]) -> None:
    """Injects the stat logger ``resolve()`` returns into ``LLMEngine`` construction."""
    _wrap_all(OFFLINE_TARGETS, functools.partial(llm_engine_factory, resolve))


def uninstall_offline() -> None:
    for target in OFFLINE_TARGETS:
        unwrap_target(target)
