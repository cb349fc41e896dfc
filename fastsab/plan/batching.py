"""Greedy size-aware batching.

Two entry points share one semantics:

* ``split_batches``, the vectorized kernel: per-item costs in epoch order in, batch
  boundaries out. It is what the loaders and samplers use.
* ``size_aware_batching``, the streaming generator of the
  bionemo API, for plain iterables of data.

The greedy rule (bionemo compatible): items are taken in order; an item whose cost exceeds
``max_total_size`` is oversize (skipped and counted by default); an item joins the current
batch while the batch's cost stays ``<= max_total_size`` (the cap is inclusive), otherwise
the batch is emitted and a new one starts with that item; the last partial batch is
emitted; no empty batch is ever emitted.

This module holds the kernel's API (``split_batches``, ``split_with``); the batches
come back as a ``PlanChunk`` (also named ``BatchSplit``), the caps and
costs are those of a ``BatchCost``, and the walks of the batches are in
``fastsab.plan._sum_kernel``, ``fastsab.plan._padded_kernel`` and ``fastsab.plan._greedy_walk``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal, cast

import numpy as np

from fastsab._checks import as_cost_array, as_numeric_array, check_choice
from fastsab.plan._greedy_walk import _greedy_ends
from fastsab.plan._padded_kernel import _padded_feature_counter, _padded_split
from fastsab.plan._sum_kernel import _sum_split
from fastsab.plan.costs import BatchCost, LastBatch
from fastsab.plan.costs import CostMode as CostMode
from fastsab.plan.plans import Carry, PlanChunk

__all__ = ["BatchSplit", "Carry", "split_batches"]

OversizePolicy = Literal["skip", "own_batch", "error"]

#: The result of ``split_batches``: batches in CSR form (``ids``, ``offsets``), the
#: skipped items and the open batch (``carry``).
BatchSplit = PlanChunk


def split_batches(
    costs: Any,
    max_total_size: Any,
    *,
    max_batch_size: int | None = None,
    cost: CostMode = "sum",
    batch_size_multiple: int = 1,
    last_batch: LastBatch = "keep",
    oversize: OversizePolicy = "skip",
    ids: Any = None,
    carry: Carry | None = None,
    final: bool = True,
) -> PlanChunk:
    """Split items with per-item costs into greedy batches, vectorized.

    Gives exactly the batches of the greedy loop described in the module docstring, for
    integer costs (exact ``int64`` sums; padded costs exact for every ``int64`` cost, never
    wrapped around) and float costs (``float64`` sums accumulated in item order from the
    batch start, as the loop does, so values right at the cap agree).
    The work is a prefix sum and one binary search per batch (``sum`` mode), or a few
    vectorized passes that give every position the end of a batch starting there and one
    lookup per batch (``padded`` mode); there is no Python loop per item.

    Args:
        costs: Per-item costs in order: 1-D, or ``(n, k)`` for ``k`` limits at once (e.g.
            nodes and edges of a graph); numpy array, torch tensor or sequence; finite, >= 0.
        max_total_size: The inclusive cap of a batch's cost; one number, or ``k`` numbers
            for ``(n, k)`` costs (an item joins while every column stays within its cap).
            Finite and >= 0 (a cap of 0 batches the items of cost 0); caps past int64
            (``2**70``, ``1e19``) work as "no practical cap".
        max_batch_size: Optional cap on the number of items in a batch.
        cost: ``"sum"`` (a batch costs the sum of its items, bionemo) or ``"padded"`` (a
            batch costs ``len(batch) * max(cost in batch)``, the padded-tensor cost).
        batch_size_multiple: A full batch (one closed because the next item does not fit)
            longer than this multiple is cut down to a multiple of it; the remainder opens
            the next batch (fairseq's ``required_batch_size_multiple``). The last batch and
            batches closed by an ``own_batch`` item are kept whole.
        last_batch: ``"keep"`` (default) the last batch whole, or ``"round_down"``: cut the last
            batch of a final split down to a multiple of ``batch_size_multiple`` and drop the
            rest (the whole batch when it is shorter), returned in ``PlanChunk.dropped``, as
            fairseq's ``batch_by_size`` does. An own batch of an oversize item is never cut.
        oversize: What to do with an item whose cost alone exceeds the cap: ``"skip"`` it
            (returned in ``PlanChunk.skipped``; callers warn), give it a batch of its
            ``"own_batch"``, or raise ``ValueError`` (``"error"``).
        ids: Optional ids of the items (same length as ``costs``), returned in place of
            positions, e.g. dataset indices in epoch order.
        carry: The ``PlanChunk.carry`` of the previous chunk's call.
        final: ``False`` if more chunks follow: the trailing batch that could still grow is
            returned as ``PlanChunk.carry`` instead of being emitted.

    Returns:
        A ``PlanChunk`` with the batches in CSR form.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If a value is out of range (negative or NaN costs, negative or
            infinite caps, a mismatched ``ids`` length or carry), or an item is oversize with
            ``oversize="error"``.

    Examples:
        >>> split = split_batches([2, 2, 5, 3, 1, 4], 4)
        >>> [b.tolist() for b in split.batches()], split.skipped.tolist()
        ([[0, 1], [3, 4], [5]], [2])
        >>> split_batches([1, 1, 1, 1, 1], 10, batch_size_multiple=2, max_batch_size=3).batches()
        [array([0, 1]), array([2, 3, 4])]
        >>> split = split_batches([1] * 7, 3, batch_size_multiple=2, last_batch="round_down")
        >>> [b.tolist() for b in split.batches()], split.dropped.tolist()
        ([[0, 1], [2, 3], [4, 5]], [6])
        >>> split_batches([1, 3, 1, 1], 6, cost="padded").batches()  # 2 * 3 <= 6 < 3 * 3
        [array([0, 1]), array([2, 3])]

        Chunk by chunk gives the same batches as one call:

        >>> first = split_batches([2, 2, 3], 4, final=False)
        >>> rest = split_batches([1, 4], 4, carry=first.carry)
        >>> [b.tolist() for b in first.batches() + rest.batches()]
        [[0, 1], [2, 3], [4]]
    """
    # NOTE: keyword arguments named as the rule's; alike only in shape to the loader's call
    rule = BatchCost(
        max_total_size,
        cost=cost,
        max_batch_size=max_batch_size,
        batch_size_multiple=batch_size_multiple,
        last_batch=last_batch,
    )
    return split_with(rule, costs, oversize=oversize, ids=ids, carry=carry, final=final)


def split_with(
    rule: BatchCost,
    costs: Any,
    *,
    oversize: OversizePolicy = "skip",
    ids: Any = None,
    carry: Carry | None = None,
    final: bool = True,
) -> PlanChunk:
    """``split_batches`` under the caps and options of ``rule``."""
    policy = check_choice("oversize", oversize, ("skip", "own_batch", "error"))
    if not isinstance(final, bool):
        raise TypeError(f"final must be a bool, got {final!r}.")
    if carry is not None and not isinstance(carry, Carry):
        raise TypeError(f"carry must be a Carry from a previous split, got {type(carry).__name__}.")

    c, bound = as_cost_array("costs", costs, ndim=(1, 2))
    if c.ndim == 1:
        c = c[:, None]
    # NOTE: when the rule pads features, the rows given are features: the carry keeps them,
    # and `c` becomes the items' own costs (for the oversize policy and the caps' dtype)
    features = c if rule.feature_cost is not None else None
    if features is not None:
        c = _feature_item_costs(rule, features)
    n, k = c.shape
    start = 0 if carry is None else carry.next_position
    item_ids = None  # None: the ids are the positions start, start + 1, ... (made lazily)
    if ids is not None:
        item_ids = np.asarray(ids)
        if item_ids.ndim != 1 or len(item_ids) != n:
            raise ValueError(f"ids must be 1-D with one id per item ({n}), got shape {tuple(item_ids.shape)}.")
    carry_costs = None if carry is None else carry.costs
    if carry is not None and features is not None:
        if features.shape[1] != carry.costs.shape[1]:
            raise ValueError(
                f"carry has {carry.costs.shape[1]} feature columns but costs has {features.shape[1]}; "
                "use the carry of a split over the same kind of features."
            )
        if len(carry):
            carry_costs = _feature_item_costs(rule, carry.costs)
            if not n:
                # NOTE: no rows of features tell how many cost columns feature_cost gives: the carry's do
                c = np.empty((0, carry_costs.shape[1]), dtype=carry_costs.dtype)
                k = c.shape[1]
        else:
            carry_costs = np.empty((0, k), dtype=c.dtype)
    if carry_costs is not None:
        if carry_costs.shape[1] != k:
            raise ValueError(
                f"carry has {carry_costs.shape[1]} cost columns but costs has {k}; "
                "use the carry of a split over the same kind of costs."
            )
        if carry_costs.dtype != c.dtype:
            c = c.astype(np.float64)
    float_mode = c.dtype == np.float64 or (carry_costs is not None and carry_costs.dtype == np.float64)
    caps, cap_values = rule.kernel_caps(k, float_mode)
    if float_mode:
        c = c.astype(np.float64, copy=False)

    over: np.ndarray | None = None
    skipped = np.empty(0, dtype=np.int64 if item_ids is None else item_ids.dtype)
    if n and _may_pass(c, caps, None if float_mode or features is not None else bound):
        over = _above(c, caps)
        if policy == "error":
            pos = int(np.argmax(over))
            item = start + pos if item_ids is None else item_ids[pos].item()
            # NOTE: with a fixed cost an item is oversize by its cost plus the fixed cost: name both
            fixed = f" (plus fixed_cost {rule.options()['fixed_cost']!r})" if rule.has_fixed else ""
            # NOTE: and with pad_to_multiple_of its cost is not the length given: say why
            multiple = rule.pad_to_multiple_of
            padded = f" (its length padded to a multiple of {multiple})" if multiple is not None else ""
            raise ValueError(
                f"item {item!r} has cost {_row(c, pos)!r}{padded}{fixed} above max_total_size {rule.shown()!r} "
                "(oversize='error')."
            )
        if policy == "skip":
            if item_ids is None:
                item_ids = np.arange(start, start + n, dtype=np.int64)
            skipped = item_ids[over]
            c = c[~over]
            if features is not None:
                features = features[~over]
            item_ids = item_ids[~over]
            over = None

    if carry is not None and len(carry):
        if item_ids is None:
            item_ids = np.arange(start, start + n, dtype=np.int64)
        c = np.concatenate([cast(np.ndarray, carry_costs).astype(c.dtype, copy=False), c])
        if features is not None:
            features = np.concatenate([carry.costs.astype(features.dtype, copy=False), features])
        item_ids = np.concatenate([carry.ids, item_ids])
        if over is not None:
            over = np.concatenate([np.zeros(len(carry), dtype=bool), over])

    # NOTE: no batch of this call holds more than len(c) items, so a max_batch_size or multiple
    # past len(c) + 1 splits as len(c) + 1 does: clipped, both fit the walks' int64 (sys.maxsize,
    # a common "no cap", would else overflow i + max_items)
    max_items = None if rule.max_batch_size is None else min(rule.max_batch_size, len(c) + 1)
    multiple = min(rule.batch_size_multiple, len(c) + 1)
    if rule.cost == "sum":
        ends, open_start = _sum_split(c, caps, cap_values, max_items, multiple, over, final)
    elif features is not None:
        count = _padded_feature_counter(features, partial(_feature_item_costs, rule), caps, cap_values, float_mode)
        ends, open_start = _greedy_ends(len(c), count, max_items, multiple, over, final)
    else:
        ends, open_start = _padded_split(c, caps, cap_values, max_items, multiple, over, final)
    dropped = np.empty(0, dtype=skipped.dtype)
    if final and rule.last_batch == "round_down" and len(ends):
        ends = list(ends)  # (cut in place)
        cut = _round_down_last(ends, multiple, over)
        if cut < open_start:
            dropped = np.arange(start + cut, start + open_start) if item_ids is None else item_ids[cut:open_start]
            open_start = cut
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends
    next_carry = None
    if not final:
        rest = np.arange(start + open_start, start + n) if item_ids is None else item_ids[open_start:]
        kept = c if features is None else features
        # NOTE: copies: a carry kept (a resume point of a planned chunk) would else hold the
        # whole chunk's ids and costs it is a view of
        next_carry = Carry(rest.copy(), kept[open_start:].copy(), start + n)
    batched = range(start, start + open_start) if item_ids is None else item_ids[:open_start]
    return PlanChunk(batched, offsets, skipped, dropped, carry=next_carry)  # type: ignore[arg-type]


def _round_down_last(ends: list[int], multiple: int, over: np.ndarray | None) -> int:
    """Cut the last of the batches ending at ``ends`` down to a multiple of ``multiple``, in place.

    Returns the new end of the batched items; a batch cut to nothing is removed. The own batch
    of an oversize item (``over``) stays whole.
    """
    begin = ends[-2] if len(ends) > 1 else 0
    size = ends[-1] - begin
    if over is not None and over[begin]:
        return ends[-1]
    kept = begin + size - size % multiple
    if kept == begin:
        ends.pop()
    else:
        ends[-1] = kept
    return kept


def _may_pass(c: np.ndarray, caps: np.ndarray, bound: int | None) -> bool:
    """Whether some column of ``c`` holds a cost above its cap; ``bound`` (or None) is at or above every cost."""
    # NOTE: the bound comes with the costs' checks; only when it passes a cap are the columns' maxima needed
    if bound is not None and all(bound <= int(cap) for cap in caps):
        return False
    return any(column.max() > cap for column, cap in zip(c.T, caps, strict=True))


def _above(c: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Whether each row of ``c`` is above its cap in some column."""
    # NOTE: column by column: numpy reduces across the short rows of an (n, k) array many times slower
    over: np.ndarray = c[:, 0] > caps[0]
    for j in range(1, c.shape[1]):
        over |= c[:, j] > caps[j]
    return over


def _row(c: np.ndarray, pos: int) -> Any:
    return c[pos, 0].item() if c.shape[1] == 1 else c[pos].tolist()


def _feature_item_costs(rule: BatchCost, rows: np.ndarray) -> np.ndarray:
    """The costs ``rule.feature_cost`` gives feature rows, checked, as ``(len(rows), k)``."""
    if not len(rows):
        return np.empty((0, rule.num_columns), dtype=np.float64)
    values = as_numeric_array("feature_cost values", cast(Any, rule.feature_cost)(rows), ndim=(1, 2))
    if len(values) != len(rows):
        raise ValueError(
            f"feature_cost returned {len(values)} costs for {len(rows)} rows of features; expected one each."
        )
    return values.reshape(len(rows), -1)
