"""Fetching a batch of indices from a dataset in as few calls as possible.

``Fetcher`` picks the fastest way a dataset offers, in this order:

1. ``dataset.__getitems__(indices)`` (one call per batch, the ``torch.utils.data`` hook).
   If it returns a ``list`` it is a list of samples and must have one per index; it is
   collated with ``collate_fn`` (default ``torch.utils.data.default_collate``). Any other
   return value is an already batched pytree, whose array leaves must have one row per
   index, or a packed batch of sequences (a dict with a 1-D ``cu_seqlens``, as
   ``PackCollator`` makes), whose ``cu_seqlens`` must have one entry
   per index and one more; ``collate_fn``, if given, is applied to it.
   A dataset whose ``__getitems__`` only gathers from memory (index arithmetic and copies,
   no I/O, no waiting) says so with a true ``getitems_in_memory`` attribute (a class
   attribute, or a property): its batches are then made in the loop's thread, since a
   hand-off to a prefetch thread costs more than such a gather (see ``Fetcher.in_memory``).
2. Data whose rows are what indexing it gives, gathered by fancy indexing: a tensor, a
   numpy array, a ``TensorDataset`` whose class changes neither ``__getitem__`` nor
   ``__len__``, or a pytree of tensors/arrays with a common first dimension. The pytree
   containers are dicts, tuples, namedtuples and dataclasses that do not define
   ``__getitem__`` (a dataclass field by field, without calling ``__init__`` or
   ``__post_init__`` again); other leaves (names, flags: ``None``, numbers, strings) are
   passed through unchanged. A pytree holding a list or any other object is refused: a
   ``list`` is a sequence of samples, not a container, and a class defining
   ``__getitem__`` is a dataset, whose items need not be rows of its tensors.
3. Otherwise ``dataset[i]`` per index and ``collate_fn``: correct, but slow; warned about.
An empty container is refused (``check_holds_data``); arrays of 0 rows and ``[]`` (a list of 0
samples) are a dataset of 0 items.

Indices are checked: every one must be in ``[0, len(dataset))`` (negative indices do not
count from the end).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset, default_collate

from fastsab._arrays import tensor_rows
from fastsab._checks import short_repr, user_stacklevel
from fastsab.fetch.pytree import check_holds_data, tree_arrays, tree_map_arrays
from fastsab.fetch.pytree import children as _children
from fastsab.fetch.pytree import is_array as _is_array
from fastsab.fetch.pytree import is_dataclass_tree as _is_dataclass_tree  # noqa: F401  # an older import path
from fastsab.fetch.pytree import is_namedtuple as _is_namedtuple  # noqa: F401  # an older import path
from fastsab.fetch.pytree import walk as _walk

__all__ = ["Fetcher", "GatheredRows", "UnequalSamplesError", "collate_batch", "getitems_in_memory", "indexable"]


class UnequalSamplesError(ValueError, RuntimeError):
    """Samples of different shapes that the default ``collate_fn`` cannot stack into one batch.

    A ``ValueError`` (the house rule for bad values) that is also the ``RuntimeError`` torch's
    ``default_collate`` raises, so code written for a ``DataLoader`` keeps working.
    """


class Fetcher:
    """Fetches batches of a dataset; see the module docstring for the order of methods.

    Args:
        dataset: The dataset.
        collate_fn: Optional function that makes a batch from what was fetched.

    Attributes:
        kind: ``"getitems"``, ``"gather"`` or ``"per_item"``.
        in_memory: Whether a batch is an in-memory gather: ``"gather"``, or ``"getitems"`` of a
            dataset declaring ``getitems_in_memory = True``. The loaders prefetch in a thread
            by default only where this is false.
        length: Number of items of the dataset.
        row_bytes: Bytes of one item for ``"gather"`` (0 otherwise).

    Raises:
        TypeError: If the dataset can be neither indexed nor gathered, is a pytree with a
            list or another object among its containers, or has a ``getitems_in_memory``
            that is not a bool.
        ValueError: If the arrays of a gathered dataset do not share their first dimension, or
            the dataset holds nothing (``{}``, ``()``, containers nesting only empty ones; ``[]`` is a
            list of 0 samples).

    Examples:
        >>> fetch = Fetcher({"x": torch.arange(10), "y": torch.arange(10) * 2}, None)
        >>> fetch.kind, fetch.in_memory, fetch.length, fetch(np.array([3, 1]))
        ('gather', True, 10, {'x': tensor([3, 1]), 'y': tensor([6, 2])})
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any] | None) -> None:
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}.")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.row_bytes = 0
        self._source: Any = None
        self._items: Any = getattr(dataset, "fetch_ids", None)  # (a Mixture's ids name their source epoch too)
        self.in_memory = False
        if callable(getattr(dataset, "__getitems__", None)):
            self.kind = "getitems"
            self.length = _length(dataset)
            self.in_memory = getitems_in_memory(dataset)
            return
        source, arrays = _gather_source(dataset)
        if source is not None:
            self.kind = "gather"
            self.in_memory = True
            self.length = _common_rows("dataset", arrays)
            self._source = source
            self.row_bytes = sum(_row_bytes(leaf) for leaf in arrays)
            return
        if not callable(getattr(dataset, "__getitem__", None)):
            raise TypeError(
                "dataset must define __getitems__ or __getitem__, or be a pytree of tensors, "
                f"got {type(dataset).__name__}."
            )
        self.kind = "per_item"
        self.length = _length(dataset)
        if not self.length:  # (no item is read: no advice about slow reads)
            return
        name = type(dataset).__name__
        # NOTE: advising __getitems__ alone misleads: one that loops over the indices is as slow
        warnings.warn(
            f"dataset {name} is read item by item: each batch calls {name}.__getitem__ once per sample, in Python, "
            "which is slow. Tensors, numpy arrays, pytrees of them and fastsab.RaggedDataset (variable-length "
            "sequences) are gathered a batch at a time without per-item Python: pass the data in one of these forms. "
            "A __getitems__(indices) method helps only if it reads the whole batch at once (a gather, one read), "
            "not if it loops over the indices.",
            stacklevel=user_stacklevel(),
        )

    def take(self, indices: Any) -> Any:
        """Rows ``indices`` of a tensor pytree (``kind == "gather"``), before ``collate_fn``."""
        return self._gather(check_indices(indices, self.length))

    def collate(self, rows: Any) -> Any:
        """Apply ``collate_fn`` (if any) to rows from ``take``."""
        return rows if self.collate_fn is None else self.collate_fn(rows)

    def __call__(self, indices: Any) -> Any:
        """The batch for ``indices`` (a 1-D array or sequence of integers in ``[0, length)``).

        Raises:
            TypeError: If ``indices`` are not integers.
            ValueError: If ``indices`` is not one-dimensional.
            IndexError: If an index is negative or not less than ``length``.
        """
        index = check_indices(indices if self._items is None else self._items(np.asarray(indices)), self.length)
        if self.kind == "gather":
            return self.collate(self._gather(index))
        if self.kind == "getitems":  # (a Mixture reads its ids itself: they name the source epoch read in)
            return self._getitems(index if self._items is None else np.asarray(indices, dtype=np.int64))
        samples = [self.dataset[i] for i in index.tolist()]
        return (self.collate_fn or collate_batch)(samples)

    def _gather(self, index: np.ndarray) -> Any:
        tensor_index = torch.from_numpy(index)
        return tree_map_arrays(lambda x: _rows(x, index, tensor_index), self._source)

    def _getitems(self, indices: np.ndarray) -> Any:
        name = type(self.dataset).__name__
        result = self.dataset.__getitems__(indices.tolist())
        if isinstance(result, list):
            if len(result) != len(indices):
                raise ValueError(f"{name}.__getitems__ returned {len(result)} samples for {len(indices)} indices.")
        elif _is_packed(result):
            sequences = len(result["cu_seqlens"]) - 1
            if sequences != len(indices):
                raise ValueError(
                    f"{name}.__getitems__ returned a packed batch of {sequences} sequences (len(cu_seqlens) - 1) "
                    f"for {len(indices)} indices."
                )
        else:
            leaves = _result_arrays(result)
            if leaves and _common_rows(f"{name}.__getitems__ result", leaves) != len(indices):
                raise ValueError(
                    f"{name}.__getitems__ returned a batch of {leaves[0].shape[0]} rows for {len(indices)} indices."
                )
        return (self.collate_fn or collate_batch)(result)


