"""What a loader's worker processes are given and run: the plan's index batches as tasks.

A ``DataLoader`` over worker processes (``fastsab.fetch.workers``) is made of three parts,
all here: its batch sampler, ``PlanBatches``, reads the index batches from the loader's
plan stream on demand, each a task ``(ids, generation, seed)``; its dataset,
``BatchFetch`` (``ReseedingBatchFetch`` for persistent workers), makes one whole
batch per task with the loader's ``Fetcher``, re-seeding ``random``,
``numpy`` and ``torch`` on a worker's first batch of a new generation as torch seeds a new worker
(``base_seed``); its ``collate_fn``, ``collate_whole``, pickles the batch in the worker
(small tensors sent ``in_band``), so that one that does not pickle is
the worker's error.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.worker import _generate_state

from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.sending import in_band, pickled
from fastsab.position.stream import Stream

__all__ = ["BatchFetch", "PlanBatches", "ReseedingBatchFetch", "base_seed", "collate_whole"]


class BatchFetch:
    """A map-style dataset whose ``__getitems__(ids)`` is ``(ids, batch)``: one batch fetched and collated.

    What a ``DataLoader``'s worker process runs for each index batch of the plan. It holds only
    the ``Fetcher`` (the dataset and ``collate_fn``), which is what a spawned
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


class ReseedingBatchFetch(BatchFetch):
    """A ``BatchFetch`` of persistent workers: ``__getitems__((ids, generation, base_seed))``.

    On its first batch of a new ``generation`` a worker re-seeds ``random``, ``torch`` and
    ``numpy`` from ``base_seed`` as torch seeds a worker it starts (and sets its
    ``get_worker_info().seed``); ``worker_init_fn`` is not run again.

    Examples:
        >>> fetch = ReseedingBatchFetch(Fetcher(torch.arange(5) * 10, None), generation=1)
        >>> fetch.__getitems__((np.array([4]), 1, 123))
        (array([4]), tensor([40]))
    """

    def __init__(self, fetcher: Fetcher, generation: int) -> None:
        super().__init__(fetcher)
        self.generation = generation  # the one the workers are started for (seeded by torch)

    def __getitems__(self, task: tuple[np.ndarray, int, int]) -> tuple[np.ndarray, Any]:  # type: ignore[override]
        ids, generation, seed = task
        if generation != self.generation:
            self.generation = generation
            _reseed(seed)
        return super().__getitems__(ids)


def _reseed(base_seed: int) -> None:
    """Seed this worker process's generators as torch seeds a worker it starts with ``base_seed``."""
    info = get_worker_info()
    if info is None:  # (called in this process: nothing to re-seed)
        return
    seed = base_seed + info.id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, info.id))  # type: ignore[no-untyped-call]  # torch's own
    # NOTE: WorkerInfo refuses to be changed once made; its seed is what the worker's generators now follow
    object.__setattr__(info, "seed", seed)


def base_seed(seed: int) -> int:
    """The base seed a ``DataLoader`` with ``generator=torch.Generator().manual_seed(seed)`` starts workers with.

    Examples:
        >>> base_seed(0) == base_seed(0) != base_seed(1)
        True
    """
    # NOTE: the first draw of DataLoader's generator, as _BaseDataLoaderIter makes it (worker i gets base + i)
    generator = torch.Generator().manual_seed(seed)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class PlanBatches:
    """The index batches of a plan stream, read on demand (a ``DataLoader``'s ``batch_sampler``).

    Each index batch goes with the iteration's ``task`` (generation, seed): ``(ids, *task)``;
    no batches while ``stream`` is ``None``.
    """

    def __init__(self) -> None:
        self.stream: Stream | None = None
        self.task: tuple[int, int] = (0, 0)

    def __iter__(self) -> Iterator[Any]:
        # NOTE: the stream is taken now (at iter()), not at the first next()
        return _index_batches(self.stream, self.task)


def _index_batches(stream: Stream | None, task: tuple[int, int]) -> Iterator[Any]:
    if stream is None:
        return
    generation, seed = task
    for chunk in stream:
        for ids in chunk.batches():
            yield ids, generation, seed


def collate_whole(fetched: Any) -> tuple[np.ndarray, Any]:
    """The workers' ``collate_fn``: the batch made by ``BatchFetch``, sent ``in_band``, pickled here.

    Raises:
        TypeError: If the batch does not pickle (naming what in it does not), raised in the
            loop's process as a worker's error.
    """
    ids, batch = fetched
    # NOTE: pickled now, in the worker's own thread, rather than by its queue's thread, which
    # prints the error and drops the batch, the loop waiting for it forever
    return ids, pickled(in_band(batch))
