"""``Mixture``: named datasets mixed into one epoch by weights; read here by the ids its order yields.

A loader given a ``Mixture`` plans its epochs over all the sources at once
(``fastsab.plan.mixed_order.MixedOrder``, by the rule of ``fastsab.plan.mixing``); this module
holds what the user builds (the sources, weights, stopping rule) and how a batch of a mixture's
ids is read: each source's items with one fetch (``Fetcher``: a gather, one ``__getitems__``, or
per item), put back in the plan's order.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import optree
import torch

from fastsab._checks import check_choice, short_repr
from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.pytree import tree_map_arrays
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.mix_weights import StopRule, WeightSchedule, parse_stop
from fastsab.plan.mixed_order import MixedOrder, source_numbers
from fastsab.plan.shuffle import DEFAULT_GROUP_SIZE

__all__ = ["Mixture", "MixtureSamplesError"]


class MixtureSamplesError(ValueError):
    """Samples of different sources that cannot share a batch."""


class Mixture:
    """Named datasets mixed into one epoch, each source's share of the cost set by its weight.

    Pass it to ``FastSizeAwareLoader`` (weights count the loader's cost: tokens under a token
    budget, bytes under a memory model) or ``FastLoader`` (weights count items), with ``sizeof``
    a mapping ``{source: sizes}``. Which source the next item comes from is the mixing rule of
    ``fastsab.plan.mixing`` (no random draw): after every prefix of the run (its epochs one after
    another), each source's cost is within the largest item's cost of its share of the total.

    Args:
        sources: ``{name: dataset}``: any dataset a loader takes (tensors, pytrees of tensors,
            ``RaggedDataset``, ``OutOfCoreDataset``, a Hugging Face dataset, a ``__getitems__``
            dataset), each with at least one item.
        weights: ``{name: weight}`` (constant), or a schedule ``[(at, {name: weight}), ...]``
            with ``(at, weights, "linear")`` for a linear segment (see ``WeightSchedule``).
            ``None``: equal weights.
        stop: When the mixture's epoch ends: ``"first"`` (default; when a source ends a source
            epoch begun within it), ``"last"`` (when every source has ended one; the others start
            their next source epoch meanwhile: upsampled), ``{"cost": total}`` or ``{"items": count}``.
            A source's epochs run on across the mixture's (one carried over is finished without
            ending the next mixture epoch): every item of a source is yielded once per source epoch.
        by: What weights count: ``"cost"`` (default; the loader's cost of each item) or
            ``"items"``.
        over: What a schedule's ``at`` counts: ``"cost"`` or ``"items"`` since the mixture's start.

    Raises:
        TypeError, ValueError: For no sources, a name that is not a string, a source with no
            items, and weights or ``stop`` as ``WeightSchedule`` and ``parse_stop`` refuse them.

    Examples:
        >>> mix = Mixture({"a": torch.arange(4), "b": torch.arange(100, 102)}, weights={"a": 2, "b": 1}, stop="last")
        >>> mix.names, len(mix), mix.locate([1, 5])
        (['a', 'b'], 6, [('a', 1), ('b', 1)])
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: object = None,
        *,
        stop: object = "first",
        by: str = "cost",
        over: str = "cost",
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError(f"sources must be a non-empty mapping {{name: dataset}}, got {short_repr(sources)}.")
        for name in sources:
            if not isinstance(name, str):
                raise TypeError(f"source names must be strings, got {short_repr(name)}.")
        self.names = list(sources)
        self.sources = dict(sources)
        self.fetchers = {name: Fetcher(dataset, None) for name, dataset in self.sources.items()}
        for name, fetcher in self.fetchers.items():
            if not fetcher.length:
                raise ValueError(f"source {name!r} has no items: leave it out of the mixture, or give it data.")
        self.lengths = [self.fetchers[name].length for name in self.names]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.schedule = WeightSchedule(
            self.names, {name: 1.0 for name in self.names} if weights is None else weights, over
        )
        self.stop: StopRule = parse_stop(stop)
        self.by = check_choice("by", by, ("cost", "items"))
        # NOTE: collators are told apart by their repr (what they do): RaggedDatasets given none
        # each make a PadCollator() of their own
        collators = {repr(getattr(d, "collator", None)): getattr(d, "collator", None) for d in self.sources.values()}
        #: The sources' collator where all have an equal one (``RaggedDataset``s'): the mixture's batches' layout.
        self.collator = next(iter(collators.values())) if len(collators) == 1 else None
        self._chunk_orders: dict[str, tuple[EpochOrder, int]] = {}  # a chunked source's order, source epoch told

    def __len__(self) -> int:
        """Items of all sources together (not of an epoch: see ``MixedOrder.epoch_length``)."""
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name!r}: {length}" for name, length in zip(self.names, self.lengths))
        return (
            f"Mixture({{{sizes}}}, weights={self.schedule.as_list()!r}, stop={self.stop.as_dict()!r}, by={self.by!r})"
        )

    @property
    def getitems_in_memory(self) -> bool:
        """Whether every source's batches are gathered from memory (see ``Fetcher.in_memory``)."""
        return all(fetcher.in_memory for fetcher in self.fetchers.values())

    def order(self, *, shuffle: bool, seed: int, group_size: Any) -> MixedOrder:
        """The order a loader plans this mixture's epochs in (each source shuffled on its own)."""
        orders = []
        for name, dataset in self.sources.items():
            chunk = getattr(dataset, "chunk_size", None)
            chunked = isinstance(chunk, int) and callable(getattr(dataset, "set_chunk_order", None))
            size: int = chunk if chunked else (group_size or DEFAULT_GROUP_SIZE)  # type: ignore[assignment]
            seed_s = MixedOrder.source_seed(seed, name)
            order = EpochOrder(
                self.fetchers[name].length, shuffle=shuffle, seed=seed_s, group_size=size, rotate=not chunked
            )
            if chunked:  # (its chunks' order in each source epoch, told to it as it is read: see _read)
                self._chunk_orders[name] = (order, -1)
            orders.append(order)
        return MixedOrder(
            self.names,
            orders,
            self.schedule,
            self.stop,
            shuffle=shuffle,
            seed=seed,
            group_size=group_size or DEFAULT_GROUP_SIZE,
            by_items=self.by == "items",
        )

    def joined(self, name: str, values: object) -> object:
        """A per-source mapping of per-item values (``sizeof``, ``features``) laid end to end; other values as given.

        Raises:
            ValueError: If the mapping leaves out or adds a source, if a source's values do not
                have one row per item, or if the sources' rows differ in shape.
        """
        if not isinstance(values, Mapping):
            return values
        if set(values) != set(self.names):
            missing, unknown = [n for n in self.names if n not in values], [k for k in values if k not in self.names]
            raise ValueError(
                f"{name} must give the values of every source of the mixture and of no other: "
                f"missing {missing}, unknown {unknown}."
            )
        parts = []
        for source, length in zip(self.names, self.lengths):
            part = values[source]
            if isinstance(part, (str, bytes)) or not hasattr(part, "__len__"):
                raise TypeError(f"{name}[{source!r}] must be an array, tensor or sequence, got {short_repr(part)}.")
            if len(part) != length:
                raise ValueError(f"{name}[{source!r}] has {len(part)} values but source {source!r} has {length} items.")
            parts.append(part)
        shapes = {source: tuple(np.shape(part)[1:]) for source, part in zip(self.names, parts)}
        if len(set(shapes.values())) > 1:
            each = ", ".join(f"each of {name}[{source!r}] has shape {shape}" for source, shape in shapes.items())
            raise ValueError(f"{name} must give values of one shape for every source: {each}.")
        if all(isinstance(part, torch.Tensor) for part in parts):
            return torch.cat(parts)
        return np.concatenate([np.asarray(part) for part in parts])

    def locate(self, ids: Any) -> list[tuple[str, int]]:
        """The source and index in it of each id (a loader's, e.g. ``stats.skipped``).

        Raises:
            TypeError: If ``ids`` is not a sequence of integers.
            ValueError: If an id is negative (a mixture's ids count from 0).
        """
        given = np.asarray(ids)
        if given.ndim != 1 or not (given.size == 0 or np.issubdtype(given.dtype, np.integer)):
            raise TypeError(f"ids must be a sequence of integers (a loader's ids), got {short_repr(ids)}.")
        if given.size and given.min() < 0:
            raise ValueError(f"ids must be >= 0 (a mixture's ids count from 0), got {int(given.min())}.")
        items = given.astype(np.int64) % len(self)
        sources = source_numbers(self.offsets, items)
        return [(self.names[s], int(i - self.offsets[s])) for s, i in zip(sources.tolist(), items.tolist())]

    def fetch_ids(self, ids: np.ndarray) -> np.ndarray:
        """The items ``ids`` name (a mixture's ids name the source epoch too: ``id % len(self)``)."""
        return np.asarray(ids, dtype=np.int64) % len(self)

    def __getitem__(self, index: int) -> Any:
        """Item ``index`` (of all sources end to end), as its source gives it."""
        (item,) = self.fetch_ids(np.array([index])).tolist()
        s = int(source_numbers(self.offsets, item))
        local, source_epoch = np.array([item - int(self.offsets[s])]), np.array([index // len(self)])
        part = self._read(s, local, source_epoch)  # (a pytree source's row: as a batch reads it)
        return part[0] if isinstance(part, list) else _samples(part, 1)[0]

    def __getitems__(self, indices: Any) -> Any:
        """The items ``indices`` in order: each source read with one fetch.

        Sources gathered from tensors give a batched pytree (their rows joined, where all are
        such sources); otherwise a list of samples, collated by the loader's ``collate_fn`` (or the
        sources' shared ``collator``).

        Raises:
            MixtureSamplesError: If gathered sources' rows differ in structure, dtype or shape.
        """
        items = self.fetch_ids(np.asarray(indices, dtype=np.int64))
        sources = source_numbers(self.offsets, items)
        present = np.unique(sources).tolist()
        where = {s: np.flatnonzero(sources == s) for s in present}
        epochs = np.asarray(indices, dtype=np.int64) // len(self)
        parts = {s: self._read(s, items[where[s]] - self.offsets[s], epochs[where[s]]) for s in present}
        if all(not isinstance(part, list) for part in parts.values()):
            if len(present) == 1:
                return parts[present[0]]
            return self._joined(parts, where, len(items))
        samples: list[Any] = [None] * len(items)
        for s in present:
            part = parts[s]
            rows = part if isinstance(part, list) else _samples(part, len(where[s]))
            for place, sample in zip(where[s].tolist(), rows):
                samples[place] = sample
        return samples if self.collator is None else self.collator(samples)

    def _read(self, s: int, local: np.ndarray, source_epochs: np.ndarray) -> Any:
        fetcher = self.fetchers[self.names[s]]
        if fetcher.kind == "gather":
            return fetcher.take(local)
        dataset = fetcher.dataset
        if self.names[s] in self._chunk_orders and self.collator is None:
            return self._read_chunked(self.names[s], local, source_epochs)
        if fetcher.kind == "getitems" and self.collator is None:
            result = dataset.__getitems__(local.tolist())
            return result if isinstance(result, list) else _samples(result, len(local))
        return [dataset[i] for i in local.tolist()]

    def _read_chunked(self, name: str, local: np.ndarray, source_epochs: np.ndarray) -> list[Any]:
        """Samples of a chunked source (``OutOfCoreDataset``), each source epoch's read in its chunks' order.

        NOTE: as a loader tells a chunked dataset its epoch's chunk order, so that a batch across
        chunks reads them in that order and the last stays held for the next batch: each chunk is
        read once per source epoch.
        """
        dataset = self.sources[name]
        order, told = self._chunk_orders[name]
        samples: list[Any] = [None] * len(local)
        for epoch in np.unique(source_epochs).tolist():
            if epoch != told:
                dataset.set_chunk_order(order.group_order(epoch))
                told = epoch
                self._chunk_orders[name] = (order, told)
            at = np.flatnonzero(source_epochs == epoch)
            for place, sample in zip(at.tolist(), _samples(dataset.__getitems__(local[at].tolist()), len(at))):
                samples[place] = sample
        return samples

    def _joined(self, parts: dict[int, Any], where: dict[int, np.ndarray], count: int) -> Any:
        order = np.empty(count, dtype=np.int64)
        order[np.concatenate([where[s] for s in parts])] = np.arange(count)
        index = torch.from_numpy(order)
        try:
            return optree.tree_map(lambda *rows: _join(rows, index), *parts.values(), none_is_leaf=True)
        except (ValueError, TypeError, RuntimeError) as error:
            names = [self.names[s] for s in parts]
            raise MixtureSamplesError(
                f"the samples of sources {names} cannot share a batch ({error}): rows gathered from tensors are "
                "joined before any collate_fn, so give the sources the same structure, dtypes and trailing shapes."
            ) from None


def _join(rows: tuple[Any, ...], index: torch.Tensor) -> Any:
    # NOTE: leaves of other types or dtypes are refused, not converted (torch.cat and numpy would
    # promote them, and a batch's dtype would depend on which sources it holds)
    if len({type(row) for row in rows}) > 1:
        raise TypeError(f"leaves of types {[type(row).__name__ for row in rows]} differ")
    if isinstance(rows[0], (torch.Tensor, np.ndarray)) and len({row.dtype for row in rows}) > 1:
        raise TypeError(f"dtypes {[row.dtype for row in rows]} differ")
    if isinstance(rows[0], torch.Tensor):
        return torch.cat(rows)[index]
    if isinstance(rows[0], np.ndarray):
        return np.concatenate(rows)[index.numpy()]
    if any(row != rows[0] for row in rows[1:]):
        raise ValueError(f"leaves {rows!r} differ")
    return rows[0]


def _samples(batch: Any, count: int) -> list[Any]:
    """A batched pytree's rows as samples."""
    return [tree_map_arrays(functools.partial(_row, i), batch) for i in range(count)]


def _row(i: int, leaf: Any) -> Any:
    return leaf[i]
