"""Feeding more data than fits in RAM: ``OutOfCoreDataset``, chunks read by identity, shuffled chunk by chunk.

``OutOfCoreDataset`` reads samples by their identity (a file name, a row number)
into CPU-resident chunks sized from a CPU memory budget, and serves ``__getitems__`` from
them. The fast loaders recognize it and shuffle with groups equal to its chunks, so each
chunk is read once per epoch; the dataset reads the next chunk of the epoch in the
background while the current one is served (``fastsab.out_of_core.chunks``).

Memory: at most two chunks are held (the one served and the one read ahead, or the two a
batch spans), each of at most ``cpu_memory_limit / 2`` bytes of samples, in mappings of
their own that go back to the system when dropped. On top of that come the batches in
flight (the loader's ``prefetch`` plus two, as gathered copies) and the allocations of the
interpreter, torch and the C heap: the documented overhead is ``OVERHEAD_BYTES`` plus the
batches in flight. A test measures the peak resident set of a 256 MiB file fed within a
32 MiB budget against exactly this bound.

Samples: every sample must have the layout of the first sample the dataset read
(``fastsab.out_of_core.samples``); anything else is an error naming the read. What is
served is what ``read_input`` gave.
"""

from __future__ import annotations

import glob
import operator
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import optree
import torch

from fastsab._checks import check_positive_int, user_stacklevel
from fastsab.fetch.fetcher import check_indices
from fastsab.fetch.transfer import tree_map_arrays
from fastsab.memory.plan import sample_nbytes
from fastsab.out_of_core.chunks import ChunkCache
from fastsab.out_of_core.memmap import MemmapRows
from fastsab.out_of_core.reads import ChunkLoader, SampleReads
from fastsab.out_of_core.samples import empty_batch

__all__ = ["OVERHEAD_BYTES", "OutOfCoreDataset"]

#: Host memory beyond the two chunks that a feeding process may use (allocator slack,
#: index arrays, Python objects), besides the batches in flight.
OVERHEAD_BYTES = 32 * 2**20


