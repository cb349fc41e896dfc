"""Epoch plans: which indices form which batches, chunk by chunk.

A planner (:class:`~fastsab.plans.Planner`) turns ``(epoch)`` into a stream of
:class:`~fastsab.plans.PlanChunk` (ids in epoch order and batch offsets), computed one shuffle group
at a time so that memory stays bounded and the first batch is ready at once. The loaders
fetch what a plan names; :class:`fastsab.planned.PlannedBatchSampler` hands the same
plan to a ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fastsab._checks import check_choice, check_positive_int
from fastsab.batching import OversizePolicy, split_with
from fastsab.costs import BatchCost, Caps, CostMode, CostSource, refuse_above
from fastsab.plans import _EMPTY_IDS, Carry, PlanChunk, PlanInputs
from fastsab.windows import batch_order, check_sort_window, window_order

if TYPE_CHECKING:
    from fastsab.epochs import EpochOrder

__all__ = ["FixedSizeEpoch", "FixedSizePlanner", "SizeAwareEpoch", "SizeAwarePlanner", "SortedWindowEpoch"]

#: Epochs of at most this many items keep their whole plan after ``len()`` computed it.
PLAN_CACHE_ITEMS = 2**22


class FixedSizePlanner:
    """Batches of ``batch_size`` consecutive items of the epoch order (across chunk borders)."""

    def __init__(self, order: EpochOrder, batch_size: int, drop_last: bool) -> None:
        self.order = order
        self.batch_size = check_positive_int("batch_size", batch_size)
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}.")
        self.drop_last = drop_last

    def num_batches(self, epoch: int) -> int:
        n, size = self.order.n, self.batch_size
        return n // size if self.drop_last else -(-n // size)

    def plan_inputs(self) -> PlanInputs:
        """What besides the order decides the batches: the batch size and ``drop_last``."""
        return PlanInputs("FixedSizePlanner", {"batch_size": self.batch_size, "drop_last": self.drop_last}, b"")

    def chunks(self, epoch: int) -> FixedSizeEpoch:
        return FixedSizeEpoch(self, epoch)

    def batch_costs(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Cost of each batch ``ids[offsets[b]:offsets[b + 1]]`` for balancing: its size."""
        return np.diff(offsets).astype(np.float64)

    @property
    def limit(self) -> int:
        """The configured limit: the batch size."""
        return self.batch_size

    def check_limit(self, limit: object) -> int:
        """``limit`` checked as a batch size."""
        return check_positive_int("limit", limit)

    def check_lowered_limit(self, limit: object) -> int:
        """``limit`` checked as a batch size, not above the configured one."""
        checked = self.check_limit(limit)
        refuse_above([checked], [self.batch_size], self.batch_size, limit)
        return checked

    def smaller_limit(self, ids: np.ndarray, current: int, factor: float) -> int:
        """A batch size about ``factor`` times below the failed batch's size."""
        return min(current, max(1, int(len(ids) / factor)))

    def split(self, ids: np.ndarray, limit: int) -> list[np.ndarray]:
        """Cut ``ids`` into batches of at most ``limit`` items."""
        return [ids[start : start + limit] for start in range(0, len(ids), limit)]


class FixedSizeEpoch:
    """One epoch of a :class:`FixedSizePlanner`, whose batch size can be lowered mid-epoch.

    With ``drop_last`` the last ``n % batch_size`` items of the order are dropped, as
    planned at the start of the epoch: lowering the batch size never changes which items
    the epoch covers (a last partial batch after a lowering is kept).
    """

    def __init__(self, planner: FixedSizePlanner, epoch: int) -> None:
        self.planner = planner
        self.batch_size = planner.batch_size
        n = planner.order.n
        self._keep = n - n % planner.batch_size if planner.drop_last else n  # items batched at all
        self._seen = 0
        self._chunks = planner.order.chunks(epoch)
        self._rest = _EMPTY_IDS

    def __iter__(self) -> FixedSizeEpoch:
        return self

    def __next__(self) -> PlanChunk:
        size = self.batch_size
        for chunk in self._chunks:
            kept = max(0, min(len(chunk), self._keep - self._seen))
            self._seen += len(chunk)
            dropped = chunk[kept:]
            ids = np.concatenate([self._rest, chunk[:kept]]) if len(self._rest) else chunk[:kept]
            full = len(ids) // size * size
            self._rest = ids[full:]
            if full or len(dropped):
                return PlanChunk(ids[:full], np.arange(0, full + 1, size, dtype=np.int64), dropped=dropped)
        if not len(self._rest):
            raise StopIteration
        # NOTE: the rest is handed out once; a lowering in it gives the items after its cut back
        rest, self._rest = self._rest, _EMPTY_IDS
        return PlanChunk(rest, np.append(np.arange(0, len(rest), size, dtype=np.int64), len(rest)))

    def lower(self, pending: np.ndarray, limit: int) -> None:
        """Batch ``pending`` (the rest of the current chunk) and all that follows with ``limit`` items."""
        self._rest = np.concatenate([pending, self._rest])
        self.batch_size = int(limit)


