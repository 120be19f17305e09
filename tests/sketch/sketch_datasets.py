"""Seeded data sets shared by the sketch tests and ``benchmarks/bench_sketch.py``.

All values are durations in seconds, shaped like what otelgpu records.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def lognormal(n: int, seed: int = 1) -> np.ndarray:
    """Request latency: lognormal around 50 ms, sigma 1 (p99.9 ~ 1 s)."""
    return np.random.default_rng(seed).lognormal(mean=np.log(0.05), sigma=1.0, size=n)


def bimodal(n: int, seed: int = 2) -> np.ndarray:
    """90 % fast requests around 20 ms, a 10 % slow tail around 400 ms."""
    rng = np.random.default_rng(seed)
    fast = rng.lognormal(np.log(0.02), 0.2, size=n)
    slow = rng.lognormal(np.log(0.4), 0.3, size=n)
    return np.where(rng.random(n) < 0.1, slow, fast)


def pareto(n: int, seed: int = 3) -> np.ndarray:
    """Heavy tail: classical Pareto, alpha = 1.5, minimum 1 ms (infinite variance)."""
    return (np.random.default_rng(seed).pareto(1.5, size=n) + 1.0) * 1e-3


def step_times(n: int, seed: int = 4) -> np.ndarray:
    """Training step times drifting from 100 to 150 ms, 2 % jitter, and a 5x spike
    (checkpoint, GC) every 100 steps plus a 20x spike every 1000 steps."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    base = 0.1 + 0.05 * steps / max(n - 1, 1)
    values = base * (1.0 + 0.02 * rng.standard_normal(n))
    values[steps % 100 == 99] *= 5.0
    values[steps % 1000 == 999] *= 4.0
    return np.abs(values)


DATASETS: dict[str, Callable[[int], np.ndarray]] = {
    "lognormal": lognormal,
    "bimodal": bimodal,
    "pareto": pareto,
    "step_times": step_times,
}

QUANTILES = (0.5, 0.95, 0.99, 0.999)


def exact_quantile(sorted_values: np.ndarray, q: float) -> float:
    """The lower-rank quantile the sketch estimates: ``sorted[int(q * (n - 1))]``."""
    return float(sorted_values[int(q * (len(sorted_values) - 1))])
