"""Caps made exact for the greedy kernel: in the costs' dtype, and less a batch's fixed cost.

The greedy loop compares running totals with the caps in Python's exact semantics; the kernel
compares in one numpy dtype. ``dtype_caps`` converts the caps once so that ``cost <= cap``
gives the same answers in that dtype, and ``threshold`` finds, for a fixed cost per batch,
the largest variable cost that still fits as the loop computes ``fixed + v <= cap``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from fractions import Fraction
from numbers import Integral

import numpy as np

__all__ = ["dtype_caps", "threshold"]

_INT64_MAX = 2**63 - 1  # the largest integer cap or cost the kernels hold in int64


def dtype_caps(caps: list[int | float], float_mode: bool) -> np.ndarray:
    """``caps`` in the costs' dtype, so that ``cost <= cap`` stays exact."""
    # NOTE: the loop compares a running total with the cap exactly (Python semantics). For
    # integer totals `total <= cap` equals `total <= floor(cap)`; for float totals it equals
    # `total <= the largest float64 not above cap`. Converting the cap once this way keeps
    # every later comparison exact in a single numpy dtype. An integer cap past int64 acts
    # as the largest int64 where no cost exceeds it; sums that pass int64 and padded mode
    # work from the exact caps (see _sum_kernel._sum_counter, _padded_kernel._padded_lengths).
    # A cap below 0 (a fixed cost above it) holds no cost >= 0, as -1 does: a fixed cost past
    # int64 leaves one below int64's smallest, so it is held as -1.
    if not float_mode:
        return np.array([min(max(math.floor(cap), -1), _INT64_MAX) for cap in caps], dtype=np.int64)
    out = []
    for cap in caps:
        if isinstance(cap, Integral) and cap > sys.float_info.max:
            f = sys.float_info.max
        else:
            f = float(cap)
            if isinstance(cap, Integral) and f > cap:
                f = math.nextafter(f, -math.inf)
        out.append(f)
    return np.array(out, dtype=np.float64)


def threshold(cap: int | float, fixed: int | float, float_mode: bool) -> int | float:
    """The largest variable cost ``v`` with ``fixed + v <= cap`` as the greedy loop computes it.

    ``v`` is an integer for integer costs and a float64 for float costs. The test is monotone
    in ``v``, so a galloping search from the exact difference finds it: over integers, or over
    the floats in their order (many floats may give the same rounded sum).
    """
    if float_mode:
        if isinstance(cap, Integral) and cap > sys.float_info.max:
            return sys.float_info.max
        start = _float_key(float(Fraction(cap) - Fraction(fixed)))
        return _key_float(_largest(lambda key: fixed + _key_float(key) <= cap, start))
    return _largest(lambda v: fixed + v <= cap, math.floor(Fraction(cap) - Fraction(fixed)))


def _largest(holds: Callable[[int], bool], start: int) -> int:
    """The largest integer for which ``holds`` (true up to some integer, false above it) is true."""
    step = 1
    if holds(start):
        low = start
        while holds(low + step):
            low, step = low + step, 2 * step
        high = low + step
    else:
        high = start
        while not holds(high - step):
            high, step = high - step, 2 * step
        low = high - step
    while high - low > 1:  # holds(low), not holds(high)
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def _float_key(value: float) -> int:
    """An integer that orders float64 values as they compare (``-0.0`` and ``0.0`` alike)."""
    bits = int(np.float64(value).view(np.int64))
    return bits if bits >= 0 else -(bits & _INT64_MAX)


def _key_float(key: int) -> float:
    """The float64 of ``_float_key`` (keys past the finite floats give +-inf)."""
    limit = _float_key(math.inf)
    if key >= limit:
        return math.inf
    if key <= -limit:
        return -math.inf
    bits = key if key >= 0 else (-key) | (1 << 63)
    return float(np.array(bits, dtype=np.uint64).view(np.float64))
