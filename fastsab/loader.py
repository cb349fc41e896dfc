"""FastLoader and FastSizeAwareLoader: the DataLoader replacement.

A loader wires the data path together: epoch order (:mod:`fastsab.shuffle`) -> batch plan
(:mod:`fastsab.planners`, split by :mod:`fastsab.batching`) -> fetch (:mod:`fastsab.fetch`)
-> device transfer (:mod:`fastsab.transfer`), one shuffle group at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch

from fastsab._checks import check_positive_int
from fastsab.batching import CostMode, OversizePolicy
from fastsab.costs import make_cost_source
from fastsab.cursor import EpochCursor, Stream
from fastsab.dataloader_keywords import TakesDataLoaderKeywords
from fastsab.distributed import EvenBatches, resolve_rank
from fastsab.epochs import EpochOrder, EpochStats
from fastsab.fetch import Fetcher
from fastsab.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.planners import FixedSizePlanner, SizeAwarePlanner
from fastsab.plans import PlanChunk
from fastsab.shuffle import DEFAULT_GROUP_SIZE
from fastsab.transfer import pin_available, resolve_device, to_device, tree_map_arrays, warn_pin_unavailable

__all__ = ["FastLoader", "FastSizeAwareLoader"]

#: Default bound on the bytes gathered at once from an in-memory tensor dataset.
DEFAULT_CHUNK_BYTES = 64 * 2**20

# Keyword arguments both loaders pass on to _Loader unchanged.
_SHARED_OPTIONS = (
    "shuffle",
    "seed",
    "group_size",
    "collate_fn",
    "device",
    "pin_memory",
    "non_blocking",
    "prefetch",
    "chunk_bytes",
    "rank",
    "world_size",
    "even_batches",
    "balance",
)


class _Loader(EpochCursor, metaclass=TakesDataLoaderKeywords):
    """What both loaders share: epochs, ranks, fetching, transfer, prefetch, stats and state.

    The metaclass drops DataLoader's keywords at their default values (``num_workers=0``) and
    refuses the others with what to use instead, so that the constructors keep explicit signatures.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        shuffle: bool,
        seed: int,
        group_size: int | None,
        collate_fn: Callable[[Any], Any] | None,
        device: Any,
        pin_memory: bool,
        non_blocking: bool,
        prefetch: int | None,
        chunk_bytes: int,
        rank: int | None,
        world_size: int | None,
        even_batches: EvenBatches,
        balance: bool,
    ) -> None:
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._sharding = (even_batches, balance)
        self.fetcher = Fetcher(dataset, collate_fn)
        self.dataset = dataset
        chunk_size: Any = getattr(dataset, "chunk_size", None)
        self._chunked = isinstance(chunk_size, int) and callable(getattr(dataset, "set_chunk_order", None))
        if group_size is None:
            # NOTE: a chunked dataset (OutOfCoreDataset) is shuffled with its chunks as the
            # groups, unrotated, so every chunk is read once per epoch
            group_size = chunk_size if self._chunked else DEFAULT_GROUP_SIZE
        self.order = EpochOrder(
            self.fetcher.length, shuffle=shuffle, seed=seed, group_size=group_size, rotate=not self._chunked
        )
        self.device = resolve_device(device)
        for name, value in (("pin_memory", pin_memory), ("non_blocking", non_blocking)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}.")
        if pin_memory and not pin_available():
            warn_pin_unavailable()
            pin_memory = False
        self.pin_memory = pin_memory
        self.non_blocking = non_blocking
        if prefetch is not None:
            if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
                raise ValueError(f"prefetch must be None or a non-negative integer, got {prefetch!r}.")
        self.prefetch = prefetch
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be a non-negative integer, got {chunk_bytes!r}.")
        self.chunk_bytes = chunk_bytes
        self.stats: EpochStats | None = None
        self.planner: FixedSizePlanner | SizeAwarePlanner
        self.limit: Any = None  # the batch size or caps in force in the current epoch
        # (limit, retry): asked for by lower_limit() or retry_last_batch() (maybe from another
        # thread), applied by the iteration before it hands out the next batch
        self._pending: tuple[Any, bool] | None = None
        self._pending_lock = threading.Lock()
        self._handed_out = 0  # items of the batch last handed out
        self._rewound = False  # whether that batch was taken back to be planned again

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_pending_lock"]  # a lock does not pickle; a new one is made on load
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending_lock = threading.Lock()

    # -- epochs and plans -------------------------------------------------------------

    def _use_planner(self, planner: FixedSizePlanner | SizeAwarePlanner) -> None:
        even_batches, balance = self._sharding
        self._init_cursor(planner, self.rank, self.world_size, even_batches, balance)

    def batch_sampler(self) -> PlannedBatchSampler:
        """This loader's batch plan as a ``Sampler[list[int]]`` for ``DataLoader(batch_sampler=...)``.

        The sampler starts at the loader's next epoch and counts epochs on its own.
        """
        sampler = PlannedBatchSampler(self.planner, self.rank, self.world_size, *self._sharding, epoch=self.epoch)
        self._copy_position(sampler)
        return sampler

    def data_loader(self, **options: Any) -> PlannedDataLoader:
        """A ``DataLoader`` with this loader's batch plan, e.g. for worker processes.

        ``options`` go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...). Its
        ``state_dict`` counts the batches the training loop received, not those the
        workers fetched ahead. This loader's device transfer and ``collate_fn`` are not
        used (the default ``collate_fn`` is :func:`~fastsab.collate_batch`): pass what
        ``DataLoader`` needs.
        """
        return PlannedDataLoader(self.dataset, self.batch_sampler(), **options)

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(with_indices=False)

    def iter_with_indices(self) -> Iterator[tuple[np.ndarray, Any]]:
        """Iterate the next epoch as ``(indices, batch)`` pairs (indices: an int64 array)."""
        return self._iterate(with_indices=True)

    def _iterate(self, with_indices: bool) -> Iterator[Any]:
        # NOTE: a generator, so the epoch is fixed at the first next(), not at iter(): a
        # trainer may call iter() before set_epoch(), as DataLoader's lazy samplers allow.
        stats = EpochStats(self.epoch)
        epoch, stream = self._start_epoch(stats)
        if self._chunked:
            self.dataset.set_chunk_order(self.order.group_order(epoch))
        self.stats = stats
        self._pending = None
        self.limit = self.planner.limit
        for segment in self._history:  # lowered in earlier stretches, then before the resumed position
            for _, limit in segment.lowered:
                self.limit = limit
        for position, limit in stream.lowered:
            if position <= stream.skip:
                self.limit = limit
        depth = self.prefetch
        if depth is None:  # in-memory gathers are cheaper than a thread hand-off
            depth = 0 if self.fetcher.kind == "gather" else 2
        next_stream: Stream | None = stream
        while next_stream is not None:
            produced = self._produce(next_stream)
            source = produced if depth == 0 else _prefetched(produced, depth)
            next_stream = yield from self._consume(next_stream, source, stats, with_indices)
        self._epoch_done(stats)

    def _consume(
        self, stream: Stream, source: Iterator[tuple[np.ndarray, Any]], stats: EpochStats, with_indices: bool
    ) -> Generator[Any, None, Stream | None]:
        """Yield the batches of ``source`` (from ``stream``); ``stream`` again if the limit was lowered.

        A lowering applies right after the batch last handed out (or, to retry, in its
        place): the batches ``source`` prepared ahead under the old limit are planned again.
        """
        lowering = None
        try:
            for ids, batch in source:
                stats.num_batches += 1
                stats.num_items += len(ids)
                self._step_done()
                self._handed_out, self._rewound = len(ids), False
                yield (ids, batch) if with_indices else batch
                if self._pending is not None:  # (read without the lock: the common case is none)
                    lowering = self._take_pending()
                    if lowering is not None:
                        break
                if self._progress is not None:
                    stream.release(self._progress[1] - 1)  # a retry may take back the batch handed out
        finally:
            source.close()  # type: ignore[attr-defined]  # joins a prefetch thread
        if lowering is None:
            return None
        limit, retry = lowering
        if retry:
            stats.num_batches -= 1
            stats.num_items -= self._handed_out
            self._rewound = True
            self._rewind()
        position = self._progress[1] if self._progress is not None else 0
        stream.lower(position, limit)
        stats.limit_changes.append((stats.num_batches, self.limit, limit))
        self.limit = limit
        return stream

    def _take_pending(self, keep: bool = False) -> tuple[Any, bool] | None:
        """The lowering asked for since the last batch (kept with ``keep``), unless it changes nothing."""
        with self._pending_lock:
            pending = self._pending
            if not keep:
                self._pending = None
        if pending is None or (not pending[1] and _same_limit(pending[0], self.limit)):
            return None
        return pending

    def _pending_lowering(self) -> tuple[int, Any] | None:
        pending = self._take_pending(keep=True)
        if pending is None or self._progress is None:
            return None
        return self._progress[1] - (1 if pending[1] else 0), pending[0]

    def _produce(self, stream: Stream) -> Iterator[tuple[np.ndarray, Any]]:
        for chunk in stream:
            yield from self._chunk_batches(chunk, chunk.offsets.tolist())

    def _chunk_batches(self, chunk: PlanChunk, offsets: list[int]) -> Iterator[tuple[np.ndarray, Any]]:
        fetcher = self.fetcher
        ids = chunk.ids
        if fetcher.kind == "gather" and fetcher.row_bytes * len(ids) <= self.chunk_bytes:
            # NOTE: one gather for the whole chunk; batches are slices of it. This is what
            # makes in-memory epochs run at numpy speed. Each batch is collated, then moved,
            # as on every other path; without a collate_fn the whole chunk is moved at once
            # (the same result in one copy).
            collate = fetcher.collate_fn
            rows = fetcher.take(ids) if collate is not None else self._move(fetcher.take(ids))
            if isinstance(rows, torch.Tensor):  # views made in one call, cheaper than slicing
                parts: Any = rows.split(np.diff(offsets).tolist())
            else:
                parts = (tree_map_arrays(_slicer(offsets[b], offsets[b + 1]), rows) for b in range(len(offsets) - 1))
            for b, part in enumerate(parts):
                yield ids[offsets[b] : offsets[b + 1]], part if collate is None else self._move(collate(part))
            return
        for b in range(len(offsets) - 1):
            lo, hi = offsets[b], offsets[b + 1]
            yield ids[lo:hi], self.fetch(ids[lo:hi])

    def _move(self, batch: Any) -> Any:
        if self.device is None and not self.pin_memory:
            return batch
        return to_device(batch, self.device, non_blocking=self.non_blocking, pin_memory=self.pin_memory)

    # -- adapting to out-of-memory errors -------------------------------------------------

    def fetch(self, indices: np.ndarray) -> Any:
        """The batch for ``indices`` (fetched and moved like the loader's own batches)."""
        return self._move(self.fetcher(np.asarray(indices, dtype=np.int64)))

    def lower_limit(self, limit: Any) -> None:
        """Use a smaller limit (batch size, or cap per column) for the rest of this epoch.

        Applies from the next batch on (batches prefetched under the old limit are planned
        again): the items not yet handed out are planned again, so no sample is lost or
        repeated; items above the new limit get batches of their own. It may be called from
        another thread (a memory monitor) or from the dataset: a batch being fetched is
        handed out whole, and the lowering applies after it. A limit equal to the
        one in force changes nothing. Recorded in ``stats.limit_changes`` and in the state;
        the next epoch starts from the configured limit again.

        Raises:
            ValueError: If ``limit`` is not a valid batch size or caps, exceeds the
                configured limit, or this is one of several ranks.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=False)

    def retry_last_batch(self, limit: Any) -> None:
        """Plan the batch last yielded again, with everything after it, under ``limit``.

        For a batch that failed (ran out of memory): it is no longer counted as done, and
        the next batches are its parts under the smaller limit, then the rest of the epoch.
        A state taken in between resumes exactly. :func:`fastsab.adaptive.run` uses it.

        Raises:
            ValueError: As :meth:`lower_limit`.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=True)

    def _ask_lowering(self, limit: Any, retry: bool) -> None:
        with self._pending_lock:
            pending = self._pending
            # a batch is retried once, however often it is asked; a later lowering keeps the retry
            retry = (retry and not self._rewound) or (pending is not None and pending[1])
            self._pending = (limit, retry)

    def _checked_lowering(self, limit: Any) -> Any:
        checked = self.check_lowered_limit(limit)
        if self.world_size > 1:
            raise ValueError(
                f"cannot lower the limit to {limit!r} on rank {self.rank} of {self.world_size}: the ranks would run "
                "different numbers of steps and data-parallel training would hang."
            )
        if self.position is None:
            raise RuntimeError("lowering the limit needs an epoch being iterated (after its first batch).")
        return checked

    def split_indices(self, indices: np.ndarray, limit: Any) -> list[np.ndarray]:
        """Split a batch's ``indices`` in order into batches within ``limit`` (greedy)."""
        planner: Any = self.planner
        return planner.split(np.asarray(indices, dtype=np.int64), planner.check_limit(limit))

    def smaller_limit(self, indices: np.ndarray, factor: float) -> Any:
        """The limit under which the batch ``indices`` splits into about ``factor`` parts."""
        return self.planner.smaller_limit(np.asarray(indices, dtype=np.int64), self.limit, factor)


