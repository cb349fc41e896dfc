"""Iterating a loader's epoch: ``LoaderIteration``.

The epoch's plan stream (``EpochCursor``) becomes runs of batches,
made in this process by the ``BatchMaker`` (optionally ahead in a
thread: ``fastsab.fetch.prefetch``) or fetched in worker processes (``fastsab.fetch.workers``,
kept across epochs with ``persistent_workers`` until ``close``); they are
handed out one batch at a time, counted in the epoch's stats and position, and a lowered limit
(``fastsab.loaders.limit_lowering``) is applied between two batches.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Protocol, cast

import numpy as np

from fastsab.fetch.batch_maker import IndexArray, Run
from fastsab.fetch.fillers import with_sample_mask
from fastsab.fetch.prefetch import prefetched
from fastsab.fetch.workers import PersistentWorkers, worker_batches
from fastsab.loaders.limit_lowering import LimitLowering
from fastsab.loaders.options import LoaderOptions, T
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.mixed_order import MixedOrder
from fastsab.position.cursor import EpochCursor, Stream
from fastsab.position.stats import EpochStats
from fastsab.position.trainer_sampler import CountedLength

__all__ = ["LoaderIteration"]


class _ChunkedDataset(Protocol):
    """A dataset read in chunks that wants the epoch's chunk order (``OutOfCoreDataset``)."""

    chunk_size: int

    def set_chunk_order(self, order: np.ndarray) -> None: ...


class LoaderIteration(LimitLowering[T]):
    """Iterating the next epoch: batches made here, ahead in a thread, or in worker processes.

    The loader (``LoaderBase``) sets the attributes declared here.
    """

    options: LoaderOptions
    dataset: object
    order: EpochOrder
    stats: EpochStats | None  # what the last epoch yielded
    _chunked: bool  # the dataset is read in chunks (a _ChunkedDataset)
    _counted: CountedLength  # the length a trainer counts for the coming epoch
    _workers: PersistentWorkers | None  # with persistent_workers, once started

    @property
    def prefetch(self) -> int | None:
        """Batches a background thread, or each worker process, prepares ahead (``None``: chosen per dataset)."""
        return self.options.prefetch

    @property
    def num_workers(self) -> int:
        """Worker processes that fetch batches (0 where batches are gathered or fetched in this process).

        In-memory tensor data is gathered here whatever ``num_workers`` says: a gather is a copy
        of rows, which a worker would only copy once more (into shared memory). So is a dataset
        read in chunks (``OutOfCoreDataset``): its batches are copies of rows of
        the chunk in memory, and each worker would read every chunk into a copy of its own. A
        ``__getitems__`` declared ``getitems_in_memory`` is not: it may still be worth workers
        (a large batch, a memory-mapped file), and asking for them is the caller's choice.
        """
        # NOTE: ignored for "gather" and chunked datasets rather than refused, so that one set of
        # options (e.g. loader.options.keywords()) serves a tensor dataset and one that fetches
        return 0 if self.maker.fetcher.kind == "gather" or self._chunked else self.options.num_workers

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_workers"] = None  # processes do not pickle; a copy starts workers of its own
        return state

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
        if isinstance(self.order, MixedOrder):
            stats.source_figures = functools.partial(self.order.source_figures, epoch)
        progress = self._progress
        if self._chunked:
            dataset: _ChunkedDataset = self.dataset  # type: ignore[assignment]  # checked in LoaderBase.__init__
            dataset.set_chunk_order(self.order.group_order(epoch))
        self.stats = stats
        self._pending = None
        self.parts_left = 0
        self.limit = self.start_limit()
        depth = self.prefetch
        if depth is None:  # in-memory gathers are cheaper than a thread hand-off
            depth = 0 if self.maker.fetcher.in_memory and not self.num_workers else 2
        next_stream: Stream | None = stream
        try:
            fills = getattr(self.planner, "partial", None) == "fill"  # (shape buckets' filler rows)
            while next_stream is not None:
                if self.num_workers:
                    source = self._produce_in_workers(next_stream, depth, with_indices or fills)
                else:
                    produced = self._produce(next_stream, with_indices or fills, per_batch=depth > 0)
                    source = produced if depth == 0 else prefetched(produced, depth)
                if fills:
                    source = with_sample_mask(source, self.maker.transfer, with_indices)
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
        # FastSizeAwareLoader adds about 0.8 us per batch of planning, most of it the greedy
        # split's walk (looking up the chunk's sizes: 0.03 us); 0.32 us with the walk compiled
        # (use_compiled; best of 40 epochs of each, taking turns in one run).
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
                    self._rewound = False
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
            stats.num_items -= size  # (the batch last handed out)
            self._rewound = True
            self._rewind()
        position = self._progress[1] if self._progress is not None else 0
        stream.lower(position, limit)
        stats.limit_changes.append((stats.num_batches, self.limit, limit))
        self.limit = limit
        return stream

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
                    self.maker.fetcher, self.num_workers, depth, options.worker_init_fn, options.multiprocessing_context
                )
            batches = self._workers.batches(stream, seed)
        else:
            batches = worker_batches(
                self.maker.fetcher,
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
