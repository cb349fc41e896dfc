"""Calibration batches: the batches a budget plans, spread over their numbers of items and item sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.memory import PolynomialRegression, calibration_batches, fit_batch_memory

N = 600


def _images() -> np.ndarray:
    return np.random.default_rng(0).integers(8, 64, size=(N, 2))


def _image_model() -> Any:
    """Images padded to the batch's largest height and width: peak = 8000 + len * 12 * H * W."""
    rng = np.random.default_rng(1)
    batches = [rng.integers(8, 64, size=(int(rng.integers(1, 9)), 2)) for _ in range(30)]
    peaks = [8000 + len(b) * 12.0 * b.max(axis=0).prod() for b in batches]
    return fit_batch_memory(batches, peaks, cost="padded", degree=2)


def _planned(loader: FastSizeAwareLoader[Any]) -> list[np.ndarray]:
    return [np.asarray(batch) for batch in loader]


def _check_spread(picked: list[np.ndarray], planned: list[np.ndarray], item_costs: np.ndarray) -> None:
    # invariant: every calibration batch is one the loader plans, and they span its batches'
    # numbers of items and its largest item
    as_sets = {tuple(sorted(batch.tolist())) for batch in planned}
    assert all(tuple(sorted(batch.tolist())) in as_sets for batch in picked)
    sizes = [len(batch) for batch in picked]
    assert min(sizes) == min(len(batch) for batch in planned) and max(sizes) == max(len(b) for b in planned)
    largest = max(float(item_costs[batch].max()) for batch in planned)
    assert max(float(item_costs[batch].max()) for batch in picked) == largest
    assert min(float(item_costs[batch].max()) for batch in picked) == min(float(item_costs[b].max()) for b in planned)


@pytest.mark.parametrize("sort_window", [None, 100])
def test_batches_of_a_batch_model_are_the_loaders_under_that_budget(sort_window: int | None) -> None:
    features, model, budget = _images(), _image_model(), 250_000.0
    picked = calibration_batches(features, budget, model, count=12, sort_window=sort_window, seed=3)
    assert len(picked) == 12
    loader = FastSizeAwareLoader(
        np.arange(N), features=features, seed=3, sort_window=sort_window, **model.loader_options(budget)
    )
    planned = _planned(loader)
    item_costs = model.per_item(torch.from_numpy(features).double()).numpy()
    _check_spread(picked.indices, planned, item_costs)
    assert all(np.array_equal(rows, features[ids]) for ids, rows in zip(picked.indices, picked.features))
    assert (model.predict(picked.features) <= budget).all()
    # another epoch's batches fall in the same range of numbers of items, but for a few at its edges
    loader.set_epoch(1)
    sizes = [len(batch) for batch in picked.indices]
    later = np.array([len(batch) for batch in _planned(loader)])
    assert ((later >= min(sizes)) & (later <= max(sizes))).mean() >= 0.95


@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_without_a_model_an_item_costs_its_feature(cost: str) -> None:
    lengths = np.random.default_rng(2).integers(16, 512, size=N)
    picked = calibration_batches(lengths, 4096, count=10, cost=cost)  # type: ignore[arg-type]
    planned = _planned(FastSizeAwareLoader(np.arange(N), lengths, 4096, cost=cost, seed=0))  # type: ignore[arg-type]
    _check_spread(picked.indices, planned, lengths)
    # 1-D features give 1-D batches
    assert all(
        rows.ndim == 1 and np.array_equal(rows, lengths[ids]) for ids, rows in zip(picked.indices, picked.features)
    )


def test_a_per_item_model_charges_each_item_its_prediction() -> None:
    lengths = np.random.default_rng(4).integers(16, 512, size=N)
    rough = PolynomialRegression(1)
    rough.fit(torch.tensor([16.0, 512.0]), torch.tensor([2000.0 + 16 * 100, 2000.0 + 512 * 100]))
    picked = calibration_batches(lengths[:, None], 60_000, rough, count=8)
    planned = _planned(FastSizeAwareLoader(np.arange(N), rough, 60_000, features=lengths, seed=0))
    _check_spread(picked.indices, planned, lengths)
    # (n, 1) features give (items, 1) batches, as fit_batch_memory fits them
    assert all(rows.shape == (len(ids), 1) for ids, rows in zip(picked.indices, picked.features))


def test_a_plan_of_fewer_batches_gives_them_all() -> None:
    lengths = np.arange(1, 11)
    picked = calibration_batches(lengths, 20, count=50, seed=0)
    planned = _planned(FastSizeAwareLoader(np.arange(10), lengths, 20, seed=0))
    assert [b.tolist() for b in picked.indices] == [b.tolist() for b in planned]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"count": 0}, ValueError, r"count must be a positive integer, got 0"),
        ({"count": 2.5}, TypeError, r"count must be an int"),
        ({"model": "rough"}, TypeError, r"model must be a BatchMemoryModel, a PolynomialRegression or None, got str\."),
        ({"cost": "max"}, ValueError, r"cost must be one of 'sum', 'padded', got 'max'\."),
        ({"features": np.ones((5, 2))}, ValueError, r"features must be one per item without a model .* got 2 per item"),
        ({"features": [1, -2, 3]}, ValueError, r"features must hold features >= 0, got -2\.0\."),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments: dict[str, Any] = {"features": np.arange(1, 6), "budget": 10}
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        calibration_batches(**arguments)


def test_a_batch_models_cost_is_its_own() -> None:
    with pytest.raises(ValueError, match=r"cost must be the model's cost 'padded' or None, got 'sum'\."):
        calibration_batches(_images(), 250_000.0, _image_model(), cost="sum")


@pytest.mark.parametrize("budget", [0, -5, float("nan"), float("inf")])
def test_calibration_batches_names_the_budget_it_refuses(budget):
    with pytest.raises(ValueError, match=rf"budget must be a positive finite number, got {budget!r}\."):
        calibration_batches(np.arange(1, 11), budget)


def test_calibration_batches_names_a_budget_that_is_no_number():
    with pytest.raises(TypeError, match="budget must be a real number, got '300' of type str"):
        calibration_batches(np.arange(1, 11), "300")
