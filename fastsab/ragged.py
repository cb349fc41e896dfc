"""Variable-length sequences held flat, batched without per-item Python.

A :class:`RaggedDataset` holds ``n`` sequences as flat per-token arrays (one or several keys,
such as ``input_ids`` and ``labels``, sharing one ``offsets`` index of ``n + 1`` entries:
sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``), plus optional per-sequence values
(a class label). Its :attr:`~RaggedDataset.lengths` are the ``sizeof`` of the size-aware
loader, and ``__getitems__`` gathers a whole batch with index arithmetic (one ``repeat``, one
``arange`` minus offsets, one gather) straight into the layout of its collator: padded
``(B, L)`` + ``attention_mask`` (:class:`~fastsab.collate.PadCollator`) or packed ``(T,)`` +
``cu_seqlens`` (:class:`~fastsab.collate.PackCollator`), the same batches as the collator
gives over ``[dataset[i] for i in indices]``.

Sources: lists of sequences (:meth:`RaggedDataset.from_sequences`), flat values and offsets
(the constructor), columns of a Hugging Face ``datasets.Dataset``
(:meth:`RaggedDataset.from_hf`) and flat token files mapped in memory with an offsets index
(:meth:`RaggedDataset.from_memmap`). A memory-mapped array pickles as its file name and is
mapped again on unpickling, so worker processes do not copy the file.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastsab._checks import short_repr
from fastsab.collate import Collator, Flat, PadCollator, pack_positions

__all__ = ["RaggedDataset"]

#: Arrays of a dataset: numpy where numpy holds the dtype (memory maps included), else tensors.
Array = np.ndarray | torch.Tensor


class RaggedDataset:
    """Variable-length sequences as flat values and offsets, batched padded or packed.

    Args:
        values: The flat per-token values: a 1-D tensor or array (named ``key``), or a mapping
            from key to such arrays, all of the same length (several per-token keys share
            ``offsets``).
        offsets: ``n + 1`` integers: 1-D, starting at 0, non-decreasing, ending at the
            length of the values. Empty sequences (equal neighbours) are allowed.
        collator: The layout of a batch: :class:`~fastsab.collate.PadCollator` (default
            ``PadCollator()``) or :class:`~fastsab.collate.PackCollator`.
        per_sequence: Optional mapping from key to a 1-D tensor or array of ``n`` values (a
            label per sequence), stacked into ``(B,)`` tensors.
        key: The name of ``values`` when it is a single array.

    Tensors are kept as numpy views of their memory where numpy holds their dtype. Batches
    keep the dtypes of the values (a ``uint16`` token file gives ``uint16`` tensors).

    Raises:
        TypeError: If an array is not a tensor or a numpy array of numbers, ``offsets`` are
            not integers, or ``collator`` is not a collator.
        ValueError: If an array is not 1-D, the per-token arrays differ in length, the
            offsets break a rule above, or a per-sequence array has not ``n`` values.

    Examples:
        >>> data = RaggedDataset.from_sequences([[5, 6, 7], [8], [9, 10]])
        >>> len(data), data.lengths.tolist()
        (3, [3, 1, 2])
        >>> batch = data.__getitems__([2, 1])
        >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
        ([[9, 10], [8, 0]], [[1, 1], [1, 0]])
    """

    def __init__(
        self,
        values: Array | Mapping[str, Array],
        offsets: Any,
        *,
        collator: Collator | None = None,
        per_sequence: Mapping[str, Any] | None = None,
        key: str = "input_ids",
    ) -> None:
        columns = dict(values) if isinstance(values, Mapping) else {key: values}
        if not columns:
            raise ValueError(f"values must hold at least one per-token array, got {values!r}.")
        self.values: dict[str, Flat] = {name: _as_array(f"values[{name!r}]", v) for name, v in columns.items()}
        total = _common_length(self.values)
        self.offsets = _checked_offsets(offsets, total)
        self.lengths: np.ndarray = np.diff(self.offsets).astype(np.int64, copy=False)
        n = len(self.lengths)
        self.per_sequence: dict[str, Flat] = {}
        for name, column in (per_sequence or {}).items():
            if name in self.values:
                raise ValueError(f"per_sequence key {name!r} is also a per-token key of values.")
            array = _as_array(f"per_sequence[{name!r}]", column)
            if len(array) != n:
                raise ValueError(f"per_sequence[{name!r}] has {len(array)} values for {n} sequences.")
            self.per_sequence[name] = array
        self.collator = collator if collator is not None else PadCollator()
        if not isinstance(self.collator, Collator):
            raise TypeError(
                f"collator must be a PadCollator or a PackCollator, got {short_repr(collator)} "
                f"of type {type(collator).__name__}."
            )
        for name in self.values.keys() | self.per_sequence.keys():
            if name in self.collator.reserved:
                raise ValueError(f"{type(self.collator).__name__} makes the key {name!r}; rename that column.")
        # NOTE: a batch of no sequence checks the collator against the keys and dtypes (a pad
        # value for a key the dataset lacks, or one its dtype cannot hold) before any epoch runs
        self.__getitems__(np.zeros(0, dtype=np.int64))

    # -- sources ---------------------------------------------------------------------------

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Any] | Mapping[str, Sequence[Any]],
        *,
        key: str = "input_ids",
        collator: Collator | None = None,
        per_sequence: Mapping[str, Any] | None = None,
    ) -> RaggedDataset:
        """A dataset of ``sequences``: 1-D lists, tensors or arrays (or a mapping from key to such lists).

        Raises:
            TypeError: If a sequence is not numbers.
            ValueError: If a sequence is not 1-D, or the keys' sequences differ in number or length.

        Examples:
            >>> data = RaggedDataset.from_sequences({"input_ids": [[1, 2], []], "labels": [[2, 3], []]})
            >>> data.offsets.tolist(), sorted(data.values)
            ([0, 2, 2], ['input_ids', 'labels'])
        """
        columns = dict(sequences) if isinstance(sequences, Mapping) else {key: sequences}
        flat: dict[str, np.ndarray] = {}
        offsets: np.ndarray | None = None
        for name, column in columns.items():
            values, column_offsets = _flatten(
                f"sequences[{name!r}]" if isinstance(sequences, Mapping) else "sequences", column
            )
            if offsets is not None and not np.array_equal(offsets, column_offsets):
                raise ValueError(f"sequences[{name!r}] differ in number or length from the sequences of the first key.")
            flat[name], offsets = values, column_offsets
        return cls(
            flat,
            offsets if offsets is not None else np.zeros(1, np.int64),
            collator=collator,
            per_sequence=per_sequence,
        )

    @classmethod
    def from_hf(
        cls,
        dataset: Any,
        columns: Sequence[str] = ("input_ids",),
        *,
        per_sequence: Sequence[str] = (),
        collator: Collator | None = None,
    ) -> RaggedDataset:
        """A dataset of list columns of a Hugging Face ``datasets.Dataset``, read once through Arrow.

        Args:
            dataset: A ``datasets.Dataset`` (its row order after ``shuffle`` or ``select``).
            columns: Its per-token columns (lists of numbers with the same lengths).
            per_sequence: Its columns of one number per row.
            collator: The layout of a batch.

        Raises:
            TypeError: If ``dataset`` has no ``with_format`` (not a ``datasets.Dataset``), or a
                column is not a list column of numbers.
            ValueError: If a column holds missing values, or the columns differ in lengths.
        """
        if not callable(getattr(dataset, "with_format", None)):
            raise TypeError(
                f"dataset must be a Hugging Face datasets.Dataset, got {short_repr(dataset)} "
                f"of type {type(dataset).__name__}."
            )
        if isinstance(columns, str):
            columns = (columns,)
        table = dataset.with_format("arrow")
        flat: dict[str, np.ndarray] = {}
        offsets: np.ndarray | None = None
        for name in columns:
            values, column_offsets = _arrow_list_column(name, table[name])
            if offsets is not None and not np.array_equal(offsets, column_offsets):
                raise ValueError(f"column {name!r} has other sequence lengths than column {columns[0]!r}.")
            flat[name], offsets = values, column_offsets
        if offsets is None:
            raise ValueError(f"columns must name at least one list column, got {columns!r}.")
        scalars = {name: _arrow_scalar_column(name, table[name]) for name in per_sequence}
        return cls(flat, offsets, collator=collator, per_sequence=scalars)

    @classmethod
    def from_memmap(
        cls,
        tokens: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
        offsets: str | os.PathLike[str],
        *,
        dtype: Any = np.uint16,
        collator: Collator | None = None,
        key: str = "input_ids",
    ) -> RaggedDataset:
        """A dataset of flat token files mapped in memory, and their offsets index.

        Args:
            tokens: A flat token file (``.npy``, or raw values of ``dtype``), or a mapping from
                key to such files.
            offsets: A ``.npy`` file of ``n + 1`` integer offsets, also mapped in memory.
            dtype: The dtype of raw token files (``.npy`` files say their own).
            collator: The layout of a batch.
            key: The name of ``tokens`` when it is a single file.

        Nothing is read but the offsets (checked once); batches read the tokens they gather.
        """
        files = dict(tokens) if isinstance(tokens, Mapping) else {key: tokens}
        values = {name: _map_file(path, dtype) for name, path in files.items()}
        return cls(values, np.load(offsets, mmap_mode="r"), collator=collator)

    # -- items and batches -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.lengths)

    def __repr__(self) -> str:
        keys = list(self.values) + list(self.per_sequence)
        return f"RaggedDataset({len(self)} sequences, {int(self.offsets[-1])} tokens, keys={keys!r}, {self.collator!r})"

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Sequence ``index`` as a sample: a 1-D tensor per per-token key, a 0-d tensor per per-sequence key.

        Raises:
            TypeError: If ``index`` is not an integer.
            IndexError: If ``index`` is not in ``[0, len(self))``.
        """
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer, got {short_repr(index)} of type {type(index).__name__}.")
        self._check_range(np.array([index]))
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        sample = {name: _copy_tensor(values[lo:hi]) for name, values in self.values.items()}
        sample.update({name: _copy_tensor(values[index]) for name, values in self.per_sequence.items()})
        return sample

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """The batch of sequences ``indices``, gathered in one pass into the collator's layout.

        Raises:
            TypeError: If ``indices`` are not integers.
            ValueError: If ``indices`` is not one-dimensional.
            IndexError: If an index is not in ``[0, len(self))``.
        """
        index = np.asarray(indices)
        if index.dtype.kind not in "iu" and not (index.size == 0 and index.dtype.kind == "f"):
            raise TypeError(f"indices must be integers, got dtype {index.dtype}: {short_repr(indices)}.")
        if index.ndim != 1:
            raise ValueError(f"indices must be one-dimensional, got shape {index.shape}: {short_repr(indices)}.")
        index = index.astype(np.int64, copy=False)
        self._check_range(index)
        lengths = self.lengths[index]
        cu, positions = pack_positions(lengths)
        # NOTE: the flat position of every token of the batch: its sequence's start plus its
        # position in the sequence; one gather per key reads them in batch order
        source = np.repeat(np.asarray(self.offsets[index], dtype=np.int64), lengths) + positions
        tokens = {name: _take(values, source) for name, values in self.values.items()}
        scalars = {name: _as_tensor(_take(values, index)) for name, values in self.per_sequence.items()}
        return self.collator.from_flat(tokens, lengths, scalars, positions=(cu, positions))

    def _check_range(self, index: np.ndarray) -> None:
        if index.size:
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= len(self):
                bad = low if low < 0 else high
                raise IndexError(
                    f"index {bad} is out of range for {len(self)} sequences: indices must be in [0, {len(self)})."
                )

    # -- pickling -------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # NOTE: a memory map pickles as its file, mapped again in the process that unpickles
        # it (a DataLoader worker): pickling the array itself would copy the whole file
        state = dict(self.__dict__)
        state["values"] = {name: _MappedFile.of(v) or v for name, v in self.values.items()}
        state["offsets"] = _MappedFile.of(self.offsets) or self.offsets
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["values"] = {name: _reopen(v) for name, v in state["values"].items()}
        state["offsets"] = _reopen(state["offsets"])
        self.__dict__.update(state)