class OutOfCoreDataset:
    """Samples read by identity into CPU chunks that fit a memory budget.

    Args:
        ids: The identities of the reads, e.g. file paths.
        read_input: ``read_input(id)`` returns a sample (a tensor, an array or a pytree of
            them); with ``one_read_count > 1``, an iterable (list, generator) of that many
            samples, e.g. a sample and its augmented copies.
        cpu_memory_limit: Bytes the held chunks may use: each chunk gets half of it.
        one_read_count: Samples per read; item ``i`` is sample ``i % one_read_count`` of the
            read ``ids[i // one_read_count]``.
        sample_bytes: Bytes of one sample (measured on the first read if omitted).
        read_ahead: Read the next chunk of the epoch in a background thread.

    Raises:
        ValueError: If the budget cannot hold two chunks of one read each, or a read gives
            the wrong number of samples, or a sample's structure or a leaf's shape differs
            from the first sample's.
        TypeError: If a leaf's dtype differs from the first sample's (samples are not
            cast), or is one a torch tensor cannot hold.

    Examples:
        >>> dataset = OutOfCoreDataset(range(10), lambda i: np.full(4, i, dtype=np.float32),
        ...                            cpu_memory_limit=128)
        >>> dataset.chunk_size, len(dataset), dataset.__getitems__([7, 2]).tolist()
        (4, 10, [[7.0, 7.0, 7.0, 7.0], [2.0, 2.0, 2.0, 2.0]])
    """

    def __init__(
        self,
        ids: Iterable[Any],
        read_input: Callable[[Any], Any],
        *,
        cpu_memory_limit: int,
        one_read_count: int = 1,
        sample_bytes: int | None = None,
        read_ahead: bool = True,
    ) -> None:
        if not callable(read_input):
            raise TypeError(f"read_input must be callable, got {type(read_input).__name__}.")
        self.ids: Sequence[Any] = list(ids)
        self.read_input = read_input
        self.one_read_count = check_positive_int("one_read_count", one_read_count)
        self._setup(SampleReads(self.ids, read_input, self.one_read_count), cpu_memory_limit, sample_bytes, read_ahead)

    def _setup(
        self,
        loader: ChunkLoader,
        cpu_memory_limit: int,
        sample_bytes: int | None,
        read_ahead: bool,
    ) -> None:
        self.cpu_memory_limit = check_positive_int("cpu_memory_limit", cpu_memory_limit)
        if not isinstance(read_ahead, bool):
            raise TypeError(f"read_ahead must be a bool, got {read_ahead!r}.")
        self._load_chunk_reads = loader
        if sample_bytes is None:  # measured on the first read (a sample of 0 bytes counts as 1)
            measured = sample_nbytes(loader(0, 1)) // self.one_read_count if self.ids else 1
            self.sample_bytes = max(1, measured)
        else:
            self.sample_bytes = check_positive_int("sample_bytes", sample_bytes)
        reads_per_chunk = (self.cpu_memory_limit // 2) // (self.sample_bytes * self.one_read_count)
        if reads_per_chunk < 1:
            raise ValueError(
                f"cpu_memory_limit={self.cpu_memory_limit} bytes cannot hold two chunks of one read "
                f"({self.one_read_count} samples of {self.sample_bytes} bytes each)."
            )
        self.reads_per_chunk = reads_per_chunk
        self.chunk_size = reads_per_chunk * self.one_read_count
        self.read_ahead = read_ahead
        self._cache = ChunkCache(self.num_chunks, read_ahead)

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def from_memmap(cls, array: np.memmap, *, cpu_memory_limit: int, read_ahead: bool = True) -> OutOfCoreDataset:
        """Rows of a file-backed numpy memmap, read a chunk of contiguous rows at a time.

        Chunks are read with plain file reads (not through the mapping), so the pages of the
        file do not pile up in the process's resident memory. ``array`` may be a contiguous
        view of a memmap (``m[10:20]``, ``m[5:]``, ``m[3]``); a strided one (``m[::2]``) is
        refused, and so is a copy-on-write memmap (``mode="c"``), whose changes are not in
        the file.

        Raises:
            TypeError: If ``array`` is not a file-backed memmap, or has a dtype torch cannot hold.
            ValueError: If ``array`` is not C-contiguous, is copy-on-write, or is not a view
                of a memmap made on its file.
        """
        rows = MemmapRows.of(array)
        dataset = cls.__new__(cls)
        dataset.ids = range(len(array))  # NOTE: not a list: a file may have billions of rows
        dataset.read_input = rows.row
        dataset.one_read_count = 1
        dataset._setup(rows, cpu_memory_limit, max(1, rows.row_bytes), read_ahead)
        return dataset

    @classmethod
    def from_files(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        *,
        cpu_memory_limit: int,
        load: Callable[[str], Any] | None = None,
        **options: Any,
    ) -> OutOfCoreDataset:
        """One sample per file (``.npy`` by default, read without pickle; or ``load(path)``)."""
        return cls([os.fspath(p) for p in paths], load or _load_npy, cpu_memory_limit=cpu_memory_limit, **options)

    @classmethod
    def from_directory(
        cls, directory: str | os.PathLike[str], pattern: str = "*.npy", **options: Any
    ) -> OutOfCoreDataset:
        """One sample per file of ``directory`` matching ``pattern``, in sorted order (see ``from_files``)."""
        paths = sorted(glob.glob(os.path.join(os.fspath(directory), pattern)))
        if not paths:
            raise ValueError(f"no files match {pattern!r} in {os.fspath(directory)!r}.")
        return cls.from_files(paths, **options)

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids) * self.one_read_count

    @property
    def num_chunks(self) -> int:
        return -(-len(self) // self.chunk_size)

    @property
    def chunk_reads(self) -> int:
        """Chunks read so far (read-ahead included)."""
        return self._cache.reads

    def _read_chunk(self, chunk: int) -> Any:
        first = chunk * self.reads_per_chunk
        end = min(first + self.reads_per_chunk, len(self.ids))
        return self._load_chunk_reads(first, end)

    def set_chunk_order(self, order: Sequence[int]) -> None:
        """The order in which an epoch visits the chunks (sent by the loaders), for read-ahead."""
        self._cache.set_order(order)

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """The samples at ``indices`` as one batch (a pytree of tensors with a first batch dim).

        Raises:
            TypeError: If ``indices`` are not integers.
            IndexError: If an index is negative or not less than ``len(self)``.
        """
        index = check_indices(indices, len(self))
        if not index.size:
            return self._empty_batch()
        chunks = index // self.chunk_size
        unique, run = self._cache.in_order(np.unique(chunks).tolist())
        if len(unique) == 1:
            rows = torch.from_numpy(index - unique[0] * self.chunk_size)
            return tree_map_arrays(_rows(rows), self._cache.held(unique, self._read_chunk)[unique[0]])
        if len(unique) > 2 and not run:
            warnings.warn(
                f"a batch of {len(index)} samples spans {len(unique)} chunks of {self.chunk_size} samples: they are "
                "read one after the other for this batch alone. Batches of random samples read most of the data "
                "for each batch; the fastsab loaders (and their batch_sampler()) keep batches within chunks, or "
                "within chunks that follow each other in the epoch.",
                stacklevel=user_stacklevel(),
            )
        held = self._cache.held(unique, self._read_chunk) if len(unique) == 2 else {}
        parts = []
        for chunk in unique:
            # NOTE: beyond two chunks, one at a time in the epoch's order, within the budget: the
            # next one read ahead only when they follow each other in it (else it may not be next)
            data = held[chunk] if held else self._cache.held([chunk], self._read_chunk, ahead=run)[chunk]
            mask = chunks == chunk
            rows = torch.from_numpy(index[mask] - chunk * self.chunk_size)
            parts.append((np.flatnonzero(mask), tree_map_arrays(_rows(rows), data)))
            del data  # NOTE: before the next chunk is read: this one is then only the cache's to drop
        del held
        positions = torch.from_numpy(np.argsort(np.concatenate([p for p, _ in parts]), kind="stable"))
        leaves = [optree.tree_flatten(part)[0] for _, part in parts]
        spec = optree.tree_structure(parts[0][1])
        merged = [torch.cat(group)[positions] for group in zip(*leaves)]
        return optree.tree_unflatten(spec, merged)

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise TypeError(f"index must be an integer, got {index!r}.")
        return tree_map_arrays(lambda leaf: leaf[0], self.__getitems__([operator.index(index)]))

    def _empty_batch(self) -> Any:
        """A batch of no samples, with the structure, shapes and dtypes of the samples."""
        layout = self._load_chunk_reads.layout  # of the first sample read, which every other sample has
        if layout is not None:
            return empty_batch(layout)
        if not self.ids:
            raise ValueError("cannot make an empty batch of a dataset without samples: its structure is unknown.")
        return tree_map_arrays(lambda leaf: leaf[:0], self._load_chunk_reads(0, 1))  # the first read's

    def close(self) -> None:
        """Stop the read-ahead thread and drop the held chunks."""
        self._cache.close()


def _load_npy(path: str) -> Any:
    """A ``.npy`` file, read without pickle."""
    return np.load(path, allow_pickle=False)


def _rows(rows: torch.Tensor) -> Callable[[Any], Any]:
    return lambda leaf: leaf[rows]
