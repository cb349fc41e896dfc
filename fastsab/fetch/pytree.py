"""Pytrees: batches and datasets made of containers with tensors and arrays as leaves.

Two kinds of trees are walked here:

* **Batches** (what a ``collate_fn`` or a dataset returns): any nesting of the containers of
  optree (dict, list, tuple, namedtuple, ...) and of dataclasses. ``tree_map_arrays``
  maps a function over their tensor and numpy leaves and keeps every other leaf.
* **Datasets gathered by fancy indexing** (``fastsab.fetch.fetcher``): containers matched by
  exact type only (dicts, tuples, namedtuples, dataclasses without ``__getitem__``), because
  a subclass or a list may give indexing another meaning. ``walk`` checks such a tree and
  collects its arrays; ``children`` takes one container apart.

A dataclass is rebuilt field by field on a copy, never through its ``__init__``: that would
run ``__post_init__`` again (which may transform the data a second time) and lose the values
of fields that ``__init__`` does not take.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import optree
import torch

from fastsab._arrays import short_repr

__all__ = [
    "check_holds_data",
    "children",
    "holds_nothing",
    "is_array",
    "tree_arrays",
    "tree_leaves",
    "tree_map_arrays",
    "walk",
]

D = TypeVar("D")

#: What ``tree_map_arrays`` and ``tree_arrays`` count as arrays.
ARRAY_TYPES = (torch.Tensor, np.ndarray)

# NOTE: dataset containers are matched by exact type: a subclass may change what indexing
# or iterating it means, so it is not taken apart.
_DICTS = (dict, OrderedDict, defaultdict)
# Leaves that are kept as they are in every batch: names, flags, sizes.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, np.generic)


# -- batches ------------------------------------------------------------------------------


def is_dataclass_instance(node: object) -> bool:
    """Whether ``node`` is a dataclass instance (not a dataclass type)."""
    return dataclasses.is_dataclass(node) and not isinstance(node, type)


def replace_fields(node: D, convert: Callable[[Any], Any]) -> D:
    """A shallow copy of the dataclass instance ``node`` with ``convert`` applied to every field.

    Examples:
        >>> @dataclasses.dataclass
        ... class Pair:
        ...     x: int
        ...     y: int = dataclasses.field(init=False, default=0)
        >>> pair = Pair(1)
        >>> pair.y = 5
        >>> replace_fields(pair, lambda v: v * 10)
        Pair(x=10, y=50)
    """
    out = copy.copy(node)
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        # NOTE: object.__setattr__ also sets the fields of a frozen dataclass
        object.__setattr__(out, field.name, convert(getattr(node, field.name)))
    return out


def tree_map_arrays(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every tensor and numpy array leaf of ``tree``; keep other leaves.

    Containers are those of optree (dict, list, tuple, namedtuple, ...) and dataclasses
    (rebuilt field by field, see the module docstring).

    Examples:
        >>> batch = {"x": torch.zeros(2, 3), "meta": ("id", [torch.ones(2)])}
        >>> tree_map_arrays(lambda t: t.shape[0], batch)
        {'x': 2, 'meta': ('id', [2])}
    """
    if isinstance(tree, ARRAY_TYPES):  # the common batch: one tensor
        return fn(tree)

    def visit(leaf: Any) -> Any:
        if isinstance(leaf, ARRAY_TYPES):
            return fn(leaf)
        if is_dataclass_instance(leaf):
            return replace_fields(leaf, lambda value: tree_map_arrays(fn, value))
        return leaf

    return optree.tree_map(visit, tree, is_leaf=is_dataclass_instance, none_is_leaf=True)


def tree_leaves(tree: Any) -> list[Any]:
    """All leaves of ``tree`` in traversal order, looking inside dataclasses too."""
    found: list[Any] = []
    for leaf in optree.tree_leaves(tree, is_leaf=is_dataclass_instance, none_is_leaf=True):
        if is_dataclass_instance(leaf):
            for field in dataclasses.fields(leaf):
                found += tree_leaves(getattr(leaf, field.name))
        else:
            found.append(leaf)
    return found


def tree_arrays(tree: Any) -> list[torch.Tensor | np.ndarray]:
    """The tensor and numpy array leaves of ``tree`` in traversal order."""
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, ARRAY_TYPES)]


