"""The samples of an ``OutOfCoreDataset``: their layout, its checks, the arrays chunks are made of.

Every sample must have the structure (the keys and nesting of its pytree), and per leaf the
shape and dtype, of the first sample the dataset read: ``Layout`` holds that first
sample's, ``check_sample`` compares another against it. Dtypes must match exactly: a
sample is not cast, not even safely (``int32`` into an ``int64`` chunk).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import optree
import torch

__all__ = ["Layout", "as_numpy", "check_dtypes", "check_sample", "check_torch_dtype", "empty_array", "empty_batch"]


class Layout(NamedTuple):
    """The structure of a sample and the shape and dtype of each of its leaves."""

    spec: Any  # optree.PyTreeSpec
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype[Any]]

    @classmethod
    def of(cls, spec: Any, arrays: list[np.ndarray]) -> Layout:
        """The layout of a sample flattened to ``spec`` and ``arrays``."""
        return cls(spec, [a.shape for a in arrays], [a.dtype for a in arrays])


def check_dtypes(spec: Any, arrays: list[np.ndarray], where: str) -> None:
    """Raise if a leaf of a sample (flattened to ``spec`` and ``arrays``) has a dtype a torch tensor cannot hold.

    Args:
        spec: The sample's structure.
        arrays: Its leaves, as arrays.
        where: What gave the sample, to start a message (``"read_input(3) gave a sample"``).
    """
    for path, a in zip(spec.paths(), arrays):
        check_torch_dtype(a.dtype, f"{where} of dtype {a.dtype}{_at(path)}")


def check_sample(layout: Layout, spec: Any, arrays: list[np.ndarray], where: Callable[[], str]) -> None:
    """Raise if a sample (flattened to ``spec`` and ``arrays``) does not have ``layout``.

    ``where()`` names what gave the sample, to start a message.

    Raises:
        ValueError: If its structure or a leaf's shape differs from ``layout``'s.
        TypeError: If a leaf's dtype differs from ``layout``'s (samples are not cast).
    """
    if spec == layout.spec and all(
        a.shape == shape and a.dtype == dtype for a, shape, dtype in zip(arrays, layout.shapes, layout.dtypes)
    ):
        return
    subject = where()
    if spec != layout.spec:
        raise ValueError(
            f"{subject} of structure {spec}; the first sample's is {layout.spec}: every sample must have the same "
            "keys and nesting."
        )
    for path, a, shape, dtype in zip(spec.paths(), arrays, layout.shapes, layout.dtypes):
        at = _at(path)
        if a.shape != shape:
            raise ValueError(f"{subject} of shape {a.shape}{at}; the first sample's is {shape}.")
        if a.dtype != dtype:
            raise TypeError(
                f"{subject} of dtype {a.dtype}{at}; the first sample's is {dtype}: samples are not cast, "
                "read_input must give every sample the same dtypes."
            )


def check_torch_dtype(dtype: np.dtype[Any], subject: str) -> None:
    """Raise a TypeError, starting with ``subject``, if a torch tensor cannot hold values of ``dtype``."""
    try:
        torch.from_numpy(np.empty(0, dtype))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{subject}, which a torch tensor cannot hold: values must be bools, integers, floats or complex "
            "numbers in the machine's byte order."
        ) from err


def empty_batch(layout: Layout) -> Any:
    """A batch of no samples of ``layout``: a pytree of tensors with a first dimension of 0."""
    empty = [torch.from_numpy(np.empty((0, *shape), dtype)) for shape, dtype in zip(layout.shapes, layout.dtypes)]
    return optree.tree_unflatten(layout.spec, empty)


def empty_array(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialized array; large ones in their own anonymous mapping.

    NOTE: a chunk freed from the C heap often stays in the process (the allocator keeps
    it for reuse), so the resident set would creep past the budget; a mapping of its own
    goes back to the system as soon as the chunk is dropped.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < 2**20:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def as_numpy(leaf: Any, where: Callable[[], str]) -> np.ndarray:
    """A leaf of a sample (a tensor, an array or a number) as a numpy array; ``where`` names the sample.

    Raises:
        TypeError: If the leaf is a tensor of a dtype numpy lacks (bfloat16): chunks are numpy arrays.
    """
    if not isinstance(leaf, torch.Tensor):
        return np.asarray(leaf)
    try:
        return leaf.detach().cpu().numpy()
    except TypeError as err:
        raise TypeError(
            f"{where()} with a tensor of dtype {leaf.dtype}, which numpy cannot hold, and the chunks of an "
            "OutOfCoreDataset are numpy arrays. Return it as float32 (which holds every bfloat16 value exactly) "
            "and cast the batch where it is used, e.g. batch.to(torch.bfloat16)."
        ) from err


def _at(path: tuple[Any, ...]) -> str:
    """Where a leaf is in a sample, for messages: nothing for a sample that is one array."""
    return f" at {path!r}" if path else ""
