"""The epoch order and what an epoch yielded.

:class:`EpochOrder` gives the order in which an epoch visits ``range(n)``, one chunk
(shuffle group) at a time; :class:`EpochStats` counts what the last epoch yielded. The
planners (:mod:`fastsab.plan.planners`) batch that order, with costs from a cost source
(:mod:`fastsab.plan.costs`); both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastsab._checks import check_positive_int
from fastsab.plan.costs import make_cost_source
from fastsab.plan.planners import FixedSizePlanner, SizeAwarePlanner
from fastsab.plan.plans import PlanChunk
from fastsab.plan.shuffle import DEFAULT_GROUP_SIZE, GroupedPermutation

__all__ = [
    "EpochOrder",
    "EpochStats",
    "FixedSizePlanner",
    "SizeAwarePlanner",
    "make_cost_source",
]


@dataclass
class EpochStats:
    """What the last epoch yielded.

    Attributes:
        epoch: The epoch number.
        num_batches: Batches yielded so far.
        num_items: Items in those batches.
        num_skipped: Oversize items skipped (size-aware loaders).
        skipped: Their dataset indices.
        num_dropped: Items left out: the last partial batch with ``drop_last=True``, or the
            surplus batches with ``even_batches="drop"`` under ``torch.distributed``.
        dropped: Their dataset indices.
        limit_changes: ``(batches yielded before, old limit, new limit)`` for every time
            the batch size or cap was lowered during the epoch (out-of-memory adaptation).
        num_splits: Batches split because their step ran out of memory
            (:func:`fastsab.adaptive.run`).
        num_padded: Steps filled by repeating batches so that every rank runs the same
            number of steps (``even_batches="pad"`` under ``torch.distributed``), over all ranks.
        padded: The indices this rank yields a second time in the epoch: its share of those
            repeated batches. A resumed epoch reports, like ``skipped`` and ``dropped``, the
            whole epoch's: all repeats of the ranks it runs on, also those run before the save.
        spread_before, spread_after: Mean per-step cost spread ``(max - min) / max`` across
            ranks with batches dealt in plan order, and with the balanced assignment.
    """

    epoch: int
    num_batches: int = 0
    num_items: int = 0
    num_skipped: int = 0
    skipped: list[int] = field(default_factory=list)
    num_dropped: int = 0
    dropped: list[int] = field(default_factory=list)
    limit_changes: list[tuple[int, Any, Any]] = field(default_factory=list)
    num_splits: int = 0
    num_padded: int = 0
    padded: list[int] = field(default_factory=list)
    spread_before: float = 0.0
    spread_after: float = 0.0

    def clear_reports(self) -> None:
        """Forget the skipped, dropped and padded items (a new plan of the epoch reports them again)."""
        self.num_skipped = self.num_dropped = 0
        self.skipped, self.dropped, self.padded = [], [], []

    def add(self, chunk: PlanChunk) -> None:
        self.num_skipped += len(chunk.skipped)
        self.skipped += chunk.skipped.tolist()
        self.num_dropped += len(chunk.dropped)
        self.dropped += chunk.dropped.tolist()
        self.padded += chunk.padded.tolist()


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