# -- datasets gathered by fancy indexing ----------------------------------------------------


def is_array(node: object) -> bool:
    """Whether ``node`` is a tensor or an array whose rows are what fancy indexing gives."""
    # NOTE: np.matrix and masked arrays are ndarrays whose rows are not what fancy
    # indexing gives; a memmap's are
    return isinstance(node, torch.Tensor) or type(node) in (np.ndarray, np.memmap)


def is_namedtuple(node: object) -> bool:
    """Whether ``node`` is a namedtuple whose class changes neither indexing nor iterating."""
    kind = type(node)
    return (
        isinstance(node, tuple)
        and isinstance(getattr(kind, "_fields", None), tuple)
        and all(getattr(kind, name) is getattr(tuple, name) for name in ("__getitem__", "__len__", "__iter__"))
    )


def is_dataclass_tree(node: object) -> bool:
    """A dataclass instance that is a container: one that defines ``__getitem__`` is a dataset."""
    return is_dataclass_instance(node) and not hasattr(type(node), "__getitem__")


def children(node: Any) -> list[tuple[str, Any]] | None:
    """The children of a dataset container with the path step to each, or ``None`` for anything else."""
    kind = type(node)
    if kind in _DICTS:
        return [(f"[{key!r}]", value) for key, value in node.items()]
    if kind is tuple:
        return [(f"[{i}]", value) for i, value in enumerate(node)]
    if is_namedtuple(node):
        return [(f".{name}", value) for name, value in zip(kind._fields, node)]
    if is_dataclass_tree(node):
        return [(f".{field.name}", getattr(node, field.name)) for field in dataclasses.fields(node)]
    return None


def holds_nothing(node: Any) -> bool:
    """Whether ``node`` is an empty container, or a dataset container whose children all hold nothing.

    A list is a sequence of samples: it holds nothing only when it is empty.

    Examples:
        >>> holds_nothing({}), holds_nothing({"a": ((), [])}), holds_nothing([{}]), holds_nothing({"a": None})
        (True, True, False, False)
    """
    if type(node) is list:
        return not node
    parts = children(node)
    return parts is not None and all(holds_nothing(child) for _, child in parts)


def check_holds_data(dataset: Any) -> None:
    """Refuse a dataset that ``holds_nothing``, but a list: ``[]`` is a list of 0 samples.

    Raises:
        ValueError: If ``dataset`` is ``{}``, ``()`` or containers nesting only empty ones (``{"a": []}``).
    """
    # NOTE: a list is a sequence of samples, as DataLoader takes it: one filtered down to none is a
    # dataset of 0 items, as arrays of 0 rows and range(0) are
    if type(dataset) is not list and holds_nothing(dataset):
        # NOTE: read item by item it would be a dataset of len() items none of which can be read: of 0
        # items for {}, of 1 for {"a": {}}
        raise ValueError(
            f"dataset must hold data, got {short_repr(dataset)}: it holds no tensor, array or sample. A dataset is a "
            "tensor or a numpy array (its rows are the items; with 0 rows, a dataset of 0 items), a pytree of them "
            "(dict, tuple, namedtuple, dataclass) with a common first dimension, or an object with __len__ and "
            "__getitem__ or __getitems__ (a list of samples, a torch Dataset)."
        )


def walk(node: Any, path: str, arrays: list[Any]) -> str | None:
    """Collect the array leaves of a dataset tree into ``arrays``.

    Returns:
        ``None`` if ``node`` holds only containers (``children``), arrays
        (``is_array``) and plain leaves, else the path and type of the first node that
        is none of these.

    Examples:
        >>> arrays = []
        >>> walk({"x": torch.zeros(2), "name": "a"}, "dataset", arrays), len(arrays)
        (None, 1)
        >>> walk((torch.zeros(2), [1, 2]), "dataset", [])
        'dataset[1] is a list'
    """
    if is_array(node):
        arrays.append(node)
        return None
    parts = children(node)
    if parts is None:
        return None if isinstance(node, _PLAIN) else f"{path} is a {type(node).__name__}"
    for step, child in parts:
        problem = walk(child, path + step, arrays)
        if problem is not None:
            return problem
    return None
