"""Moving batch pytrees to a device with optree.

A batch may be a tensor or any nesting of dicts, lists, tuples, namedtuples and
dataclasses holding tensors; :func:`tree_map_arrays` maps a function over its tensor and
numpy leaves and keeps everything else, and :func:`to_device` moves the tensors.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import optree
import torch

__all__ = ["pin_available", "resolve_device", "to_device", "tree_map_arrays"]


def _is_dataclass_instance(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def tree_map_arrays(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every tensor and numpy array leaf of ``tree``; keep other leaves.

    Containers are those of optree (dict, list, tuple, namedtuple, ...) and dataclasses.

    Examples:
        >>> batch = {"x": torch.zeros(2, 3), "meta": ("id", [torch.ones(2)])}
        >>> tree_map_arrays(lambda t: t.shape[0], batch)
        {'x': 2, 'meta': ('id', [2])}
    """

    def visit(leaf: Any) -> Any:
        if isinstance(leaf, (torch.Tensor, np.ndarray)):
            return fn(leaf)
        if _is_dataclass_instance(leaf):
            changes = {f.name: tree_map_arrays(fn, getattr(leaf, f.name)) for f in dataclasses.fields(leaf) if f.init}
            return dataclasses.replace(leaf, **changes)
        return leaf

    return optree.tree_map(visit, tree, is_leaf=_is_dataclass_instance, none_is_leaf=True)


def tree_leaves(tree: Any) -> list[Any]:
    """All leaves of ``tree`` in traversal order, looking inside dataclasses too."""
    found: list[Any] = []
    for leaf in optree.tree_leaves(tree, is_leaf=_is_dataclass_instance, none_is_leaf=True):
        if _is_dataclass_instance(leaf):
            for field in dataclasses.fields(leaf):
                found += tree_leaves(getattr(leaf, field.name))
        else:
            found.append(leaf)
    return found


def tree_arrays(tree: Any) -> list[Any]:
    """The tensor and numpy array leaves of ``tree`` in traversal order."""
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, (torch.Tensor, np.ndarray))]


def resolve_device(device: Any) -> torch.device | None:
    """Validate ``device`` (None, a string or a ``torch.device``) and return it.

    Raises:
        TypeError: If ``device`` is not None, a string or a ``torch.device``.
        ValueError: If the string is not a device, or the device's backend is unavailable.

    Examples:
        >>> resolve_device("cpu")
        device(type='cpu')
        >>> resolve_device("gpu")
        Traceback (most recent call last):
        ...
        ValueError: device 'gpu' is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1', 'mps').
    """
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be None, a string or a torch.device, got {type(device).__name__}.")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1', 'mps').") from err
    if resolved.type != "cpu":
        module = getattr(torch, resolved.type, None)
        available = getattr(module, "is_available", None)
        if available is None or not available():
            raise ValueError(f"device {device!r} was requested but torch.{resolved.type} is not available here.")
        count = getattr(module, "device_count", None)
        if resolved.index is not None and count is not None and resolved.index >= count():
            raise ValueError(f"device {device!r} was requested but only {count()} {resolved.type} devices exist.")
    return resolved


def pin_available() -> bool:
    """Whether pinned (page-locked) host memory can be used: it needs an accelerator."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def warn_pin_unavailable() -> None:
    """Warn that ``pin_memory=True`` has no effect without an accelerator (as DataLoader does)."""
    warnings.warn(
        "pin_memory=True has no effect: no accelerator is available, so batches stay in pageable memory.",
        stacklevel=3,
    )


def to_device(batch: Any, device: torch.device | None, *, non_blocking: bool = True, pin_memory: bool = False) -> Any:
    """Move every tensor of a batch pytree to ``device`` (numpy arrays become tensors).

    Args:
        batch: A tensor or a pytree of tensors (and other leaves, kept as they are).
        device: Target device; ``None`` keeps tensors where they are (numpy stays numpy).
        non_blocking: Let host-to-device copies from pinned memory run asynchronously.
        pin_memory: Pin CPU tensors first, so ``non_blocking`` copies overlap compute. The
            caller checks :func:`pin_available` (pinning needs an accelerator).

    Examples:
        >>> out = to_device({"x": torch.ones(2), "n": 3}, torch.device("cpu"))
        >>> out["x"].device, out["n"]
        (device(type='cpu'), 3)
    """
    if device is None and not pin_memory:
        return batch

    def move(leaf: Any) -> Any:
        tensor = torch.from_numpy(leaf) if isinstance(leaf, np.ndarray) else leaf
        if pin_memory and tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        if device is None:
            return tensor
        return tensor.to(device, non_blocking=non_blocking)

    return tree_map_arrays(move, batch)
