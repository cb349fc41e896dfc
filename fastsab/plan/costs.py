"""The batch cost: what a batch may hold, and what it costs.

``BatchCost`` owns the caps (one number, or one per cost column), how a batch's cost is
counted (``"sum"`` of its items, or ``"padded"``: its length times its largest item, or times
the item cost of its per-feature maxima), the cost paid once per batch, the optional cap on
items and the batch size multiple; it checks and lowers the caps and prices
batches. The kernel (``split_batches``), the planners, the bionemo
samplers and the streaming generator all take their rule from it. Any accepted ``sizeof``
is turned into costs by ``fastsab.plan.cost_sources`` (``make_cost_source``, re-exported); caps are
made exact for the kernel's dtype and less a fixed cost by ``fastsab.plan.exact_caps``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from fastsab._checks import (
    check_choice,
    check_nonnegative_real,
    check_optional_positive_int,
    check_positive_int,
    check_positive_real,
    short_repr,
)
from fastsab.plan.cost_sources import CostSource, PaddedLengths, make_cost_source, pad_multiple
from fastsab.plan.exact_caps import dtype_caps, threshold

__all__ = ["BatchCost", "CostMode", "CostSource", "LastBatch", "make_cost_source"]

CostMode = Literal["sum", "padded"]
LastBatch = Literal["keep", "round_down"]
Caps = list[int | float]

#: A loader's limit: a batch size (fixed-size batching) or caps (size-aware batching).
Limit = int | Caps


class BatchCost:
    """Caps on a batch's cost and how that cost is counted.

    Args:
        max_total_size: The inclusive cap: one number (for every cost column) or one per
            column (a sequence or 1-D array); finite and >= 0. A 0-d array or tensor is one number.
        cost: ``"sum"`` (a batch costs the sum of its items) or ``"padded"`` (its length
            times its largest item, per column).
        max_batch_size: Optional cap on the number of items of a batch.
        batch_size_multiple: Full batches are cut down to a multiple of this.
        last_batch: ``"keep"`` (default): the last batch of a final split stays whole.
            ``"round_down"``: it is cut down to a multiple of ``batch_size_multiple`` and the
            rest is dropped (all of it when it holds fewer items), fairseq's ``batch_by_size``
            rule; an own batch of an oversize item is never cut.
        fixed_cost: The cost every batch pays once, whatever its items (e.g. a step's
            gradient buffers and workspace): one number, or one per column; finite and >= 0.
            A batch costs ``fixed_cost + sum`` or ``fixed_cost + len * max``, and only that
            total is compared with the caps (an item is oversize if ``fixed_cost`` plus its
            own cost exceeds a cap).
        feature_cost: With ``cost="padded"``, pad features instead of costs: the rows given
            as "costs" are then per-item features ``(n, d)``, every feature column is padded
            to the batch's maximum, and a batch costs ``fixed_cost + len * feature_cost(max
            row)``; ``feature_cost`` maps an ``(m, d)`` array of rows to their ``m`` checked
            costs (1-D, or ``(m, k)`` for ``k`` caps). ``None`` (default): a batch costs
            ``len * max(cost)`` per column.
        pad_to_multiple_of: With ``cost="padded"`` and one cost column of lengths, charge each
            item its length rounded up to a multiple of this (``padded_length``),
            the length a ``PadCollator`` with this ``pad_to_multiple_of``
            pads to; the planners read costs through ``charged``. ``None``: lengths as they are.

    Attributes:
        caps: The caps as Python numbers (integers stay integers, so comparisons are exact).
        per_column: Whether the caps were given one per column (else one cap for all).
        fixed: The fixed costs as Python numbers (one, or one per column).

    Examples:
        >>> rule = BatchCost([10, 4], cost="padded")
        >>> rule.per_batch(np.array([[3, 1], [5, 1], [2, 2]]), np.array([0, 2, 3])).tolist()
        [[10, 2], [2, 2]]
        >>> rule.smaller_caps(np.array([[3, 1], [5, 1]]), rule.caps, 4)
        [2.5, 0.5]
    """

    __slots__ = (
        "batch_size_multiple",
        "caps",
        "cost",
        "feature_cost",
        "fixed",
        "last_batch",
        "max_batch_size",
        "pad_to_multiple_of",
        "per_column",
    )

    def __init__(
        self,
        max_total_size: Any,
        *,
        cost: CostMode = "sum",
        max_batch_size: int | None = None,
        batch_size_multiple: int = 1,
        last_batch: LastBatch = "keep",
        fixed_cost: Any = 0,
        feature_cost: Callable[[np.ndarray], np.ndarray] | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        self.cost: CostMode = check_choice("cost", cost, ("sum", "padded"))  # type: ignore[assignment]
        self.max_batch_size = check_optional_positive_int("max_batch_size", max_batch_size)
        self.batch_size_multiple = check_positive_int("batch_size_multiple", batch_size_multiple)
        self.last_batch: LastBatch = check_choice("last_batch", last_batch, ("keep", "round_down"))  # type: ignore[assignment]
        self.per_column = _several(max_total_size)
        self.caps: Caps = _numbers("max_total_size", max_total_size, self.per_column)
        self.fixed: Caps = _numbers("fixed_cost", fixed_cost, _several(fixed_cost))
        if len(self.fixed) > 1 and (not self.per_column or len(self.fixed) != len(self.caps)):
            raise ValueError(f"fixed_cost must be one number or one per cap ({len(self.caps)}), got {fixed_cost!r}.")
        if feature_cost is not None and not callable(feature_cost):
            raise TypeError(f"feature_cost must be a callable or None, got {feature_cost!r}.")
        if feature_cost is not None and self.cost != "padded":
            raise ValueError(f"feature_cost pads features, so it needs cost='padded', got cost={cost!r}.")
        self.feature_cost = feature_cost
        self.pad_to_multiple_of = check_optional_positive_int("pad_to_multiple_of", pad_to_multiple_of)
        if self.pad_to_multiple_of is not None and (self.cost != "padded" or feature_cost is not None):
            raise ValueError(
                f"pad_to_multiple_of={pad_to_multiple_of!r} rounds up the lengths a padded batch charges, so it needs "
                f"cost='padded' with costs that are lengths (not padded features), got cost={cost!r}"
                f"{' with padded features' if feature_cost is not None else ''}."
            )

    def charged(self, source: CostSource) -> CostSource:
        """The costs this rule charges for the items of ``source``: padded lengths with ``pad_to_multiple_of``."""
        return source if self.pad_to_multiple_of is None else PaddedLengths(source, self.pad_to_multiple_of)

    def check_collators(self, collators: Mapping[str, object]) -> None:
        """Refuse a collator that pads lengths further than this rule charges them.

        A collator with a ``pad_to_multiple_of`` (``pad_multiple``: ``PadCollator``, or
        transformers' padding collators) pads a batch to its longest length rounded up to that
        multiple; a padded rule of lengths charges it only if its own ``pad_to_multiple_of`` is
        a multiple of the collator's. A loader that sees the collator charges its multiple where
        none is given (``resolve_multiple``).

        Args:
            collators: Where each collator is given (e.g. ``"collate_fn"``) -> the collator, or ``None``.

        Raises:
            ValueError: If a collator rounds lengths up to a multiple this padded rule does not charge.
        """
        # NOTE: a sum budget charges the real tokens by choice, and padded features are charged
        # what feature_cost says of them: neither charges the padded length a collator makes
        if self.cost != "padded" or self.feature_cost is not None:
            return
        charged = self.pad_to_multiple_of
        for where, collator in collators.items():
            multiple = pad_multiple(collator)
            if multiple is None or (charged or 1) % multiple == 0:
                continue
            head = f"{where} {short_repr(collator)} rounds every batch's length up to a multiple of {multiple}, "
            if charged is None:  # (a collator the loader did not see when it planned: data_loader's)
                raise ValueError(
                    f"{head}which the padded budget does not charge (its pad_to_multiple_of is None): pass "
                    f"pad_to_multiple_of={multiple} (or a multiple of it) to FastSizeAwareLoader, or give it this "
                    "collator, so that the budget charges the padded length."
                )
            raise ValueError(
                f"{head}but pad_to_multiple_of={charged} charges lengths rounded up to a multiple of {charged}, "
                f"which does not cover it: pass pad_to_multiple_of={multiple} (or a multiple of it), or leave "
                f"pad_to_multiple_of unset and the budget charges the collator's {multiple}."
            )

    @property
    def limit(self) -> Caps:
        """The caps as a list (one entry for one cap)."""
        return list(self.caps)

    @property
    def num_columns(self) -> int:
        """Cost columns the caps name (1 for one cap, which applies to every column)."""
        return len(self.caps)

    def shown(self) -> int | float | Caps:
        """The caps as given: one number, or the list."""
        return self.limit if self.per_column else self.caps[0]

    def column_caps(self, k: int) -> Caps:
        """The cap of each of ``k`` cost columns."""
        if not self.per_column:
            return self.caps * k
        if len(self.caps) != k:
            raise ValueError(f"max_total_size has {len(self.caps)} caps but costs has {k} columns: {self.caps!r}.")
        return list(self.caps)

    def check_columns(self, costs: np.ndarray) -> None:
        """Raise ``ValueError`` if ``costs`` (``(n,)`` or ``(n, k)``) has other columns than caps.

        One cap applies to every column; caps given one per column must be as many as the columns.

        Examples:
            >>> BatchCost([4, 5]).check_columns(np.ones((3, 3)))
            Traceback (most recent call last):
            ...
            ValueError: max_total_size has 2 caps but costs has 3 columns: [4, 5].
        """
        k = costs.shape[1] if costs.ndim == 2 else 1
        if self.pad_to_multiple_of is not None and k > 1:
            raise ValueError(
                f"pad_to_multiple_of={self.pad_to_multiple_of!r} rounds up one column of lengths, but costs has "
                f"{k} columns: give the lengths alone as sizeof."
            )
        self.column_caps(k)

    @property
    def has_fixed(self) -> bool:
        """Whether batches pay a fixed cost (a nonzero ``fixed_cost``)."""
        return any(self.fixed)

    def column_fixed(self, k: int) -> Caps:
        """The fixed cost of each of ``k`` cost columns."""
        return self.fixed * k if len(self.fixed) == 1 else list(self.fixed)

    def kernel_caps(self, k: int, float_mode: bool) -> tuple[np.ndarray, Caps]:
        """The caps the counters compare a batch's variable cost with: in the costs' dtype, and exact.

        Without a fixed cost these are the caps. With one, the cap of column ``j`` becomes the
        largest variable cost ``v`` (an integer, or a float64 for float costs) for which
        ``fixed_cost + v <= cap`` holds as the greedy loop computes it; that test is monotone in
        ``v``, so ``v <= threshold`` is the same test (a threshold below 0 makes every item oversize).
        """
        caps = self.column_caps(k)
        if self.has_fixed:
            caps = [threshold(cap, fixed, float_mode) for cap, fixed in zip(caps, self.column_fixed(k))]
        return dtype_caps(caps, float_mode), caps

    def caps_for_dtype(self, k: int, float_mode: bool) -> np.ndarray:
        """The caps of ``k`` columns in the costs' dtype, so that ``cost <= cap`` stays exact."""
        return dtype_caps(self.column_caps(k), float_mode)

    def fits(self, total: int | float, count: int) -> bool:
        """Whether a batch of ``count`` items of one summed cost column totalling ``total`` is allowed."""
        if self.has_fixed:
            total = self.fixed[0] + total
        return total <= self.caps[0] and (self.max_batch_size is None or count <= self.max_batch_size)

    def per_batch(self, costs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The cost of each batch ``costs[offsets[b]:offsets[b + 1]]``, per column: shape ``(b, k)``.

        ``costs`` are per-item features when the rule pads features (``feature_cost``).
        """
        variable = self.variable_per_batch(costs, offsets)
        if not self.has_fixed:
            return variable
        total: np.ndarray = variable + np.asarray(self.column_fixed(variable.shape[1]))
        return total

    def variable_per_batch(self, costs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """``per_batch`` without the fixed cost."""
        costs = costs.reshape(len(costs), -1)
        starts = offsets[:-1]
        if self.cost == "sum":
            return np.add.reduceat(costs, starts, axis=0)
        lengths = np.diff(offsets)[:, None]
        if self.feature_cost is None:
            return np.maximum.reduceat(costs, starts, axis=0) * lengths
        if not len(starts):
            return np.empty((0, 1))
        padded = np.asarray(self.feature_cost(np.maximum.reduceat(costs, starts, axis=0)))
        return padded.reshape(len(starts), -1) * lengths

    def balance_costs(self, costs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Each batch's cost relative to the caps (a cap of 0 divides by 1), the largest column counting.

        The batches are batches this rule planned: each costs at most its caps, or holds one item.
        """
        if len(offsets) < 2:
            return np.empty(0, dtype=np.float64)
        rows = np.asarray(costs)
        # NOTE: padded features reach feature_cost in their own dtype (a callable may need integers).
        # Integer costs are priced in int64 (several times faster than float64) where no planned
        # batch can pass it: it costs at most a cap, or one item's cost; in float64 under caps near
        # int64 or with a fixed cost (added to an item's), where a sum or len * max could wrap around
        if self.feature_cost is None and not (rows.dtype.kind == "i" and not self.has_fixed and max(self.caps) < 2**62):
            rows = rows.astype(np.float64)
        per_batch = self.per_batch(rows, offsets)
        # NOTE: a column capped at 0 holds only items of cost 0 (and own-batch oversize items):
        # its costs count as they are, not divided by 0.
        caps = [float(cap) if cap > 0 else 1.0 for cap in self.caps]
        if per_batch.shape[1] == 1:  # (a reduction over one column costs more than the division)
            return per_batch[:, 0] / caps[0]
        return (per_batch / np.asarray(caps)).max(axis=1)  # type: ignore[no-any-return]

    def smaller_caps(self, costs: np.ndarray, current: Caps, factor: float) -> Caps:
        """Caps ``factor`` times below the cost of the batch of ``costs`` (never above ``current``).

        A column the batch spent nothing of keeps its cap: it cannot have caused the error.
        With a fixed cost, the part of the batch's cost above it is divided: a batch pays
        ``fixed_cost`` whatever its size, so the caps become ``fixed_cost + spent / factor``.
        """
        if not len(costs):
            return list(current)
        # NOTE: priced in float64: the result is a float, and an int64 sum or len * max of
        # costs near int64 would wrap around (to a cost of 0 or less, which lowers nothing)
        values = np.asarray(costs) if self.feature_cost is not None else np.asarray(costs, dtype=np.float64)
        spent = self.variable_per_batch(values, np.array([0, len(costs)]))[0].tolist()
        fixed = self.column_fixed(len(spent))
        # NOTE: dividing the fixed cost too would soon leave caps below it, under which every
        # item is oversize and gets a batch of its own: shrinking must leave batches to shrink
        return [
            min(cap, base + float(cost) / factor) if cost > 0 else cap for cap, base, cost in zip(current, fixed, spent)
        ]

    def check_caps(self, limit: object) -> Caps:
        """``limit`` as caps for these columns: as many as configured, finite, positive (0 where configured 0)."""
        several = isinstance(limit, Sequence) or (isinstance(limit, np.ndarray) and limit.ndim > 0)
        values = list(limit) if several else [limit.item() if isinstance(limit, np.ndarray) else limit]  # type: ignore[call-overload]
        if len(values) != len(self.caps):
            raise ValueError(f"limit must have {len(self.caps)} cap(s), got {limit!r}.")
        # NOTE: a configured cap of 0 (items of cost 0 only) has no smaller cap: it stays as it is
        return [
            cap if _is_zero(cap) and configured == 0 else check_positive_real("limit", cap)
            for cap, configured in zip(values, self.caps)
        ]

    def check_lowered(self, limit: object) -> Caps:
        """``limit`` checked as caps (``check_caps``), none above the configured ones."""
        checked = self.check_caps(limit)
        refuse_above(checked, self.caps, self.limit, limit)
        return checked

    def lowered(self, caps: Caps) -> BatchCost:
        """The same rule under ``caps`` (checked caps, as many as configured)."""
        rule = copy.copy(self)
        rule.caps = list(caps)
        return rule

    def options(self) -> dict[str, Any]:
        """How batches are counted and cut, besides the caps (a fixed cost and padded features only when set)."""
        options: dict[str, Any] = {
            "cost": self.cost,
            "max_batch_size": self.max_batch_size,
            "batch_size_multiple": self.batch_size_multiple,
        }
        # NOTE: absent when unset, so that the fingerprints of plans made without them stay the same
        if self.has_fixed:
            options["fixed_cost"] = self.fixed[0] if len(self.fixed) == 1 else list(self.fixed)
        if self.feature_cost is not None:
            options["padding"] = "features"
        if self.pad_to_multiple_of is not None:
            options["pad_to_multiple_of"] = self.pad_to_multiple_of
        if self.last_batch != "keep":
            options["last_batch"] = self.last_batch
        return options

    def fingerprint_options(self, oversize: str | None = None) -> dict[str, Any]:
        """What of this rule decides batches: the caps (as a list), ``oversize`` if given, the options."""
        head: dict[str, Any] = {"limit": self.limit}
        if oversize is not None:
            head["oversize"] = oversize
        return head | self.options()


def _is_zero(value: object) -> bool:
    """Whether ``value`` is a real number equal to 0 (not a bool)."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    return real and value == 0


def refuse_above(
    new: Sequence[int | float], old: Sequence[int | float], shown: object, limit: object, which: str = "configured"
) -> None:
    """Raise ``ValueError`` if a lowered limit ``new`` has a cap above ``old`` (the ``which`` limit, ``shown``)."""
    if any(a > b for a, b in zip(new, old)):
        raise ValueError(f"a lowered limit must not exceed the {which} {shown!r}, got {limit!r}.")


def _several(value: object) -> bool:
    """Whether ``value`` gives one number per column (a sequence or an array with dimensions)."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, Sequence) and not isinstance(value, str)


def _numbers(name: str, value: Any, several: bool) -> Caps:
    """``value`` (one number, or one per column) as a list of checked numbers >= 0."""
    if several:
        return [check_nonnegative_real(name, v) for v in value]
    return [check_nonnegative_real(name, value)]
