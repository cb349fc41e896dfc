"""FastLoader and FastSizeAwareLoader: the DataLoader replacement.

A loader wires the data path together: epoch order (``fastsab.plan.epochs``) -> batch plan
(``fastsab.plan.planners``, split by ``fastsab.plan.batching``) -> this rank's share
(``fastsab.position.cursor``) -> batches made by ``BatchMaker`` (fetch,
collate, move), one plan chunk at a time, optionally ahead in a thread
(``fastsab.fetch.prefetch``).

A loader is generic in its batch type: ``FastLoader[torch.Tensor]``, or the return type of
the given ``collate_fn``, which a type checker infers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from typing_extensions import Unpack

from fastsab._checks import check_choice, check_positive_int
from fastsab.fetch.fillers import not_a_mapping
from fastsab.fetch.mixture import Mixture
from fastsab.loaders.bucketed import DATASET_COLLATOR, bucket_collators, bucket_planner
from fastsab.loaders.loader_base import LoaderBase
from fastsab.loaders.options import (
    DEFAULT_CHUNK_BYTES,
    LimitLike,
    LoaderKeywords,
    LoaderOptions,
    T,
    takes_loader_options,
)
from fastsab.plan.batching import CostMode, OversizePolicy
from fastsab.plan.bucket_planner import BucketPlanner, Partial
from fastsab.plan.cost_sources import feature_rows, pad_multiple
from fastsab.plan.costs import BatchCost, CostSource, LastBatch, make_cost_source
from fastsab.plan.fixed_size import FixedSizePlanner
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.plan.shape_buckets import ShapeBuckets
from fastsab.varlen.collate import PadCollator

__all__ = ["DEFAULT_CHUNK_BYTES", "FastLoader", "FastSizeAwareLoader", "LoaderBase", "LoaderOptions"]

#: Per-item sizes as ``FastSizeAwareLoader`` accepts them (see its ``sizeof``).
SizeOf = (
    torch.Tensor | np.ndarray | Sequence[float] | Sequence[Sequence[float]] | Callable[[Any], Any] | Mapping[str, Any]
)
#: Per-item features for a callable ``sizeof``.
Features = torch.Tensor | np.ndarray | Sequence[Any] | Mapping[str, Any]
#: What ``cost="padded"`` pads: the features (``len * sizeof(maxima)``) or the costs (``len * max``).
Padding = Literal["features", "costs"]


def resolve_padding(padding: object, cost: object, features: object) -> Padding:
    """What a padded batch pads: ``padding`` as given, or ``"features"`` where ``features`` are given.

    Raises:
        ValueError: If ``padding`` is unknown, or ``"features"`` without ``cost="padded"``.
    """
    if padding is None:
        return "features" if cost == "padded" and features is not None else "costs"
    checked: Padding = check_choice("padding", padding, ("features", "costs"))  # type: ignore[assignment]
    if checked == "features" and cost != "padded":
        raise ValueError(f"padding='features' pads a padded batch's features, so it needs cost='padded', got {cost!r}.")
    return checked


def resolve_multiple(given: int | None, cost: object, padding: Padding, collators: Mapping[str, object]) -> int | None:
    """The ``pad_to_multiple_of`` a budget charges: ``given``, else the one of the collators that pad its batches.

    A padded budget of lengths (``cost="padded"``, ``padding="costs"``) charges what the loader's
    collators pad to: with none given, the multiple of each (``pad_multiple``; the least common
    multiple of several), as if it were given. A multiple given is kept (``check_collators`` refuses
    one that does not cover a collator's); a token budget (``cost="sum"``) and padded features charge
    no padded length.

    Examples:
        >>> resolve_multiple(None, "padded", "costs", {"collate_fn": PadCollator(pad_to_multiple_of=8)})
        8
        >>> resolve_multiple(None, "sum", "costs", {"collate_fn": PadCollator(pad_to_multiple_of=8)}) is None
        True
    """
    if given is not None or cost != "padded" or padding != "costs":
        return given
    multiples = [multiple for multiple in map(pad_multiple, collators.values()) if multiple is not None]
    return math.lcm(*multiples) if multiples else None


class FastLoader(LoaderBase[T]):
    """A fast replacement for ``DataLoader(dataset, batch_size, shuffle=...)``.

    Batches of ``batch_size`` items over a seeded grouped permutation; an in-memory tensor
    dataset is gathered a whole shuffle group at a time, other datasets are fetched with one
    ``__getitems__`` call per batch (see ``fastsab.fetch.fetcher``).

    Args:
        dataset: A tensor, numpy array, ``TensorDataset``, pytree of tensors with a common
            first dimension, or a map-style dataset (``__getitems__`` or ``__getitem__``).
        batch_size: Items per batch.
        drop_last: Drop the last partial batch (counted in ``stats.num_dropped``).
        **options: The options both loaders share (``shuffle``, ``seed``, ``group_size``,
            ``collate_fn``, ``device``, ``pin_memory``, ``non_blocking``, ``prefetch``,
            ``chunk_bytes``, ``rank``, ``world_size``, ``even_batches``, ``balance``,
            ``num_workers``, ``worker_init_fn``, ``multiprocessing_context``), described in
            ``LoaderOptions`` (kept in ``loader.options``). ``shuffle``
            shuffles every epoch (a seeded grouped permutation, by default); ``device`` moves
            every batch there; ``num_workers`` fetches batches in worker processes.

    Examples:
        >>> loader = FastLoader(torch.arange(10), batch_size=4, seed=0)
        >>> batches = list(loader)
        >>> [len(b) for b in batches], sorted(torch.cat(batches).tolist()) == list(range(10))
        ([4, 4, 2], True)
        >>> len(loader), loader.stats.num_items, loader.options.seed
        (3, 10, 0)
    """

    @takes_loader_options
    def __init__(
        self,
        dataset: object,
        batch_size: int,
        *,
        drop_last: bool = False,
        **options: Unpack[LoaderKeywords[T]],
    ) -> None:
        check_positive_int("batch_size", batch_size)
        super().__init__(dataset, LoaderOptions.given_to(type(self).__name__, options))
        self._batch_size = batch_size
        self._use_planner(FixedSizePlanner(self.order, batch_size, drop_last))

    # NOTE: read-only, as in DataLoader: the epoch's plan is made from it, so a new value set
    # afterwards would silently not apply
    @property
    def batch_size(self) -> int:
        """Items per batch, as configured (a lowered limit is ``loader.limit``)."""
        return self._batch_size


class FastSizeAwareLoader(LoaderBase[T]):
    """Batches whose total cost stays within ``max_total_size``, planned per epoch.

    The greedy size-aware rule of ``fastsab.plan.batching`` over a seeded grouped
    permutation, with sizes evaluated one shuffle group at a time. ``len()`` is exact: it
    plans the epoch (cheap, vectorized) and keeps the plan for the iteration.

    Args:
        dataset: As for ``FastLoader``.
        sizeof: Per-item sizes: a 1-D (or ``(n, k)`` for ``k`` limits) tensor, array or
            sequence; a callable applied to ``features[indices]`` (e.g. a fitted memory
            model) when ``features`` is given; a vectorized callable taking an index array;
            or a per-item callable (accepted, warned about as slow). For a ``Mixture``, also
            ``{source: sizes}`` (and ``features`` ``{source: features}``), laid end to end.
        max_total_size: The inclusive cap (or ``k`` caps) of a batch's cost.
        features: Per-item features for a callable ``sizeof``, e.g. sequence lengths.
        cost: ``"sum"`` or ``"padded"`` (``len(batch) * max(size)``, or with padded features
            ``len(batch) * sizeof(per-feature maxima)``: see ``padding``).
        padding: What ``cost="padded"`` pads. ``"features"``: every feature column is padded to
            the batch's maximum (an image batch padded to its largest height and its largest
            width), and a batch costs ``len(batch) * sizeof(row of maxima)``; it needs a callable
            ``sizeof`` with ``features``. ``"costs"``: a batch costs ``len(batch) * max(cost)``,
            the costs' maximum per column. ``None`` (default): ``"features"`` where ``features``
            is given with ``cost="padded"``, else ``"costs"``. Features are never summed: with
            ``cost="sum"`` each item costs ``sizeof`` of its own features.
        fixed_cost: The cost a batch pays once whatever its items (e.g. a training step's
            gradient buffers and workspace), one number or one per cap: a batch costs
            ``fixed_cost`` plus its sum or padded cost, and that total stays within
            ``max_total_size``. A fitted ``BatchMemoryModel`` gives it.
        max_batch_size: Optional cap on items per batch.
        batch_size_multiple: Cut full batches down to a multiple of this.
        last_batch: ``"keep"`` (default) or ``"round_down"``: the epoch's last batch cut down to a
            multiple of ``batch_size_multiple``, the rest dropped (``stats.dropped``), as fairseq does.
        oversize: ``"skip"`` (counted in ``stats`` and warned once per epoch),
            ``"own_batch"`` or ``"error"``.
        pad_to_multiple_of: With ``cost="padded"`` and ``sizeof`` of lengths, charge each item its
            length rounded up to a multiple of this, the length a ``PadCollator`` with the same
            ``pad_to_multiple_of`` pads to, so that a padded ``(B, L)`` batch stays within
            ``max_total_size`` (items are oversize, windows sorted and batches split by the
            rounded lengths). ``None`` (default): the multiple of the loader's collator (``collate_fn``,
            or a ``RaggedDataset``'s ``collator``: a ``PadCollator``, or any collator with a
            ``pad_to_multiple_of``), charged as if given here; none without one. A collator that pads
            to a multiple the one given is not a multiple of is refused. With ``buckets``, chosen
            bucket lengths are multiples of it.
        buckets: Shape buckets, for compiled models: every batch is padded to one of ``K``
            lengths and a batch of bucket ``k`` holds a fixed ``B_k`` items, so that an epoch has
            at most ``K`` batch shapes (see ``fastsab.plan.shape_buckets``). ``K`` (the lengths
            that pad the fewest tokens, chosen from ``sizeof``, fractional lengths rounded up), the
            bucket lengths, or a
            ``ShapeBuckets`` (with ``batch_sizes``, e.g. measured: then without
            ``max_total_size``). ``sizeof`` gives the lengths (or a callable over ``features`` of
            lengths gives a row's cost, as a memory model does, of ``cost="sum"`` or ``"padded"``
            alike: every row is padded to ``L_k``); ``B_k`` is the largest count
            with ``fixed_cost + B_k * cost(L_k) <= max_total_size``, capped by
            ``max_batch_size`` and cut to ``batch_size_multiple``. Items are shuffled within
            each bucket and each chunk's batches are yielded in a seeded random order; an item
            longer than every bucket follows ``oversize``. With a dataset read in chunks
            (``OutOfCoreDataset``), every bucket's last batch is made at the end of each chunk, so
            that each chunk is read once an epoch. A ``PadCollator`` given as
            ``collate_fn`` pads to the bucket lengths (``loader.options.collate_fn`` is that copy).
            ``loader.limit`` is then the batch size of each bucket.
        partial: With ``buckets``, what completes a bucket's last, partial batch of the epoch:
            ``"fill"`` (default) repeats the batch's own items up to ``B_k`` rows, after them,
            and adds a boolean ``sample_mask`` (``False`` on filler rows) to the batch, which
            must then be a dict, so that a loss can leave them out (``stats.num_filler_rows``
            counts them); ``"keep"`` yields the batch as it is, an extra shape.
        sort_window: Sort each run of this many items of the epoch order by size before
            splitting it, so that batches hold items of similar size (little padding), and
            yield each shuffle group's batches in a seeded random order. ``None`` (default)
            splits the order as it is. Windows do not cross shuffle groups; sizes with ``k``
            columns sort by the first column, then the next ones. See ``fastsab.plan.windows``.
        **options: As for ``FastLoader`` (see ``LoaderOptions``).

    Examples:
        >>> lengths = torch.tensor([3, 1, 2, 4, 1, 2, 2])
        >>> loader = FastSizeAwareLoader(torch.arange(7) * 10, lengths, max_total_size=4, shuffle=False)
        >>> len(loader), [b.tolist() for b in loader]
        (5, [[0, 10], [20], [30], [40, 50], [60]])
        >>> sorted_loader = FastSizeAwareLoader(torch.arange(7) * 10, lengths, 4, shuffle=False, sort_window=7)
        >>> len(sorted_loader), [b.tolist() for b in sorted_loader]
        (4, [[10, 40, 20], [50, 60], [0], [30]])
    """

    @takes_loader_options
    def __init__(
        self,
        dataset: object,
        sizeof: SizeOf,
        max_total_size: LimitLike | None = None,
        *,
        features: Features | None = None,
        cost: CostMode | None = None,
        max_batch_size: int | None = None,
        batch_size_multiple: int = 1,
        last_batch: LastBatch = "keep",
        oversize: OversizePolicy = "skip",
        padding: Padding | None = None,
        fixed_cost: float | Sequence[float] = 0,
        sort_window: int | None = None,
        pad_to_multiple_of: int | None = None,
        buckets: int | Sequence[int] | ShapeBuckets | None = None,
        partial: Partial | None = None,
        **options: Unpack[LoaderKeywords[T]],
    ) -> None:
        super().__init__(dataset, LoaderOptions.given_to(type(self).__name__, options))
        self._max_total_size = max_total_size
        if isinstance(dataset, Mixture):  # (sizes and features per source, laid end to end)
            sizeof, features = dataset.joined("sizeof", sizeof), dataset.joined("features", features)  # type: ignore[assignment]
        costs: CostSource = make_cost_source(sizeof, self.order.n, features)
        collators = {"collate_fn": self.options.collate_fn, DATASET_COLLATOR: getattr(dataset, "collator", None)}
        if buckets is not None:
            if last_batch != "keep":
                raise ValueError(
                    f"last_batch={last_batch!r} cuts the epoch's last batch, but with buckets each bucket has a last "
                    "batch, which partial decides: pass partial='fill' or 'keep' and leave last_batch unset."
                )
            if cost == "sum" and features is not None:
                # NOTE: a memory model's sum over a bucket batch's rows, each padded to L_k, is its padded
                # cost B_k * sizeof(L_k): its loader_options (cost="sum") size the buckets as cost="padded"
                cost = "padded"
            padded = resolve_padding(padding, cost or "padded", features)
            rule_options = {
                "max_total_size": max_total_size,
                "fixed_cost": fixed_cost,
                "max_batch_size": max_batch_size,
                "batch_size_multiple": batch_size_multiple,
                # (a table of batch sizes charges no budget: it pads to its own lengths)
                "pad_to_multiple_of": pad_to_multiple_of
                if max_total_size is None
                else resolve_multiple(pad_to_multiple_of, "padded", padded, collators),
            }
            bucketed = bucket_planner(
                self.order,
                costs,
                buckets,
                rule_options,
                padding=padded,
                cost=cost,
                sort_window=sort_window,
                oversize=oversize,
                partial=partial or "fill",
                per_group=self._chunked,  # (a chunk read once an epoch: no batch holds items of two)
            )
            self._use_buckets(bucketed, collators)
            return
        if partial is not None:
            raise ValueError(
                f"partial completes the last batch of a shape bucket: it needs buckets=, got partial={partial!r}."
            )
        if max_total_size is None:
            raise TypeError("FastSizeAwareLoader needs max_total_size, the inclusive cap of a batch's cost.")
        cost = cost or "sum"
        feature_cost = None
        padded = resolve_padding(padding, cost, features)
        if padded == "features":
            rows = feature_rows(costs)
            costs, feature_cost = rows, rows.item_costs
        # NOTE: keyword arguments named as the rule's; alike only in shape to other such calls
        rule = BatchCost(
            max_total_size,
            cost=cost,
            max_batch_size=max_batch_size,
            batch_size_multiple=batch_size_multiple,
            last_batch=last_batch,
            fixed_cost=fixed_cost,
            feature_cost=feature_cost,
            pad_to_multiple_of=resolve_multiple(pad_to_multiple_of, cost, padded, collators),
        )
        planner = SizeAwarePlanner(self.order, costs, rule, oversize=oversize, sort_window=sort_window)
        planner.rule.check_collators(collators)
        pad_collators = [c for c in collators.values() if isinstance(c, PadCollator)]
        if pad_collators and features is None:  # (sizeof gives the lengths the collator pads)
            planner.figures.pad_with(pad_collators[0].pad_to_multiple_of)
        self._use_planner(planner)

    def _use_buckets(self, planner: BucketPlanner, given: Mapping[str, object]) -> None:
        """Plan with ``planner``, padding with the ``given`` collators made to pad to its buckets' lengths.

        Raises:
            TypeError: With ``partial="fill"``, if the batches are gathered rows of a tensor (or a
                sequence of them): they cannot hold the ``sample_mask`` key.
            ValueError: If a collator pads further than the budget charges, or to other lengths.
        """
        gathered = self.maker.fetcher.kind == "gather" and self.options.collate_fn is None
        if planner.partial == "fill" and gathered and not isinstance(self.dataset, Mapping):
            raise not_a_mapping(type(self.dataset).__name__)
        if planner.rule is not None:
            planner.rule.check_collators(given)
        collators = bucket_collators(given, planner)
        if collators["collate_fn"] is not self.options.collate_fn:
            self.options = dataclasses.replace(self.options, collate_fn=collators["collate_fn"])  # type: ignore[arg-type]
            self.maker.fetcher.collate_fn = self.options.collate_fn
        self._use_planner(planner)

    @property
    def max_total_size(self) -> LimitLike | None:
        """The cap (or caps) of a batch's cost, as given (a lowered limit is ``loader.limit``); read-only."""
        return self._max_total_size

    @property
    def buckets(self) -> ShapeBuckets | None:
        """The shape buckets: their lengths and each one's configured batch size (``None`` without buckets)."""
        planner = self.planner
        if not isinstance(planner, BucketPlanner):
            return None
        return ShapeBuckets(planner.buckets.lengths, planner.batch_sizes, planner.buckets.source)
