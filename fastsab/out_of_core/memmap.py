"""Rows of a file-backed numpy memmap read with plain file reads, for ``OutOfCoreDataset.from_memmap``.

Reading a chunk with ``readinto`` rather than through the mapping keeps the pages of the
file out of the process's resident memory.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import optree
import torch

from fastsab.out_of_core.samples import Layout, check_torch_dtype, empty_array

__all__ = ["MemmapRows"]


class MemmapRows:
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

    @classmethod
    def of(cls, array: np.memmap) -> MemmapRows:
        """The rows of ``array``, a memmap or a contiguous view of one, checked.

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
        check_torch_dtype(array.dtype, f"array has dtype {array.dtype!r}")
        return cls(os.fspath(str(array.filename)), _file_offset(array), array.dtype, array.shape[1:])

    @property
    def layout(self) -> Layout:
        """Every row is one array of ``row_shape`` and ``dtype``."""
        return Layout(optree.treespec_leaf(), [self.row_shape], [self.dtype])

    def __call__(self, first: int, end: int) -> torch.Tensor:
        rows = empty_array((end - first, *self.row_shape), self.dtype)
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
