"""What both loaders share: :class:`LoaderBase`.

The base of :class:`~fastsab.FastLoader` and :class:`~fastsab.FastSizeAwareLoader`: the
epoch, rank and state of an :class:`~fastsab.position.cursor.EpochCursor`, iteration (batches made by
a :class:`~fastsab.fetch.batch_maker.BatchMaker`, optionally ahead in a thread), stats, and
lowering the limit mid-epoch (the loader side of :func:`fastsab.adaptive.run`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, cast

import numpy as np
import torch

from fastsab.fetch.batch_maker import BatchMaker, IndexArray, Run
from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.prefetch import prefetched
from fastsab.fetch.transfer import Transfer
from fastsab.fetch.workers import PersistentWorkers, worker_batches
from fastsab.loaders.dataloader_keywords import TakesDataLoaderKeywords
from fastsab.loaders.options import Limit, LimitLike, LoaderOptions, T
from fastsab.loaders.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.plan.costs import refuse_above
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.fixed_size import FixedSizePlanner
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.plan.shuffle import DEFAULT_GROUP_SIZE
from fastsab.position.cursor import EpochCursor, Stream
from fastsab.position.distributed import resolve_rank
from fastsab.position.stats import EpochStats
from fastsab.position.trainer_sampler import CountedLength, TrainerSampler, loaded_at_epoch_end

__all__ = ["LoaderBase"]


class _ChunkedDataset(Protocol):
    """A dataset read in chunks that wants the epoch's chunk order (:class:`~fastsab.OutOfCoreDataset`)."""

    chunk_size: int

    def set_chunk_order(self, order: np.ndarray) -> None: ...


