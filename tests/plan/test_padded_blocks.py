"""The numpy walk of padded splits, block by block (``_padded_kernel._blocked_walk``): the greedy loop's batches."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import split_batches
from fastsab.plan import _padded_kernel
from tests.reference import greedy_reference

# NOTE: costs of 0 to 3 make batches many blocks long, costs of 200 batches of one or two, 1000
# items above every cap drawn (skipped or in batches of their own)
costs = st.lists(st.one_of(st.integers(0, 3), st.integers(4, 60), st.sampled_from([0, 200, 1000])), max_size=150)
blocks = st.sampled_from([1, 2, 3, 5, 16])


def as_lists(split):
    return [b.tolist() for b in split.batches()]


def blocked(block, *args, **kwargs):
    """``split_batches(*args, **kwargs)`` with blocks of ``block`` items."""
    with patch.object(_padded_kernel, "_BLOCK", block):
        return split_batches(*args, **kwargs)


@settings(max_examples=300, deadline=None)
@given(
    rows=costs,
    cap=st.sampled_from([0, 1, 60, 200, 999]),
    block=blocks,
    max_batch_size=st.sampled_from([None, None, 1, 4, 64]),
    multiple=st.sampled_from([1, 1, 2, 3, 8]),
    oversize=st.sampled_from(["skip", "own_batch"]),
    as_float=st.booleans(),
)
def test_blocks_of_any_size_give_the_greedy_loops_batches(
    rows, cap, block, max_batch_size, multiple, oversize, as_float
):
    # invariant: whatever the block size, a padded split has the plain loop's batches and skipped items
    expected, skipped = greedy_reference(
        rows, cap, cost="padded", max_batch_size=max_batch_size, multiple=multiple, oversize=oversize
    )
    values = np.array(rows, dtype=np.float64 if as_float else np.int64)
    options = {"max_batch_size": max_batch_size, "batch_size_multiple": multiple, "oversize": oversize}
    split = blocked(block, values, cap, cost="padded", **options)
    assert as_lists(split) == expected
    assert split.skipped.tolist() == skipped


@settings(max_examples=200, deadline=None)
@given(
    rows=costs,
    cap=st.sampled_from([1, 60, 200]),
    block=blocks,
    multiple=st.sampled_from([1, 2, 3]),
    oversize=st.sampled_from(["skip", "own_batch"]),
    last_batch=st.sampled_from(["keep", "round_down"]),
    cut=st.integers(0, 150),
)
def test_blocks_keep_the_open_batch_the_last_batch_and_carries(rows, cap, block, multiple, oversize, last_batch, cut):
    # invariant: blocks change no batch, no dropped item and no carry of a split, whole or in two chunks
    values = np.array(rows, dtype=np.int64)
    options = {"cost": "padded", "batch_size_multiple": multiple, "oversize": oversize, "last_batch": last_batch}
    for final in (True, False):
        whole, parts = (
            split_batches(values, cap, final=final, **options),
            blocked(block, values, cap, final=final, **options),
        )
        assert as_lists(parts) == as_lists(whole) and parts.dropped.tolist() == whole.dropped.tolist()
        assert (parts.carry is None) == (whole.carry is None)
        if whole.carry is not None and parts.carry is not None:
            assert parts.carry.ids.tolist() == whole.carry.ids.tolist()
    cut = min(cut, len(rows))
    first = blocked(block, values[:cut], cap, final=False, **options)
    rest = blocked(block, values[cut:], cap, ids=np.arange(cut, len(rows)), carry=first.carry, **options)
    assert as_lists(first) + as_lists(rest) == as_lists(split_batches(values, cap, **options))


def test_a_batch_many_blocks_long_is_one_batch():
    # the block from the batch's start doubles until the batch ends inside it
    split = blocked(2, np.ones(1000, dtype=np.int64), 500, cost="padded", max_batch_size=None)
    assert np.diff(split.offsets).tolist() == [500, 500]
    split = blocked(3, np.array([1] * 37 + [1000] + [1] * 5), 999, cost="padded", oversize="own_batch")
    assert np.diff(split.offsets).tolist() == [37, 1, 5]


def test_a_carry_item_above_the_cap_in_a_later_block_names_its_position():
    first = split_batches([1, 1, 1, 1, 1, 9], 100, cost="padded", final=False)
    with pytest.raises(ValueError, match=r"item at position 5 of this split costs more than max_total_size"):
        blocked(2, [1, 1], 8, cost="padded", carry=first.carry)
