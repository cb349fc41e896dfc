"""Fetching a loader's batches in worker processes: ``worker_batches``, ``PersistentWorkers``.

With ``num_workers=n`` a loader's batches are fetched and collated in ``n`` worker processes
by torch's own ``DataLoader`` machinery, made of the parts in ``fastsab.fetch.worker_tasks``:
a ``DataLoader`` over ``BatchFetch`` (whose ``__getitems__``
makes one whole batch) whose batch sampler pulls the index batches from the loader's plan stream
on demand, at most ``prefetch * n`` ahead. A batch's small tensors come with it through the
worker's pipe, torch moves larger ones through shared memory. This module runs them: it yields
the batches in order, re-raises a worker's exception with its traceback, reports a worker that
died, and shuts the workers down when the iteration ends or is closed (``worker_batches``:
the workers of one iteration are ``PersistentWorkers`` used once). Closing them from
another thread, or from a signal handler, ends a wait for a batch with a ``RuntimeError``.

``PersistentWorkers`` keeps the worker processes across epochs (``persistent_workers=True``):
one ``DataLoader(persistent_workers=True)`` whose batch sampler reads each epoch's plan stream in
turn. Each iteration is a generation: the index batches carry it with the seed its workers would
have been started with, and a worker re-seeds ``random``, ``numpy`` and ``torch`` (as torch seeds a
new worker) on its first batch of a new generation, so that its draws are those of workers started
for that iteration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.worker_tasks import PlanBatches, ReseedingBatchFetch, base_seed, collate_whole
from fastsab.position.stream import Stream

__all__ = ["PersistentWorkers", "worker_batches"]


#: Seconds between two looks, while waiting for a batch from the workers, at whether they were closed.
_LOOK_S = 0.5

_CLOSED = (
    "the loader was closed (loader.close()) during this iteration, which ends here: its worker processes are "
    "shut down (the next iteration starts new ones)."
)


class _Closed(Exception):
    """The workers were closed while this process waited for a batch from them."""


class _WorkerLoader(DataLoader[tuple[np.ndarray, Any]]):
    """A ``DataLoader`` over worker processes whose wait for a batch ends once ``closed`` is set."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.closed = threading.Event()

    def _get_iterator(self) -> _WorkerIterator:
        self.check_worker_number_rationality()  # (as DataLoader's own)
        return _WorkerIterator(self, self.closed)


class _WorkerIterator(_MultiProcessingDataLoaderIter):
    """``DataLoader``'s iterator over worker processes, whose wait for a batch ends when ``closed`` is set."""

    def __init__(self, loader: DataLoader[Any], closed: threading.Event) -> None:
        self._closed = closed
        super().__init__(loader)

    def _get_data(self) -> Any:
        # NOTE: DataLoader waits as long as a worker it has not shut down lives, so a wait under
        # way when the workers are shut down (close() from another thread, or from a signal
        # handler in this one) would never end; no timeout= and no pin_memory thread here
        while not self._closed.is_set():
            success, data = self._try_get_data(_LOOK_S)  # type: ignore[no-untyped-call]
            if success:
                return data
        raise _Closed(_CLOSED)


def worker_batches(
    fetcher: Fetcher,
    stream: Stream,
    num_workers: int,
    prefetch: int,
    worker_init_fn: Callable[[int], None] | None = None,
    multiprocessing_context: Any = None,
    seed: int = 0,
) -> Generator[tuple[np.ndarray, Any], None, None]:
    """``(ids, batch)`` for every batch of ``stream``, fetched in ``num_workers`` processes, in plan order.

    The stream is read in this process, as the workers need index batches (at most
    ``prefetch * num_workers`` batches ahead of the one yielded). Closing the generator (a
    ``break``, an exception, garbage collection) shuts the workers down, so that the batches
    read ahead can be planned again (a lowered limit) once it returns.

    Args:
        fetcher: Fetches and collates a batch (in the workers).
        stream: The plan's chunks.
        num_workers: Worker processes (at least 1).
        prefetch: Batches each worker prepares ahead (at least 1).
        worker_init_fn: Called in each worker with its id, as by ``DataLoader``.
        multiprocessing_context: How workers start (``"fork"``, ``"spawn"``, ...; ``None``:
            the platform's default, as for ``DataLoader``).
        seed: Decides the workers' seeds (``torch.initial_seed()`` in each): the same seed,
            the same worker seeds.

    Raises:
        RuntimeError: If a worker dies (e.g. killed), also while a batch is being received.
        Exception: A worker's exception, with its traceback (as ``DataLoader`` raises it).
    """
    # NOTE: the workers of one iteration are persistent workers used once: one way of running them
    workers = PersistentWorkers(fetcher, num_workers, prefetch, worker_init_fn, multiprocessing_context)
    try:
        yield from workers.batches(stream, seed)
    finally:
        # NOTE: at once, not when the iterator is collected: the stream must not be read
        # (index batches put ahead) once the caller plans its remaining batches again
        workers.close()


