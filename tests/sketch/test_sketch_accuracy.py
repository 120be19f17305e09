"""The accuracy promise on realistic data: <= 1 % relative error at p50/p95/p99/p99.9
(the default scale 6 guarantees 0.54 %), for both twins, on four data sets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sketch_datasets import DATASETS, QUANTILES, exact_quantile

N = 100_000


@pytest.fixture(scope="module", params=sorted(DATASETS))
def dataset(request: pytest.FixtureRequest) -> tuple[np.ndarray, np.ndarray]:
    values = DATASETS[request.param](N)
    return values, np.sort(values)


def test_quantiles_within_one_percent(sketch_cls: Any, dataset: tuple[Any, Any]) -> None:
    values, ordered = dataset
    s = sketch_cls()
    s.add_many(values)
    assert s.count == N and s.rejected == 0
    for q, est in zip(QUANTILES, s.quantiles(QUANTILES), strict=True):
        exact = exact_quantile(ordered, q)
        err = abs(est - exact) / exact
        assert err <= s.relative_accuracy * (1 + 1e-9), (q, est, exact)
        assert err <= 0.01


def test_every_percentile_within_the_guarantee(sketch_cls: Any, dataset: tuple[Any, Any]) -> None:
    values, ordered = dataset
    s = sketch_cls(0.02)  # scale 5 (1.08 %): a different scale than the default
    s.add_many(values)
    qs = [i / 1000 for i in range(1001)]
    for q, est in zip(qs, s.quantiles(qs), strict=True):
        exact = exact_quantile(ordered, q)
        assert abs(est - exact) <= s.relative_accuracy * exact * (1 + 1e-9), q
