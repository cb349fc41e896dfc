"""Calibration batches: batches to measure that are like the ones a budget will plan.

A batch memory model is only as good as the batches it was fitted on: fitted on batches of one
or two items, it guesses the fixed part of a batch of forty. ``calibration_batches`` plans
an epoch of the items as ``FastSizeAwareLoader`` would under the budget, with a
rough first model (a per-item model, a first batch model) or, without one, a first guess of the
budget in the features' own units (tokens, say), and picks batches of that plan spread over its
numbers of items and its item sizes: the fewest and most items, the smallest and largest items.
Measure them (``measure_batches``) and fit
(``fit_batch_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastsab._checks import check_choice, check_positive_int, check_positive_real
from fastsab.loaders.loader import FastSizeAwareLoader
from fastsab.memory.batch import BatchCostMode, BatchMemoryModel, _batch_rows, _model_input, _num_features
from fastsab.memory.model import PolynomialRegression

__all__ = ["CalibrationBatches", "calibration_batches"]


@dataclass(frozen=True)
class CalibrationBatches:
    """Batches to measure, as item indices and as the items' features.

    Attributes:
        indices: Each batch's item indices (int64 arrays), in the order of the plan.
        features: Each batch's items' features, shaped as the features were given (1-D, or
            ``(items, d)``, as float64): what ``fit_batch_memory`` takes.
    """

    indices: list[np.ndarray]
    features: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.indices)


def calibration_batches(
    features: Any,
    budget: float,
    model: BatchMemoryModel | PolynomialRegression | None = None,
    *,
    count: int = 24,
    cost: BatchCostMode | None = None,
    sort_window: int | None = None,
    max_batch_size: int | None = None,
    seed: int = 0,
) -> CalibrationBatches:
    """Up to ``count`` batches of the items that ``budget`` plans, spread over their shapes.

    The items are planned for one epoch as ``FastSizeAwareLoader`` plans them
    (the same ``sort_window``, ``max_batch_size`` and ``seed``), each item costing what
    ``model`` predicts; half the batches picked are spread over the numbers of items (the
    fewest and the most included), half over the largest item's cost (the batch holding the
    largest item included). Pass the loader's options, so that the batches measured are the
    kind it will plan.

    Args:
        features: The items' features: 1-D (one per item, e.g. lengths) or ``(n, d)``.
        budget: The budget of a batch: in bytes with a ``model`` that predicts bytes, in the
            features' units without one (e.g. tokens per batch).
        model: A rough first model: a ``BatchMemoryModel`` (its
            ``loader_options`` plan the batches), a per-item
            ``PolynomialRegression`` (e.g. ``fit_memory_model``'s: a
            batch costs the sum or the padded cost of its items' predictions), or ``None``: an
            item costs its one feature.
        count: The most batches to pick; fewer where the plan has fewer.
        cost: ``"sum"`` or ``"padded"`` for a per-item model or none (default ``"sum"``); a
            batch model's own cost mode otherwise.
        sort_window: The loader's ``sort_window``.
        max_batch_size: The loader's ``max_batch_size``.
        seed: The loader's ``seed``.

    Returns:
        A ``CalibrationBatches``.

    Raises:
        TypeError: If ``model`` is of another type, ``count`` is not an integer, or ``budget`` is not
            a real number.
        ValueError: If ``count`` or ``budget`` is not positive (or ``budget`` not finite), ``cost``
            is unknown or differs from a batch model's, features are not real-valued and
            non-negative, there are several features per item and no model, or the loader refuses
            an option.

    Examples:
        >>> lengths = np.arange(1, 101)  # tokens per sequence, and a first guess of 300 tokens a batch
        >>> batches = calibration_batches(lengths, budget=300, count=4)
        >>> sorted(len(b) for b in batches.indices), int(max(b.max() for b in batches.features))
        ([4, 5, 7, 7], 100)
        >>> all(b.sum() <= 300 for b in batches.features)
        True
    """
    count = check_positive_int("count", count)
    # NOTE: checked here, so that the error names this function's argument (not the loader's
    # max_total_size); a budget of 0 would plan no batch to measure
    budget = check_positive_real("budget", budget)
    d = _num_features([features])
    rows = _batch_rows("features", features, d)
    column = _model_input(rows, d)
    options: dict[str, Any]
    if isinstance(model, BatchMemoryModel):
        if cost is not None and check_choice("cost", cost, ("sum", "padded")) != model.cost:
            raise ValueError(f"cost must be the model's cost {model.cost!r} or None, got {cost!r}.")
        options = {"features": column, **model.loader_options(budget)}
        item_costs = model.per_item(torch.from_numpy(column))
    else:
        mode = check_choice("cost", "sum" if cost is None else cost, ("sum", "padded"))
        if isinstance(model, PolynomialRegression):
            options = {"sizeof": model, "features": column}
            item_costs = model(torch.from_numpy(column))
        elif model is None:
            if d != 1:
                raise ValueError(
                    f"features must be one per item without a model (an item costs its feature), got {d} per item; "
                    "pass a rough model of the items' memory."
                )
            options = {"sizeof": column}
            item_costs = torch.from_numpy(column)
        else:
            raise TypeError(
                f"model must be a BatchMemoryModel, a PolynomialRegression or None, got {type(model).__name__}."
            )
        options.update(max_total_size=budget, cost=mode)
    loader = FastSizeAwareLoader(
        np.arange(len(rows)), seed=seed, sort_window=sort_window, max_batch_size=max_batch_size, **options
    )
    planned = [np.asarray(batch) for batch in loader]
    picked = _spread(planned, item_costs.numpy(), count)
    shaped = rows[:, 0] if np.ndim(features) == 1 else rows
    return CalibrationBatches([planned[b] for b in picked], [shaped[planned[b]] for b in picked])


def _spread(planned: list[np.ndarray], item_costs: np.ndarray, count: int) -> list[int]:
    """Up to ``count`` of the planned batches (positions in the plan, in plan order), spread over
    their numbers of items and their largest items' costs, the extremes of each first."""
    if len(planned) <= count:
        return list(range(len(planned)))
    sizes = np.array([len(batch) for batch in planned])
    tops = np.array([item_costs[batch].max() for batch in planned])
    by_size, by_top = np.lexsort((tops, sizes)), np.lexsort((sizes, tops))
    # NOTE: floor of evenly spaced positions: distinct (steps of at least 1), both ends included
    spaced = np.floor(np.linspace(0, len(planned) - 1, count)).astype(np.int64)
    interleaved = np.stack([by_size[spaced], by_top[spaced]], axis=1).ravel()
    candidates = [by_size[-1], by_top[-1], by_size[0], by_top[0], *interleaved]
    picked: list[int] = []
    for batch in candidates:
        if int(batch) not in picked:
            picked.append(int(batch))
    return sorted(picked[:count])
