"""Where the flat values and offsets of a ``RaggedDataset`` come from, checked.

Lists of sequences (``flatten_sequences``), list columns of a Hugging Face dataset read
through Arrow (``hf_columns``), flat token files mapped in memory (``memmap_files``,
``MappedFile``: a memory map pickled as its file), and the checks of flat arrays and
offsets every source goes through (``as_array``, ``common_length``, ``checked_offsets``).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastsab._arrays import as_numpy, short_repr
from fastsab.varlen.sample_columns import Flat

__all__ = [
    "MappedFile",
    "as_array",
    "checked_offsets",
    "common_length",
    "flatten_sequences",
    "hf_columns",
    "memmap_files",
    "reopen",
]


def flatten_sequences(
    sequences: Sequence[Any] | Mapping[str, Sequence[Any]], key: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The flat values of ``sequences`` (lists of 1-D sequences, or a mapping from key to such lists) and their offsets.

    Raises:
        TypeError: If a sequence is not numbers.
        ValueError: If a sequence is not 1-D, or the keys' sequences differ in number or length.
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
    return flat, offsets if offsets is not None else np.zeros(1, np.int64)


def hf_columns(
    dataset: Any, columns: Sequence[str], per_sequence: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
    """The flat values and offsets of list ``columns`` of a Hugging Face dataset, and its ``per_sequence`` columns.

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
    return flat, offsets, {name: _arrow_scalar_column(name, table[name]) for name in per_sequence}


def memmap_files(
    tokens: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]],
    offsets: str | os.PathLike[str],
    dtype: Any,
    key: str,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Flat token files (``.npy`` or raw ``dtype``) and an offsets ``.npy`` file, mapped in memory."""
    files = dict(tokens) if isinstance(tokens, Mapping) else {key: tokens}
    return {name: _map_file(path, dtype) for name, path in files.items()}, np.load(offsets, mmap_mode="r")


# -- memory maps ---------------------------------------------------------------------------


class MappedFile:
    """Where a memory-mapped array lives in its file: enough to map it again."""

    def __init__(self, filename: str, dtype: np.dtype[Any], offset: int, shape: tuple[int, ...]) -> None:
        self.filename, self.dtype, self.offset, self.shape = filename, dtype, offset, shape

    @classmethod
    def of(cls, array: Any) -> MappedFile | None:
        """The file of ``array`` if it is a whole memory map (not a view of one), else ``None``."""
        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename is not None:
            return cls(str(array.filename), array.dtype, int(array.offset), tuple(array.shape))
        return None

    def open(self) -> np.memmap[Any, Any]:
        return np.memmap(self.filename, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


def reopen(value: Any) -> Any:
    return value.open() if isinstance(value, MappedFile) else value


def _map_file(path: str | os.PathLike[str], dtype: Any) -> np.ndarray:
    if os.fspath(path).endswith(".npy"):
        mapped: np.ndarray = np.load(path, mmap_mode="r")
        return mapped
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


# -- checks and conversions ------------------------------------------------------------------


def as_array(name: str, values: Any) -> Flat:
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


def common_length(values: dict[str, Flat]) -> int:
    lengths = {name: len(v) for name, v in values.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"values must have one length for every key (they share offsets), got lengths {lengths!r}.")
    return next(iter(lengths.values()))


def checked_offsets(offsets: Any, total: int) -> np.ndarray:
    """``offsets`` checked: 1-D integers from 0 to ``total``, non-decreasing."""
    array = as_numpy("offsets", offsets, expected="a one-dimensional sequence of integers")
    if array.ndim != 1:
        raise ValueError(f"offsets must be one-dimensional, got shape {array.shape}: {short_repr(offsets)}.")
    if len(array) == 0:
        raise ValueError(f"offsets must hold n + 1 >= 1 entries (the first is 0), got {short_repr(offsets)}.")
    if array.dtype.kind not in "iu":
        # NOTE: the dtype given, not the one numpy widened it to (bfloat16 is read as float32)
        given = offsets.dtype if isinstance(offsets, torch.Tensor) else array.dtype
        raise TypeError(f"offsets must be integers, got dtype {given}: {short_repr(offsets)}.")
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
    typed = []  # NOTE: the arrays and tensors, whose dtype is their own (an empty list's is numpy's float64)
    for position, sequence in enumerate(sequences):
        array = _sequence_array(name, position, sequence)
        if array.ndim != 1:
            raise ValueError(
                f"{name}[{position}] must be one-dimensional, got shape {array.shape}: {short_repr(sequence)}."
            )
        if array.size and array.dtype.kind not in "biuf":
            raise TypeError(f"{name}[{position}] must hold numbers, got dtype {array.dtype}: {short_repr(sequence)}.")
        arrays.append(array)
        if isinstance(sequence, (np.ndarray, torch.Tensor)):
            typed.append(array)
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    filled = [a for a in arrays if a.size]
    values = np.concatenate(filled) if filled else np.zeros(0, dtype=_empty_dtype(typed))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return values, offsets


def _sequence_array(name: str, position: int, sequence: Any) -> np.ndarray:
    """``sequence`` (a list, array or tensor) as a numpy array."""
    if not isinstance(sequence, torch.Tensor):
        return as_numpy(f"{name}[{position}]", sequence, expected="a one-dimensional sequence of numbers")
    try:
        return sequence.detach().cpu().numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16)
        raise TypeError(
            f"{name}[{position}] is a tensor of dtype {sequence.dtype}, which numpy cannot hold; pass the "
            "sequences as one flat tensor and their offsets instead: RaggedDataset(torch.cat(sequences), offsets)."
        ) from None


def _empty_dtype(typed: list[np.ndarray]) -> np.dtype[Any]:
    """The dtype of a column of empty sequences: that of its arrays and tensors (promoted), else int64."""
    return np.result_type(*typed) if typed else np.dtype(np.int64)


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