class LoaderBase(EpochCursor, Generic[T], metaclass=TakesDataLoaderKeywords):
    """What both loaders share: epochs, ranks, making batches, prefetch, workers, stats and state.

    The metaclass drops DataLoader's keywords at their default values (``timeout=0``) and
    refuses the others with what to use instead, so that the constructors keep explicit signatures.

    Attributes:
        options: The :class:`~fastsab.loaders.options.LoaderOptions` as given.
        dataset: The dataset.
        order: The epoch order (:class:`~fastsab.plan.epochs.EpochOrder`).
        maker: Makes the batches (:class:`~fastsab.fetch.batch_maker.BatchMaker`).
        stats: What the last epoch yielded (:class:`~fastsab.plan.epochs.EpochStats`), ``None`` before.
        limit: The batch size or caps in force in the current epoch.
        parts_left: While :func:`fastsab.adaptive.run` runs the parts of a split step, how
            many come after the one running (0 otherwise).
    """

    def __init__(self, dataset: object, options: LoaderOptions) -> None:
        self.options = options
        self.rank, self.world_size = resolve_rank(options.rank, options.world_size)
        fetcher = Fetcher(dataset, options.collate_fn)
        self.dataset = dataset
        chunk_size = getattr(dataset, "chunk_size", None)
        self._chunked = isinstance(chunk_size, int) and callable(getattr(dataset, "set_chunk_order", None))
        group_size = options.group_size
        if group_size is None:
            # NOTE: a chunked dataset (OutOfCoreDataset) is shuffled with its chunks as the
            # groups, unrotated, so every chunk is read once per epoch
            group_size = chunk_size if isinstance(chunk_size, int) and self._chunked else DEFAULT_GROUP_SIZE
        self.order = EpochOrder(
            fetcher.length, shuffle=options.shuffle, seed=options.seed, group_size=group_size, rotate=not self._chunked
        )
        transfer = Transfer.create(options.device, options.pin_memory, options.non_blocking)
        self.maker: BatchMaker[T] = BatchMaker(fetcher, transfer, options.chunk_bytes)
        self.stats: EpochStats | None = None
        self.planner: FixedSizePlanner | SizeAwarePlanner
        self.limit: Limit | None = None
        # (limit, retry): asked for by lower_limit() or retry_last_batch() (maybe from another
        # thread), applied by the iteration before it hands out the next batch
        self._pending: tuple[Limit, bool] | None = None
        self._pending_lock = threading.Lock()
        self._handed_out = 0  # items of the batch last handed out
        self._rewound = False  # whether that batch was taken back to be planned again
        self.parts_left = 0
        self._workers: PersistentWorkers | None = None  # with persistent_workers, once started
        self._counted = CountedLength()  # the length a trainer counts for the coming epoch

    @property
    def fetcher(self) -> Fetcher:
        """How batches are read from the dataset (:class:`~fastsab.fetch.fetcher.Fetcher`)."""
        return self.maker.fetcher

    @property
    def device(self) -> torch.device | None:
        """Where batches are moved (``None``: left where they are)."""
        return self.maker.transfer.device

    @property
    def pin_memory(self) -> bool:
        """Whether host memory is pinned before copies (``False`` where no accelerator is available)."""
        return self.maker.transfer.pin_memory

    @property
    def non_blocking(self) -> bool:
        """Whether host-to-device copies are asynchronous."""
        return self.maker.transfer.non_blocking

    @property
    def prefetch(self) -> int | None:
        """Batches a background thread, or each worker process, prepares ahead (``None``: chosen per dataset)."""
        return self.options.prefetch

    @property
    def num_workers(self) -> int:
        """Worker processes that fetch batches (0 where batches are gathered or fetched in this process).

        In-memory tensor data is gathered here whatever ``num_workers`` says: a gather is a copy
        of rows, which a worker would only copy once more (into shared memory). So is a dataset
        read in chunks (:class:`~fastsab.OutOfCoreDataset`): its batches are copies of rows of
        the chunk in memory, and each worker would read every chunk into a copy of its own. A
        ``__getitems__`` declared ``getitems_in_memory`` is not: it may still be worth workers
        (a large batch, a memory-mapped file), and asking for them is the caller's choice.
        """
        # NOTE: ignored for "gather" and chunked datasets rather than refused, so that one set of
        # options (e.g. loader.options.keywords()) serves a tensor dataset and one that fetches
        return 0 if self.fetcher.kind == "gather" or self._chunked else self.options.num_workers

    @property
    def chunk_bytes(self) -> int:
        """Largest in-memory gather of one plan chunk."""
        return self.maker.chunk_bytes

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_pending_lock"]  # a lock does not pickle; a new one is made on load
        state["_workers"] = None  # processes do not pickle; a copy starts workers of its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending_lock = threading.Lock()

    # -- epochs and plans -------------------------------------------------------------

    def _use_planner(self, planner: FixedSizePlanner | SizeAwarePlanner) -> None:
        self._init_cursor(planner, self.rank, self.world_size, self.options.even_batches, self.options.balance)

    def batch_sampler(self) -> PlannedBatchSampler:
        """This loader's batch plan as a ``Sampler[list[int]]`` for ``DataLoader(batch_sampler=...)``.

        The sampler starts at the loader's next epoch and counts epochs on its own.
        """
        sampler = PlannedBatchSampler(
            self.planner, self.rank, self.world_size, self.even_batches, self.balance, epoch=self.epoch
        )
        self._copy_position(sampler)
        return sampler

    def data_loader(self, **options: Any) -> PlannedDataLoader:
        """A ``DataLoader`` with this loader's batch plan, e.g. for worker processes.

        ``options`` go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...). Its
        ``state_dict`` counts the batches the training loop received, not those the
        workers fetched ahead. This loader's device transfer and ``collate_fn`` are not
        used (the default ``collate_fn`` is :func:`~fastsab.collate_batch`): pass what
        ``DataLoader`` needs.

        Raises:
            ValueError: If ``collate_fn`` pads lengths further than a padded budget charges them
                (its ``pad_to_multiple_of``: see :meth:`~fastsab.plan.costs.BatchCost.check_collators`).
        """
        if isinstance(self.planner, SizeAwarePlanner):
            self.planner.rule.check_collators({"data_loader's collate_fn": options.get("collate_fn")})
        return PlannedDataLoader(self.dataset, self.batch_sampler(), **options)

    def __len__(self) -> int:
        """Exact number of steps of the next epoch (see :meth:`EpochCursor.__len__`)."""
        return self._counted.read(super().__len__())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see :meth:`EpochCursor.load_state_dict`)."""
        super().load_state_dict(state)
        if self.finished_steps:  # saved after its epoch's last step: a trainer may count them on
            loaded_at_epoch_end(self.fingerprint(), self.epoch, self.finished_steps, self)

    @property
    def sampler(self) -> TrainerSampler:
        """Where a trainer written for ``DataLoader`` sets the epoch (see :class:`TrainerSampler`)."""
        return TrainerSampler(self.set_epoch, self._counted)

    # -- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        return cast(Iterator[T], self._iterate(with_indices=False))

    def iter_with_indices(self) -> Iterator[tuple[IndexArray, T]]:
        """Iterate the next epoch as ``(indices, batch)`` pairs (indices: an int64 array)."""
        return cast(Iterator[tuple[IndexArray, T]], self._iterate(with_indices=True))

    def _iterate(self, with_indices: bool) -> Generator[T | tuple[IndexArray, T], None, None]:
        # NOTE: a generator, so the epoch is fixed at the first next(), not at iter(): a
        # trainer may call iter() before set_epoch(), as DataLoader's lazy samplers allow.
        self._counted.start(self, self.epoch, lambda: EpochCursor.__len__(self), self.fingerprint)
        stats = EpochStats(self.epoch)
        epoch, stream = self._start_epoch(stats)
        progress = self._progress
        if self._chunked:
            dataset: _ChunkedDataset = self.dataset  # type: ignore[assignment]  # checked in __init__
            dataset.set_chunk_order(self.order.group_order(epoch))
        self.stats = stats
        self._pending = None
        self.parts_left = 0
        self.limit = self.start_limit()
        depth = self.prefetch
        if depth is None:  # in-memory gathers are cheaper than a thread hand-off
            depth = 0 if self.fetcher.in_memory and not self.num_workers else 2
        next_stream: Stream | None = stream
        try:
            while next_stream is not None:
                if self.num_workers:
                    source = self._produce_in_workers(next_stream, depth, with_indices)
                else:
                    produced = self._produce(next_stream, with_indices, per_batch=depth > 0)
                    source = produced if depth == 0 else prefetched(produced, depth)
                next_stream = yield from self._consume(next_stream, source, stats, progress)
        except GeneratorExit:
            if self._progress is progress:  # (not an iteration a newer one left behind)
                self._iteration_left()
            raise
        self._epoch_done(stats)

    def _consume(
        self, stream: Stream, source: Generator[Run, None, None], stats: EpochStats, progress: list[int] | None
    ) -> Generator[T | tuple[IndexArray, T], None, Stream | None]:
        """Yield the batches of ``source`` (from ``stream``); ``stream`` again if the limit was lowered.

        A lowering applies right after the batch last handed out (or, to retry, in its
        place): the batches ``source`` prepared ahead under the old limit are planned again.
        ``progress`` is the position this iteration counts its steps in.

        Raises:
            RuntimeError: If another iteration of the loader began (or a state was loaded)
                since this one's last batch: its batches would be counted in that one's position.
        """
        # NOTE: the per-batch loop, kept to what each batch needs: a run's batches are made in
        # one torch.split where they are views of one gather (see Run), and a batch costs here
        # two counters, the step, the batch to take back on a retry and one test for a lowering.
        # Where a batch's microseconds go (FastLoader, torch.arange(240_000), batch size 64,
        # one CPU thread, best of 15 epochs on a loaded shared machine: 1.6 us in all against
        # 0.83 us for numpy's permutation + reshape): 0.5 us planning, of which 0.31 us
        # torch.randperm itself (the seeded order: one per group of 65,536) and 0.13 us
        # widening, offsetting and wrapping its indices; 0.24 us the gather of the chunk's rows
        # (index_select); 0.6 us the batch's tensor view, made and dropped (torch.split's own
        # cost is 0.5 us a view, view(...).unbind(0)'s 0.6 us; the tensor floor pays it too); about
        # 0.2 us this loop and the generators around it (an attribute update costs 15 to 25 ns).
        # FastSizeAwareLoader adds about 1.1 us per batch of planning, nearly all of it the
        # greedy split's walk (looking up the chunk's sizes: 0.03 us).
        lowering = None
        try:
            for sizes, batch_ids, batches in source:
                items: Iterable[T | tuple[IndexArray, T]] = batches if batch_ids is None else zip(batch_ids, batches)
                first = True
                for size, item in zip(sizes, items):
                    if self._progress is not progress:
                        raise RuntimeError(
                            "this iterator of the loader was left behind: a newer iteration began, or a state was "
                            "loaded, since its last batch. Iterate one epoch at a time (one iter(loader) in use)."
                        )
                    stats.num_batches += 1
                    stats.num_items += size
                    if progress is not None:  # _step_done(), inlined
                        progress[1] += 1
                    self._handed_out, self._rewound = size, False
                    yield item
                    if self._pending is not None:  # (read without the lock: the common case is none)
                        lowering = self._take_pending()
                        if lowering is not None:
                            break
                    if first and self._progress is not None:
                        # NOTE: only a run's first batch releases chunks (those before its own);
                        # a retry may take back the batch handed out
                        stream.release(self._progress[1] - 1)
                        first = False
                if lowering is not None:
                    break
        finally:
            source.close()  # joins a prefetch thread, shuts worker processes down
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

    def _take_pending(self, keep: bool = False) -> tuple[Limit, bool] | None:
        """The lowering asked for since the last batch (kept with ``keep``), unless it changes nothing."""
        with self._pending_lock:
            pending = self._pending
            if not keep:
                self._pending = None
        if pending is None or (not pending[1] and _same_limit(pending[0], self.limit)):
            return None
        return pending

    def _pending_lowering(self) -> tuple[int, Limit] | None:
        pending = self._take_pending(keep=True)
        if pending is None or self._progress is None:
            return None
        return self._progress[1] - (1 if pending[1] else 0), pending[0]

    def _step_open(self) -> bool:
        if self.parts_left <= 0:
            return False
        warnings.warn(
            f"state_dict() was called between the parts of a split step ({self.parts_left} part(s) still to run): "
            "the state resumes at the start of that step, so its parts already run will run again. Save states "
            "when loader.parts_left is 0.",
            stacklevel=4,
        )
        return True

    def _produce(self, stream: Stream, with_indices: bool, per_batch: bool) -> Generator[Run, None, None]:
        runs = self.maker.runs
        for chunk in stream:
            yield from runs(chunk.ids, chunk.offsets, with_indices, per_batch)

    def _produce_in_workers(self, stream: Stream, depth: int, with_indices: bool) -> Generator[Run, None, None]:
        """The batches of ``stream`` fetched and collated in worker processes, moved in this one."""
        options = self.options
        epoch = self._progress[0] if self._progress is not None else 0
        # NOTE: the workers' seeds depend on (seed, epoch, rank, where the stream starts), not on global state
        seed = int(np.random.default_rng([options.seed, epoch, self.rank, stream.position]).integers(2**62))
        if options.persistent_workers:
            if self._workers is None:
                self._workers = PersistentWorkers(
                    self.fetcher, self.num_workers, depth, options.worker_init_fn, options.multiprocessing_context
                )
            batches = self._workers.batches(stream, seed)
        else:
            batches = worker_batches(
                self.fetcher,
                stream,
                self.num_workers,
                depth,
                options.worker_init_fn,
                options.multiprocessing_context,
                seed,
            )
        try:
            for ids, batch in batches:
                yield Run([len(ids)], [ids] if with_indices else None, (self.maker.transfer(batch),))
        finally:
            batches.close()

    def close(self) -> None:
        """Shut down the worker processes kept with ``persistent_workers=True`` (the next epoch starts new ones).

        May be called from any thread or a signal handler: an iteration under way raises a
        ``RuntimeError`` saying the loader was closed (within half a second if it waits for a
        batch). Garbage collection and the interpreter's exit shut them down too; without
        persistent workers there is nothing to close (each iteration shuts its workers down).
        """
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.close()

    # -- adapting to out-of-memory errors -------------------------------------------------

    def fetch(self, indices: IndexArray | Sequence[int]) -> T:
        """The batch for ``indices``, made like the loader's own batches (fetched, collated, moved)."""
        return self.maker(np.asarray(indices, dtype=np.int64))

    def lower_limit(self, limit: LimitLike) -> None:
        """Use a smaller limit (batch size, or cap per column) for the rest of this epoch.

        Applies from the next batch on (batches prefetched under the old limit are planned
        again): the items not yet handed out are planned again, so no sample is lost or
        repeated; items above the new limit get batches of their own. It may be called from
        another thread (a memory monitor) or from the dataset in this process (not from a
        worker process, which holds a copy of the loader): a batch being fetched is
        handed out whole, and the lowering applies after it. A limit equal to the
        one in force changes nothing; one above it is refused (a lowering only lowers). Of two
        lowerings asked before the next batch, the smaller caps hold.
        Recorded in ``stats.limit_changes`` and in the state; the next epoch starts from the
        configured limit again.

        Raises:
            ValueError: If ``limit`` is not a valid batch size or caps, exceeds the
                configured limit or the one in force, or this is one of several ranks.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=False)

    def retry_last_batch(self, limit: LimitLike) -> None:
        """Plan the batch last yielded again, with everything after it, under ``limit``.

        For a batch that failed (ran out of memory): it is no longer counted as done, and
        the next batches are its parts under the smaller limit, then the rest of the epoch.
        A state taken in between resumes exactly. :func:`fastsab.adaptive.run` uses it.

        Raises:
            ValueError: As :meth:`lower_limit`.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=True)

    def _ask_lowering(self, limit: Limit, retry: bool) -> None:
        with self._pending_lock:
            pending = self._pending
            if pending is not None:
                # NOTE: a lowering not applied yet (a memory monitor's) is the limit of the next
                # batch; a later one (adaptive.run's, from the limit in force) must not undo it
                limit = _smaller(limit, pending[0])
            # a batch is retried once, however often it is asked; a later lowering keeps the retry
            retry = (retry and not self._rewound) or (pending is not None and pending[1])
            self._pending = (limit, retry)

    def _checked_lowering(self, limit: LimitLike) -> Limit:
        checked: Limit = self.check_lowered_limit(limit)
        if self.world_size > 1:
            raise ValueError(
                f"cannot lower the limit to {limit!r} on rank {self.rank} of {self.world_size}: the ranks would run "
                "different numbers of steps and data-parallel training would hang."
            )
        if self.position is None:
            raise RuntimeError("lowering the limit needs an epoch being iterated (after its first batch).")
        # NOTE: a lowering only lowers: the limit in force may already be below the configured one
        current = self.limit
        refuse_above(_as_caps(checked), _as_caps(current), current, limit, which="current")
        return checked

    def split_indices(self, indices: IndexArray | Sequence[int], limit: LimitLike) -> list[IndexArray]:
        """Split a batch's ``indices`` in order into batches within ``limit`` (greedy)."""
        planner: Any = self.planner  # NOTE: each planner takes its own kind of limit, checked first
        parts: list[IndexArray] = planner.split(np.asarray(indices, dtype=np.int64), planner.check_limit(limit))
        return parts

    def smaller_limit(self, indices: IndexArray | Sequence[int], factor: float) -> Limit:
        """The limit under which the batch ``indices`` splits into about ``factor`` parts."""
        planner: Any = self.planner  # NOTE: self.limit is of the planner's kind
        limit: Limit = planner.smaller_limit(np.asarray(indices, dtype=np.int64), self.limit, factor)
        return limit


def _smaller(limit: Limit, other: Limit) -> Limit:
    """The smaller of two limits of one kind, cap by cap."""
    if isinstance(limit, list) and isinstance(other, list):
        return [min(a, b) for a, b in zip(limit, other)]
    return min(cast(int, limit), cast(int, other))


def _as_caps(limit: Limit | None) -> list[int | float]:
    """A batch size or caps as a list of caps."""
    return [] if limit is None else list(limit) if isinstance(limit, list) else [limit]


def _same_limit(a: Limit | None, b: Limit | None) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))
