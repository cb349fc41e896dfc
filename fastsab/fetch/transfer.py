"""Moving batch pytrees to a device.

A batch may be a tensor or any nesting of dicts, lists, tuples, namedtuples and
dataclasses holding tensors (``fastsab.fetch.pytree``); ``to_device`` moves its tensors,
and ``Transfer`` is a loader's way of doing so: the device, pinning and asynchrony it
was given, checked once. The pytree helpers ``tree_map_arrays``, ``tree_leaves`` and
``tree_arrays`` are also importable from here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from fastsab._checks import user_stacklevel
from fastsab.fetch.pytree import tree_arrays, tree_leaves, tree_map_arrays

__all__ = [
    "Transfer",
    "pin_available",
    "resolve_device",
    "to_device",
    "tree_arrays",
    "tree_leaves",
    "tree_map_arrays",
]

B = TypeVar("B")


def resolve_device(device: object) -> torch.device | None:
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
        stacklevel=user_stacklevel(),
    )


def to_device(batch: B, device: torch.device | None, *, non_blocking: bool = True, pin_memory: bool = False) -> B:
    """Move every tensor of a batch pytree to ``device`` (numpy arrays become tensors).

    Args:
        batch: A tensor or a pytree of tensors (and other leaves, kept as they are).
        device: Target device; ``None`` keeps tensors where they are (numpy stays numpy).
        non_blocking: Let host-to-device copies from pinned memory run asynchronously.
        pin_memory: Pin CPU tensors first, so ``non_blocking`` copies overlap compute. The
            caller checks ``pin_available`` (pinning needs an accelerator).

    Examples:
        >>> out = to_device({"x": torch.ones(2), "n": 3}, torch.device("cpu"))
        >>> out["x"].device, out["n"]
        (device(type='cpu'), 3)
    """
    if device is None and not pin_memory:
        return batch

    def move(leaf: torch.Tensor | np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(leaf) if isinstance(leaf, np.ndarray) else leaf
        if pin_memory and tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        if device is None:
            return tensor
        return tensor.to(device, non_blocking=non_blocking)

    moved: B = tree_map_arrays(move, batch)
    return moved


@dataclass(frozen=True)
class Transfer:
    """How a loader moves its batches: to ``device``, pinned first or not, asynchronously or not.

    Make one with ``create``, which checks the values; calling it moves a batch
    (``to_device``; without a device and pinning, the batch is returned as it is).

    Attributes:
        device: Where batches go; ``None`` leaves them where they are.
        pin_memory: Pin host memory first (only where an accelerator is available).
        non_blocking: Asynchronous host-to-device copies.

    Examples:
        >>> move = Transfer.create("cpu")
        >>> move.device, move({"x": np.arange(2)})["x"]
        (device(type='cpu'), tensor([0, 1]))
    """

    device: torch.device | None = None
    pin_memory: bool = False
    non_blocking: bool = True

    @classmethod
    def create(cls, device: str | torch.device | None, pin_memory: bool = False, non_blocking: bool = True) -> Transfer:
        """Check the values and pin only where an accelerator is available (else warn).

        Raises:
            TypeError: If ``device`` is not None, a string or a ``torch.device``, or
                ``pin_memory`` or ``non_blocking`` is not a bool.
            ValueError: If ``device`` is not a device, or its backend is unavailable.
        """
        resolved = resolve_device(device)
        for name, value in (("pin_memory", pin_memory), ("non_blocking", non_blocking)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}.")
        if pin_memory and not pin_available():
            warn_pin_unavailable()
            pin_memory = False
        return cls(resolved, pin_memory, non_blocking)

    def __call__(self, batch: B) -> B:
        """``batch`` moved (see ``to_device``)."""
        return to_device(batch, self.device, non_blocking=self.non_blocking, pin_memory=self.pin_memory)