def getitems_in_memory(dataset: Any) -> bool:
    """Whether ``dataset`` declares its ``__getitems__`` an in-memory gather (``getitems_in_memory``).

    Raises:
        TypeError: If ``getitems_in_memory`` is set to something other than a bool.

    Examples:
        >>> class Rows:
        ...     getitems_in_memory = True
        >>> getitems_in_memory(Rows()), getitems_in_memory([1, 2])
        (True, False)
    """
    declared = getattr(dataset, "getitems_in_memory", False)
    # NOTE: a bool only: a truthy object (a method, a string) would switch the prefetch thread
    # off by accident
    if not isinstance(declared, (bool, np.bool_)):
        raise TypeError(
            f"{type(dataset).__name__}.getitems_in_memory must be True or False, got {short_repr(declared)} "
            f"of type {type(declared).__name__}."
        )
    return bool(declared)


def _result_arrays(result: Any) -> list[Any]:
    """The array leaves of a batch a dataset returned, to check their rows."""
    # NOTE: a plain dict of tensors (a padded batch of sequences) needs no walk of the tree; its
    # leaves in the order the tree walk gives them (sorted keys), so that messages are the same
    if type(result) is dict and all(type(value) is torch.Tensor for value in result.values()):
        try:
            return [result[key] for key in sorted(result)]
        except TypeError:  # keys that do not sort
            pass
    return tree_arrays(result)


