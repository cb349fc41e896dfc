"""Feeding more data than fits in RAM: chunks read by identity, shuffled chunk by chunk.

:class:`OutOfCoreDataset` reads samples by their identity (a file name, a row number)
into CPU-resident chunks sized from a CPU memory budget, and serves ``__getitems__`` from
them. The fast loaders recognize it and shuffle with groups equal to its chunks, so each
chunk is read once per epoch; the dataset reads the next chunk of the epoch in the
background while the current one is served.

Memory: at most two chunks are held (the one served and the one read ahead, or the two a
batch spans), each of at most ``cpu_memory_limit / 2`` bytes of samples, in mappings of
their own that go back to the system when dropped. On top of that come the batches in
flight (the loader's ``prefetch`` plus two, as gathered copies) and the allocations of the
interpreter, torch and the C heap: the documented overhead is ``OVERHEAD_BYTES`` plus the
batches in flight. A test measures the peak resident set of a 256 MiB file fed within a
32 MiB budget against exactly this bound.

Samples: every sample must have the structure (the keys and nesting of its pytree), and
per leaf the shape and dtype, of the first sample the dataset read; anything else is an
error naming the read. Dtypes must match exactly: a sample is not cast, not even safely
(``int32`` into an ``int64`` chunk), so what is served is what ``read_input`` gave.
"""

from __future__ import annotations

import glob
import mmap
import operator
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import optree
import torch

from fastsab._checks import check_positive_int
from fastsab.fetch import check_indices
from fastsab.memory.plan import sample_nbytes
from fastsab.transfer import tree_map_arrays

__all__ = ["OVERHEAD_BYTES", "OutOfCoreDataset"]

#: Host memory beyond the two chunks that a feeding process may use (allocator slack,
#: index arrays, Python objects), besides the batches in flight.
OVERHEAD_BYTES = 32 * 2**20

ChunkLoader = Callable[[int, int], Any]  # (first read, end read) -> pytree of stacked arrays