def _same_limit(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _slicer(lo: int, hi: int) -> Callable[[Any], Any]:
    return lambda leaf: leaf[lo:hi]


def _prefetched(source: Iterator[Any], depth: int) -> Iterator[Any]:
    """Run ``source`` in a background thread, ``depth`` items ahead of the consumer.

    Errors in the thread are raised in the consumer. When the consumer stops early
    (``break``, an exception, garbage collection), the thread is told to stop, the queue is
    drained so it cannot block, and the thread is joined: no thread outlives the loop.
    """
    items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(message: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                items.put(message, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in source:
                if not put(("item", item)):
                    return
            put(("end", None))
        except BaseException as err:  # forwarded to the consumer, which re-raises it
            put(("error", err))
        finally:
            source.close()  # type: ignore[attr-defined]

    thread = threading.Thread(target=produce, name="fastsab-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, payload = items.get()
            if kind == "item":
                yield payload
            elif kind == "end":
                return
            else:
                raise payload
    finally:
        stop.set()
        while True:
            try:
                items.get_nowait()
            except queue.Empty:
                break
        thread.join()


class FastLoader(_Loader):
    """A fast replacement for ``DataLoader(dataset, batch_size, shuffle=...)``.

    Batches of ``batch_size`` items over a seeded grouped permutation; an in-memory tensor
    dataset is gathered a whole shuffle group at a time, other datasets are fetched with one
    ``__getitems__`` call per batch (see :mod:`fastsab.fetch`).

    Args:
        dataset: A tensor, numpy array, ``TensorDataset``, pytree of tensors with a common
            first dimension, or a map-style dataset (``__getitems__`` or ``__getitem__``).
        batch_size: Items per batch.
        shuffle: Shuffle every epoch (grouped permutation); otherwise sequential order.
        seed: Seed of the epoch orders: the order depends only on ``(seed, epoch)``.
        drop_last: Drop the last partial batch (counted in ``stats.num_dropped``).
        group_size: Items per shuffle group, the unit of planning and of in-memory gathers;
            by default 2**16, or the chunks of a chunked dataset such as
            :class:`~fastsab.OutOfCoreDataset` (then read once per epoch each).
        collate_fn: Applied to what is fetched for a batch (see :mod:`fastsab.fetch`).
        device: Move each batch (pytree) there; ``None`` leaves batches where they are.
        pin_memory: Pin host memory before copying to an accelerator (ignored, with a
            warning, where none is available).
        non_blocking: Asynchronous host-to-device copies.
        prefetch: Batches a background thread prepares ahead; ``None`` chooses 0 for
            in-memory tensor data and 2 for datasets that fetch.
        chunk_bytes: Largest in-memory gather of one shuffle group; bigger groups are
            gathered batch by batch.
        rank, world_size: This process's share of the epoch; default from
            ``torch.distributed`` when it is initialized, else one process. Every rank
            plans the same global batches and runs the same number of steps.
        even_batches: ``"pad"`` (fill the last step with repeats of the first batches) or
            ``"drop"`` (leave the surplus batches out); counted in ``stats``.
        balance: Deal batches of similar cost to the ranks at each step (see
            :mod:`fastsab.distributed`); ``stats.spread_before``/``spread_after`` report it.

    Examples:
        >>> loader = FastLoader(torch.arange(10), batch_size=4, seed=0)
        >>> batches = list(loader)
        >>> [len(b) for b in batches], sorted(torch.cat(batches).tolist()) == list(range(10))
        ([4, 4, 2], True)
        >>> len(loader), loader.stats.num_items
        (3, 10)
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        group_size: int | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        device: Any = None,
        pin_memory: bool = False,
        non_blocking: bool = True,
        prefetch: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
        even_batches: EvenBatches = "pad",
        balance: bool = True,
    ) -> None:
        options = locals()
        check_positive_int("batch_size", batch_size)
        super().__init__(dataset, **{name: options[name] for name in _SHARED_OPTIONS})
        self.batch_size = batch_size
        self._use_planner(FixedSizePlanner(self.order, batch_size, drop_last))


class FastSizeAwareLoader(_Loader):
    """Batches whose total cost stays within ``max_total_size``, planned per epoch.

    The greedy size-aware rule of :mod:`fastsab.batching` over a seeded grouped
    permutation, with sizes evaluated one shuffle group at a time. ``len()`` is exact: it
    plans the epoch (cheap, vectorized) and keeps the plan for the iteration.

    Args:
        dataset: As for :class:`FastLoader`.
        sizeof: Per-item sizes: a 1-D (or ``(n, k)`` for ``k`` limits) tensor, array or
            sequence; a callable applied to ``features[indices]`` (e.g. a fitted memory
            model) when ``features`` is given; a vectorized callable taking an index array;
            or a per-item callable (accepted, warned about as slow).
        max_total_size: The inclusive cap (or ``k`` caps) of a batch's cost.
        features: Per-item features for a callable ``sizeof``, e.g. sequence lengths.
        cost: ``"sum"`` or ``"padded"`` (``len(batch) * max(size)``).
        max_batch_size: Optional cap on items per batch.
        batch_size_multiple: Cut full batches down to a multiple of this.
        oversize: ``"skip"`` (counted in ``stats`` and warned once per epoch),
            ``"own_batch"`` or ``"error"``.
        shuffle, seed, group_size, collate_fn, device, pin_memory, non_blocking, prefetch,
        chunk_bytes, rank, world_size, even_batches, balance: As for :class:`FastLoader`.

    Examples:
        >>> lengths = torch.tensor([3, 1, 2, 4, 1, 2, 2])
        >>> loader = FastSizeAwareLoader(torch.arange(7) * 10, lengths, max_total_size=4, shuffle=False)
        >>> len(loader), [b.tolist() for b in loader]
        (5, [[0, 10], [20], [30], [40, 50], [60]])
    """

    def __init__(
        self,
        dataset: Any,
        sizeof: Any,
        max_total_size: Any,
        *,
        features: Any = None,
        cost: CostMode = "sum",
        max_batch_size: int | None = None,
        batch_size_multiple: int = 1,
        oversize: OversizePolicy = "skip",
        shuffle: bool = True,
        seed: int = 0,
        group_size: int | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        device: Any = None,
        pin_memory: bool = False,
        non_blocking: bool = True,
        prefetch: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
        even_batches: EvenBatches = "pad",
        balance: bool = True,
    ) -> None:
        options = locals()
        super().__init__(dataset, **{name: options[name] for name in _SHARED_OPTIONS})
        self.max_total_size = max_total_size
        costs = make_cost_source(sizeof, self.order.n, features)
        planner = SizeAwarePlanner(
            self.order,
            costs,
            max_total_size,
            cost=cost,
            max_batch_size=max_batch_size,
            batch_size_multiple=batch_size_multiple,
            oversize=oversize,
        )
        self._use_planner(planner)
