"""An epoch's small first plan chunk (``EpochOrder.chunks_first_small``): the first batches from a few items, no batch changed."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.plan.epochs import FIRST_CHUNK, EpochOrder

N = 3 * FIRST_CHUNK + 1000  # more than one first chunk, in one shuffle group
SIZES = torch.from_numpy(np.random.default_rng(3).integers(1, 60, N))


def make(kind: str, **options: Any) -> Any:
    data = torch.arange(N)
    if kind == "fixed":
        return FastLoader(data, 100, **options)
    if kind == "sum":
        return FastSizeAwareLoader(data, SIZES, 3000, **options)
    return FastSizeAwareLoader(data, SIZES, 3000, cost="padded", batch_size_multiple=8, **options)


def steps(loader: Any, epoch: int = 1) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [indices.tolist() for indices, _ in loader.iter_with_indices()]


def whole_group_first(loader_kind: str, **options: Any) -> list[list[int]]:
    """The batches when the first chunk is the whole first shuffle group, as before."""
    with patch.object(EpochOrder, "chunks_first_small", EpochOrder.chunks):
        return steps(make(loader_kind, **options))


@pytest.mark.parametrize("kind", ["fixed", "sum", "padded"])
def test_the_first_plan_chunk_holds_the_first_items_of_the_order(kind):
    # the first batches are planned from FIRST_CHUNK items, not from the whole first group of N
    first = next(iter(make(kind).planner.chunks(0)))
    assert 0 < first.num_batches and len(first.ids) <= FIRST_CHUNK


@pytest.mark.parametrize("kind", ["fixed", "sum", "padded"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_small_first_chunk_changes_no_batch_of_any_rank(kind, world_size):
    # invariant: each rank's batches, step by step, are those of a plan whose first chunk is the whole group
    for rank in range(world_size):
        options = {"rank": rank, "world_size": world_size}
        assert steps(make(kind, **options)) == whole_group_first(kind, **options)


@pytest.mark.parametrize("kind", ["fixed", "sum", "padded"])
@pytest.mark.parametrize("taken", [1, 30])
def test_a_run_resumed_inside_or_after_the_first_chunk_sees_the_uninterrupted_batches(kind, taken):
    # invariant: interrupted after `taken` steps and resumed from the state, the run sees the rest of the uninterrupted one
    expected = whole_group_first(kind)
    loader = make(kind)
    loader.set_epoch(1)
    seen = []
    for indices, _ in loader.iter_with_indices():
        seen.append(indices.tolist())
        if len(seen) == taken:
            break
    state = loader.state_dict()
    resumed = make(kind)
    resumed.load_state_dict(state)
    seen += [indices.tolist() for indices, _ in resumed.iter_with_indices()]
    assert seen == expected
