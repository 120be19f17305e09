"""MFU per step: torch's FLOP counter against the analytic count of stacked Linear layers,
and ``otelgpu.train.mfu`` against a simulated H100's table peak (real OTel SDK, the sampler
of ``otelgpu.instrument()`` on the wall-clock simulator)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fixtures.otel import attributes_of, instrumented_steps, span_seconds
from opentelemetry.sdk.trace import ReadableSpan

import otelgpu
from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.gpu_truth import peaks
from otelgpu.gpu_truth.flops import MAX_SHAPES, StepFlops, count_flops
from otelgpu.gpu_truth.work import mismatch_reason

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

WIDTHS = (64, 128, 256, 32)


def _model() -> torch.nn.Module:
    layers = [torch.nn.Linear(a, b) for a, b in itertools.pairwise(WIDTHS)]
    return torch.nn.Sequential(*layers)


def _analytic_flops(batch: int) -> int:
    """2·B·in·out per layer forward; backward twice that (input and weight gradients)."""
    return sum(3 * 2 * batch * a * b for a, b in itertools.pairwise(WIDTHS))


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = model(x).sum()
    loss.backward()
    return loss


def _gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.T


@pytest.mark.parametrize("batch", [8, 33])
def test_flop_counter_matches_the_stacked_linear_formula(batch: int) -> None:
    model = _model()
    x = torch.randn(batch, WIDTHS[0], requires_grad=True)  # input gradient: the full 3x
    _, flops = count_flops(lambda: _train_step(model, x))
    expected = _analytic_flops(batch)
    assert flops == pytest.approx(expected, rel=0.01)


def test_step_flops_counts_once_per_input_shape() -> None:
    model = _model()
    counter = StepFlops()
    seen = []
    for batch in (8, 8, 8, 16, 16, 8):
        x = torch.randn(batch, WIDTHS[0], requires_grad=True)
        _, flops = counter.step(functools.partial(_train_step, model, x), x)
        seen.append(flops)
    assert counter.measured == 2  # the first step of each shape, never the others
    assert seen == [_analytic_flops(b) for b in (8, 8, 8, 16, 16, 8)]


def test_step_flops_memory_is_bounded() -> None:
    counter = StepFlops()
    for n in range(MAX_SHAPES + 5):
        x = torch.randn(1, n + 1)
        counter.step(functools.partial(_gram, x), x)
    assert counter.measured == MAX_SHAPES


def test_peak_table_matches_nvml_names() -> None:
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peaks.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peaks.peak_flops("NVIDIA H100 NVL") == 835e12
    assert peaks.peak_flops("NVIDIA H200") == 989e12
    assert peaks.peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peaks.peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None  # no FP8 on Ampere
    assert peaks.peak_flops("NVIDIA L40S") == 362.05e12
    assert peaks.peak_flops("NVIDIA L4") == 121e12
    assert peaks.peak_flops("NVIDIA GeForce RTX 4090", "fp8") == 330.3e12
    assert peaks.peak_flops("NVIDIA B200") == 2250e12
    assert peaks.peak_flops("Tesla T4") is None
    assert "| H100 SXM | 989 |" in peaks.markdown_table()


def test_mismatch_rule() -> None:
    assert mismatch_reason(0.5, 0.10) == "mfu_above_tensor_activity"
    assert mismatch_reason(0.1, 0.80) == "tensor_activity_without_model_flops"
    assert mismatch_reason(0.4, 0.55) is None
    assert mismatch_reason(0.02, 0.05) is None  # idle tensor pipes, little work: consistent


def _run_steps(
    sim_scenario: Callable[..., sim.SimGpu], flops: float, **settings: Any
) -> list[ReadableSpan]:
    sim_scenario("memory-bound-decode", clock="wall")  # 1x H100 SXM, tensor activity 10 %
    return instrumented_steps(
        2,
        0.2,
        warmup_s=0.15,
        step={"samples": 4, "flops": flops},
        sample_interval_ms=50,
        **settings,
    )


def test_step_mfu_against_the_simulated_h100_peak(
    sim_scenario: Callable[..., sim.SimGpu],
) -> None:
    flops = 0.004 * 989e12 * 0.2  # ~0.4 % MFU: consistent with 10 % tensor activity
    steps = _run_steps(sim_scenario, flops)
    for span in steps:
        attrs = attributes_of(span)
        duration_s = span_seconds(span)
        assert attrs["otelgpu.train.flops"] == flops
        assert attrs["otelgpu.train.mfu"] == pytest.approx(flops / (duration_s * 989e12))
        assert not [e for e in span.events if e.name == "otelgpu.train.mfu.mismatch"]


def test_peak_override_and_mismatch_event(sim_scenario: Callable[..., sim.SimGpu]) -> None:
    peak = 1e12
    flops = 0.5 * peak * 0.2  # ~50 % MFU while the tensor pipes are 10 % busy
    steps = _run_steps(sim_scenario, flops, peak_flops=peak)
    for span in steps:
        attrs = attributes_of(span)
        duration_s = span_seconds(span)
        assert attrs["otelgpu.train.mfu"] == pytest.approx(flops / (duration_s * peak))
        (event,) = [e for e in span.events if e.name == "otelgpu.train.mfu.mismatch"]
        assert event.attributes is not None
        assert event.attributes["otelgpu.train.mfu.mismatch.reason"] == (
            "mfu_above_tensor_activity"
        )
        assert event.attributes["otelgpu.gpu.tensor.activity"] == pytest.approx(0.10)


def test_bad_peak_setting_fails_fast() -> None:
    with pytest.raises(ConfigurationError, match=r"OTELGPU_PEAK_FLOPS|peak_flops"):
        otelgpu.instrument(exporters="none", gpu=False, peak_flops=-1)
    with pytest.raises(ConfigurationError, match=r"mfu_dtype|OTELGPU_MFU_DTYPE"):
        otelgpu.instrument(exporters="none", gpu=False, mfu_dtype="fp4")