class PersistentWorkers:
    """Worker processes kept across epochs: ``batches`` fetches each stream's batches in the same workers.

    The workers start with the first ``batches`` (holding a copy of the dataset as it is
    then, as ``DataLoader(persistent_workers=True)`` does) and live until ``close``, garbage
    collection or the interpreter's exit. Leaving an iteration early (a ``break``, a lowered
    limit) leaves them running: the batches they fetched ahead are dropped when the next
    iteration begins, and the stream left behind is read no further. A worker's error, or a
    worker that died, shuts them all down; the next iteration starts new ones (also when a
    worker died between iterations).

    Args:
        fetcher, num_workers, prefetch, worker_init_fn, multiprocessing_context: As for
            ``worker_batches``.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        num_workers: int,
        prefetch: int,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
    ) -> None:
        self.fetcher = fetcher
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self._loader: _WorkerLoader | None = None
        self._plan = PlanBatches()
        self._generation = 0
        self._waiting: int | None = None  # the thread waiting for the workers, if any

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty before they start and after ``close``)."""
        return [worker.pid for worker in self._processes()]

    def _processes(self) -> list[Any]:
        iterator = getattr(self._loader, "_iterator", None)
        return list(getattr(iterator, "_workers", []))

    def batches(self, stream: Stream, seed: int) -> Generator[tuple[np.ndarray, Any], None, None]:
        """``(ids, batch)`` for every batch of ``stream``, in plan order, as ``worker_batches`` with ``seed``."""
        if not all(worker.is_alive() for worker in self._processes()):
            self.close()  # NOTE: a worker died between iterations: new workers, not an iteration failing on it
        self._generation += 1
        task = (self._generation, base_seed(seed))
        if self._loader is None:
            self._loader = _WorkerLoader(
                ReseedingBatchFetch(self.fetcher, self._generation),
                batch_sampler=self._plan,  # (ids, generation, seed) tasks
                collate_fn=collate_whole,
                num_workers=self.num_workers,
                prefetch_factor=self.prefetch,
                worker_init_fn=self.worker_init_fn,
                multiprocessing_context=self.multiprocessing_context,
                persistent_workers=True,
                # NOTE: started with this generation's seed, which the workers then need not set again; a
                # generator of its own, since DataLoader otherwise draws the workers' seeds from the global
                # torch generator of this process (the training loop's)
                generator=torch.Generator().manual_seed(seed),
            )
        # NOTE: read by iter() below, which drops what the workers fetched for the iteration before
        self._plan.stream, self._plan.task = stream, task
        generation, loader = self._generation, self._loader
        batches: Any = None
        try:
            batches = self._waiting_for(lambda: iter(loader))
            # NOTE: one DataLoader iterator serves every iteration: one left behind by a newer
            # iteration must not take (and lose) a batch of that one's, nor one closed meanwhile
            # hand out a batch that came in place of one lost
            while self._generation == generation:
                batch = self._waiting_for(lambda: next(batches, None))
                if self._generation != generation:
                    break
                if batch is None:
                    return
                yield batch
        except GeneratorExit:
            raise
        except BaseException as error:
            closed = loader.closed.is_set()
            ended = _ended_message(batches, error) if isinstance(error, (ConnectionError, EOFError)) else None
            # NOTE: a worker's error or death (or an interrupt while waiting for one) may leave
            # tasks unanswered: new workers for the next iteration rather than a guess at their state
            self._end(loader)
            if closed and isinstance(error, Exception):
                # (closed while this thread waited for a batch, or sent index batches to queues closed under it)
                raise RuntimeError(_CLOSED) from None if isinstance(error, _Closed) else error
            if ended is not None:
                raise RuntimeError(ended) from error
            raise
        finally:
            if self._generation == generation:
                self._plan.stream = None  # read no further: its rest may be planned again
        if loader.closed.is_set():
            self._end(loader)  # (asked from a signal handler while this thread waited)
            raise RuntimeError(_CLOSED)
        raise RuntimeError(
            "this iterator of the loader was left behind: a newer iteration began since its last batch. Iterate one "
            "epoch at a time (one iter(loader) in use)."
        )

    def _end(self, loader: _WorkerLoader) -> None:
        """Shut down the workers of ``loader``, which this iteration ran on (closed since, or not)."""
        if self._loader is loader:
            self.close()
        else:
            # NOTE: closed from another thread while iter() started them: the closing thread found
            # no workers to shut down yet, so this iteration does
            _shut_down(loader)

    def _waiting_for(self, step: Callable[[], Any]) -> Any:
        """``step()`` (a wait for the workers), during which ``close`` in this thread only asks to close."""
        self._waiting = threading.get_ident()
        try:
            return step()
        finally:
            self._waiting = None

    def close(self) -> None:
        """Shut the worker processes down (the next ``batches`` starts new ones).

        May be called from any thread, or a signal handler. An iteration under way raises a
        ``RuntimeError`` saying the loader was closed: at once if it waits for a batch (within
        half a second), else at its next batch.
        """
        self._generation += 1  # (the iteration under way ends)
        loader = self._loader
        if loader is None:
            return
        loader.closed.set()  # (ends a wait for a batch)
        if self._waiting == threading.get_ident():
            # NOTE: a signal handler's, run while this thread waits for the workers, maybe inside a
            # queue's lock that shutting them down takes again: the iteration shuts them down as it ends
            return
        self._loader = None
        _shut_down(loader)


def _shut_down(loader: _WorkerLoader) -> None:
    """Shut down the worker processes of ``loader``, if it started them."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()


def _ended_message(batches: Any, error: BaseException) -> str:
    """What to say when reading a batch from the workers failed with ``error``: which workers ended."""
    ended = [worker.pid for worker in getattr(batches, "_workers", []) if not worker.is_alive()]
    return (
        f"DataLoader worker (pid(s) {', '.join(map(str, ended)) or 'unknown'}) ended while a batch was being "
        f"received ({type(error).__name__}: {error})."
    )
