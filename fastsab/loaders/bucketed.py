"""Shape buckets on ``FastSizeAwareLoader``: the planner its arguments make, and the collators it pads with.

``bucket_planner`` turns the loader's arguments (``sizeof`` of lengths, or a callable over one
feature column of lengths with ``padding="features"``; ``max_total_size`` or a table of batch
sizes) into a ``BucketPlanner``, refusing what buckets cannot honour. ``bucket_collators``
makes every padding collator pad to the buckets' lengths: a ``PadCollator`` given without them is
used as ``padded_to`` those lengths, and one that pads otherwise is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastsab._checks import short_repr
from fastsab.plan.batching import OversizePolicy
from fastsab.plan.bucket_planner import BucketPlanner, Partial
from fastsab.plan.cost_sources import CostSource, FeatureRows, feature_rows, pad_multiple, padded_length
from fastsab.plan.costs import BatchCost
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.shape_buckets import ShapeBuckets
from fastsab.varlen.collate import PadCollator

__all__ = ["DATASET_COLLATOR", "bucket_collators", "bucket_planner"]

#: Where ``bucket_collators`` is told a collator is the dataset's own (which it cannot replace).
DATASET_COLLATOR = "the dataset's collator"


class _FeatureLengths:
    """The lengths of one feature column (``FeatureRows`` of width 1), as a cost source."""

    def __init__(self, rows: FeatureRows) -> None:
        self.rows = rows

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return self.rows(ids)[:, 0]

    def fingerprint(self, n: int) -> bytes | memoryview:
        return self.rows.fingerprint(n)


def _feature_unit_cost(rows: FeatureRows, lengths: np.ndarray) -> np.ndarray:
    """The cost ``sizeof`` gives one row of each of ``lengths`` (a feature column of lengths)."""
    dtype = rows.rows.dtype
    values = np.asarray(lengths).astype(dtype, copy=False).reshape(-1, 1)
    costs = np.asarray(rows.item_costs(values))
    if costs.ndim > 1 and costs.shape[1] != 1:
        raise ValueError(f"buckets take one cost column, but sizeof gives {costs.shape[1]} per row of features.")
    return costs.reshape(-1)


def bucket_planner(
    order: EpochOrder,
    costs: CostSource,
    buckets: ShapeBuckets | Sequence[int] | int,
    rule_options: dict[str, Any],
    *,
    padding: str,
    cost: str | None,
    sort_window: int | None,
    oversize: OversizePolicy,
    partial: Partial,
    per_group: bool = False,
) -> BucketPlanner:
    """The planner of a loader with ``buckets``.

    Args:
        order: The loader's epoch order.
        costs: Its ``sizeof`` as a cost source.
        buckets: As the loader takes it.
        rule_options: ``max_total_size`` (``None`` with a table), ``fixed_cost``, ``max_batch_size``,
            ``batch_size_multiple`` and ``pad_to_multiple_of`` as given.
        padding: ``"features"`` or ``"costs"``, resolved.
        cost: ``cost`` as given (``None``, or ``"padded"``: a bucket batch costs its padded shape).
        sort_window: Must be ``None``: buckets group items by length themselves.
        oversize: The loader's ``oversize``.
        partial: The loader's ``partial``.
        per_group: Close the buckets at the end of each group (a dataset read in chunks: ``BucketPlanner``).

    Raises:
        ValueError: If an argument does not fit shape buckets (see the messages).
    """
    if cost not in (None, "padded"):
        raise ValueError(
            f"buckets pad every batch to its bucket's length, so a batch costs its padded shape: cost={cost!r} "
            "does not apply; leave cost unset (or pass cost='padded')."
        )
    if sort_window is not None:
        raise ValueError(
            f"buckets group items of similar length themselves: pass either buckets or sort_window, not both "
            f"(got sort_window={sort_window!r})."
        )
    if padding == "features":
        rows = feature_rows(costs)
        if rows.rows.shape[1] != 1:
            raise ValueError(
                f"buckets pad one column of lengths, but features has {rows.rows.shape[1]} columns: give the "
                "lengths alone as features."
            )
        lengths: CostSource = _FeatureLengths(rows)
        unit_cost: Any = functools.partial(_feature_unit_cost, rows)
        feature_cost: Any = rows.item_costs
    else:
        lengths, feature_cost = costs, None
        unit_cost = functools.partial(padded_length, multiple=rule_options["pad_to_multiple_of"])
    table = isinstance(buckets, ShapeBuckets) and buckets.batch_sizes is not None
    if rule_options["max_total_size"] is None:
        if not table:
            raise TypeError(
                "FastSizeAwareLoader needs max_total_size (the budget of a batch), unless buckets is a "
                "ShapeBuckets with batch_sizes (e.g. from fastsab.memory.max_batch_sizes)."
            )
        defaults = {"fixed_cost": 0, "max_batch_size": None, "batch_size_multiple": 1, "pad_to_multiple_of": None}
        given = [f"{name}={rule_options[name]!r}" for name, value in defaults.items() if rule_options[name] != value]
        if given:
            raise ValueError(
                f"{', '.join(given)} shape a budget's batches, but buckets gives each bucket's batch size: "
                "leave them unset, or pass max_total_size and buckets without batch_sizes."
            )
        return BucketPlanner(
            order, lengths, buckets, rule=None, unit_cost=unit_cost, oversize=oversize, partial=partial
        )
    rule = BatchCost(cost="padded", feature_cost=feature_cost, **rule_options)
    if rule.num_columns != 1 or len(rule.fixed) != 1:
        raise ValueError(f"buckets take one cap and one fixed_cost, got max_total_size={rule.shown()!r}.")
    return BucketPlanner(
        order, lengths, buckets, rule=rule, unit_cost=unit_cost, oversize=oversize, partial=partial, per_group=per_group
    )


def bucket_collators(collators: Mapping[str, object], planner: BucketPlanner) -> dict[str, object]:
    """The collators (where each is given -> it) padding to ``planner``'s bucket lengths.

    A ``PadCollator`` without bucket lengths is replaced by one padding to the buckets'
    (``padded_to``), but the dataset's (``DATASET_COLLATOR``); any other collator is returned as it is.

    Raises:
        ValueError: If a collator pads to other bucket lengths, to a multiple a bucket length is
            not a multiple of, or is a dataset's ``PadCollator`` without bucket lengths (which the
            loader cannot replace).
    """
    lengths = planner.buckets.lengths
    made: dict[str, object] = {}
    for where, collator in collators.items():
        multiple = pad_multiple(collator)
        if multiple is not None and any(length % multiple for length in lengths):
            raise ValueError(
                f"{where} {short_repr(collator)} pads to a multiple of {multiple}, but the bucket lengths "
                f"{list(lengths)!r} are not all multiples of it: a batch would be padded past its bucket's length. "
                "Give bucket lengths that are multiples of it."
            )
        if isinstance(collator, PadCollator):
            if collator.bucket_lengths is None and where != DATASET_COLLATOR:
                collator = collator.padded_to(lengths)
            elif collator.bucket_lengths != lengths:
                raise ValueError(
                    f"{where} {short_repr(collator)} pads to other lengths than the buckets {list(lengths)!r}: "
                    f"give it bucket_lengths={list(lengths)!r} (PadCollator(..., bucket_lengths=...))."
                )
        made[where] = collator
    return made