# -- memory maps ---------------------------------------------------------------------------


class _MappedFile:
    """Where a memory-mapped array lives in its file: enough to map it again."""

    def __init__(self, filename: str, dtype: np.dtype[Any], offset: int, shape: tuple[int, ...]) -> None:
        self.filename, self.dtype, self.offset, self.shape = filename, dtype, offset, shape

    @classmethod
    def of(cls, array: Any) -> _MappedFile | None:
        """The file of ``array`` if it is a whole memory map (not a view of one), else ``None``."""
        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename is not None:
            return cls(str(array.filename), array.dtype, int(array.offset), tuple(array.shape))
        return None

    def open(self) -> np.memmap[Any, Any]:
        return np.memmap(self.filename, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


def _reopen(value: Any) -> Any:
    return value.open() if isinstance(value, _MappedFile) else value


def _map_file(path: str | os.PathLike[str], dtype: Any) -> np.ndarray:
    if os.fspath(path).endswith(".npy"):
        mapped: np.ndarray = np.load(path, mmap_mode="r")
        return mapped
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


# -- checks and conversions ------------------------------------------------------------------


def _as_array(name: str, values: Any) -> Flat:
    """``values`` as a 1-D numpy array of numbers (a tensor as a view of its memory where numpy holds its dtype)."""
    if isinstance(values, torch.Tensor):
        array: Flat = values.detach()
        if values.device.type == "cpu":
            try:
                array = values.detach().numpy()
            except TypeError:  # a dtype numpy lacks (bfloat16): kept as a tensor
                pass
    elif isinstance(values, np.ndarray):
        array = values
    else:
        raise TypeError(
            f"{name} must be a tensor or a numpy array, got {short_repr(values)} of type {type(values).__name__}."
        )
    if isinstance(array, np.ndarray) and array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}: {short_repr(values)}.")
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(array.shape)}: {short_repr(values)}.")
    return array


