"""Seeded grouped permutations: fast, cache-friendly epoch orders.

A full random permutation of ``n`` indices touches memory at random, which is slow for
large ``n`` and makes the first batch wait for the whole permutation. A grouped
permutation splits the (randomly rotated) index range into contiguous groups of
``group_size`` indices, shuffles the order of the groups, then the indices inside each
group. Each group is produced on its own, so an epoch can be generated group by group in
``O(n / group_size + group_size)`` memory.

The order depends only on ``(seed, epoch)``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fastsab._checks import check_nonnegative_int, check_positive_int

__all__ = ["GroupedPermutation", "grouped_permutation"]

DEFAULT_GROUP_SIZE = 2**16
_INT32_MAX = 2**31 - 1


class GroupedPermutation:
    """Epoch orders over ``range(n)`` made of shuffled groups of shuffled indices.

    Args:
        n: Number of indices.
        group_size: Indices per group (the last group may be shorter).
        seed: Seed of the whole sequence of epochs.
        rotate: Rotate the group boundaries by a random offset each epoch, so that
            neighbouring indices do not always share a group. Set ``False`` to keep groups
            aligned with fixed blocks ``[k * group_size, (k + 1) * group_size)`` (e.g. chunks
            of a dataset that are read as a whole).

    Examples:
        >>> perm = GroupedPermutation(10, group_size=4, seed=0)
        >>> order = perm.permutation(epoch=0)
        >>> sorted(order.tolist()) == list(range(10))
        True
        >>> bool((order == perm.permutation(epoch=0)).all()), bool((order == perm.permutation(1)).all())
        (True, False)
        >>> sorted(len(g) for g in perm.groups(epoch=0))  # one group is the short tail
        [2, 4, 4]
    """

    def __init__(self, n: int, group_size: int = DEFAULT_GROUP_SIZE, seed: int = 0, *, rotate: bool = True) -> None:
        self.n = check_nonnegative_int("n", n)
        self.group_size = check_positive_int("group_size", group_size)
        self.seed = check_nonnegative_int("seed", seed)
        if not isinstance(rotate, bool):
            raise TypeError(f"rotate must be a bool, got {rotate!r}.")
        self.rotate = rotate

    @property
    def num_groups(self) -> int:
        """Number of groups in every epoch."""
        return -(-self.n // self.group_size)

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Group order, per-group seeds and rotation of an epoch."""
        epoch = check_nonnegative_int("epoch", epoch)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_groups)
        seeds = rng.integers(0, 2**63 - 1, size=self.num_groups, dtype=np.int64)
        shift = int(rng.integers(0, self.n)) if self.rotate and self.n else 0
        return order, seeds, shift

    def group_order(self, epoch: int) -> np.ndarray:
        """The groups in the order ``epoch`` visits them (group ``k`` starts at ``k * group_size``,
        plus the epoch's rotation when ``rotate``)."""
        return self._plan(epoch)[0]

    def _group_size(self, group: int) -> int:
        return min(self.group_size, self.n - group * self.group_size)

    def _fill_group(self, out: np.ndarray, group: int, seed: int, shift: int) -> np.ndarray:
        """Write the shuffled indices of ``group`` into ``out`` (of the group's size)."""
        generator = torch.Generator()
        generator.manual_seed(seed)
        first = group * self.group_size + shift
        if first >= self.n:
            first -= self.n
        # NOTE: torch's CPU randperm is the fastest Fisher-Yates at hand (about 2x numpy's
        # Generator.permutation per group), and a group of 2**16 stays in cache while it is
        # shuffled. It draws the same numbers whatever the dtype, so a group is shuffled in
        # int32 (a fifth faster) and widened to int64 in the pass that adds its first index.
        if len(out) <= _INT32_MAX:
            order = torch.randperm(len(out), generator=generator, dtype=torch.int32).numpy()
            np.add(order, first, out=out, dtype=np.int64)
        else:
            torch.randperm(len(out), generator=generator, out=torch.from_numpy(out))
            out += first
        if first + len(out) > self.n:
            # NOTE: the indices past n wrap to the range's start; a subtraction of n times the
            # mask is about 10x faster than the masked update out[out >= n] -= n (a gather and
            # a scatter at random places), and every index wraps at most once (first < n, len(out) <= n)
            out -= np.multiply(out >= self.n, self.n, dtype=np.int64)
        return out

    def groups(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """Yield the groups of an epoch in order, each an ``int64`` array of indices.

        ``start`` skips the first ``start`` groups of the epoch (without shuffling them).
        """
        order, seeds, shift = self._plan(epoch)
        for group in order[start:].tolist():
            out = np.empty(self._group_size(group), dtype=np.int64)
            yield self._fill_group(out, group, int(seeds[group]), shift)

    def position_of(self, epoch: int, index: int) -> int:
        """Where ``index`` comes in ``epoch``'s order: the inverse of ``permutation``, one group shuffled.

        Examples:
            >>> perm = GroupedPermutation(10, group_size=4, seed=0)
            >>> order = perm.permutation(epoch=3)
            >>> [perm.position_of(3, int(i)) for i in order] == list(range(10))
            True
        """
        order, seeds, shift = self._plan(epoch)
        offset = index - shift if index >= shift else index - shift + self.n
        group = offset // self.group_size
        out = self._fill_group(np.empty(self._group_size(group), dtype=np.int64), group, int(seeds[group]), shift)
        place = int(np.flatnonzero(order == group)[0])
        return self._start_of(order, place) + int(np.flatnonzero(out == index)[0])

    def _start_of(self, order: np.ndarray, place: int) -> int:
        """Items of the groups before the ``place``-th of ``order`` (the last group is the short one)."""
        short = self.num_groups * self.group_size - self.n
        last_before = short and bool((order[:place] == self.num_groups - 1).any())
        return place * self.group_size - (short if last_before else 0)

    def groups_from(self, epoch: int, position: int) -> Iterator[np.ndarray]:
        """Yield the groups of ``epoch`` from its ``position``-th index on, the first one cut there."""
        order, _, _ = self._plan(epoch)
        sizes = np.full(self.num_groups, self.group_size, dtype=np.int64)
        if self.num_groups:
            sizes[order == self.num_groups - 1] = self._group_size(self.num_groups - 1)
        place = int(np.searchsorted(np.cumsum(sizes), position, side="right"))
        within = position - self._start_of(order, place)
        for number, group in enumerate(self.groups(epoch, place)):
            yield group[within:] if number == 0 else group

    def permutation(self, epoch: int) -> np.ndarray:
        """The whole epoch order as one ``int64`` array."""
        order, seeds, shift = self._plan(epoch)
        out = np.empty(self.n, dtype=np.int64)
        pos = 0
        for group in order.tolist():
            size = self._group_size(group)
            self._fill_group(out[pos : pos + size], group, int(seeds[group]), shift)
            pos += size
        return out

    def __repr__(self) -> str:
        return f"GroupedPermutation(n={self.n}, group_size={self.group_size}, seed={self.seed}, rotate={self.rotate})"


def grouped_permutation(n: int, *, group_size: int = DEFAULT_GROUP_SIZE, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """One epoch order of a ``GroupedPermutation`` as an array.

    Examples:
        >>> order = grouped_permutation(1000, group_size=64, seed=3, epoch=2)
        >>> order.shape, bool((np.sort(order) == np.arange(1000)).all())
        ((1000,), True)
    """
    return GroupedPermutation(n, group_size, seed).permutation(epoch)
