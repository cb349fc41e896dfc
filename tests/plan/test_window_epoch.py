"""The epoch with sorted windows holds one group's worth of planning, however long the epoch."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
import torch

import fastsab.plan.planners
from fastsab import FastSizeAwareLoader

GROUP = 2**14


def _peaks(n: int) -> tuple[list[int], bool]:
    """Peak traced bytes of ``len()``, of an epoch, and of a resume 3/4 into it, over ``n`` items.

    Also whether the resumed epoch gave the batches of the uninterrupted one from there on.
    """
    lengths = np.random.default_rng(0).integers(1, 100, n)
    data = torch.arange(n)

    def make() -> FastSizeAwareLoader[Any]:
        loader = FastSizeAwareLoader(data, lengths, 50_000, sort_window=1024, group_size=GROUP, seed=0)
        loader.state_dict()  # NOTE: the digest of the sizes (a copy of them, once) is made before measuring
        return loader

    loader, resumed = make(), make()
    peaks = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        total = len(loader)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.reset_peak()
        batches: list[torch.Tensor] = []  # NOTE: torch's allocations are not traced
        for batch in loader:
            batches.append(batch)
            if len(batches) == 3 * total // 4:
                state = loader.state_dict()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.reset_peak()
        resumed.load_state_dict(state)
        rest = iter(resumed)
        first = next(rest)
        peaks.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    tail = [first, *rest]
    same = len(tail) == total - 3 * total // 4 and all(map(torch.equal, tail, batches[3 * total // 4 :]))
    return peaks, same


def test_memory_does_not_grow_with_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    # invariant: planning with sort_window holds a group and the open batch, not a carry (or a
    # view of a whole group) per group planned: len(), an epoch and a resume 3/4 into it peak
    # alike over 5 x 10^5 and 2 x 10^6 items (31 and 123 groups; 16 bytes an item, 24 MiB more,
    # when every group planned was held)
    monkeypatch.setattr(fastsab.plan.planners, "PLAN_CACHE_ITEMS", 0)  # no whole plan cached for len()
    small, same_small = _peaks(5 * 10**5)
    large, same_large = _peaks(2 * 10**6)
    assert same_small and same_large
    for phase, before, after in zip(["len()", "epoch", "resume"], small, large):
        assert after - before < 4 * 2**20, (phase, small, large)


def _retried(prefetch: int, first: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The batches of a windowed epoch whose ``first``-th batch is retried under a quarter of the budget.

    Also the state saved right after the retry's first part.
    """
    lengths = np.random.default_rng(1).integers(1, 40, 2000)
    loader = FastSizeAwareLoader(
        torch.arange(2000), lengths, 400, sort_window=16, group_size=64, seed=5, prefetch=prefetch
    )
    iterator = loader.iter_with_indices()
    kept = [next(iterator)[0].tolist() for _ in range(first)]
    loader.retry_last_batch(100)
    kept[-1] = next(iterator)[0].tolist()
    state = loader.state_dict()
    return kept + [ids.tolist() for ids, _ in iterator], state


@pytest.mark.parametrize("first", [1, 7])
def test_a_lowering_gives_back_the_chunks_planned_ahead_from_their_marks(
    monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    # invariant: planned live (no whole plan cached), a lowering re-plans the chunks prefetched
    # ahead from the marks the stream keeps with them: the batches of the cached plan's run,
    # whatever was planned ahead, and a resume from the state gives the rest
    cached, _ = _retried(0, first)
    monkeypatch.setattr(fastsab.plan.planners, "PLAN_CACHE_ITEMS", 0)
    for prefetch in (0, 3):
        batches, state = _retried(prefetch, first)
        assert batches == cached
        resumed = FastSizeAwareLoader(
            torch.arange(2000),
            np.random.default_rng(1).integers(1, 40, 2000),
            400,
            sort_window=16,
            group_size=64,
            seed=5,
        )
        resumed.load_state_dict(state)
        assert [ids.tolist() for ids, _ in resumed.iter_with_indices()] == cached[state["steps"] :]