class SizeAwarePlanner:
    """Greedy size-aware batches over the epoch order, split chunk by chunk with a carry.

    ``fixed_cost`` and ``feature_cost`` are those of :class:`~fastsab.costs.BatchCost`; with a
    ``feature_cost``, ``costs`` gives the items' features (:class:`~fastsab.cost_sources.FeatureRows`).

    With ``sort_window`` the order is first sorted by size in windows of that many items and
    the batches of each chunk are yielded in a seeded random order (:class:`SortedWindowEpoch`).
    """

    def __init__(
        self,
        order: EpochOrder,
        costs: CostSource,
        max_total_size: Any,
        *,
        cost: CostMode = "sum",
        max_batch_size: int | None = None,
        batch_size_multiple: int = 1,
        oversize: OversizePolicy = "skip",
        fixed_cost: Any = 0,
        feature_cost: Callable[[np.ndarray], np.ndarray] | None = None,
        sort_window: int | None = None,
    ) -> None:
        self.order = order
        self.costs = costs
        self.sort_window = check_sort_window(sort_window)
        self.rule = BatchCost(
            max_total_size,
            cost=cost,
            max_batch_size=max_batch_size,
            batch_size_multiple=batch_size_multiple,
            fixed_cost=fixed_cost,
            feature_cost=feature_cost,
        )
        self.oversize: OversizePolicy = check_choice("oversize", oversize, ("skip", "own_batch", "error"))  # type: ignore[assignment]
        if order.n:
            # NOTE: the caps are checked against the first item's cost columns now, not at the first len() or iter()
            self.rule.check_columns(np.asarray(costs(np.zeros(1, dtype=np.int64))))
        self._cache: tuple[int, list[PlanChunk]] | None = None
        self._window_cache: tuple[int, _WindowPlan] | None = None

    def num_batches(self, epoch: int) -> int:
        """Exact number of batches of ``epoch``: the plan is computed (and cached if small)."""
        if self.sort_window is not None:
            if self.order.n > PLAN_CACHE_ITEMS and not (self._window_cache and self._window_cache[0] == epoch):
                return sum(chunk.num_batches for chunk in SortedWindowEpoch(self, epoch))
            return self._window_plan(epoch).num_batches
        if self._cache is not None and self._cache[0] == epoch:
            return sum(chunk.num_batches for chunk in self._cache[1])
        if self.order.n <= PLAN_CACHE_ITEMS:
            chunks = list(SizeAwareEpoch(self, epoch))
            self._cache = (epoch, chunks)
            return sum(chunk.num_batches for chunk in chunks)
        return sum(chunk.num_batches for chunk in SizeAwareEpoch(self, epoch))

    def chunks(self, epoch: int) -> SizeAwareEpoch | SortedWindowEpoch:
        if self.sort_window is not None:
            hit = self._window_cache
            return SortedWindowEpoch(self, epoch, hit[1] if hit is not None and hit[0] == epoch else None)
        cached = self._cache[1] if self._cache is not None and self._cache[0] == epoch else None
        return SizeAwareEpoch(self, epoch, cached)

    def _window_plan(self, epoch: int) -> _WindowPlan:
        """The whole plan of ``epoch`` with sorted windows, kept for its iteration."""
        if self._window_cache is not None and self._window_cache[0] == epoch:
            return self._window_cache[1]
        live = SortedWindowEpoch(self, epoch)
        plan = _WindowPlan(list(live), live.log, live.state())
        self._window_cache = (epoch, plan)
        return plan

    def batch_costs(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Cost of each batch ``ids[offsets[b]:offsets[b + 1]]`` for balancing.

        The batch cost of every column (sum, or size times maximum) divided by its cap (a
        cap of 0 divides by 1); the largest column counts.
        """
        if len(offsets) < 2:
            return np.empty(0, dtype=np.float64)
        return self.rule.balance_costs(self.costs(ids), offsets)

    def plan_inputs(self) -> PlanInputs:
        """What besides the order decides the batches: the caps, options and sizes."""
        options = self.rule.fingerprint_options(self.oversize)
        if self.sort_window is not None:  # NOTE: absent when unset, so that earlier digests still hold
            options["sort_window"] = self.sort_window
        return PlanInputs("SizeAwarePlanner", options, self.costs.fingerprint(self.order.n))

    @property
    def limit(self) -> Caps:
        """The configured limit: the cap of every cost column."""
        return self.rule.limit

    def check_limit(self, limit: object) -> Caps:
        """``limit`` checked as caps: as many as configured, each positive."""
        return self.rule.check_caps(limit)

    def check_lowered_limit(self, limit: object) -> Caps:
        """``limit`` checked as caps, none above the configured ones."""
        return self.rule.check_lowered(limit)

    def smaller_limit(self, ids: np.ndarray, current: Caps, factor: float) -> Caps:
        """Caps ``factor`` times below the failed batch's cost (never above the current caps).

        A column the batch spent nothing of keeps its cap: it cannot have caused the error.
        """
        return self.rule.smaller_caps(self.costs(ids), current, factor)

    def split(self, ids: np.ndarray, limit: Caps) -> list[np.ndarray]:
        """Split ``ids`` greedily under ``limit``; an item above it gets a batch of its own."""
        return split_with(self.rule.lowered(limit), self.costs(ids), ids=ids, oversize="own_batch").batches()


class SizeAwareEpoch:
    """One epoch of a :class:`SizeAwarePlanner`, whose cap can be lowered mid-epoch.

    Items above the original cap follow the planner's ``oversize`` policy; after
    :meth:`lower`, items between the lowered and the original cap get a batch of their own,
    so that lowering the cap never drops a sample.
    """

    def __init__(self, planner: SizeAwarePlanner, epoch: int, cached: list[PlanChunk] | None = None) -> None:
        self.planner = planner
        self._cached = iter(cached) if cached is not None else None
        self._cached_list = cached
        self._order: Iterator[np.ndarray] = planner.order.chunks(epoch) if cached is None else iter(())
        self._carry: Carry | None = None
        self._lowered: BatchCost | None = None  # the rule under the lowered caps, once lower() was called
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None  # items re-planned by lower()
        self._extra_skipped = _EMPTY_IDS
        self._done = False

    def __iter__(self) -> SizeAwareEpoch:
        return self

    def __next__(self) -> PlanChunk:
        if self._cached is not None:
            return next(self._cached)
        for ids in self._order:
            # NOTE: the open batch is split again with every chunk it grows into; a batch
            # spanning many groups would cost quadratic time, so groups are joined until they
            # are at least as long as the open batch (the batches are the same either way)
            while self._carry is not None and len(self._carry) > len(ids):
                more = next(self._order, None)
                if more is None:
                    break
                ids = np.concatenate([ids, more])
            return self._split(ids, final=False)
        if self._done and self._prefix is None:  # a lowering in the last chunk gives items back
            raise StopIteration
        self._done = True
        if (self._carry is None or not len(self._carry)) and not len(self._extra_skipped) and self._prefix is None:
            raise StopIteration
        return self._split(np.empty(0, dtype=np.int64), final=True)

    def _split(self, ids: np.ndarray, final: bool) -> PlanChunk:
        planner = self.planner
        costs = planner.costs(ids) if len(ids) else self._empty_costs()
        rule, oversize = planner.rule, planner.oversize
        skipped = self._extra_skipped
        self._extra_skipped = _EMPTY_IDS
        if self._lowered is not None:
            # the original cap's policy first, then the lowered cap with own batches
            if len(ids):
                keep = split_with(rule, costs, ids=ids, oversize=oversize)
                kept = np.isin(ids, keep.skipped, invert=True)
                skipped = np.concatenate([skipped, keep.skipped])
                ids, costs = ids[kept], costs[kept]
            if self._prefix is not None:
                # NOTE: the items lower() took back are split as items of this chunk, not as
                # a carry, so that each is checked against the lowered cap
                (prefix_ids, prefix_costs), self._prefix = self._prefix, None
                ids = np.concatenate([prefix_ids, ids])
                costs = np.concatenate([prefix_costs, np.asarray(costs).reshape(len(costs), prefix_costs.shape[1])])
            rule, oversize = self._lowered, "own_batch"
        split = split_with(rule, costs, ids=ids, carry=self._carry, final=final, oversize=oversize)
        self._carry = split.carry
        batched = split.ids
        if batched.base is not None and batched.base.nbytes > 2 * batched.nbytes + 4096:
            batched = batched.copy()  # a small view would keep the whole joined chunk alive
        return PlanChunk(batched, split.offsets, np.concatenate([skipped, split.skipped]))

    def _empty_costs(self) -> np.ndarray:
        if self._carry is not None:
            return np.empty((0, self._carry.costs.shape[1]), dtype=self._carry.costs.dtype)
        return np.empty((0, self.planner.rule.num_columns))

    def lower(self, pending: np.ndarray, caps: Caps) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``caps``."""
        if self._cached is not None:
            # switch from the cached plan to live planning of everything not yet yielded
            rest = list(self._cached)
            pending = np.concatenate([pending, *[chunk.ids for chunk in rest]])
            self._extra_skipped = np.concatenate([self._extra_skipped, *[chunk.skipped for chunk in rest]])
            self._cached = None
        costs = np.asarray(self.planner.costs(pending)).reshape(len(pending), -1) if len(pending) else None
        carry, self._carry = self._carry, None
        if carry is not None and len(carry):
            pending = np.concatenate([pending, carry.ids])
            costs = carry.costs if costs is None else np.concatenate([costs, carry.costs])
        self._prefix = None if costs is None else (pending, costs)
        self._lowered = self.planner.rule.lowered(caps)
        self._done = False  # the last chunk may have been planned: plan what was taken back


@dataclass(frozen=True)
class _Resume:
    """Where a :class:`SortedWindowEpoch` stands between two chunks: enough to plan on from there.

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


class SortedWindowEpoch:
    """One epoch of a :class:`SizeAwarePlanner` with ``sort_window``, whose cap can be lowered mid-epoch.

    Each shuffle group is sorted by size in windows of ``sort_window`` items
    (:func:`~fastsab.windows.window_order`), split greedily (the open batch carried on to the
    next group, as without windows), and the chunk's batches are yielded in an order shuffled
    with a seed of ``(seed, epoch, group)``. The batches that hold items carried in from
    earlier groups stay first, and batches of a later group come after those of an earlier
    one, so that a chunked dataset is still read group after group.

    A lowering re-plans the items not yet yielded of the current chunk (with the open batch)
    under the lowered caps, and the epoch's groups after that chunk anew: chunks planned ahead
    (prefetched) are given back (:meth:`lower_giving_back`), so that the rest of the
    epoch does not depend on how far ahead it was planned and a resumed epoch replays it exactly.
    """

    def __init__(self, planner: SizeAwarePlanner, epoch: int, cached: _WindowPlan | None = None) -> None:
        if planner.sort_window is None:
            raise ValueError("SortedWindowEpoch needs a planner with a sort_window, got sort_window=None.")
        self.planner = planner
        self.epoch = epoch
        self.window = planner.sort_window
        self._cached = cached
        self._yielded = 0  # chunks of the cached plan yielded
        self._next_group = 0
        self._groups: Iterator[np.ndarray] = planner.order.chunks(epoch) if cached is None else iter(())
        self._reported = 0  # groups whose skipped items were reported (in chunks yielded)
        self._silent: list[np.ndarray] = []  # groups planned again: their skipped items were reported
        self._carry: Carry | None = None
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None
        self._lowered: BatchCost | None = None
        self._done = False
        self.log: list[_Resume] = []  # the state before each chunk yielded (planned live)

    def __iter__(self) -> SortedWindowEpoch:
        return self

    def __next__(self) -> PlanChunk:
        if self._cached is not None:
            if self._yielded == len(self._cached.chunks):
                raise StopIteration
            self._yielded += 1
            return self._cached.chunks[self._yielded - 1]
        before = self.state()
        chunk = self._plan_next()
        self.log.append(before)
        return chunk

    def state(self) -> _Resume:
        """Where the live planning stands (not valid while a cached plan is replayed)."""
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
        return ids[order], costs[order]

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
        split = split_with(rule, costs, ids=ids, carry=self._carry, final=final, oversize=oversize)
        self._carry = split.carry
        skipped = np.concatenate([skipped, split.skipped])
        if self._silent:
            skipped = skipped[np.isin(skipped, np.concatenate(self._silent), invert=True)]
            self._silent = []
        order = batch_order(self._labels(split, ids, bounds, carry, carried), self._rng(first))
        chunk = PlanChunk(split.ids, split.offsets).select(order)
        return PlanChunk(chunk.ids, chunk.offsets, skipped)

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
        self.lower_giving_back(pending, caps, 0)

    def lower_giving_back(self, pending: np.ndarray, caps: Caps, given_back: int) -> None:
        """Re-plan ``pending`` (the rest of the current chunk) and all that follows under ``caps``.

        Args:
            pending: The items of the current chunk not yet yielded, in order.
            caps: The lowered caps.
            given_back: Chunks yielded after the current one (planned ahead, none of their
                batches yielded): their groups are planned again.
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

    def _rewound(self, given_back: int) -> _Resume:
        """The state before the ``given_back`` last chunks yielded; planning goes on from there."""
        cached = self._cached
        if cached is not None:
            states = [*cached.log, cached.end]
            state = states[self._yielded - given_back]
            self._reported = states[self._yielded].next_group
            self._cached = None
        elif given_back:
            state = self.log[len(self.log) - given_back]
            del self.log[len(self.log) - given_back :]
        else:
            return self.state()
        self._next_group = state.next_group
        self._groups = self.planner.order.chunks(self.epoch, state.next_group)
        return state
