"""Fitted memory budgets on a GPU: measure on CUDA, fit, batch under a budget, measure every planned batch.

The fidelity suite's workflow (``fastsab.bench.fidelity.run_kind``) on small items of each kind,
its models and steps on the device: every planned batch's measured CUDA peak stays within the budget.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.bench.fidelity import run_kind
from fastsab.memory.batch import fit_batch_memory, measure_batches
from tests.bench.test_fidelity import small_kind

KiB = 2**10
MiB = 2**20


@pytest.mark.parametrize(("index", "window"), [(0, None), (1, None), (2, None), (3, None), (0, 32)])
def test_every_planned_batch_stays_within_a_budget_fitted_on_the_gpu(
    index: int, window: int | None, device: torch.device
) -> None:
    kind = small_kind(index, device)
    assert kind.device == device
    result, model = run_kind(kind, items=120, calibration=14, batches=8, sort_window=window)
    assert result.batches == 8
    assert result.over_budget == 0, result  # invariant: no planned batch's measured peak above the budget
    assert 0 < result.min_use <= result.mean_use <= result.max_use <= 1.0
    assert model.report is not None and model.report.num_batches == 3


def test_an_exact_workload_fills_its_budget_and_never_passes_it(device: torch.device) -> None:
    # a batch of items of features x allocates 64 KiB + 4 KiB per unit of x, all at once: the model is exact
    def step(rows: np.ndarray) -> None:
        block = torch.empty((64 + 4 * int(rows.sum())) * KiB, dtype=torch.uint8, device=device)
        block.fill_(1)

    rng = np.random.default_rng(0)
    features = rng.integers(1, 200, size=400)
    calibrate = [features[rng.choice(400, size=int(rng.integers(2, 12)), replace=False)] for _ in range(16)]
    peaks = measure_batches(step, calibrate, device)
    exact = [(64 + 4 * int(rows.sum())) * KiB for rows in calibrate]
    # NOTE: the allocator counts a block whole when what is left of its segment is too small to split
    # (under 1 MiB of a segment rounded to 2 MiB): a peak is the bytes asked for, or a little more
    assert all(bytes_ <= peak < bytes_ + 2 * MiB for bytes_, peak in zip(exact, peaks)), (exact, peaks)
    model = fit_batch_memory(calibrate, peaks, cost="sum", degree=1)
    budget = 16 * MiB  # about 40 items a batch
    loader = FastSizeAwareLoader(np.arange(400), features=features, seed=0, **model.loader_options(budget))
    batches = [np.asarray(batch) for batch in loader]
    assert sorted(np.concatenate(batches).tolist()) == list(range(400))  # invariant: every item once
    use = np.array(measure_batches(step, [features[ids] for ids in batches], device)) / budget
    assert (use <= 1).all(), use
    assert use[:-1].mean() > 0.85, use  # full batches (all but the last) fill the budget but for about an item