def _common_length(values: dict[str, Flat]) -> int:
    lengths = {name: len(v) for name, v in values.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"values must have one length for every key (they share offsets), got lengths {lengths!r}.")
    return next(iter(lengths.values()))


def _checked_offsets(offsets: Any, total: int) -> np.ndarray:
    """``offsets`` checked: 1-D integers from 0 to ``total``, non-decreasing."""
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.detach().cpu().numpy()
    array = offsets if isinstance(offsets, np.ndarray) else np.asarray(offsets)
    if array.ndim != 1:
        raise ValueError(f"offsets must be one-dimensional, got shape {array.shape}: {short_repr(offsets)}.")
    if len(array) == 0:
        raise ValueError(f"offsets must hold n + 1 >= 1 entries (the first is 0), got {short_repr(offsets)}.")
    if array.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, got dtype {array.dtype}: {short_repr(offsets)}.")
    if array[0] != 0:
        raise ValueError(f"offsets must start at 0, got offsets[0] = {array[0]!r}.")
    steps = np.diff(array.astype(np.int64, copy=False))
    if len(steps) and steps.min() < 0:
        bad = int(np.argmax(steps < 0))
        raise ValueError(
            f"offsets must be non-decreasing, got offsets[{bad + 1}] = {array[bad + 1]!r} after "
            f"offsets[{bad}] = {array[bad]!r}."
        )
    if array[-1] != total:
        raise ValueError(f"offsets must end at the length of the values, {total}, got offsets[-1] = {array[-1]!r}.")
    return array


