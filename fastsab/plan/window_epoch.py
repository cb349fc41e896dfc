"""The epoch of a size-aware planner with ``sort_window``: groups sorted in windows, batches shuffled.

The window order and the order of batches are ``fastsab.plan.windows``; ``SortedWindowEpoch``
plans an epoch with them, chunk by chunk, and re-plans what follows a lowered cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fastsab.plan.batching import OversizePolicy, split_with
from fastsab.plan.costs import BatchCost, Caps, CostSource
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.figures import BatchFigures
from fastsab.plan.plans import _EMPTY_IDS, Carry, PlanChunk
from fastsab.plan.windows import batch_order, window_order

__all__ = ["SortedWindowEpoch", "WindowedPlanner"]


class WindowedPlanner(Protocol):
    """What a ``SortedWindowEpoch`` reads of its planner (a ``SizeAwarePlanner``)."""

    @property
    def order(self) -> EpochOrder: ...

    @property
    def costs(self) -> CostSource: ...

    @property
    def rule(self) -> BatchCost: ...

    @property
    def oversize(self) -> OversizePolicy: ...

    @property
    def sort_window(self) -> int | None: ...

    @property
    def figures(self) -> BatchFigures: ...


@dataclass(frozen=True)
class _Resume:
    """Where a ``SortedWindowEpoch`` stands between two chunks: enough to plan on from there.

    Attributes:
        next_group: The epoch's next shuffle group to plan.
        carry: The open batch.
        prefix: Items (and their costs) given back by a lowering, planned before the next group.
    """

    next_group: int
    carry: Carry | None
    prefix: tuple[np.ndarray, np.ndarray] | None


@dataclass(frozen=True)
class _WindowPlan:
    """A whole epoch planned with sorted windows: its chunks, where each began, and where it ended."""

    chunks: list[PlanChunk]
    log: list[_Resume]
    end: _Resume

    @property
    def num_batches(self) -> int:
        return sum(chunk.num_batches for chunk in self.chunks)

    @classmethod
    def of(cls, epoch: SortedWindowEpoch) -> _WindowPlan:
        """The rest of ``epoch`` planned live, with the mark before each chunk."""
        chunks: list[PlanChunk] = []
        log: list[_Resume] = []
        while True:
            mark = epoch.mark()
            chunk = next(epoch, None)
            if chunk is None:
                return cls(chunks, log, mark)
            chunks.append(chunk)
            log.append(mark)


class SortedWindowEpoch:
    """One epoch of a ``SizeAwarePlanner`` with ``sort_window``, whose cap can be lowered mid-epoch.

    Each shuffle group is sorted by size in windows of ``sort_window`` items
    (``window_order``), split greedily (the open batch carried on to the
    next group, as without windows), and the chunk's batches are yielded in an order shuffled
    with a seed of ``(seed, epoch, group)``. The batches that hold items carried in from
    earlier groups stay first, and batches of a later group come after those of an earlier
    one, so that a chunked dataset is still read group after group.

    A lowering re-plans the items not yet yielded of the current chunk (with the open batch)
    under the lowered caps, and the epoch's groups after that chunk anew: chunks planned ahead
    (prefetched) are given back (``lower_giving_back``), so that the rest of the
    epoch does not depend on how far ahead it was planned and a resumed epoch replays it exactly.

    Memory: the epoch holds the group being planned and the open batch; where each chunk
    began (``mark``) is kept by whoever holds the chunk and may give it back.
    """

    def __init__(self, planner: WindowedPlanner, epoch: int, cached: _WindowPlan | None = None) -> None:
        if planner.sort_window is None:
            raise ValueError("SortedWindowEpoch needs a planner with a sort_window, got sort_window=None.")
        self.planner = planner
        self.epoch = epoch
        self.window = planner.sort_window
        self._cached = cached
        self._yielded = 0  # chunks of the cached plan yielded
        self._next_group = 0
        self._groups: Iterator[np.ndarray] = planner.order.window_chunks(epoch) if cached is None else iter(())
        self._reported = 0  # groups whose skipped items were reported (in chunks yielded)
        self._silent: list[np.ndarray] = []  # groups planned again: their skipped items were reported
        self._carry: Carry | None = None
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None
        self._lowered: BatchCost | None = None
        self._done = False

    def __iter__(self) -> SortedWindowEpoch:
        return self

    def __next__(self) -> PlanChunk:
        if self._cached is not None:
            if self._yielded == len(self._cached.chunks):
                raise StopIteration
            self._yielded += 1
            return self._cached.chunks[self._yielded - 1]
        return self._plan_next()

    def mark(self) -> _Resume:
        """Where the epoch stands before its next chunk: ``lower_giving_back`` plans again from there.

        NOTE: the mark is handed out, not logged: a log of every chunk's mark would grow with
        the epoch (a carry per group), where only the chunks still held may be given back.
        """
        cached = self._cached
        if cached is not None:
            return cached.log[self._yielded] if self._yielded < len(cached.log) else cached.end
        return _Resume(self._next_group, self._carry, self._prefix)

    def _plan_next(self) -> PlanChunk:
        first = self._next_group
        pulled = self._pull()
        if pulled is not None:
            ids, costs = pulled
            bounds = [0]
            # NOTE: as without windows, groups are joined until they are at least as long as
            # the open batch (each group sorted in its own windows)
            while self._carry is not None and len(self._carry) > len(ids):
                more = self._pull()
                if more is None:
                    break
                bounds.append(len(ids))
                ids, costs = np.concatenate([ids, more[0]]), np.concatenate([costs, more[1]])
            return self._split(ids, costs, np.asarray(bounds, dtype=np.int64), first, final=False)
        if self._done and self._prefix is None:
            raise StopIteration
        self._done = True
        if (self._carry is None or not len(self._carry)) and self._prefix is None:
            raise StopIteration
        empty = np.empty((0, self.planner.rule.num_columns))
        if self._carry is not None:
            empty = np.empty((0, *self._carry.costs.shape[1:]), dtype=self._carry.costs.dtype)
        return self._split(_EMPTY_IDS, empty, np.zeros(1, dtype=np.int64), first, final=True)

    def _pull(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The next group of the epoch with its costs, sorted in windows; ``None`` after the last."""
        ids = next(self._groups, None)
        if ids is None:
            return None
        if self._next_group < self._reported:
            self._silent.append(ids)
        self._next_group += 1
        self._reported = max(self._reported, self._next_group)
        costs = np.asarray(self.planner.costs(ids))
        order = window_order(costs, self.window)
        return ids.take(order), costs.take(order, axis=0)  # (take: faster than fancy indexing, rows alike)

    def _split(self, ids: np.ndarray, costs: np.ndarray, bounds: np.ndarray, first: int, final: bool) -> PlanChunk:
        """Split ``ids`` (groups starting at ``bounds``) after the carry and prefix; shuffle the batches."""
        rule, oversize = self.planner.rule, self.planner.oversize
        carry = carried = 0 if self._carry is None else len(self._carry)
        skipped = _EMPTY_IDS
        if self._lowered is not None:
            # the original cap's policy first, then the lowered cap with own batches
            if len(ids):
                keep = split_with(rule, costs, ids=ids, oversize=oversize)
                kept = np.isin(ids, keep.skipped, invert=True)
                skipped = keep.skipped
                ids, costs = ids[kept], costs[kept]
                bounds = np.searchsorted(np.flatnonzero(kept), bounds)
            if self._prefix is not None:
                (prefix_ids, prefix_costs), self._prefix = self._prefix, None
                ids = np.concatenate([prefix_ids, ids])
                costs = np.concatenate([prefix_costs, costs.reshape(len(costs), prefix_costs.shape[1])])
                bounds = bounds + len(prefix_ids)
                carried += len(prefix_ids)
            rule, oversize = self._lowered, "own_batch"
        open_batch = self._carry
        split = split_with(rule, costs, ids=ids, carry=open_batch, final=final, oversize=oversize)
        self._carry = split.carry
        skipped = np.concatenate([skipped, split.skipped])
        if self._silent:
            skipped = skipped[np.isin(skipped, np.concatenate(self._silent), invert=True)]
            self._silent = []
        order = batch_order(self._labels(split, ids, bounds, carry, carried), self._rng(first))
        figures = self.planner.figures.of_split(split, open_batch, ids, costs)
        chunk = PlanChunk(split.ids, split.offsets, figures=figures).select(order)
        return PlanChunk(chunk.ids, chunk.offsets, skipped, split.dropped, figures=chunk.figures)

    @staticmethod
    def _labels(split: PlanChunk, ids: np.ndarray, bounds: np.ndarray, carry: int, carried: int) -> np.ndarray:
        """Per batch of ``split``: the group of its first item, or a negative place if it starts with a carried item.

        Args:
            split: The split of the carry (``carry`` items) followed by ``ids``.
            ids: The items split after the carry; group ``t`` starts at ``bounds[t]``.
            bounds: Where the groups start in ``ids``.
            carry: Items of the carry.
            carried: Items before the first group in the split: the carry and a lowering's prefix.
        """
        if len(split.skipped):  # skipped items are not in the split's ids
            bounds = np.searchsorted(np.flatnonzero(np.isin(ids, split.skipped, invert=True)), bounds)
        starts = split.offsets[:-1]
        labels = np.searchsorted(bounds + carry, starts, side="right") - 1
        leading = starts < carried
        labels[leading] = np.arange(-int(leading.sum()), 0)
        return labels

    def _rng(self, first: int) -> np.random.Generator | None:
        order = self.planner.order
        return np.random.default_rng([order.seed, self.epoch, first]) if order.shuffle else None

    def lower(self, pending: np.ndarray, caps: Caps) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``caps``."""
        self.lower_giving_back(pending, caps, None)

    def lower_giving_back(self, pending: np.ndarray, caps: Caps, given_back: _Resume | None) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``caps``.

        Args:
            pending: The items of the current chunk not yet yielded, in order.
            caps: The lowered caps.
            given_back: The ``mark`` before the first chunk given back (yielded after the
                current one, none of its batches yielded), or ``None``: the groups of the chunks
                from there on are planned again.
        """
        state = self._rewound(given_back)
        parts = [pending]
        costs = [np.asarray(self.planner.costs(pending)).reshape(len(pending), -1)] if len(pending) else []
        if state.prefix is not None:
            parts.append(state.prefix[0])
            costs.append(state.prefix[1])
        if state.carry is not None and len(state.carry):
            parts.append(state.carry.ids)
            costs.append(state.carry.costs.reshape(len(state.carry), -1))
        self._carry = None
        self._prefix = (np.concatenate(parts), np.concatenate(costs)) if costs else None
        self._lowered = self.planner.rule.lowered(caps)
        self._done = False

    def _rewound(self, given_back: _Resume | None) -> _Resume:
        """The state at ``given_back`` (``None``: now); planning goes on from there."""
        if self._cached is not None:
            now = self.mark()
            self._reported = now.next_group
            self._cached = None
            state = now if given_back is None else given_back
        elif given_back is None:
            return self.mark()
        else:
            state = given_back
        self._next_group = state.next_group
        self._groups = self.planner.order.window_chunks(self.epoch, state.next_group)
        return state
