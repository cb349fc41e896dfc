"""The planner of shape buckets: batches of ``B_k`` items padded to ``L_k``, at most ``K`` shapes an epoch.

``BucketPlanner`` takes the bucket lengths (given, or chosen from the items' lengths by
``choose_lengths``) and each bucket's batch size: from a table (``ShapeBuckets`` with batch sizes,
e.g. measured), or the largest count whose padded batch the rule's budget holds
(``fixed_cost + B * cost(L_k) <= max_total_size``, capped by ``max_batch_size`` and cut to
``batch_size_multiple``). Its limit is the list of batch sizes: a lowering (out of memory) makes
one bucket's batches smaller. The epochs are ``BucketEpoch`` (``fastsab.plan.bucket_epoch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Literal

import numpy as np
import torch

from fastsab._checks import check_choice, check_positive_int
from fastsab.plan.batching import OversizePolicy
from fastsab.plan.bucket_epoch import BucketEpoch, first_occurrences, plan_buckets
from fastsab.plan.cost_sources import CostSource, padded_length
from fastsab.plan.costs import BatchCost
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.figures import FILL, FILLER, PADDED, REAL
from fastsab.plan.plans import _EMPTY_IDS, PlanChunk, PlanInputs
from fastsab.plan.shape_buckets import ShapeBuckets, bucket_lengths, choose_lengths

__all__ = ["BucketPlanner", "Partial"]

#: What completes a bucket's last, partial batch: filler rows (``"fill"``) or nothing (``"keep"``).
Partial = Literal["fill", "keep"]

#: Items whose lengths are read at once to count the buckets.
_BLOCK = 2**22


class BucketPlanner:
    """Batches of a fixed size per shape bucket, every batch padded to its bucket's length.

    Args:
        order: The epoch order.
        lengths: Each item's length (the padded column: a sequence length).
        buckets: The bucket lengths (``K`` of them, or a ``ShapeBuckets``, whose batch sizes are
            used as given), or ``K``: the lengths that pad the fewest tokens.
        rule: The budget a batch's padded cost stays within (``None`` with a table of batch sizes).
        unit_cost: The cost of one row padded to each of an array of lengths (a length itself,
            or a memory model's cost of that length).
        oversize: What happens to an item longer than the longest bucket: ``"skip"``,
            ``"own_batch"`` or ``"error"``.
        partial: ``"fill"`` or ``"keep"`` (see ``Partial``).
        per_group: Make every bucket's last batch at the end of each shuffle group, not of the epoch,
            so that no batch holds items of two groups: a dataset read in chunks (the groups, which
            then do not rotate) reads each chunk once an epoch, for up to ``K`` more filled (or kept)
            batches per group.
    """

    def __init__(
        self,
        order: EpochOrder,
        lengths: CostSource,
        buckets: ShapeBuckets | Sequence[int] | int,
        *,
        rule: BatchCost | None,
        unit_cost: Callable[[np.ndarray], np.ndarray],
        oversize: OversizePolicy = "skip",
        partial: Partial = "fill",
        per_group: bool = False,
    ) -> None:
        self.order, self.lengths, self.rule, self.unit_cost = order, order.read_by_ids(lengths), rule, unit_cost
        if per_group and order.rotate:
            raise ValueError("per_group closes the buckets of each shuffle group: it needs groups that do not rotate.")
        self.per_group = per_group
        self.oversize: OversizePolicy = check_choice("oversize", oversize, ("skip", "own_batch", "error"))  # type: ignore[assignment]
        self.partial: Partial = check_choice("partial", partial, ("fill", "keep"))  # type: ignore[assignment]
        self._histogram: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(buckets, (bool, str, bytes)) or not isinstance(
            buckets, (Integral, ShapeBuckets, Sequence, np.ndarray, torch.Tensor)
        ):
            raise TypeError(
                f"buckets must be a number of buckets, a sequence of bucket lengths or a ShapeBuckets, got {buckets!r}."
            )
        # NOTE: one item's length read now, so that lengths of several columns fail here, not at len()
        self.lengths_of(np.arange(min(order.n, 1), dtype=np.int64))
        if isinstance(buckets, Integral):
            buckets = ShapeBuckets(self._chosen_lengths(check_positive_int("buckets", buckets)))
        elif not isinstance(buckets, ShapeBuckets):
            buckets = ShapeBuckets(bucket_lengths("buckets", buckets))
        if (buckets.batch_sizes is None) == (rule is None):
            raise ValueError(
                "give each bucket's batch size one way: max_total_size (the largest batches its budget holds) or a "
                f"ShapeBuckets with batch_sizes, not {'both' if rule is not None else 'neither'}; "
                f"got buckets={buckets!r}."
            )
        multiple = None if rule is None else rule.pad_to_multiple_of
        if multiple is not None and any(length % multiple for length in buckets.lengths):
            raise ValueError(
                f"bucket lengths {list(buckets.lengths)!r} must be multiples of pad_to_multiple_of={multiple} (given "
                "to the loader, or its collator's): each batch is padded to its bucket's length. Give lengths that "
                "are multiples of it, or a number of buckets (buckets=K chooses such lengths)."
            )
        self.buckets = buckets
        self.units = np.asarray(unit_cost(np.asarray(buckets.lengths)), dtype=np.float64).reshape(-1)
        self.batch_sizes: list[int] = list(buckets.batch_sizes or self._budget_sizes(rule))
        self.figures = BucketFigures(self)

    # -- the buckets ----------------------------------------------------------------------------

    def lengths_of(self, ids: np.ndarray) -> np.ndarray:
        """The lengths of ``ids``, one per item.

        Raises:
            ValueError: If the lengths have several columns.
        """
        values = np.asarray(self.lengths(ids))
        if values.size != len(ids):
            raise ValueError(
                f"buckets pad one length per item, but sizeof gives {values.size // len(ids)} per item (shape "
                f"{values.shape}): give one length per item, e.g. sizeof=lengths of shape (n,)."
            )
        return values.reshape(len(ids))

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct lengths of the epoch's items and how many have each (read once, in blocks)."""
        if self._histogram is None:
            values, counts = [], []
            for start in range(0, self.order.n, _BLOCK):
                block = self.lengths_of(np.arange(start, min(start + _BLOCK, self.order.n), dtype=np.int64))
                distinct, count = np.unique(block, return_counts=True)
                values.append(distinct)
                counts.append(count)
            merged = np.concatenate(values) if values else np.empty(0)
            distinct, where = np.unique(merged, return_inverse=True)
            self._histogram = (distinct, np.bincount(where, weights=np.concatenate(counts) if counts else None))
        return self._histogram

    def _chosen_lengths(self, k: int) -> tuple[int, ...]:
        """The ``k`` bucket lengths that pad the items the budget holds the least."""
        distinct, counts = self.histogram()
        if not len(distinct):
            raise ValueError(
                f"buckets={k!r} chooses bucket lengths from the items' lengths, but the dataset is empty: give the "
                "bucket lengths (buckets=[...]) instead."
            )
        if self.rule is not None:
            fits = self.rule.fixed[0] + np.asarray(self.unit_cost(distinct), dtype=np.float64) <= self.rule.caps[0]
            distinct, counts = distinct[fits], counts[fits]
        if not len(distinct):
            raise ValueError(
                "buckets=K chooses bucket lengths from the items the budget holds, but there is none: "
                "raise max_total_size, or give the bucket lengths."
            )
        multiple = None if self.rule is None else self.rule.pad_to_multiple_of
        # NOTE: a fractional length l pads to ceil(l) tokens, and goes to the first bucket length
        # >= l, which is the first >= ceil(l): rounded up, it chooses exactly as given lengths hold it
        whole = np.ceil(distinct).astype(np.int64) if distinct.dtype.kind == "f" else distinct
        return choose_lengths(whole, k, pad_to_multiple_of=multiple, counts=counts.astype(np.int64))

    def _budget_sizes(self, rule: BatchCost | None) -> list[int]:
        """Each bucket's largest batch whose padded cost ``rule`` holds, at most the dataset's items (if a rule)."""
        if rule is None:
            return []
        cap, fixed = rule.caps[0], rule.fixed[0]
        # NOTE: no batch holds more rows than the dataset has items: a budget far above the data would
        # otherwise fill a bucket's last batch with a number of rows memory cannot hold
        most = max(self.order.n, 1)
        sizes = []
        for length, unit in zip(self.buckets.lengths, self.units.tolist()):
            if unit <= 0:
                size = rule.max_batch_size
                if size is None:
                    raise ValueError(
                        f"a row of bucket length {length} costs {unit!r}: its batch size is unbounded; "
                        "pass max_batch_size."
                    )
            else:
                # NOTE: a budget that holds `most` rows is not searched: past 2**53 its products step by more
                # than a row, and a search one row at a time would not end
                size = most if fixed + most * unit <= cap else int(max(cap - fixed, 0) // unit)
                while size and fixed + size * unit > cap:  # (float rounding: the budget's own test decides)
                    size -= 1
                while size < most and fixed + (size + 1) * unit <= cap:
                    size += 1
                if rule.max_batch_size is not None:
                    size = min(size, rule.max_batch_size)
            size = min(size, most)
            multiple = rule.batch_size_multiple
            size = size - size % multiple if size >= multiple else size
            if size < 1:
                raise ValueError(
                    f"a batch of bucket length {length} costs {unit!r} per row"
                    f"{f' plus fixed_cost {fixed!r}' if fixed else ''}: not even one row fits max_total_size "
                    f"{rule.shown()!r}. Lower the bucket lengths from {length} on"
                    f"{', lower fixed_cost' if fixed else ''}, or raise max_total_size."
                )
            sizes.append(size)
        return sizes

    def set_oversize_aside(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``ids`` without the items longer than every bucket: ``(kept, own batches, skipped)``.

        Raises:
            ValueError: With ``oversize="error"``, if an item is longer than every bucket.
        """
        if not len(ids):
            return ids, _EMPTY_IDS, _EMPTY_IDS
        lengths = self.lengths_of(ids)
        over = lengths > self.buckets.lengths[-1]
        if not over.any():
            return ids, _EMPTY_IDS, _EMPTY_IDS
        if self.oversize == "error":
            at = int(np.argmax(over))
            raise ValueError(
                f"item {int(ids[at])} has length {lengths[at].item()!r}, longer than the longest bucket "
                f"{self.buckets.lengths[-1]} (oversize='error'): add a longer bucket, or pass oversize='skip' or "
                "'own_batch'."
            )
        if self.oversize == "skip":
            return ids[~over], _EMPTY_IDS, ids[over]
        return ids[~over], ids[over], _EMPTY_IDS

    # -- the Planner protocol -------------------------------------------------------------------

    @property
    def limit(self) -> list[int]:
        """The configured limit: each bucket's batch size."""
        return list(self.batch_sizes)

    def num_batches(self, epoch: int) -> int:
        """Exact number of batches of an epoch, counted from the lengths (the same in every epoch)."""
        per_bucket = self._counts() if self.order.each_item_once else self._epoch_counts(epoch)
        if per_bucket[:, -1].any() and self.oversize == "error":
            self.set_oversize_aside(np.arange(self.order.n, dtype=np.int64))
        batches = -(-per_bucket[:, :-1] // np.asarray(self.batch_sizes, dtype=np.int64))
        return int(batches.sum()) + (int(per_bucket[:, -1].sum()) if self.oversize == "own_batch" else 0)

    def _epoch_counts(self, epoch: int) -> np.ndarray:
        """Items per bucket of ``epoch``, read from its order (a mixture's: some items twice, some left for later)."""
        columns = len(self.batch_sizes) + 1
        counts = np.zeros(columns, dtype=np.int64)
        for ids in self.order.chunks(epoch):
            counts += np.bincount(self.buckets.bucket_of(self.lengths_of(ids)), minlength=columns)
        return counts[None, :]

    def _counts(self) -> np.ndarray:
        """Items per bucket (the last column: longer than every bucket), one row per group with ``per_group``."""
        columns = len(self.batch_sizes) + 1
        if not self.per_group:
            distinct, counts = self.histogram()
            return np.bincount(self.buckets.bucket_of(distinct), weights=counts, minlength=columns)[None, :].astype(
                np.int64
            )
        # NOTE: groups that do not rotate are the same blocks of indices in every epoch, whatever their order
        size, n = self.order.group_size, self.order.n
        rows = np.zeros(max(-(-n // size), 1) * columns, dtype=np.int64)
        step = max(_BLOCK // size, 1) * size
        for start in range(0, n, step):
            ids = np.arange(start, min(start + step, n), dtype=np.int64)
            cells = ids // size * columns + self.buckets.bucket_of(self.lengths_of(ids))
            rows += np.bincount(cells, minlength=len(rows))
        return rows.reshape(-1, columns)

    def chunks(self, epoch: int) -> BucketEpoch:
        return BucketEpoch(self, epoch)

    def batch_costs(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Each batch's padded cost over the budget (rows over the batch size with a table), for balancing."""
        fill: np.ndarray = self.figures.of(ids, offsets)[FILL]
        return fill

    def check_limit(self, limit: object) -> list[int]:
        """``limit`` checked as one positive batch size per bucket (a sequence, array or 1-d tensor)."""
        count = len(self.batch_sizes)
        # NOTE: arrays and tensors by their values (a 0-d one is a scalar, refused below)
        values = limit.tolist() if hasattr(limit, "tolist") and hasattr(limit, "ndim") else limit
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(
                f"limit must be a sequence of {count} batch sizes, one per bucket (a list, numpy array or "
                f"1-d tensor), got {limit!r} of type {type(limit).__name__}."
            )
        if len(values) != count:
            raise ValueError(f"limit must give one batch size per bucket ({count}), got {limit!r}.")
        return [check_positive_int("limit", v) for v in values]

    def check_lowered_limit(self, limit: object) -> list[int]:
        """``limit`` checked as batch sizes, none above the configured ones."""
        checked = self.check_limit(limit)
        if any(new > old for new, old in zip(checked, self.batch_sizes)):
            raise ValueError(f"a lowered limit must not exceed the configured {self.batch_sizes!r}, got {limit!r}.")
        return checked

    def smaller_limit(self, ids: np.ndarray, current: list[int], factor: float) -> list[int]:
        """The failed batch's bucket's size ``factor`` times below the batch's rows (cut to ``batch_size_multiple``).

        Never above ``current``. The rows of a bucket's last batch kept short (``partial="keep"``) are
        fewer than the bucket's size: a size under them splits that batch, as a smaller one of the bucket's.
        """
        if not len(ids):
            return list(current)
        k = int(self.buckets.bucket_of(np.asarray([self.lengths_of(ids).max()]))[0])
        if k == len(current):  # an oversize item's own batch: no bucket to shrink
            return list(current)
        lowered = list(current)
        # NOTE: from the batch's rows (fillers included: they take memory), not the bucket's size,
        # which a short last batch is below: halving the size would leave that batch whole, to be
        # split within its step, where no state between its parts resumes exactly
        size = max(int(min(current[k], len(ids)) / factor), 1)
        multiple = 1 if self.rule is None else self.rule.batch_size_multiple
        lowered[k] = size - size % multiple if size >= multiple else size
        return lowered

    def split(self, ids: np.ndarray, limit: list[int]) -> list[np.ndarray]:
        """``ids`` (fillers dropped) in batches of ``limit`` per bucket, each bucket's last one filled or kept."""
        kept, own, _ = self.set_oversize_aside(first_occurrences(ids))
        queues = [_EMPTY_IDS] * len(limit)
        return plan_buckets(self, kept, own, queues, list(limit), final=True).batches()

    def plan_inputs(self) -> PlanInputs:
        """What besides the order decides the batches: the buckets, batch sizes, options and lengths."""
        options = {} if self.rule is None else self.rule.fingerprint_options()
        options |= {
            "oversize": self.oversize,
            "bucket_lengths": list(self.buckets.lengths),
            "bucket_batch_sizes": list(self.batch_sizes),
            "partial": self.partial,
        }
        if self.per_group:  # (absent when unset, as the options of other planners)
            options["per_group"] = True
        # NOTE: a multiple decides a bucket plan only through the bucket lengths, which the options name:
        # the plan without it is the same, as a loader made it before it charged its collator's multiple
        older = ({key: value for key, value in options.items() if key != "pad_to_multiple_of"},)
        sizes = self.lengths.fingerprint(self.order.n)
        return PlanInputs("BucketPlanner", options, sizes, older if "pad_to_multiple_of" in options else ())

    def skipped_warning(self, skipped: list[int], epoch: int) -> str:
        """The warning for the items ``skipped`` in ``epoch`` (longer than every bucket), and the fixes."""
        longest = self.lengths_of(np.asarray(skipped, dtype=np.int64)).max().item()
        return (
            f"{len(skipped)} items were longer than the longest bucket ({self.buckets.lengths[-1]}) and were skipped "
            f"in epoch {epoch}; their indices are in stats.skipped. The longest has length {longest!r}. To keep such "
            "items, add a longer bucket, or pass oversize='own_batch' (each in a batch of its own) or "
            "oversize='error' (stop at the first)."
        )


class BucketFigures:
    """Each bucket batch's fill of the budget, real and padded tokens, and filler rows (see ``BatchFigures``)."""

    def __init__(self, planner: BucketPlanner) -> None:
        self.planner = planner

    def of(self, ids: np.ndarray, offsets: np.ndarray, real_rows: np.ndarray | None = None) -> np.ndarray:
        """The figures of the batches ``ids[offsets[b]:offsets[b + 1]]``; ``real_rows``: their real items, if known."""
        planner = self.planner
        figures = np.zeros((4, len(offsets) - 1))
        if not figures.shape[1]:
            return figures
        starts, rows = offsets[:-1], np.diff(offsets)
        lengths = planner.lengths_of(ids)
        real = np.ones(len(ids), dtype=bool)
        if real_rows is None or (real_rows < rows).any():
            real = PlanChunk(ids, offsets).first_places()  # (a filler repeats an item of its batch)
        figures[REAL] = np.add.reduceat(np.where(real, lengths, 0), starts).astype(np.float64)
        figures[FILLER] = rows - np.add.reduceat(real.astype(np.int64), starts)
        longest = np.maximum.reduceat(lengths, starts)
        multiple = None if planner.rule is None else planner.rule.pad_to_multiple_of
        padded = padded_length(longest, multiple, planner.buckets.lengths)
        figures[PADDED] = rows * padded
        bucket = planner.buckets.bucket_of(longest)
        inside = bucket < len(planner.batch_sizes)
        if planner.rule is None:  # a table: the rows over the bucket's batch size
            sizes = np.asarray([*planner.batch_sizes, planner.batch_sizes[-1]], dtype=np.float64)
            figures[FILL] = rows * np.where(inside, 1.0, padded / planner.buckets.lengths[-1]) / sizes[bucket]
            return figures
        units = np.empty(len(rows))
        units[inside] = planner.units[bucket[inside]]
        if not inside.all():
            units[~inside] = np.asarray(planner.unit_cost(padded[~inside]), dtype=np.float64).reshape(-1)
        cap = planner.rule.caps[0]
        figures[FILL] = (planner.rule.fixed[0] + rows * units) / (cap if cap > 0 else 1.0)
        return figures
