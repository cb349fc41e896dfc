"""Integer sizes at the edges of the integer types (int16, int32, past them), in every form a loader takes, against
the plain greedy loop, and a state resumed inside and past an epoch's first chunk."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.plan.epochs import FIRST_CHUNK
from tests.reference import greedy_loop

N = 2 * FIRST_CHUNK + 904  # (an epoch cut after its first chunk)
TOPS = [0, 2**15 - 1, 2**15, 2**31 - 1, 2**31, 2**62]
FORMS = ["int64", "int8", "int16", "uint16", "uint32", "uint64", "tensor", "list"]


def _sizes(top: int) -> np.ndarray:
    """Sizes in ``[0, top]``, the edge itself at a few places."""
    sizes = np.random.default_rng(top % 997).integers(0, top, N, endpoint=True)
    sizes[[3, 1000, N - 1]] = top
    return sizes


def _given(sizes: np.ndarray, form: str) -> Any:
    if form == "tensor":
        return torch.from_numpy(sizes.copy())
    if form == "list":
        return sizes.tolist()
    return sizes.astype(form)


def _loader(sizes: Any, top: int, **options: Any) -> FastSizeAwareLoader[torch.Tensor]:
    return FastSizeAwareLoader(torch.arange(N), sizes, max(top // 2, 1), oversize="own_batch", seed=7, **options)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("top", TOPS)
def test_integer_sizes_at_the_type_edges_give_the_greedy_loops_batches(top: int, form: str) -> None:
    if form != "list" and form not in ("int64", "tensor") and top > np.iinfo(form).max:
        pytest.skip(f"{form} does not hold {top}")
    sizes = _sizes(top)
    loader = _loader(_given(sizes, form), top, max_batch_size=40)
    rows = [(size,) for size in sizes.tolist()]
    for epoch in range(2):
        loader.set_epoch(epoch)
        order = [int(i) for group in loader.order.chunks(epoch) for i in group]
        # invariant: every batch is the plain loop's, item by item, with the int64 sizes
        want, _ = greedy_loop(order, rows, [max(top // 2, 1)], max_batch_size=40, oversize="own_batch")
        assert [batch.tolist() for batch in loader] == want
        assert loader.stats is not None and loader.stats.num_items == N and loader.stats.num_batches == len(want)


@pytest.mark.parametrize("top", [2**15 - 1, 2**31 - 1])
@pytest.mark.parametrize("cut", [1, 40, 4000])
def test_a_state_taken_inside_or_past_the_first_chunk_resumes_the_uninterrupted_batches(top: int, cut: int) -> None:
    sizes = _sizes(top)
    full = [batch.tolist() for batch in _loader(sizes, top)]
    loader = _loader(sizes, top)
    batches = iter(loader)
    head = [next(batches).tolist() for _ in range(cut)]
    state = loader.state_dict()
    assert (sum(map(len, head)) > FIRST_CHUNK) == (cut == 4000)  # (inside the first chunk, or past it)
    assert head == full[:cut]
    resumed = _loader(sizes, top)
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == full[cut:]