def _is_packed(result: Any) -> bool:
    """Whether ``result`` is a packed batch: a dict with a 1-D ``cu_seqlens`` (see ``fastsab.varlen.collate``)."""
    cu_seqlens = result.get("cu_seqlens") if isinstance(result, dict) else None
    return isinstance(cu_seqlens, (torch.Tensor, np.ndarray)) and cu_seqlens.ndim == 1 and len(cu_seqlens) >= 1


class GatheredRows:
    """A pytree dataset as a map-style dataset whose ``__getitems__`` gathers rows with a ``Fetcher``.

    A ``DataLoader`` indexes its dataset with ``__getitems__`` (or ``dataset[i]``); a dict or a
    tuple of tensors would answer with its keys or fields. Through this view it reads the
    rows a loader reads, uncollated (the ``DataLoader``'s ``collate_fn`` collates them).

    Args:
        dataset: A pytree of tensors/arrays with a common first dimension.

    Examples:
        >>> rows = GatheredRows({"x": torch.arange(5) * 10})
        >>> len(rows), rows.__getitems__([4, 0])
        (5, {'x': tensor([40,  0])})
    """

    #: Its ``__getitems__`` gathers rows of in-memory arrays (see ``getitems_in_memory``).
    getitems_in_memory = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._fetcher = Fetcher(dataset, None)

    def __len__(self) -> int:
        return self._fetcher.length

    def __getitems__(self, indices: Any) -> Any:
        """The rows ``indices`` of every array leaf, as ``Fetcher.take`` gathers them."""
        return self._fetcher.take(indices)


def indexable(dataset: Any) -> Any:
    """``dataset`` as a ``DataLoader`` reads it: data the loaders gather as ``GatheredRows``.

    Tensors, numpy arrays, a plain ``TensorDataset`` and pytrees of them are gathered, so that
    batches and what ``collate_fn`` receives are the loader's (a numpy batch stays numpy, a
    ``TensorDataset`` batch a tuple); datasets of their own are returned unchanged.
    """
    if _gather_source(dataset)[0] is None:
        return dataset
    return GatheredRows(dataset)


def collate_batch(fetched: Any) -> Any:
    """Collate what a dataset returned for a batch: a list of samples, or a batch already.

    A list (``__getitem__`` per index, or ``__getitems__`` following the
    ``torch.utils.data`` contract) is collated with ``default_collate``; anything else,
    such as the batch ``OutOfCoreDataset`` returns, is passed through. The
    default ``collate_fn`` of the fast loaders and of ``loader.data_loader()``; pass it to a
    ``DataLoader`` of your own over such a dataset.

    Raises:
        UnequalSamplesError: If the samples have different shapes (variable-length sequences),
            which ``default_collate`` cannot stack: the message keeps torch's and names the
            collators that batch such samples.

    Examples:
        >>> collate_batch([torch.tensor([1]), torch.tensor([2])]).tolist()
        [[1], [2]]
        >>> collate_batch(torch.tensor([[1], [2]])).tolist()
        [[1], [2]]
    """
    if not isinstance(fetched, list):
        return fetched
    try:
        return default_collate(fetched)
    except RuntimeError as err:
        # NOTE: torch's texts for tensors ("stack expects each tensor to be equal size") and for
        # lists ("each element in list of batch should be of equal size"); other errors are not ours
        if "equal size" not in str(err):
            raise
        raise UnequalSamplesError(
            "the default collate_fn (torch's default_collate) cannot stack samples of different shapes into "
            f"one batch: {err}. For variable-length sequences, give each sample as a dict of per-token values "
            '(e.g. {"input_ids": tensor}) and pass '
            "collate_fn=fastsab.PadCollator() (a (B, L) batch with an attention_mask) or "
            "collate_fn=fastsab.PackCollator() (the tokens as one (T,) row with cu_seqlens); "
            "for the fast path, store the sequences as a fastsab.RaggedDataset, gathered without per-item Python."
        ) from err