def _flatten(name: str, sequences: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sequences concatenated, and their offsets."""
    if isinstance(sequences, (str, bytes, Mapping)) or not isinstance(sequences, Sequence):
        raise TypeError(
            f"{name} must be a list of sequences, got {short_repr(sequences)} of type {type(sequences).__name__}."
        )
    arrays = []
    for position, sequence in enumerate(sequences):
        array = np.asarray(sequence.detach().cpu() if isinstance(sequence, torch.Tensor) else sequence)
        if array.ndim != 1:
            raise ValueError(
                f"{name}[{position}] must be one-dimensional, got shape {array.shape}: {short_repr(sequence)}."
            )
        if array.size and array.dtype.kind not in "biuf":
            raise TypeError(f"{name}[{position}] must hold numbers, got dtype {array.dtype}: {short_repr(sequence)}.")
        arrays.append(array)
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    filled = [a for a in arrays if a.size]  # NOTE: an empty list has no dtype of its own (numpy says float64)
    values = np.concatenate(filled) if filled else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return values, offsets


def _arrow_list_column(name: str, column: Any) -> tuple[np.ndarray, np.ndarray]:
    """The flat values and offsets of an Arrow list column (a ChunkedArray or an Array)."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    # NOTE: a fixed-length Sequence (padding="max_length") is an Arrow fixed-size list: no offsets
    size = getattr(array.type, "list_size", None)
    if not hasattr(array, "flatten") or not (hasattr(array, "offsets") or isinstance(size, int)):
        raise TypeError(f"column {name!r} must be a list column (a sequence per row), got Arrow type {array.type}.")
    if array.null_count:
        raise ValueError(f"column {name!r} has {array.null_count} missing rows; a sequence may be empty, not missing.")
    flat = array.flatten()
    if flat.null_count:
        raise ValueError(f"column {name!r} has {flat.null_count} missing values inside its sequences.")
    if isinstance(size, int):
        return _arrow_numbers(name, flat), np.arange(len(array) + 1, dtype=np.int64) * size
    offsets = np.asarray(array.offsets, dtype=np.int64)
    return _arrow_numbers(name, flat), offsets - offsets[0]


def _arrow_scalar_column(name: str, column: Any) -> np.ndarray:
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if array.null_count:
        raise ValueError(f"column {name!r} has {array.null_count} missing values.")
    return _arrow_numbers(name, array)


def _arrow_numbers(name: str, array: Any) -> np.ndarray:
    try:
        values = np.asarray(array.to_numpy(zero_copy_only=False))
    except Exception as err:  # an Arrow type numpy cannot take
        raise TypeError(f"column {name!r} must hold numbers, got Arrow type {array.type}.") from err
    if values.ndim != 1 or values.dtype.kind not in "biuf":
        raise TypeError(f"column {name!r} must hold numbers (one per token or per row), got Arrow type {array.type}.")
    return values


def _take(values: Flat, index: np.ndarray) -> Flat:
    return values[index] if isinstance(values, np.ndarray) else values[torch.from_numpy(index).to(values.device)]


def _as_tensor(values: Flat) -> torch.Tensor:
    return values if isinstance(values, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(values))


def _copy_tensor(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.clone()
    return torch.from_numpy(np.array(values))  # NOTE: a copy: a memory map's rows are read-only
