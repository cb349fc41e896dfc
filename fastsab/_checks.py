"""Argument checks shared by the public API: clear errors that name the argument and value."""

from __future__ import annotations

import argparse
import math
import os
import sys
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastsab._arrays import as_numpy, short_repr

__all__ = [
    "NotANumberError",
    "NotASingleNumberError",
    "NotAnIntegerError",
    "as_cost_array",
    "as_numeric_array",
    "as_python_number",
    "as_real_array",
    "as_real_number",
    "as_size",
    "check_choice",
    "check_nonnegative_int",
    "check_nonnegative_real",
    "check_optional_positive_int",
    "check_positive_int",
    "check_positive_real",
    "positive_int_argument",
    "short_repr",
    "user_stacklevel",
]

#: The package's folder: frames of files under it are fastsab's, not the user's.
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

#: Frames skipped to reach the user's line: fastsab's, and torch.utils.data's (a DataLoader
#: iterating a fastsab sampler, as ``loader.data_loader()`` makes, calls fastsab from there).
_NOT_USERS = (_PACKAGE, os.path.join(os.path.dirname(os.path.abspath(torch.utils.data.__file__)), ""))


class NotANumberError(TypeError, ValueError):
    """A size or budget that is not a number at all.

    A ``TypeError`` (the house rule for wrong types) that is also a ``ValueError``: bionemo's
    samplers raise ``ValueError`` for a non-numeric ``max_total_size``, and code written for
    them keeps working.
    """


class NotAnIntegerError(TypeError, ValueError):
    """A count or width that is not an integer (``2.0``, ``"3"``, ``None``).

    A ``TypeError`` (the house rule for wrong types) that is also a ``ValueError``: bionemo's
    ``create_buckets`` raises ``ValueError`` for a ``max_width`` or ``min_bucket_count`` that
    is not an ``int``, and code written for it keeps working.
    """


class NotASingleNumberError(TypeError, ValueError, RuntimeError):
    """A size given as a tensor or array of several numbers instead of one number.

    A ``TypeError`` (the house rule for wrong types) that is also the ``RuntimeError`` (torch)
    and the ``ValueError`` (numpy) that bionemo's batching runs into when it compares such a
    size with the budget, so code written for it keeps working.
    """


def user_stacklevel() -> int:
    """The ``stacklevel`` at which a warning points at the user's line: the first frame not fastsab's.

    Frames of torch.utils.data are skipped too (a DataLoader calling a fastsab sampler).

    Pass it as ``warnings.warn(message, stacklevel=user_stacklevel())`` in the function that warns;
    with no frame outside the package (a thread of its own), the warning points at that function.
    """
    # NOTE: Python 3.12's warnings.warn(skip_file_prefixes=...) does this; 3.10 and 3.11 lack it
    frame = sys._getframe(1)
    level = 1
    while frame.f_code.co_filename.startswith(_NOT_USERS):
        if frame.f_back is None:
            return 1
        frame, level = frame.f_back, level + 1
    return level


def check_optional_positive_int(name: str, value: Any) -> int | None:
    """``None``, or ``value`` checked by ``check_positive_int``."""
    return None if value is None else check_positive_int(name, value)


