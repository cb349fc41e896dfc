"""What a size-aware plan says of each batch: ``BatchFigures``, its fill of the budget and its tokens.

A planner computes the figures of the batches it plans from the costs it already read (the
charged costs, or the features a padded rule pads), one ``reduceat`` per figure and chunk, and
hands them out with the batches (``figures``); a loader's
``EpochStats`` adds up those of the batches it yields.
"""

from __future__ import annotations

import numpy as np

from fastsab.plan.cost_sources import CostSource, padded_length
from fastsab.plan.costs import BatchCost
from fastsab.plan.plans import Carry, PlanChunk

__all__ = ["FILL", "FILLER", "PADDED", "REAL", "BatchFigures"]

#: The rows of a figures array: the batch's cost over the budget, its real and its padded tokens,
#: and its filler rows (shape buckets' last batches: ``fastsab.plan.bucket_planner``).
FILL, REAL, PADDED, FILLER = 0, 1, 2, 3


class BatchFigures:
    """Each batch's fill of the budget and, where batches are padded, its real and padded tokens.

    The figures of ``b`` batches are a ``(4, b)`` float64 array: row ``FILL`` is the
    batch's cost as ``rule`` charges it (fixed cost included) over the configured caps, the
    largest column counting (``balance_costs``); rows ``REAL``
    and ``PADDED`` are the batch's tokens and ``B`` times its padded length, ``NaN`` where
    tokens are not counted; row ``FILLER`` its filler rows (none here).

    Tokens are counted for a padded rule (``cost="padded"``): lengths padded to the rule's
    ``pad_to_multiple_of``, or padded features (each item's own cost, and ``B`` times the cost
    of the per-feature maxima); and after ``pad_with`` (a padding collator), for lengths
    padded to the collator's multiple. Costs of several columns count no tokens.

    Args:
        rule: The batch cost the plan follows (its configured caps).
        charged: The costs the planner reads (``rule.charged`` of ``lengths``, or feature rows).
        lengths: The items' own costs, before ``pad_to_multiple_of`` rounds them up.

    Examples:
        >>> lengths = np.array([3, 1, 4, 2])
        >>> rule = BatchCost(8, cost="padded")
        >>> source = lambda ids: lengths[ids]
        >>> BatchFigures(rule, source, source).of(np.arange(4), np.array([0, 2, 4])).tolist()
        [[0.75, 1.0], [4.0, 6.0], [6.0, 8.0], [0.0, 0.0]]
    """

    def __init__(self, rule: BatchCost, charged: CostSource, lengths: CostSource) -> None:
        self.rule, self.charged, self.lengths = rule, charged, lengths
        self.tokens = rule.cost == "padded"
        self.pad_to_multiple_of = rule.pad_to_multiple_of

    def pad_with(self, multiple: int | None) -> None:
        """Count tokens as a collator that pads lengths to a ``multiple`` (``None``: the longest) makes them."""
        self.tokens, self.pad_to_multiple_of = True, multiple

    def of(self, ids: np.ndarray, offsets: np.ndarray, costs: np.ndarray | None = None) -> np.ndarray:
        """The figures of the batches ``ids[offsets[b]:offsets[b + 1]]``; ``costs``: their charged costs, if read."""
        figures = np.full((4, len(offsets) - 1), np.nan)  # (rows: each a figure, read alone)
        figures[FILLER] = 0
        if not figures.shape[1]:
            return figures
        rule = self.rule
        rows = np.asarray(self.charged(ids) if costs is None else costs)
        figures[FILL] = rule.balance_costs(rows, offsets)
        rows = rows.reshape(len(rows), -1)
        if not self.tokens or (rule.feature_cost is None and rows.shape[1] != 1):
            return figures
        starts = offsets[:-1]
        if rule.feature_cost is not None:
            own = np.asarray(rule.feature_cost(rows), dtype=np.float64).reshape(len(rows), -1)
            if own.shape[1] != 1:
                return figures
            figures[REAL] = np.add.reduceat(own[:, 0], starts)
            figures[PADDED] = rule.variable_per_batch(rows, offsets)[:, 0]
            return figures
        # NOTE: pad_to_multiple_of charges rounded lengths: the real tokens are the lengths given
        lengths = rows[:, 0] if rule.pad_to_multiple_of is None else np.asarray(self.lengths(ids)).reshape(-1)
        figures[REAL] = np.add.reduceat(lengths, starts)  # (a batch's tokens are at most its padded cost)
        longest = padded_length(np.maximum.reduceat(lengths, starts), self.pad_to_multiple_of)
        figures[PADDED] = np.diff(offsets) * longest.astype(np.float64)
        return figures

    def of_split(self, split: PlanChunk, carry: Carry | None, ids: np.ndarray, costs: np.ndarray) -> np.ndarray:
        """The figures of ``split``'s batches: a split of ``carry`` then ``ids`` with charged ``costs``."""
        rows = np.asarray(costs)
        if len(split.skipped):  # (skipped items are not in the split)
            rows = rows[np.isin(ids, split.skipped, invert=True)]
        if carry is not None and len(carry):
            rows = np.concatenate([carry.costs, rows.reshape(len(rows), *carry.costs.shape[1:])])
        return self.of(split.ids, split.offsets, rows[: split.offsets[-1]])
