"""Fetching a batch of indices from a dataset in as few calls as possible.

:class:`Fetcher` picks the fastest way a dataset offers, in this order:

1. ``dataset.__getitems__(indices)`` (one call per batch, the ``torch.utils.data`` hook).
   If it returns a ``list`` it is a list of samples and must have one per index; it is
   collated with ``collate_fn`` (default ``torch.utils.data.default_collate``). Any other
   return value is an already batched pytree, whose array leaves must have one row per
   index; ``collate_fn``, if given, is applied to it.
2. A tensor, a numpy array, a ``TensorDataset`` or a pytree (dict, tuple, namedtuple,
   dataclass) of tensors/arrays with a common first dimension: gathered by fancy
   indexing; non-array leaves (names, flags) are passed through unchanged. A top-level
   ``list`` is a sequence of samples, not a pytree.
3. Otherwise ``dataset[i]`` per index and ``collate_fn``: correct, but slow; warned about.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset, default_collate

from fastsab.transfer import tree_arrays, tree_leaves, tree_map_arrays

__all__ = ["Fetcher"]


def _common_rows(name: str, leaves: list[Any]) -> int:
    rows = {int(leaf.shape[0]) if leaf.ndim else -1 for leaf in leaves}
    if len(rows) != 1 or -1 in rows:
        shapes = [tuple(leaf.shape) for leaf in leaves]
        raise ValueError(f"{name} leaves must share their first dimension, got shapes {shapes!r}.")
    return rows.pop()


def _row_bytes(leaf: Any) -> int:
    size = leaf.element_size() if isinstance(leaf, torch.Tensor) else leaf.itemsize
    return size * int(np.prod(leaf.shape[1:], dtype=np.int64))


class Fetcher:
    """Fetches batches of a dataset; see the module docstring for the order of methods.

    Args:
        dataset: The dataset.
        collate_fn: Optional function that makes a batch from what was fetched.

    Attributes:
        kind: ``"getitems"``, ``"gather"`` or ``"per_item"``.
        length: Number of items of the dataset.
        row_bytes: Bytes of one item for ``"gather"`` (0 otherwise).

    Examples:
        >>> fetch = Fetcher({"x": torch.arange(10), "y": torch.arange(10) * 2}, None)
        >>> fetch.kind, fetch.length, fetch(np.array([3, 1]))
        ('gather', 10, {'x': tensor([3, 1]), 'y': tensor([6, 2])})
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any] | None) -> None:
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}.")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.row_bytes = 0
        self._source: Any = None
        if callable(getattr(dataset, "__getitems__", None)):
            self.kind = "getitems"
            self.length = _length(dataset)
            return
        source = dataset.tensors if isinstance(dataset, TensorDataset) else dataset
        # a container (not a list of samples) whose array leaves are gathered; other leaves
        # (names, flags) are kept as they are in every batch
        leaves = tree_leaves(source) if not isinstance(source, list) else [source]
        arrays = [leaf for leaf in leaves if isinstance(leaf, (torch.Tensor, np.ndarray))]
        if arrays and (len(leaves) > 1 or leaves[0] is not source or isinstance(source, (torch.Tensor, np.ndarray))):
            leaves = arrays
            self.kind = "gather"
            self.length = _common_rows("dataset", leaves)
            self._source = source
            self.row_bytes = sum(_row_bytes(leaf) for leaf in leaves)
            return
        if not callable(getattr(dataset, "__getitem__", None)):
            raise TypeError(
                "dataset must define __getitems__ or __getitem__, or be a pytree of tensors, "
                f"got {type(dataset).__name__}."
            )
        self.kind = "per_item"
        self.length = _length(dataset)
        warnings.warn(
            f"{type(dataset).__name__} has no __getitems__ and is not a tensor pytree: each batch is built "
            "with one __getitem__ call per item, which is slow. Define __getitems__(indices) for one call per batch.",
            stacklevel=3,
        )

    def take(self, indices: np.ndarray) -> Any:
        """Rows ``indices`` of a tensor pytree (``kind == "gather"``), before ``collate_fn``."""
        index = torch.from_numpy(indices)
        return tree_map_arrays(lambda x: x[indices] if isinstance(x, np.ndarray) else x[index], self._source)

    def collate(self, rows: Any) -> Any:
        """Apply ``collate_fn`` (if any) to rows from :meth:`take`."""
        return rows if self.collate_fn is None else self.collate_fn(rows)

    def __call__(self, indices: np.ndarray) -> Any:
        """The batch for ``indices`` (a 1-D int64 array)."""
        if self.kind == "gather":
            return self.collate(self.take(indices))
        if self.kind == "getitems":
            return self._getitems(indices)
        samples = [self.dataset[i] for i in indices.tolist()]
        return (self.collate_fn or default_collate)(samples)

    def _getitems(self, indices: np.ndarray) -> Any:
        name = type(self.dataset).__name__
        result = self.dataset.__getitems__(indices.tolist())
        if isinstance(result, list):
            if len(result) != len(indices):
                raise ValueError(f"{name}.__getitems__ returned {len(result)} samples for {len(indices)} indices.")
            return (self.collate_fn or default_collate)(result)
        leaves = tree_arrays(result)
        if leaves and _common_rows(f"{name}.__getitems__ result", leaves) != len(indices):
            raise ValueError(
                f"{name}.__getitems__ returned a batch of {leaves[0].shape[0]} rows for {len(indices)} indices."
            )
        return result if self.collate_fn is None else self.collate_fn(result)


def _length(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError as err:
        raise TypeError(f"dataset must have a length (__len__), got {type(dataset).__name__}.") from err
