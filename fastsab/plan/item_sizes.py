"""Sizes one item at a time, for the bionemo paths: ``per_item_sizeof`` (a callable or a mapping),
``item_size`` (one checked size) and ``oversize_message`` (the skip warning)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fastsab._checks import as_size

__all__ = ["item_size", "oversize_message", "per_item_sizeof"]


def per_item_sizeof(sizeof: object, accepted: str) -> Callable[[Any], Any]:
    """``sizeof`` as a function of one item: a callable as it is, a mapping's lookup.

    Raises:
        TypeError: If ``sizeof`` is neither; ``accepted`` says what the caller takes.
    """
    if isinstance(sizeof, Mapping):
        return sizeof.__getitem__
    if not callable(sizeof):
        raise TypeError(f"sizeof must be {accepted}, got {type(sizeof).__name__}.")
    return sizeof


def item_size(sizeof: Callable[[Any], Any], item: Any, describe: Callable[[Any], str]) -> int | float:
    """The checked size ``sizeof(item)``: a Python number, finite and >= 0.

    Raises:
        RuntimeError: If ``sizeof`` raises (``describe(item)`` names the item).
        TypeError, ValueError: If the size is not one finite number >= 0.
    """
    try:
        size = sizeof(item)
    except Exception as err:
        raise RuntimeError(f"sizeof raised an error for {describe(item)}: {err}") from err
    kind = type(size)
    # NOTE: one cheap test per item for a plain int or float >= 0; the rest (numpy and tensor
    # numbers, bad values) gets the full check, which names the item.
    if (kind is int and size >= 0) or (kind is float and 0 <= size < math.inf):
        return size  # type: ignore[no-any-return]
    return as_size("sizeof", size, item)


def oversize_message(item: Any, size: int | float, cap: int | float) -> str:
    """The bionemo warning for an item skipped because its size alone exceeds the cap."""
    return f"Size of element {item} exceeds max_total_size ({size} > {cap}), skipping"