def check_positive_int(name: str, value: Any, *, error: type[TypeError] = TypeError) -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 1, else raise.

    ``error`` is the ``TypeError`` subclass raised for a value that is not an integer
    (e.g. ``NotAnIntegerError``).

    Examples:
        >>> check_positive_int("batch_size", 3)
        3
        >>> check_positive_int("batch_size", 0)
        Traceback (most recent call last):
        ...
        ValueError: batch_size must be a positive integer, got 0.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise error(f"{name} must be an integer, got {value!r} of type {type(value).__name__}.")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def check_nonnegative_int(name: str, value: Any) -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 0, else raise.

    Examples:
        >>> check_nonnegative_int("epoch", -1)
        Traceback (most recent call last):
        ...
        ValueError: epoch must be a non-negative integer, got -1.
    """
    if isinstance(value, bool) or not isinstance(value, (Integral, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}.")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    return int(value)


def as_python_number(value: Any) -> Any:
    """A size returned as a tensor or numpy scalar, as a Python number; anything else as it is."""
    return value.item() if isinstance(value, (torch.Tensor, np.ndarray, np.generic)) else value


def as_size(name: str, value: Any, element: Any) -> int | float:
    """Check one size given by the function ``name`` for ``element``; return it as a Python number.

    A size is a finite real number >= 0: a Python ``int`` or ``float``, a numpy number, or a
    tensor or array holding one number. Booleans are refused, as in ``as_numeric_array``.

    Raises:
        TypeError: If ``value`` is not a real number or holds more than one number.
        ValueError: If ``value`` is NaN, infinite or negative.

    Examples:
        >>> as_size("sizeof", np.float32(0.5), "a")
        0.5
        >>> as_size("sizeof", -1, "a")
        Traceback (most recent call last):
        ...
        ValueError: sizeof must return a finite number >= 0, got -1 for the element 'a'.
    """
    number = value
    if isinstance(number, (torch.Tensor, np.ndarray)):
        count = number.numel() if isinstance(number, torch.Tensor) else number.size
        if count != 1:
            raise NotASingleNumberError(
                f"{name} must return a single number, got {short_repr(number)} of shape {tuple(number.shape)} "
                f"for the element {short_repr(element)}."
            )
        number = number.item()
    elif isinstance(number, np.generic):
        number = number.item()
    if isinstance(number, bool) or not isinstance(number, Real):
        raise TypeError(
            f"{name} must return a real number, got {short_repr(number)} of type {type(number).__name__} "
            f"for the element {short_repr(element)}."
        )
    number = int(number) if isinstance(number, Integral) else float(number)
    if not (number >= 0 and (isinstance(number, int) or math.isfinite(number))):
        raise ValueError(
            f"{name} must return a finite number >= 0, got {short_repr(number)} for the element {short_repr(element)}."
        )
    return number


def check_positive_real(name: str, value: Any) -> int | float:
    """Return ``value`` if it is a finite real number > 0, else raise.

    Integers stay integers (so integer budgets compare exactly).

    Examples:
        >>> check_positive_real("max_total_size", 2.5)
        2.5
        >>> check_positive_real("max_total_size", -1)
        Traceback (most recent call last):
        ...
        ValueError: max_total_size must be a positive finite number, got -1.
    """
    number = as_real_number(name, value)
    if not (_is_finite(number) and number > 0):
        raise ValueError(f"{name} must be a positive finite number, got {number!r}.")
    return number


def check_nonnegative_real(name: str, value: Any) -> int | float:
    """Return ``value`` if it is a finite real number >= 0, else raise.

    Integers stay integers (so integer budgets compare exactly). A budget of 0 is allowed:
    items of size 0 fit it.

    Examples:
        >>> check_nonnegative_real("max_total_size", 0)
        0
        >>> check_nonnegative_real("max_total_size", -0.5)
        Traceback (most recent call last):
        ...
        ValueError: max_total_size must be a finite number >= 0, got -0.5.
    """
    number = as_real_number(name, value)
    if not (_is_finite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {number!r}.")
    return number


def as_real_number(name: str, value: Any) -> int | float:
    """``value`` as a Python ``int`` or ``float``; raise ``NotANumberError`` if it is no real number."""
    if isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise NotANumberError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}.")
    return int(value) if isinstance(value, Integral) else float(value)


def _is_finite(value: int | float) -> bool:
    # NOTE: math.isfinite would overflow for ints past 1e308
    return isinstance(value, int) or math.isfinite(value)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError``.

    Examples:
        >>> check_choice("cost", "max", ("sum", "padded"))
        Traceback (most recent call last):
        ...
        ValueError: cost must be one of 'sum', 'padded', got 'max'.
    """
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
    return choices[choices.index(value)]


def as_numeric_array(name: str, values: Any, *, ndim: tuple[int, ...] = (1,)) -> np.ndarray:
    """Convert per-item sizes or costs to a validated int64 or float64 numpy array.

    Accepts numpy arrays, torch tensors (any device) and sequences of numbers. Integer
    input becomes ``int64`` (exact sums), floating input ``float64``. Booleans, complex and
    non-numeric values raise ``TypeError``; NaN, infinity and negative values raise
    ``ValueError`` naming the first offending position.

    Examples:
        >>> as_numeric_array("sizes", [3, 1, 2])
        array([3, 1, 2])
        >>> as_numeric_array("sizes", [1.0, float("nan")])
        Traceback (most recent call last):
        ...
        ValueError: sizes must be finite, got nan at position 1.
    """
    return as_cost_array(name, values, ndim=ndim)[0]


def as_cost_array(name: str, values: Any, *, ndim: tuple[int, ...] = (1,)) -> tuple[np.ndarray, int | None]:
    """``as_numeric_array``, and for integers a bound at or above every value (``None`` for floats).

    Examples:
        >>> as_cost_array("costs", [3, 1, 2])
        (array([3, 1, 2]), 3)
        >>> as_cost_array("costs", [5, -1])
        Traceback (most recent call last):
        ...
        ValueError: costs must be non-negative, got -1 at position 1.
    """
    array = _as_real_numpy(name, values, ndim)
    if not array.size or array.dtype != np.int64:
        if array.size and array.min() < 0:
            _refuse_negative(name, array)
        return array, None
    # NOTE: one pass gives both checks: the bitwise or of int64 values is negative iff one of them
    # is, and otherwise at least as large as each (it holds all their bits)
    bound = int(np.bitwise_or.reduce(array, axis=None))
    if bound < 0:
        _refuse_negative(name, array)
    return array, bound


