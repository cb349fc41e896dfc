"""Tensors, arrays and nested sequences read as numpy arrays, whatever their dtype, byte order or shape.

``as_numpy`` is where per-item sizes, costs, offsets and sequences become numpy arrays:
tensors of dtypes numpy lacks (bfloat16, the float8 types) are widened exactly, and nested
sequences of unequal shapes are refused naming the first position that breaks the shape.
``native_order`` gives values read from a big-endian array (a token file written on
another machine) in the machine's byte order, which torch requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["as_numpy", "native_order", "short_repr", "tensor_rows"]


def as_numpy(name: str, values: Any, expected: str = "an array of numbers") -> np.ndarray:
    """``values`` (a tensor on any device, an array, or a nested sequence of numbers) as a numpy array.

    A numpy array is returned as it is (a memory map stays mapped, in its own byte order). A
    tensor becomes a numpy array of its dtype, or, for a floating dtype numpy lacks (bfloat16,
    the float8 types), of float32, which holds each of their values exactly; so is each such
    tensor of a nested sequence.

    Raises:
        TypeError: If ``values`` is (or holds) a tensor of a non-floating dtype numpy lacks.
        ValueError: If ``values`` is a nested sequence whose items differ in shape: the message
            says it must be ``expected`` and names the first position whose shape differs from
            that of its first sibling.

    Examples:
        >>> as_numpy("sizes", torch.tensor([1.5, 2.0], dtype=torch.bfloat16))
        array([1.5, 2. ], dtype=float32)
        >>> as_numpy("rows", [[1, 2], [3]])
        Traceback (most recent call last):
        ...
        ValueError: rows must be an array of numbers, but rows[1] is [3] of shape (1,) where rows[0] has shape (2,).
    """
    if isinstance(values, np.ndarray):
        return values  # NOTE: itself, not asarray's view: a memory map stays an np.memmap (it pickles as its file)
    if isinstance(values, torch.Tensor):
        tensor = values.detach().cpu()
        try:
            return tensor.numpy()
        except TypeError:
            # NOTE: every floating dtype torch has and numpy lacks (bfloat16, float8_*) holds
            # fewer exponent and mantissa bits than float32: the widening is exact
            if tensor.is_floating_point():
                return tensor.to(torch.float32).numpy()
            if tensor.is_complex():
                return tensor.to(torch.complex64).numpy()
            raise TypeError(
                f"{name} has dtype {values.dtype}, which numpy cannot hold: convert it to an integer or float dtype."
            ) from None
    try:
        return np.asarray(values)
    except ValueError:
        found = _first_unequal_shape(name, values)
        if found is None:
            raise
        raise ValueError(f"{name} must be {expected}, but {found}.") from None
    except TypeError:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise
        # NOTE: numpy cannot read a tensor of a dtype it lacks (bfloat16) inside a sequence (a
        # list of per-item sizes): each item is read as it is alone, then the sequence of them
        items = [as_numpy(f"{name}[{position}]", item, expected) for position, item in enumerate(values)]
        return as_numpy(name, items, expected)


def tensor_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows ``index`` (a CPU ``int64`` tensor of indices in range) of ``tensor``, as ``tensor[index]`` makes them.

    Examples:
        >>> tensor_rows(torch.arange(5) * 10, torch.tensor([3, 1]))
        tensor([30, 10])
    """
    if tensor.device.type == "cpu" and tensor.layout == torch.strided:
        # NOTE: index_select makes the same rows as tensor[index], 3x to 5x faster on CPU (no
        # advanced-indexing machinery); other devices and layouts are indexed
        return torch.index_select(tensor, 0, index)
    return tensor[index]


def native_order(array: np.ndarray) -> np.ndarray:
    """``array`` in the machine's byte order: itself if it is, else a converted copy (the same numbers).

    Examples:
        >>> native_order(np.array([1, 300], dtype=">i4")).dtype.isnative
        True
    """
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _first_unequal_shape(where: str, values: Any) -> str | None:
    """Where the nested sequence ``values`` first breaks its shape (an item's shape differs from its first
    sibling's), described in words; ``None`` if it does not."""
    if isinstance(values, (str, bytes, np.ndarray, torch.Tensor)) or not isinstance(values, Sequence):
        return None
    first: tuple[int, ...] | None = None
    for position, item in enumerate(values):
        here = f"{where}[{position}]"
        try:
            shape = tuple(np.shape(item))
        except ValueError:  # the item itself breaks its shape further down
            return _first_unequal_shape(here, item)
        if first is None:
            first = shape
        elif shape != first:
            return f"{here} is {short_repr(item)} of shape {shape} where {where}[0] has shape {first}"
    return None


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters for error messages.

    Examples:
        >>> short_repr("x" * 100, limit=12)
        "'xxxxxxxx..."
    """
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
