"""Reliability probe (security): prompt and completion text never leave the vLLM integration.

vLLM's real ``AsyncLLM.add_request`` (wrapped by otelgpu) receives a prompt carrying a
canary string; vLLM's real stat classes carry the scripted requests through the stat-logger
adapter; every span, metric and log otelgpu exports (OTLP/HTTP to the in-process receiver)
is then searched for the canary. otelgpu has no setting that records prompt text, so the
canary must appear nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from test_vllm_contract import _engine, _requests, _stat_logger_class
from vllm_script import batches, vllm_config
from vllm_support import Instrumented, wait_for_samples

from otelgpu.instrumentation.vllm import _context

pytestmark = [pytest.mark.reliability, pytest.mark.usefixtures("reset_otel_globals")]

CANARY = "CANARY-PROMPT-7f3a9c Please summarise my medical record"


def test_prompt_text_is_never_recorded(
    probe: Any, vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    p = probe(
        "security",
        "vLLM prompt text never recorded",
        "vLLM's AsyncLLM.add_request (wrapped) gets prompts carrying a canary; 4 scripted "
        "requests through vLLM's stat-logger adapter; every exported span, metric and log "
        "searched for the canary",
    )
    run = instrumented()
    wait_for_samples(run.runtime)
    (factory,) = [
        c for c in vllm_api.load_stat_logger_plugin_factories() if c is _stat_logger_class()
    ]
    adapter = vllm_api.PerEngineStatLoggerAdapter(vllm_config(vllm_api), [0], factory)
    adapter.log_engine_initialized()
    requests = _requests(time.time())
    engine = _engine()
    for r in requests:
        engine.add_request(
            r.request_id, f"{CANARY} #{r.request_id}", None, trace_headers=r.trace_headers
        ).close()
    for b in batches(vllm_api, requests):
        adapter.record(b.scheduler_stats, b.iteration_stats, None, engine_idx=0)
    time.sleep(0.05)
    run.finish()
    exported = [str(m) for _, _, m in run.receiver.spans()]
    exported += [str(m) for _, _, m in run.receiver.metrics()]
    exported += [str(m) for _, _, m in run.receiver.logs()]
    registry = repr(_context.REGISTRY._entries)
    found = [i for i, text in enumerate(exported) if "CANARY-PROMPT" in text]
    spans = len(run.receiver.spans())
    p.result(
        spans >= 4 and not found and "CANARY-PROMPT" not in registry,
        f"{len(exported)} exported items ({spans} spans) searched: canary found in "
        f"{len(found)}; not kept in otelgpu's request registry either",
    )