# -- which datasets are gathered ------------------------------------------------------


def _is_plain_tensor_dataset(dataset: Any) -> bool:
    """A ``TensorDataset`` whose items are rows of its tensors (its class changes no indexing)."""
    kind = type(dataset)
    return isinstance(dataset, TensorDataset) and all(
        getattr(kind, name, None) is getattr(TensorDataset, name, None)
        for name in ("__getitem__", "__len__", "__getitems__")
    )


def _rows(leaf: Any, index: np.ndarray, tensor_index: torch.Tensor) -> Any:
    """Rows ``index`` of an array leaf (``tensor_index``: the same indices as a CPU tensor)."""
    if isinstance(leaf, np.ndarray):
        return leaf[index]
    return tensor_rows(leaf, tensor_index)


def _gather_source(dataset: Any) -> tuple[Any, list[Any]]:
    """The pytree whose rows are the items of ``dataset`` and its arrays, or ``(None, [])``.

    Raises:
        TypeError: If ``dataset`` is a pytree container holding arrays and a list or
            another object that is not a plain leaf.
        ValueError: If ``dataset`` holds nothing (see ``check_holds_data``).
    """
    check_holds_data(dataset)
    if _is_plain_tensor_dataset(dataset):
        arrays: list[Any] = []
        plain = _walk(dataset.tensors, "dataset.tensors", arrays) is None and arrays
        return (dataset.tensors, arrays) if plain else (None, [])
    if not _is_array(dataset) and _children(dataset) is None:
        return None, []
    arrays = []
    problem = _walk(dataset, "dataset", arrays)
    if not arrays:
        return None, []  # e.g. a tuple of samples that are not arrays: indexed item by item
    if problem is not None:
        raise TypeError(
            f"{problem}, which is not a tensor, an array or a pytree container (dict, tuple, namedtuple, "
            "dataclass without __getitem__): a pytree dataset may hold only these and plain leaves (None, numbers, "
            "strings); a list is a sequence of samples. Use tuples, or give the dataset __getitems__(indices)."
        )
    return dataset, arrays


# -- checks ----------------------------------------------------------------------------


def check_indices(indices: Any, length: int) -> np.ndarray:
    """``indices`` as a 1-D int64 array, each in ``[0, length)``."""
    index = np.asarray(indices)
    if index.dtype.kind not in "iu":
        if index.size:
            raise TypeError(f"indices must be an array of integers, got dtype {index.dtype}: {index!r}.")
        index = index.astype(np.int64)  # an empty list is a float array
    if index.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, got shape {index.shape}: {index!r}.")
    if index.size:
        low, high = index.min(), index.max()
        if low < 0 or high >= length:
            bad = low if low < 0 else high
            raise IndexError(
                f"index {bad} is out of range for a dataset of {length} items: indices must be in [0, {length})."
            )
    return index.astype(np.int64, copy=False)


def _common_rows(name: str, leaves: list[Any]) -> int:
    shapes = [tuple(leaf.shape) for leaf in leaves]
    if any(not shape for shape in shapes):
        raise ValueError(f"{name} must have a first dimension to index its items, got shapes {shapes!r}.")
    rows = {shape[0] for shape in shapes}
    if len(rows) != 1:
        raise ValueError(f"{name} leaves must share their first dimension, got shapes {shapes!r}.")
    return int(rows.pop())


def _row_bytes(leaf: Any) -> int:
    size = leaf.element_size() if isinstance(leaf, torch.Tensor) else leaf.itemsize
    return size * int(np.prod(leaf.shape[1:], dtype=np.int64))


def _length(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError as err:
        raise TypeError(
            f"dataset must have a length (__len__), got {type(dataset).__name__} without one: the loaders plan whole "
            "epochs by index (which indices form which batch), so they need len(dataset) and dataset[i]. For an "
            "iterable or a stream, batch it with fastsab.size_aware_batching(iterable, sizeof, max_total_size); "
            "for WebDataset shards, use fastsab.integrations.webdataset.size_aware_batched."
        ) from err