class _Layout(NamedTuple):
    """The structure of a sample and the shape and dtype of each of its leaves."""

    spec: Any  # optree.PyTreeSpec
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype[Any]]


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

    _executor: ThreadPoolExecutor | None  # the read-ahead thread
    _pending: dict[int, Future[Any]]  # chunks being read ahead
    _chunks: OrderedDict[int, Any]  # chunks held

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
        self._setup(self._load_reads, cpu_memory_limit, sample_bytes, read_ahead)

    def _setup(
        self,
        loader: ChunkLoader,
        cpu_memory_limit: int,
        sample_bytes: int | None,
        read_ahead: bool,
        layout: _Layout | None = None,
    ) -> None:
        self.cpu_memory_limit = check_positive_int("cpu_memory_limit", cpu_memory_limit)
        if not isinstance(read_ahead, bool):
            raise TypeError(f"read_ahead must be a bool, got {read_ahead!r}.")
        self._load_chunk_reads = loader
        self._start_in_this_process()
        self._layout = layout  # of the first sample read, which every other sample must have
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
        self._order: list[int] = []
        self._served: tuple[int | None, int | None] = (None, None)  # the chunks served last, in turn
        self.chunk_reads = 0  # chunks read so far (read-ahead included)

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
        if not isinstance(array, np.memmap) or not isinstance(getattr(array, "filename", None), (str, os.PathLike)):
            raise TypeError(f"array must be a file-backed numpy.memmap, got {type(array).__name__}.")
        if not array.flags.c_contiguous or array.ndim < 1:
            raise ValueError(
                "array must be a C-contiguous memmap with at least one dimension, "
                f"got shape {array.shape} and strides {array.strides}."
            )
        if array.mode == "c":
            raise ValueError(
                f"array is a copy-on-write memmap (mode='c') of {array.filename!r}: rows are read from the file, "
                "where changes made through the mapping are not. Open it with mode='r'."
            )
        _check_torch_dtype(array.dtype, f"array has dtype {array.dtype!r}")
        rows = _MemmapRows(os.fspath(str(array.filename)), _file_offset(array), array.dtype, array.shape[1:])
        dataset = cls.__new__(cls)
        dataset.ids = range(len(array))  # NOTE: not a list: a file may have billions of rows
        dataset.read_input = rows.row
        dataset.one_read_count = 1
        layout = _Layout(optree.treespec_leaf(), [tuple(array.shape[1:])], [array.dtype])
        dataset._setup(rows, cpu_memory_limit, max(1, rows.row_bytes), read_ahead, layout)
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
        """One sample per file of ``directory`` matching ``pattern``, in sorted order (see :meth:`from_files`)."""
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

    def _samples(self, read: int) -> list[Any]:
        value = self.read_input(self.ids[read])
        if self.one_read_count == 1:
            return [value]  # the value is the sample, whatever its structure
        samples = list(value)
        if len(samples) != self.one_read_count:
            raise ValueError(
                f"read_input({self.ids[read]!r}) gave {len(samples)} samples; one_read_count is {self.one_read_count}."
            )
        return samples

    def _load_reads(self, first: int, end: int) -> Any:
        """Read ``ids[first:end]`` into one pytree of stacked arrays (preallocated).

        Every sample is checked against the layout of the first sample of the dataset
        before it is written, so a chunk never holds broadcast, cast or unwritten rows.
        """
        rows = (end - first) * self.one_read_count
        stacked: list[np.ndarray] = []
        layout = self._layout
        row = 0
        for read in range(first, end):
            for position, sample in enumerate(self._samples(read)):
                leaves, spec = optree.tree_flatten(sample)
                arrays = [_as_numpy(leaf) for leaf in leaves]  # numbers too
                if layout is None:
                    self._check_dtypes(spec, arrays, read, position)
                    layout = self._first_layout(_Layout(spec, [a.shape for a in arrays], [a.dtype for a in arrays]))
                self._check_sample(layout, spec, arrays, read, position)
                if row == 0:
                    stacked = [_empty((rows, *shape), dtype) for shape, dtype in zip(layout.shapes, layout.dtypes)]
                for target, leaf in zip(stacked, arrays):
                    target[row] = leaf
                row += 1
        if layout is None:
            raise ValueError(f"cannot read reads {first} to {end}: there are none.")
        return optree.tree_unflatten(layout.spec, [torch.from_numpy(a) for a in stacked])

    def _check_dtypes(self, spec: Any, arrays: list[np.ndarray], read: int, position: int) -> None:
        """Raise if a leaf of the first sample has a dtype that a torch tensor cannot hold."""
        where = self._where(read, position)
        for path, a in zip(spec.paths(), arrays):
            _check_torch_dtype(a.dtype, f"{where} of dtype {a.dtype}{_at(path)}")

    def _where(self, read: int, position: int) -> str:
        """Names a sample in messages: its read's id, and its position among the read's samples."""
        where = f"read_input({self.ids[read]!r}) gave a sample"
        return f"sample {position} of {where}" if self.one_read_count > 1 else where

    def _first_layout(self, layout: _Layout) -> _Layout:
        """Keep ``layout`` as the dataset's, unless another thread kept one first; return the one kept."""
        with self._lock:
            if self._layout is None:
                self._layout = layout
            return self._layout

    def _check_sample(self, layout: _Layout, spec: Any, arrays: list[np.ndarray], read: int, position: int) -> None:
        """Raise if a sample (flattened to ``spec`` and ``arrays``) does not have ``layout``."""
        if spec == layout.spec and all(
            a.shape == shape and a.dtype == dtype for a, shape, dtype in zip(arrays, layout.shapes, layout.dtypes)
        ):
            return
        where = self._where(read, position)
        if spec != layout.spec:
            raise ValueError(
                f"{where} of structure {spec}; the first sample's is {layout.spec}: every sample must have the same "
                "keys and nesting."
            )
        for path, a, shape, dtype in zip(spec.paths(), arrays, layout.shapes, layout.dtypes):
            at = _at(path)
            if a.shape != shape:
                raise ValueError(f"{where} of shape {a.shape}{at}; the first sample's is {shape}.")
            if a.dtype != dtype:
                raise TypeError(
                    f"{where} of dtype {a.dtype}{at}; the first sample's is {dtype}: samples are not cast, "
                    "read_input must give every sample the same dtypes."
                )

    def _read_chunk(self, chunk: int) -> Any:
        first = chunk * self.reads_per_chunk
        end = min(first + self.reads_per_chunk, len(self.ids))
        data = self._load_chunk_reads(first, end)
        with self._lock:
            self.chunk_reads += 1
        return data

    def set_chunk_order(self, order: Sequence[int]) -> None:
        """The order in which an epoch visits the chunks (sent by the loaders), for read-ahead."""
        self._check_process()
        with self._lock:
            self._order = [int(c) for c in order]

    def _held(self, needed: list[int], *, ahead: bool = True) -> dict[int, Any]:
        """The data of the ``needed`` chunks (one or two): held, read ahead, or read now.

        Before anything is read, every other chunk is dropped and a read ahead of a chunk
        that is not the next one is cancelled (or waited for, if it has started), so that
        at most two chunks are in memory: the needed ones, or the one needed and the next
        in the epoch's order, which is read ahead (if ``ahead``) while it is served.
        """
        with self._lock:
            position = {chunk: i for i, chunk in enumerate(self._order)}
            last = max(needed, key=lambda chunk: position.get(chunk, chunk))
            for chunk in sorted(needed, key=lambda chunk: position.get(chunk, chunk)):
                if chunk != self._served[1]:
                    self._served = (self._served[1], chunk)
            # NOTE: read ahead only while one chunk is served; a batch across two chunks
            # holds both, and a third would pass the budget
            nxt = self._next_chunk(last) if ahead and self.read_ahead and len(needed) == 1 else None
            keep = {*needed, nxt}
            for old in [chunk for chunk in self._chunks if chunk not in keep]:
                del self._chunks[old]
            held = {chunk: self._chunks.get(chunk) for chunk in needed}
            pending = {chunk: self._pending.pop(chunk) for chunk in needed if chunk in self._pending}
            stale = [self._pending.pop(chunk) for chunk in list(self._pending) if chunk not in keep]
        _forget(stale)
        for chunk in needed:
            if held[chunk] is None:
                held[chunk] = pending[chunk].result() if chunk in pending else self._read_chunk(chunk)
        with self._lock:
            self._chunks.update(held)
            if nxt is not None and nxt not in self._chunks and nxt not in self._pending:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastsab-read-ahead")
                self._pending[nxt] = self._executor.submit(self._read_chunk, nxt)
        return held

    def _next_chunk(self, chunk: int) -> int | None:
        """The chunk after ``chunk`` in the epoch's order; without an order, a guess or ``None``.

        NOTE: without an order (a dataset in a DataLoader's worker process, say), the next
        chunk is guessed to be ``chunk + 1`` only when the chunk served before ``chunk`` was
        ``chunk - 1``: a wrong guess would be read for nothing.
        """
        order = self._order
        if chunk in order:
            position = order.index(chunk)
            return order[position + 1] if position + 1 < len(order) else None
        sequential = self._served == (chunk - 1, chunk)
        return chunk + 1 if sequential and chunk + 1 < self.num_chunks else None

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """The samples at ``indices`` as one batch (a pytree of tensors with a first batch dim).

        Raises:
            TypeError: If ``indices`` are not integers.
            IndexError: If an index is negative or not less than ``len(self)``.
        """
        self._check_process()
        index = check_indices(indices, len(self))
        if not index.size:
            return self._empty_batch()
        chunks = index // self.chunk_size
        unique = np.unique(chunks).tolist()
        if len(unique) == 1:
            rows = torch.from_numpy(index - unique[0] * self.chunk_size)
            return tree_map_arrays(_rows(rows), self._held(unique)[unique[0]])
        if len(unique) > 2:
            warnings.warn(
                f"a batch of {len(index)} samples spans {len(unique)} chunks of {self.chunk_size} samples: they are "
                "read one after the other for this batch alone. Batches of random samples read most of the data "
                "for each batch; the fastsab loaders (and their batch_sampler()) keep batches within chunks.",
                stacklevel=2,
            )
        held = self._held(unique) if len(unique) == 2 else {}
        parts = []
        for chunk in unique:
            # NOTE: beyond two chunks, one at a time (no read ahead), within the budget
            data = held[chunk] if held else self._held([chunk], ahead=False)[chunk]
            mask = chunks == chunk
            rows = torch.from_numpy(index[mask] - chunk * self.chunk_size)
            parts.append((np.flatnonzero(mask), tree_map_arrays(_rows(rows), data)))
        del data, held
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
        layout = self._layout
        if layout is None:
            if not self.ids:
                raise ValueError("cannot make an empty batch of a dataset without samples: its structure is unknown.")
            return tree_map_arrays(lambda leaf: leaf[:0], self._load_chunk_reads(0, 1))  # the first read's
        empty = [torch.from_numpy(np.empty((0, *shape), dtype)) for shape, dtype in zip(layout.shapes, layout.dtypes)]
        return optree.tree_unflatten(layout.spec, empty)

    def close(self) -> None:
        """Stop the read-ahead thread and drop the held chunks."""
        self._check_process()
        with self._lock:
            executor, self._executor = self._executor, None
            self._chunks.clear()
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_pid", "_lock", "_executor", "_pending", "_chunks"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_in_this_process()

    def _start_in_this_process(self) -> None:
        """A new lock, no read-ahead thread, no chunks held."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._executor = None
        self._pending = {}
        self._chunks = OrderedDict()

    def _check_process(self) -> None:
        """Start afresh in a forked process (a DataLoader worker).

        NOTE: a forked child inherits the lock (possibly held by the read-ahead thread) and
        the executor, but not its thread: a read submitted to it would never run.
        """
        if self._pid != os.getpid():
            self._start_in_this_process()


class _MemmapRows:
    """Reads rows ``[first, end)`` of a file of rows (picklable, for worker processes).

    Args:
        path: The file.
        offset: Where row 0 starts in the file, in bytes.
        dtype: The dtype of the values.
        row_shape: The shape of one row.
    """

    def __init__(self, path: str, offset: int, dtype: np.dtype[Any], row_shape: tuple[int, ...]) -> None:
        self.path, self.offset, self.dtype, self.row_shape = path, offset, dtype, tuple(row_shape)
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * dtype.itemsize

    def __call__(self, first: int, end: int) -> torch.Tensor:
        rows = _empty((end - first, *self.row_shape), self.dtype)
        with open(self.path, "rb") as file:
            file.seek(self.offset + first * self.row_bytes)
            if file.readinto(rows.data.cast("B")) != rows.nbytes:
                raise ValueError(f"{self.path} ended before row {end}: is the memmap's shape right?")
        return torch.from_numpy(rows)

    def row(self, row: int) -> torch.Tensor:
        """Row ``row``."""
        return self(row, row + 1)[0]


def _file_offset(array: np.memmap) -> int:
    """The position in its file of the first byte of ``array``.

    NOTE: a view of a memmap (a slice, a row) keeps the ``offset`` of the memmap it was
    made from; where its data starts is found from its data pointer, relative to the
    memmap made on the file (the last array of the chain of bases, whose base is the
    mapping and whose ``offset`` is where its data starts).
    """
    root: np.ndarray = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or not isinstance(root.base, mmap.mmap) or root.filename != array.filename:
        raise ValueError(
            f"array must be a memmap of {array.filename!r} or a view of one, got an array whose memory belongs to "
            f"{type(root.base).__name__}."
        )
    return int(root.offset) + (array.ctypes.data - root.ctypes.data)


def _check_torch_dtype(dtype: np.dtype[Any], subject: str) -> None:
    """Raise a TypeError, starting with ``subject``, if a torch tensor cannot hold values of ``dtype``."""
    try:
        torch.from_numpy(np.empty(0, dtype))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{subject}, which a torch tensor cannot hold: values must be bools, integers, floats or complex "
            "numbers in the machine's byte order."
        ) from err


def _forget(reads: list[Future[Any]]) -> None:
    """Cancel reads ahead that are not needed; wait for those that have started (ignoring
    their errors), so that their chunks are freed before the next read. Empties ``reads``."""
    while reads:
        read = reads.pop()
        if not read.cancel():
            read.exception()


def _at(path: tuple[Any, ...]) -> str:
    """Where a leaf is in a sample, for messages: nothing for a sample that is one array."""
    return f" at {path!r}" if path else ""


def _load_npy(path: str) -> Any:
    """A ``.npy`` file, read without pickle."""
    return np.load(path, allow_pickle=False)


def _empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialized array; large ones in their own anonymous mapping.

    NOTE: a chunk freed from the C heap often stays in the process (the allocator keeps
    it for reuse), so the resident set would creep past the budget; a mapping of its own
    goes back to the system as soon as the chunk is dropped.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < 2**20:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def _rows(rows: torch.Tensor) -> Callable[[Any], Any]:
    return lambda leaf: leaf[rows]


def _as_numpy(leaf: Any) -> np.ndarray:
    return leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor) else np.asarray(leaf)
