"""Fetching a loader's batches in worker processes: :func:`worker_batches`.

With ``num_workers=n`` a loader's batches are fetched and collated in ``n`` worker processes
by torch's own ``DataLoader`` machinery: a ``DataLoader`` over :class:`BatchFetch` (whose
``__getitems__`` makes one whole batch with the loader's :class:`~fastsab.fetch.Fetcher`)
whose batch sampler pulls the index batches from the loader's plan stream on demand, at most
``prefetch * n`` ahead. torch moves the tensors through shared memory, yields the batches in
order, re-raises a worker's exception with its traceback, reports a worker that died, and
shuts the workers down when the iteration ends or is closed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastsab.fetch import Fetcher
from fastsab.stream import Stream

__all__ = ["BatchFetch", "worker_batches"]


class BatchFetch:
    """A map-style dataset whose ``__getitems__(ids)`` is ``(ids, batch)``: one batch fetched and collated.

    What a ``DataLoader``'s worker process runs for each index batch of the plan. It holds only
    the :class:`~fastsab.fetch.Fetcher` (the dataset and ``collate_fn``), which is what a spawned
    worker receives pickled.

    Examples:
        >>> import torch
        >>> fetch = BatchFetch(Fetcher(torch.arange(5) * 10, None))
        >>> fetch.__getitems__(np.array([3, 1]))
        (array([3, 1]), tensor([30, 10]))
    """

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher

    def __len__(self) -> int:
        return self.fetcher.length

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__(np.array([index], dtype=np.int64))[1]

    def __getitems__(self, ids: np.ndarray) -> tuple[np.ndarray, Any]:
        return ids, self.fetcher(ids)


class _PlanBatches:
    """The index batches of a plan stream, read on demand (a ``DataLoader``'s ``batch_sampler``)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[np.ndarray]:
        for chunk in self.stream:
            yield from chunk.batches()


def _whole(fetched: Any) -> Any:
    """The ``collate_fn`` of the workers' ``DataLoader``: the batch is made by :class:`BatchFetch` already."""
    return fetched


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
    loader: DataLoader[tuple[np.ndarray, Any]] = DataLoader(
        BatchFetch(fetcher),  # type: ignore[arg-type]  # a map-style dataset without the Dataset base
        batch_sampler=_PlanBatches(stream),  # type: ignore[arg-type]  # yields index arrays
        collate_fn=_whole,
        num_workers=num_workers,
        prefetch_factor=prefetch,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        # NOTE: a generator of its own, so that starting workers does not draw from the global
        # torch generator of this process (the training loop's): DataLoader draws the workers' seed from it
        generator=torch.Generator().manual_seed(seed),
    )
    batches: Any = iter(loader)
    try:
        yield from batches
    except (ConnectionError, EOFError) as error:
        # NOTE: a worker killed between sending a batch and handing over its shared memory
        # breaks the connection this process reads the batch's tensors from
        raise RuntimeError(_ended_message(batches, error)) from error
    finally:
        # NOTE: at once, not when the iterator is collected: the stream must not be read
        # (index batches put ahead) once the caller plans its remaining batches again
        batches._shutdown_workers()


def _ended_message(batches: Any, error: BaseException) -> str:
    """What to say when reading a batch from the workers failed with ``error``: which workers ended."""
    ended = [worker.pid for worker in getattr(batches, "_workers", []) if not worker.is_alive()]
    return (
        f"DataLoader worker (pid(s) {', '.join(map(str, ended)) or 'unknown'}) ended while a batch was being "
        f"received ({type(error).__name__}: {error})."
    )
