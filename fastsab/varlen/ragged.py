"""Variable-length sequences held flat, batched without per-item Python.

A ``RaggedDataset`` holds ``n`` sequences as flat per-token arrays (one or several keys,
such as ``input_ids`` and ``labels``, sharing one ``offsets`` index of ``n + 1`` entries:
sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``), plus optional per-sequence values
(a class label). Its ``lengths`` are the ``sizeof`` of the size-aware
loader, and ``__getitems__`` gathers a whole batch with index arithmetic (one ``repeat``, one
``arange`` minus offsets, one gather; a padded batch of mostly real tokens: one gather over a
``(B, L)`` matrix of positions) straight into the layout of its collator: padded
``(B, L)`` + ``attention_mask`` (``PadCollator``) or packed ``(T,)`` +
``cu_seqlens`` (``PackCollator``), the same batches as the collator
gives over ``[dataset[i] for i in indices]``.

Sources: lists of sequences (``RaggedDataset.from_sequences``), flat values and offsets
(the constructor), columns of a Hugging Face ``datasets.Dataset``
(``RaggedDataset.from_hf``) and flat token files mapped in memory with an offsets index
(``RaggedDataset.from_memmap``). A memory-mapped array pickles as its file name and is
mapped again on unpickling, so worker processes do not copy the file. The sources and the checks
of flat values and offsets are ``fastsab.varlen.ragged_sources``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastsab._arrays import native_order, short_repr
from fastsab.varlen.collate import Collator, PadCollator, pack_positions
from fastsab.varlen.collator import as_tensor
from fastsab.varlen.ragged_sources import (
    MappedFile,
    as_array,
    checked_offsets,
    common_length,
    flatten_sequences,
    hf_columns,
    memmap_files,
    reopen,
)
from fastsab.varlen.sample_columns import Flat

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
        collator: The layout of a batch: ``PadCollator`` (default
            ``PadCollator()``) or ``PackCollator``.
        per_sequence: Optional mapping from key to a 1-D tensor or array of ``n`` values (a
            label per sequence), stacked into ``(B,)`` tensors.
        key: The name of ``values`` when it is a single array.

    Tensors are kept as numpy views of their memory where numpy holds their dtype. Batches
    keep the dtypes of the values (a ``uint16`` token file gives ``uint16`` tensors), in the
    machine's byte order (a big-endian ``>u2`` file gives the same numbers as ``uint16``).

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
        self.values: dict[str, Flat] = {name: as_array(f"values[{name!r}]", v) for name, v in columns.items()}
        total = common_length(self.values)
        self.offsets = checked_offsets(offsets, total)
        self.lengths: np.ndarray = np.diff(self.offsets).astype(np.int64, copy=False)
        n = len(self.lengths)
        self.per_sequence: dict[str, Flat] = {}
        for name, column in (per_sequence or {}).items():
            if name in self.values:
                raise ValueError(f"per_sequence key {name!r} is also a per-token key of values.")
            array = as_array(f"per_sequence[{name!r}]", column)
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

        A key's values take the dtype ``numpy.concatenate`` gives its sequences; a key of only
        empty sequences keeps the dtype of its arrays and tensors (int64 for empty lists).

        Raises:
            TypeError: If a sequence is not numbers.
            ValueError: If a sequence is not 1-D, or the keys' sequences differ in number or length.

        Examples:
            >>> data = RaggedDataset.from_sequences({"input_ids": [[1, 2], []], "labels": [[2, 3], []]})
            >>> data.offsets.tolist(), sorted(data.values)
            ([0, 2, 2], ['input_ids', 'labels'])
        """
        flat, offsets = flatten_sequences(sequences, key)
        return cls(flat, offsets, collator=collator, per_sequence=per_sequence)

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
        flat, offsets, scalars = hf_columns(dataset, columns, per_sequence)
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
        values, mapped_offsets = memmap_files(tokens, offsets, dtype, key)
        return cls(values, mapped_offsets, collator=collator)

    # -- items and batches -------------------------------------------------------------------

    @property
    def getitems_in_memory(self) -> bool:
        """Whether a batch is gathered from memory only: true unless a per-token array is a file mapped in memory.

        The loaders then make batches in the loop's thread where ``prefetch`` is ``None``: a
        hand-off to a prefetch thread costs more than this gather (see ``fastsab.fetch.fetcher``).
        The tokens of a memory-mapped file may have to be read from disk, which a prefetch
        thread overlaps with the loop.

        Examples:
            >>> RaggedDataset.from_sequences([[1, 2], [3]]).getitems_in_memory
            True
        """
        return not any(isinstance(values, np.memmap) for values in self.values.values())

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
        starts = np.asarray(self.offsets[index], dtype=np.int64)
        scalars = {name: as_tensor(_take(values, index)) for name, values in self.per_sequence.items()}
        if isinstance(self.collator, PadCollator):
            padded = self.collator._gather_rows(self.values, starts, lengths, scalars)
            if padded is not None:
                return padded
        cu, positions = pack_positions(lengths)
        # NOTE: the flat position of every token of the batch: its sequence's start plus its
        # position in the sequence; one gather per key reads them in batch order
        source = np.repeat(starts, lengths)
        source += positions
        tokens = {name: _take(values, source) for name, values in self.values.items()}
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
        state["values"] = {name: MappedFile.of(v) or v for name, v in self.values.items()}
        state["offsets"] = MappedFile.of(self.offsets) or self.offsets
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["values"] = {name: reopen(v) for name, v in state["values"].items()}
        state["offsets"] = reopen(state["offsets"])
        self.__dict__.update(state)


# -- gathering ------------------------------------------------------------------------------


# NOTE: values of a big-endian array (a token file written on another machine, kept mapped: it
# is not read whole) are gathered in the machine's byte order, the only one torch holds


def _take(values: Flat, index: np.ndarray) -> Flat:
    if isinstance(values, np.ndarray):
        return native_order(values[index])
    return values[torch.from_numpy(index).to(values.device)]


def _copy_tensor(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.clone()
    # NOTE: a copy: a memory map's rows are read-only
    return torch.from_numpy(np.array(values, dtype=values.dtype.newbyteorder("=")))
