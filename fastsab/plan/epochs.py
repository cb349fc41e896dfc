"""The epoch order.

``EpochOrder`` gives the order in which an epoch visits ``range(n)``, one chunk
(shuffle group) at a time. The planners (``fastsab.plan.planners``,
``fastsab.plan.fixed_size``) batch that order, with costs from a cost source
(``fastsab.plan.costs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastsab._checks import check_positive_int
from fastsab.plan.cost_sources import CostSource
from fastsab.plan.shuffle import DEFAULT_GROUP_SIZE, GroupedPermutation

__all__ = ["FIRST_CHUNK", "EpochOrder"]

#: Items of an epoch's first chunk where its batches do not depend on where chunks end
#: (``EpochOrder.chunks_first_small``).
FIRST_CHUNK = 2**12


class EpochOrder:
    """The order in which an epoch visits ``range(n)``, one chunk (shuffle group) at a time.

    Examples:
        >>> [chunk.tolist() for chunk in EpochOrder(5, shuffle=False, group_size=2).chunks(0)]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(
        self, n: int, *, shuffle: bool, seed: int = 0, group_size: int = DEFAULT_GROUP_SIZE, rotate: bool = True
    ) -> None:
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {shuffle!r}.")
        self.n = n
        self.shuffle = shuffle
        self.group_size = check_positive_int("group_size", group_size)
        self.permutation = GroupedPermutation(n, self.group_size, seed, rotate=rotate)
        self.rotate = rotate
        self.seed = self.permutation.seed

    #: Whether every epoch visits each of the ``n`` items once (a mixture's may not).
    each_item_once = True

    @property
    def equal_epochs(self) -> bool:
        """Whether every epoch has as many items: all ``n`` (a mixture's epochs may differ)."""
        return True

    @property
    def id_bound(self) -> int:
        """Ids the order yields are below this: ``n`` (a mixture's ids also name a source epoch)."""
        return self.n

    def read_by_ids(self, costs: CostSource) -> CostSource:
        """``costs`` read with the ids this order yields: as they are (a mixture's name their item otherwise)."""
        return costs

    def state_entry(self, epoch: int, item: int | None) -> dict[str, Any]:
        """What a state saves of the order besides the seed: nothing (a mixture's rule saves where it stands)."""
        return {}

    def load_entry(self, epoch: int, entry: object, planner: object) -> None:
        """Take up what ``state_entry`` saved: nothing to take up."""

    def window_chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks whose runs ``sort_window`` sorts: ``chunks`` (a mixture's hold one source a run)."""
        return self.chunks(epoch, start)

    def epoch_length(self, epoch: int) -> int:
        """Items of ``epoch``: all ``n``."""
        return self.n

    def group_order(self, epoch: int) -> np.ndarray:
        """The order in which ``epoch`` visits the blocks ``[k * group_size, (k + 1) * group_size)``."""
        if self.shuffle:
            return self.permutation.group_order(epoch)
        return np.arange(self.permutation.num_groups, dtype=np.int64)

    def chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks of ``epoch`` in order, from its chunk number ``start`` on."""
        if self.shuffle:
            yield from self.permutation.groups(epoch, start)
            return
        for first in range(start * self.group_size, self.n, self.group_size):
            yield np.arange(first, min(first + self.group_size, self.n), dtype=np.int64)

    def chunks_first_small(self, epoch: int) -> Iterator[np.ndarray]:
        """The chunks of ``epoch`` in order, the first cut after its first ``FIRST_CHUNK`` items.

        For planners whose batches carry over chunk ends (the same batches wherever the chunks
        end): the first batches are planned, fetched and handed out from a few thousand items,
        not from a whole shuffle group.

        Examples:
            >>> [len(chunk) for chunk in EpochOrder(20_000, shuffle=False, group_size=16_384).chunks_first_small(0)]
            [4096, 12288, 3616]
        """
        chunks = self.chunks(epoch)
        first = next(chunks, None)
        if first is None:
            return
        # NOTE: a first chunk of not much more than FIRST_CHUNK items stays whole (a short rest gains nothing)
        if len(first) > 2 * FIRST_CHUNK:
            yield first[:FIRST_CHUNK]
            first = first[FIRST_CHUNK:]
        yield first
        yield from chunks

    def plan_chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks planners plan ``epoch`` from: from item ``start`` on, or whole with a small first chunk."""
        return self.chunks_from(epoch, start) if start else self.chunks_first_small(epoch)

    def position_of(self, epoch: int, index: int) -> int:
        """Where ``index`` comes in ``epoch``'s order (its number of items before it).

        Examples:
            >>> order = EpochOrder(10, shuffle=True, group_size=4, seed=1)
            >>> chunks = list(order.chunks(2))
            >>> order.position_of(2, int(chunks[1][0])) == len(chunks[0])
            True
        """
        return self.permutation.position_of(epoch, index) if self.shuffle else index

    def chunks_from(self, epoch: int, position: int) -> Iterator[np.ndarray]:
        """The chunks of ``epoch`` from its ``position``-th item on: the chunk holding it cut there, then the rest.

        Examples:
            >>> order = EpochOrder(10, shuffle=True, group_size=4, seed=1)
            >>> np.array_equal(np.concatenate(list(order.chunks_from(0, 3))), np.concatenate(list(order.chunks(0)))[3:])
            True
        """
        if self.shuffle:
            yield from self.permutation.groups_from(epoch, position)
            return
        first = position // self.group_size
        for number, chunk in enumerate(self.chunks(epoch, first)):
            yield chunk[position - first * self.group_size :] if number == 0 else chunk