def _refuse_negative(name: str, array: np.ndarray) -> None:
    """Raise the error naming the first smallest (negative) value of ``array``."""
    pos = tuple(int(i) for i in np.unravel_index(int(np.argmin(array)), array.shape))
    raise ValueError(f"{name} must be non-negative, got {array[pos].item()!r} at position {_position(pos)}.")


def as_real_array(name: str, values: Any, *, ndim: tuple[int, ...] = (1, 2)) -> np.ndarray | torch.Tensor:
    """Convert real-valued data (e.g. the features of a memory model) to checked int64 or float64.

    A tensor stays a tensor on its device; a numpy array or a sequence becomes a numpy
    array. Integer input becomes ``int64``, floating input ``float64``; negative values are
    allowed. Booleans (a mask is rarely meant as numbers: convert it first), complex,
    strings and other objects raise ``TypeError``; NaN and infinity raise ``ValueError``
    naming the first offending position.

    Examples:
        >>> as_real_array("features", [3, -1, 2])
        array([ 3, -1,  2])
        >>> as_real_array("features", torch.tensor([1, 2], dtype=torch.int32))
        tensor([1, 2])
        >>> as_real_array("features", torch.tensor([[1.0, float("inf")]]))
        Traceback (most recent call last):
        ...
        ValueError: features must be finite, got inf at position (0, 1).
    """
    if not isinstance(values, torch.Tensor):
        return _as_real_numpy(name, values, ndim)
    if values.dtype == torch.bool or not (values.is_floating_point() or values.dtype in _TORCH_INTEGERS):
        raise TypeError(f"{name} must hold integers or floats, got dtype {values.dtype}: {short_repr(values)}.")
    _check_ndim(name, values, tuple(values.shape), ndim)
    if not values.is_floating_point():
        if values.dtype == torch.uint64 and values.numel() and int(values.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"{name} has values too large for int64: {int(values.max())!r}.")
        return values.detach().to(torch.int64)
    floats = values.detach().to(torch.float64)
    finite = torch.isfinite(floats)
    if not bool(finite.all()):
        pos = tuple(int(i) for i in (~finite).nonzero()[0])
        raise ValueError(f"{name} must be finite, got {floats[pos].item()!r} at position {_position(pos)}.")
    return floats


_TORCH_INTEGERS = frozenset(
    (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)
)


def _refuse_integers_past_int64(name: str, values: Any, array: np.ndarray) -> None:
    """Raise ``ValueError`` if ``values`` (a sequence, ``array`` as numpy made it) are integers, some past int64.

    NOTE: numpy makes float64 (or object) of Python integers that int64 cannot hold, which
    would round 2**63 + 1 to 2**63 and batch it under a cap of 2**63: refused instead.
    """
    if array.dtype.kind == "f" and float(np.abs(array).max()) < 2**63:
        return
    items = np.asarray(values, dtype=object).ravel().tolist()
    if all(isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)) for item in items):
        largest = max((int(item) for item in items), key=abs)
        if abs(largest) > np.iinfo(np.int64).max:
            raise ValueError(f"{name} has values too large for int64: {largest!r}.")


def _position(pos: tuple[int, ...]) -> Any:
    return pos[0] if len(pos) == 1 else pos


def _check_ndim(name: str, values: Any, shape: tuple[int, ...], ndim: tuple[int, ...]) -> None:
    if len(shape) not in ndim:
        raise ValueError(f"{name} must be {_ranks(ndim)}, got shape {shape}: {short_repr(values)}.")


def _ranks(ndim: tuple[int, ...]) -> str:
    return " or ".join(f"{d}-D" for d in ndim)


def _as_real_numpy(name: str, values: Any, ndim: tuple[int, ...]) -> np.ndarray:
    """``values`` as a finite int64 or float64 numpy array of one of the ranks ``ndim``."""
    try:
        array = as_numpy(name, values, expected=f"a {_ranks(ndim)} array of numbers")
    except TypeError as err:
        raise TypeError(f"{name} must be an array of numbers, got {short_repr(values)}.") from err
    if not isinstance(values, (np.ndarray, torch.Tensor)) and array.dtype.kind in "fO" and array.size:
        _refuse_integers_past_int64(name, values, array)
    if array.dtype == bool or not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise TypeError(f"{name} must hold integers or floats, got dtype {array.dtype}: {short_repr(values)}.")
    _check_ndim(name, values, tuple(array.shape), ndim)
    if np.issubdtype(array.dtype, np.integer):
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} has values too large for int64: {array.max().item()!r}.")
        return array.astype(np.int64, copy=False)
    array = array.astype(np.float64, copy=False)
    finite = np.isfinite(array)
    if not finite.all():
        pos = tuple(int(i) for i in np.unravel_index(int(np.argmin(finite)), array.shape))
        raise ValueError(f"{name} must be finite, got {array[pos].item()!r} at position {_position(pos)}.")
    return array


def positive_int_argument(text: str) -> int:
    """A command-line argument ``text`` as a positive integer (an ``argparse`` type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
