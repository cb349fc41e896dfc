"""Resumes around an epoch's first plan chunk (its first 4096 items), on epochs long enough to have one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.plan.epochs import FIRST_CHUNK
from tests.position.test_resumed import run

N = 3 * FIRST_CHUNK  # one shuffle group, cut after its first FIRST_CHUNK items


def make(kind: str, rank: int, world: int, **options: Any) -> Any:
    """Fixed batches of 37, or sizes 1..97 (some oversize, some 0) under 3000 (about 60 items a batch)."""
    if kind == "fixed":
        return FastLoader(torch.arange(N), 37, rank=rank, world_size=world, seed=2, **options)
    sizes = np.arange(N) * 7919 % 97 + 1
    sizes[::53], sizes[::101] = 4000, 0
    return FastSizeAwareLoader(torch.arange(N), sizes, 3000, rank=rank, world_size=world, seed=2, **options)


def loaders(kind: str, world: int, options: dict[str, Any], state: dict[str, Any] | None = None) -> list[Any]:
    made = [make(kind, rank, world, **options) for rank in range(world)]
    for loader in made if state is not None else []:
        loader.load_state_dict(state)
    return made


CASES = [
    ("fixed", 1, {}),
    ("fixed", 2, {"even_batches": "drop"}),
    ("sized", 1, {"prefetch": 0}),
    ("sized", 1, {"shuffle": False, "oversize": "own_batch"}),
    ("sized", 2, {"balance": True}),
    ("sized", 3, {"balance": True, "even_batches": "pad"}),
    ("sized", 3, {"balance": False, "even_batches": "drop", "group_size": 5000}),
]


@pytest.mark.parametrize(("kind", "world", "options"), CASES)
def test_resumes_inside_at_and_past_the_first_chunk_run_the_uninterrupted_batches(kind, world, options):
    whole, _ = run(loaders(kind, world, options))
    total = len(whole[0])
    # the steps that hold the first chunk's last items, and a few around them, then later ones
    items = np.cumsum([len(batch) for step in zip(*whole) for batch in step])[world - 1 :: world]
    boundary = int(np.searchsorted(items, FIRST_CHUNK))
    for steps in sorted({1, boundary - 1, boundary, boundary + 1, boundary + 2, total // 2, total - 1}):
        _, state = run(loaders(kind, world, options), steps)
        assert state is not None and "resume" in state
        old = {key: value for key, value in state.items() if key != "resume"}  # as an older fastsab saved it
        again = loaders(kind, world, options, state)[0].state_dict()  # saved again before any batch
        assert again == state
        for saved in (state, old, again):
            resumed = loaders(kind, world, options, saved)
            # invariant: len() right after the load counts the whole epoch
            assert len(resumed[0]) == total
            # invariant: rank by rank and step by step, the uninterrupted run's batches after the saved step
            assert run(resumed)[0] == [batches[steps:] for batches in whole], (steps, saved is old)
