"""Epoch plans: which indices form which batches, chunk by chunk.

A planner (``Planner``) turns ``(epoch)`` into a stream of
``PlanChunk`` (ids in epoch order and batch offsets), computed one shuffle group
at a time so that memory stays bounded and the first batch is ready at once. The loaders
fetch what a plan names; ``fastsab.loaders.planned.PlannedBatchSampler`` hands the same
plan to a ``torch.utils.data.DataLoader``.

This module holds the size-aware planner and its epoch; ``FixedSizePlanner`` lives in
``fastsab.plan.fixed_size``, the epoch with sorted windows (``SortedWindowEpoch``) in
``fastsab.plan.window_epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastsab._checks import check_choice
from fastsab.plan.batching import OversizePolicy, split_with
from fastsab.plan.costs import BatchCost, Caps, CostSource
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.figures import BatchFigures
from fastsab.plan.plans import _EMPTY_IDS, Carry, PlanChunk, PlanInputs
from fastsab.plan.window_epoch import SortedWindowEpoch, _WindowPlan
from fastsab.plan.windows import check_sort_window

__all__ = ["SizeAwareEpoch", "SizeAwarePlanner", "skipped_message"]

#: Epochs of at most this many items keep their whole plan after ``len()`` computed it.
PLAN_CACHE_ITEMS = 2**22


class SizeAwarePlanner:
    """Greedy size-aware batches over the epoch order, split chunk by chunk with a carry.

    ``rule`` (a ``BatchCost``) gives the caps and what a batch costs; with
    its ``feature_cost``, ``costs`` gives the items' features
    (``FeatureRows``).

    With ``sort_window`` the order is first sorted by size in windows of that many items and
    the batches of each chunk are yielded in a seeded random order (``SortedWindowEpoch``).
    """

    def __init__(
        self,
        order: EpochOrder,
        costs: CostSource,
        rule: BatchCost,
        *,
        oversize: OversizePolicy = "skip",
        sort_window: int | None = None,
    ) -> None:
        self.order = order
        self.sort_window = check_sort_window(sort_window)
        self.rule = rule
        # NOTE: every reader of the costs (split, oversize, sorted windows, balancing, lowering)
        # sees what the rule charges: with pad_to_multiple_of, the padded lengths
        costs = order.read_by_ids(costs)
        self.costs = self.rule.charged(costs)
        self.figures = BatchFigures(self.rule, self.costs, costs)  # each planned batch's fill and tokens
        self.oversize: OversizePolicy = check_choice("oversize", oversize, ("skip", "own_batch", "error"))  # type: ignore[assignment]
        if order.n:
            # NOTE: the caps are checked against the first item's cost columns now, not at the first len() or iter()
            first = np.asarray(self.costs(np.zeros(1, dtype=np.int64)))
            # NOTE: padded features are not costs: their cost columns are those feature_cost gives
            if self.rule.feature_cost is not None:
                first = np.asarray(self.rule.feature_cost(first))
            self.rule.check_columns(first)
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

    def forget_plans(self) -> None:
        """Forget the plans kept (a mixture's order taken up from a state may plan its epoch otherwise)."""
        self._cache = self._window_cache = None

    def chunks(self, epoch: int) -> SizeAwareEpoch | SortedWindowEpoch:
        if self.sort_window is not None:
            hit = self._window_cache
            return SortedWindowEpoch(self, epoch, hit[1] if hit is not None and hit[0] == epoch else None)
        cached = self._cache[1] if self._cache is not None and self._cache[0] == epoch else None
        return SizeAwareEpoch(self, epoch, cached)

    @property
    def restarts(self) -> bool:
        """Whether ``chunks_from`` gives the epoch's batches: without sorted windows."""
        # NOTE: a sorted window's batches depend on the whole window and come shuffled, so an
        # epoch with sort_window is not planned from one of its batches (a resume replays it)
        return self.sort_window is None

    def chunks_from(self, epoch: int, item: int) -> SizeAwareEpoch:
        """The plan chunks of ``epoch`` from the batch whose first item is ``item`` on (without ``sort_window``).

        The greedy split starts afresh at each batch, so the batches from one batch's first
        item on are the epoch's, whatever came before.
        """
        return SizeAwareEpoch(self, epoch, start=self.order.position_of(epoch, item))

    def skipped_before(self, epoch: int, item: int) -> np.ndarray:
        """The oversize items ``epoch`` skips before the batch whose first item is ``item``, in order.

        Whether an item is skipped depends on its cost alone: the order up to ``item`` is
        read group by group, its costs computed (the split's work, without the batches kept).
        """
        if self.oversize != "skip":
            return _EMPTY_IDS
        end, seen, skipped = self.order.position_of(epoch, item), 0, [_EMPTY_IDS]
        for ids in self.order.chunks(epoch):
            if seen >= end:
                break
            ids = ids[: end - seen]
            seen += len(ids)
            skipped.append(split_with(self.rule, self.costs(ids), ids=ids, oversize="skip").skipped)
        return np.concatenate(skipped)

    def _window_plan(self, epoch: int) -> _WindowPlan:
        """The whole plan of ``epoch`` with sorted windows, kept for its iteration."""
        if self._window_cache is not None and self._window_cache[0] == epoch:
            return self._window_cache[1]
        plan = _WindowPlan.of(SortedWindowEpoch(self, epoch))
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

    def skipped_warning(self, skipped: list[int], epoch: int) -> str:
        """The warning for the oversize items ``skipped`` in ``epoch``: their largest cost, the caps, the fixes."""
        costs = np.asarray(self.costs(np.asarray(skipped, dtype=np.int64)))
        if self.rule.feature_cost is not None:  # (rows of features: the costs feature_cost gives them)
            costs = np.asarray(self.rule.feature_cost(costs))
        largest = costs.reshape(len(costs), -1).max(axis=0).tolist()
        k = len(largest)
        return skipped_message(len(skipped), epoch, largest, self.rule.column_caps(k), self.rule.column_fixed(k))

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
    """One epoch of a ``SizeAwarePlanner``, whose cap can be lowered mid-epoch.

    Items above the original cap follow the planner's ``oversize`` policy; after
    ``lower``, items between the lowered and the original cap get a batch of their own,
    so that lowering the cap never drops a sample.
    """

    def __init__(
        self, planner: SizeAwarePlanner, epoch: int, cached: list[PlanChunk] | None = None, *, start: int = 0
    ) -> None:
        self.planner = planner
        self._cached = iter(cached) if cached is not None else None
        self._cached_list = cached
        self._order: Iterator[np.ndarray] = iter(())
        if cached is None:
            self._order = planner.order.plan_chunks(epoch, start)
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
        carry = self._carry
        split = split_with(rule, costs, ids=ids, carry=carry, final=final, oversize=oversize)
        self._carry = split.carry
        batched = split.ids
        if batched.base is not None and batched.base.nbytes > 2 * batched.nbytes + 4096:
            batched = batched.copy()  # a small view would keep the whole joined chunk alive
        figures = planner.figures.of_split(split, carry, ids, costs)
        skipped = np.concatenate([skipped, split.skipped])
        return PlanChunk(batched, split.offsets, skipped, split.dropped, figures=figures)

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


def skipped_message(count: int, epoch: int, largest: list[Any], caps: list[Any], fixed: list[Any]) -> str:
    """The loaders' warning for ``count`` oversize items skipped in ``epoch``, and the ways to keep them.

    Per cost column: ``largest`` skipped cost, ``caps``, ``fixed`` cost per batch (one column shown as a number).

    Examples:
        >>> print(skipped_message(2, 0, [130], [100], [10]).split(". ", 1)[1])  # doctest: +NORMALIZE_WHITESPACE
        The largest has size 130 and max_total_size is 100. To keep such items, pass
        oversize='own_batch' (each in a batch of its own), oversize='error' (stop at the first),
        or max_total_size >= 140 (the size plus fixed_cost).
    """
    # NOTE: a batch of one item must hold the item and the fixed cost; columns not exceeded keep their cap
    needed = [max(cap, size + extra) for size, cap, extra in zip(largest, caps, fixed)]
    size, cap, need = (values[0] if len(values) == 1 else values for values in (largest, caps, needed))
    return (
        f"{count} items were larger than max_total_size and were skipped in epoch {epoch}; their indices are in "
        f"stats.skipped. The largest has size {size!r} and max_total_size is {cap!r}. To keep such items, pass "
        "oversize='own_batch' (each in a batch of its own), oversize='error' (stop at the first), or "
        f"max_total_size >= {need!r}{' (the size plus fixed_cost)' if any(fixed) else ''}."
    )
