"""An epoch of shape buckets: each group's items to their buckets, full batches out, the rest kept open.

``BucketEpoch`` plans an epoch of a ``BucketPlanner`` (``fastsab.plan.bucket_planner``) one
shuffle group at a time: the group's items go to their buckets in the epoch's order (so items are
shuffled within each bucket), every bucket cuts its open items into batches of its batch size, and
what is left stays open for the next group. After the last group each bucket's last, partial batch
is completed with filler rows (``partial="fill"``: the batch's own items again, cycled) or kept as
it is (``partial="keep"``). Each chunk's batches are yielded in a seeded random order.

A lowered limit (smaller batch sizes) re-plans the items not yet yielded of the current chunk with
the open ones, and the groups after that chunk anew; chunks planned ahead are given back
(``lower_giving_back``), so that a resumed epoch replays a lowering exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastsab.plan.epochs import EpochOrder
from fastsab.plan.plans import _EMPTY_IDS, PlanChunk
from fastsab.plan.shape_buckets import ShapeBuckets
from fastsab.plan.windows import batch_order

__all__ = ["BucketEpoch", "BucketRule", "first_occurrences", "plan_buckets"]


class _Figures(Protocol):
    def of(self, ids: np.ndarray, offsets: np.ndarray, real_rows: np.ndarray | None = None) -> np.ndarray: ...


class BucketRule(Protocol):
    """What a ``BucketEpoch`` reads of its planner (a ``BucketPlanner``)."""

    @property
    def order(self) -> EpochOrder: ...

    @property
    def buckets(self) -> ShapeBuckets: ...

    @property
    def batch_sizes(self) -> list[int]: ...

    @property
    def partial(self) -> str: ...

    @property
    def per_group(self) -> bool: ...

    @property
    def figures(self) -> _Figures: ...

    def lengths_of(self, ids: np.ndarray) -> np.ndarray: ...

    def set_oversize_aside(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class _Open:
    """Where a ``BucketEpoch`` stands before a chunk: enough to plan on from there.

    Attributes:
        next_group: The epoch's next shuffle group to plan.
        queues: Each bucket's open items, in order.
        own: Oversize items given back by a lowering, each still to get a batch of its own.
    """

    next_group: int
    queues: tuple[np.ndarray, ...]
    own: np.ndarray


def plan_buckets(
    planner: BucketRule, ids: np.ndarray, own: np.ndarray, queues: list[np.ndarray], sizes: list[int], final: bool
) -> PlanChunk:
    """The batches of ``ids`` (none oversize) after each bucket's open items ``queues`` (updated in place).

    Args:
        planner: Whose buckets, lengths and ``partial`` apply.
        ids: The items to batch, in order.
        own: Oversize items, each given a batch of its own (after the buckets' batches).
        queues: Each bucket's open items: read first, and left with those still open.
        sizes: Each bucket's batch size.
        final: Whether the epoch ends here: every bucket's last batch is made (filled or kept).

    Returns:
        The chunk of batches in bucket order, figures included (fillers at the end of their batch).
    """
    num_buckets = len(sizes)
    bucket = planner.buckets.bucket_of(planner.lengths_of(ids)) if len(ids) else _EMPTY_IDS
    grouped = ids[np.argsort(bucket, kind="stable")]
    ends = np.cumsum(np.bincount(bucket, minlength=num_buckets))
    parts: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    real: list[np.ndarray] = []
    for k, size in enumerate(sizes):
        new = grouped[ends[k - 1] if k else 0 : ends[k]]
        queue = np.concatenate([queues[k], new]) if len(queues[k]) else new
        full = len(queue) // size * size
        parts.append(queue[:full])
        rows.append(np.full(full // size, size, dtype=np.int64))
        real.append(rows[-1])
        rest = queue[full:]
        if final and len(rest):
            # NOTE: fillers repeat the batch's own items (cycled), after them: a filler is any
            # repeat of an id within its batch, which every path can tell from the ids alone
            parts.append(np.resize(rest, size) if planner.partial == "fill" else rest)
            rows.append(np.array([size if planner.partial == "fill" else len(rest)], dtype=np.int64))
            real.append(np.array([len(rest)], dtype=np.int64))
            rest = _EMPTY_IDS
        queues[k] = rest
    parts.append(own)
    rows.append(np.ones(len(own), dtype=np.int64))
    real.append(rows[-1])
    sizes_of = np.concatenate(rows)
    offsets = np.zeros(len(sizes_of) + 1, dtype=np.int64)
    np.cumsum(sizes_of, out=offsets[1:])
    batched = np.concatenate(parts) if parts else _EMPTY_IDS
    real_rows = np.concatenate(real)
    return PlanChunk(batched, offsets, figures=planner.figures.of(batched, offsets, real_rows))


def first_occurrences(ids: np.ndarray) -> np.ndarray:
    """``ids`` without repeats, each at its first place (a filler repeats an item of its batch)."""
    if len(ids) < 2:
        return ids
    _, first = np.unique(ids, return_index=True)
    if len(first) == len(ids):
        return ids
    return ids[np.sort(first)]


class BucketEpoch:
    """One epoch of a ``BucketPlanner`` (a ``BucketRule``), whose batch sizes can be lowered mid-epoch.

    Memory: the epoch holds the group being planned and each bucket's open items (fewer than its
    batch size); where each chunk began (``mark``) is kept by whoever holds the chunk.
    """

    def __init__(self, planner: BucketRule, epoch: int) -> None:
        self.planner = planner
        self.epoch = epoch
        self.sizes = list(planner.batch_sizes)
        num_buckets = len(self.sizes)
        self._queues: list[np.ndarray] = [_EMPTY_IDS] * num_buckets
        self._own = _EMPTY_IDS
        self._next_group = 0
        self._reported = 0  # groups whose skipped items were reported
        self._groups: Iterator[np.ndarray] = planner.order.chunks(epoch)
        self._done = False
        self._taken_back = False  # items a lowering took back wait in the buckets

    def __iter__(self) -> BucketEpoch:
        return self

    def __next__(self) -> PlanChunk:
        first = self._next_group
        per_group = self.planner.per_group
        if per_group and self._taken_back:
            # NOTE: the items a lowering took back are batched alone, not with the next group's (a group
            # is a chunk read alone)
            self._taken_back = False
            return self._plan(_EMPTY_IDS, first, final=True, report=False)
        ids = next(self._groups, None)
        if ids is not None:
            self._next_group += 1
            reported = first < self._reported
            self._reported = max(self._reported, self._next_group)
            return self._plan(ids, first, final=per_group, report=not reported)
        if self._done:
            raise StopIteration
        self._done = True
        if not any(len(queue) for queue in self._queues) and not len(self._own):
            raise StopIteration
        return self._plan(_EMPTY_IDS, first, final=True, report=False)

    def _plan(self, ids: np.ndarray, first: int, final: bool, report: bool) -> PlanChunk:
        planner = self.planner
        ids, own, skipped = planner.set_oversize_aside(ids)
        own = np.concatenate([self._own, own]) if len(self._own) else own
        self._own = _EMPTY_IDS
        chunk = plan_buckets(planner, ids, own, self._queues, self.sizes, final)
        order = batch_order(np.zeros(chunk.num_batches, dtype=np.int64), self._rng(first))
        chunk = chunk.select(order)
        return PlanChunk(chunk.ids, chunk.offsets, skipped if report else _EMPTY_IDS, figures=chunk.figures)

    def _rng(self, first: int) -> np.random.Generator | None:
        order = self.planner.order
        return np.random.default_rng([order.seed, self.epoch, first]) if order.shuffle else None

    def mark(self) -> _Open:
        """Where the epoch stands before its next chunk: ``lower_giving_back`` plans again from there."""
        return _Open(self._next_group, tuple(self._queues), self._own)

    def lower(self, pending: np.ndarray, sizes: list[int]) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``sizes``."""
        self.lower_giving_back(pending, sizes, None)

    def lower_giving_back(self, pending: np.ndarray, sizes: list[int], given_back: _Open | None) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``sizes``.

        Args:
            pending: The items of the current chunk not yet yielded, in order (fillers included).
            sizes: The lowered batch size of each bucket.
            given_back: The ``mark`` before the first chunk given back (yielded after the
                current one, none of its batches yielded), or ``None``: the groups of the chunks
                from there on are planned again.
        """
        state = self.mark() if given_back is None else given_back
        if given_back is not None:
            self._next_group = state.next_group
            self._groups = self.planner.order.chunks(self.epoch, state.next_group)
        pending = first_occurrences(pending)
        kept, own, _ = self.planner.set_oversize_aside(pending)
        bucket = self.planner.buckets.bucket_of(self.planner.lengths_of(kept))
        # NOTE: the items taken back come first in their buckets, before the open ones
        self._queues = [
            np.concatenate([kept[bucket == k], queue]) if len(queue) else kept[bucket == k]
            for k, queue in enumerate(state.queues)
        ]
        self._own = np.concatenate([own, state.own])
        self.sizes = list(sizes)
        self._done = False
        self._taken_back = any(len(queue) for queue in self._queues) or bool(len(self._own))
