from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.plan.shuffle import GroupedPermutation, grouped_permutation


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 700), st.integers(0, 2**32), st.integers(0, 50), st.booleans())
def test_every_index_exactly_once(n, group_size, seed, epoch, rotate):
    # invariant: every index once per epoch, whatever n, group size, seed and epoch
    order = GroupedPermutation(n, group_size, seed, rotate=rotate).permutation(epoch)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))


def test_deterministic_in_seed_and_epoch():
    perm = GroupedPermutation(10_000, 256, seed=7)
    assert np.array_equal(perm.permutation(3), GroupedPermutation(10_000, 256, seed=7).permutation(3))
    assert not np.array_equal(perm.permutation(3), perm.permutation(4))
    assert not np.array_equal(perm.permutation(3), GroupedPermutation(10_000, 256, seed=8).permutation(3))


def test_the_order_of_a_seed_and_epoch_is_pinned():
    # invariant: (seed, epoch) gives the same order in every process and every release, so that
    # a state saved by an earlier run resumes on exactly the samples that run had left. The
    # rotated case wraps a group around the end and starts one past it (both index shifts).
    rotated = GroupedPermutation(11, 3)  # seed 0
    assert rotated.group_order(2).tolist() == [2, 1, 0, 3]
    assert rotated.permutation(2).tolist() == [10, 0, 1, 7, 8, 9, 5, 4, 6, 2, 3]
    blocks = GroupedPermutation(11, 3, seed=5, rotate=False)
    assert blocks.permutation(2).tolist() == [0, 2, 1, 5, 3, 4, 10, 9, 8, 6, 7]


def test_groups_stream_the_permutation_in_group_order():
    perm = GroupedPermutation(1000, 64, seed=1)
    groups = list(perm.groups(epoch=2))
    assert len(groups) == perm.num_groups == 16
    # the short tail group (1000 = 15 * 64 + 40) comes where the epoch's group order puts it
    sizes = [min(64, 1000 - 64 * int(group)) for group in perm.group_order(2)]
    assert [len(group) for group in groups] == sizes
    assert np.array_equal(np.concatenate(groups), perm.permutation(2))


def test_unrotated_groups_are_fixed_blocks():
    perm = GroupedPermutation(100, 32, seed=0, rotate=False)
    for group in perm.groups(epoch=5):
        block = group[0] // 32
        assert np.array_equal(np.sort(group), np.arange(block * 32, min(block * 32 + 32, 100)))


def test_positions_are_uniform_chi_square():
    # invariant: over epochs, the position of an index is uniform over the epoch order.
    # 2000 epochs x 40 tracked indices = 80,000 positions in 20 position bins: chi-square with
    # 19 degrees of freedom; the 0.999 quantile is 43.8, a correct shuffle fails it 1 in 1000.
    n, bins, epochs = 1000, 20, 2000
    perm = GroupedPermutation(n, group_size=64, seed=12345)
    tracked = np.arange(0, n, n // 40)
    counts = np.zeros(bins)
    for epoch in range(epochs):
        order = perm.permutation(epoch)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        np.add.at(counts, position[tracked] * bins // n, 1)
    expected = len(tracked) * epochs / bins
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 43.8, chi2


def test_neighbours_do_not_always_share_a_group():
    # with rotation, indices i and i+1 land in the same group in ~ (1 - 1/group_size) of
    # epochs but not always; adjacent positions in the order are not always neighbours
    perm = GroupedPermutation(4096, group_size=64, seed=3)
    together = 0
    for epoch in range(200):
        order = perm.permutation(epoch)
        group_of = np.empty(4096, dtype=np.int64)
        group_of[order] = np.arange(4096) // 64
        together += group_of[63] == group_of[64]
    assert 150 < together < 200


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((-1,), ValueError, r"n must be a non-negative integer, got -1"),
        ((10, 0), ValueError, r"group_size must be a positive integer, got 0"),
        ((10, 4, 1.5), TypeError, r"seed must be an integer, got 1.5"),
    ],
)
def test_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        GroupedPermutation(*args)


def test_bad_epoch_and_rotate():
    perm = GroupedPermutation(10, 4)
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer, got -1"):
        perm.permutation(-1)
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer, got -1"):
        next(perm.groups(-1))
    with pytest.raises(TypeError, match="rotate must be a bool"):
        GroupedPermutation(10, rotate=1)


def test_function_form_and_empty():
    assert grouped_permutation(0).size == 0
    assert np.array_equal(
        grouped_permutation(50, group_size=8, seed=2, epoch=1), GroupedPermutation(50, 8, 2).permutation(1)
    )


def _reference_permutation(perm: GroupedPermutation, epoch: int) -> np.ndarray:
    """The epoch order drawn group by group with int64 randperm and offsets taken modulo ``n``."""
    order, seeds, shift = perm._plan(epoch)
    parts = []
    for group in order.tolist():
        size = min(perm.group_size, perm.n - group * perm.group_size)
        generator = torch.Generator().manual_seed(int(seeds[group]))
        shuffled = torch.randperm(size, generator=generator, dtype=torch.int64).numpy()
        parts.append((shuffled + group * perm.group_size + shift) % perm.n)
    return np.concatenate(parts)


@pytest.mark.parametrize(
    ("n", "group_size", "rotate"), [(10, 4, True), (1000, 64, True), (300_000, 2**16, True), (7, 3, False)]
)
def test_the_order_is_torch_randperm_per_group_whatever_the_dtype_it_is_drawn_in(n, group_size, rotate):
    perm = GroupedPermutation(n, group_size, seed=3, rotate=rotate)
    for epoch in range(3):
        order = perm.permutation(epoch)
        assert order.dtype == np.int64
        np.testing.assert_array_equal(order, _reference_permutation(perm, epoch))
        np.testing.assert_array_equal(np.concatenate(list(perm.groups(epoch))), order)
