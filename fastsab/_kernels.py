"""The greedy counters behind :func:`~fastsab.batching.split_batches`.

:func:`_greedy_ends` walks a split's batches, one counter call per batch; a counter says how
many items from a position fit the cap: :func:`_sum_counter` for ``cost="sum"`` (prefix sums
and a galloping binary search, exact for integer and float costs; Python integers where int64
sums would overflow) and :func:`_padded_counter` for ``cost="padded"`` (a running-max window,
``len * max`` against the cap), or :func:`_padded_feature_counter` when features are padded
(``len * f(running max row)``). The caps come converted by
:meth:`~fastsab.costs.BatchCost.kernel_caps` (less any fixed cost).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

_UNIT_ROUNDOFF = 2.0**-53
_INT64_MAX = 2**63 - 1


def _greedy_ends(
    m: int,
    count: Callable[[int, int, int], int],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int], int]:
    """Walk the ``m`` items' batches: one ``count`` call per batch. Returns batch ends and the open start."""
    over_pos = [] if over is None else np.flatnonzero(over).tolist()
    ends: list[int] = []
    append = ends.append
    i = 0
    guess = 64
    while i < m:
        hi = m
        certain = False  # the batch cannot grow past hi, whatever follows this chunk
        cut_ok = True  # a batch closed at hi counts as "full" for the multiple rule
        if over_pos:
            j = bisect_left(over_pos, i)
            if j < len(over_pos):
                if over_pos[j] == i:
                    append(i + 1)
                    i += 1
                    continue
                hi, certain, cut_ok = over_pos[j], True, False
        if max_items is not None and i + max_items < hi:
            # a next item exists, so a batch that reaches max_items is full
            hi, certain, cut_ok = i + max_items, True, True
        n_items = count(i, hi, guess)
        if n_items == 0 and i < hi:
            # NOTE: only a carry from a split under a larger cap can hold an item that fits
            # in no batch; going on would emit empty batches forever
            raise ValueError(
                f"item at position {i} of this split costs more than max_total_size and came in the carry; "
                "split a carry's chunk again under the cap it was made with."
            )
        end = i + n_items
        if end < hi:
            full = True
        elif certain:
            full = cut_ok
        elif final:
            full = False
        else:
            break
        if full and n_items > multiple > 1:
            n_items -= n_items % multiple
            end = i + n_items
        append(end)
        guess = n_items
        i = end
    return ends, i


def _sum_counter(
    c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float], unbounded: bool
) -> Callable[[int, int, int], int]:
    """Counter for ``cost="sum"``: how many items from ``i`` fit, at most ``hi - i``.

    ``caps`` are the caps of :meth:`~fastsab.costs.BatchCost.caps_for_dtype`, ``exact_caps``
    those given; ``unbounded`` says that some items (``own_batch`` ones) may cost more than the cap.
    """
    m, k = c.shape
    counters = []
    for j in range(k):
        column = c[:, j]
        cap = caps[j].item()
        if c.dtype == np.float64:
            prefix = np.zeros(m + 1, dtype=c.dtype)
            np.cumsum(column, out=prefix[1:])
            counters.append(_float_column_counter(prefix.data, column, cap))
        elif _int64_prefix_fits(column, cap, unbounded):
            prefix = np.zeros(m + 1, dtype=c.dtype)
            np.cumsum(column, out=prefix[1:])
            counters.append(_int_column_counter(prefix.data, cap))
        else:
            # NOTE: the prefix sums of this call pass int64 (batches may too, under a cap past
            # int64): exact Python ints, only for costs this large
            exact = list(accumulate(column.tolist(), initial=0))
            counters.append(_int_column_counter(exact, math.floor(exact_caps[j])))
    if k == 1:
        return counters[0]

    def count(i: int, hi: int, guess: int) -> int:
        for counter in counters:
            hi = i + counter(i, hi, guess)
        return hi - i

    return count


def _int64_prefix_fits(column: np.ndarray, cap: int, unbounded: bool) -> bool:
    """Whether the int64 prefix sums of ``column`` cannot overflow.

    Without items above the cap, every item is at most ``cap``, so the sum is at most
    ``len(column) * cap``: only when that bound passes int64 is the column summed (in float64,
    whose error is far below the margin between 2**62 and 2**63).
    """
    if len(column) * (cap + 1) < 2**63 and not unbounded:
        return True
    return float(column.sum(dtype=np.float64)) < 2**62


def _gallop(prefix: Sequence[Any], x: Any, i: int, hi: int, guess: int) -> int:
    """Largest ``t`` in ``[i, hi]`` with ``prefix[t] <= x``, given ``prefix[i] <= x``."""
    # NOTE: bisect over a memoryview reads Python numbers directly (no numpy call per
    # batch); probing first at twice the previous batch length keeps searches short.
    probe = i + 2 * guess + 1
    if probe < hi:
        if prefix[probe] > x:
            return bisect_right(prefix, x, i, probe) - 1
        return bisect_right(prefix, x, probe, hi + 1) - 1
    return bisect_right(prefix, x, i, hi + 1) - 1


def _int_column_counter(prefix: Sequence[Any], cap: int) -> Callable[[int, int, int], int]:
    def count(i: int, hi: int, guess: int) -> int:
        return _gallop(prefix, prefix[i] + cap, i, hi, guess) - i

    return count


def _float_column_counter(prefix: memoryview, column: np.ndarray, cap: float) -> Callable[[int, int, int], int]:
    # NOTE: prefix differences differ from the loop's running sums (which restart at each
    # batch) by rounding. Both are within m*u*total of the exact sums (the standard bound
    # for recursive summation of non-negative terms), so a search bracketed by +-tolerance
    # is certain when both ends agree, and an exact local cumsum over the bracket settles
    # the rest (rare: only batches that end within the tolerance of the cap).
    m = len(column)
    tolerance = 4.0 * (m + 2) * _UNIT_ROUNDOFF * (prefix[m] + cap) + 1e-300

    def count(i: int, hi: int, guess: int) -> int:
        base = prefix[i]
        low = base + cap - tolerance
        lo_end = _gallop(prefix, low, i, hi, guess) if prefix[i] <= low else i
        high = base + cap + tolerance
        if lo_end == hi or prefix[lo_end + 1] > high:
            return lo_end - i
        hi_end = bisect_right(prefix, high, lo_end + 1, hi + 1) - 1
        local = np.cumsum(column[i : min(hi_end + 1, hi)])
        return int(np.searchsorted(local, cap, side="right"))

    return count


def _padded_counter(c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float]) -> Callable[[int, int, int], int]:
    """Counter for ``cost="padded"``: ``len * running max`` is monotone, so count the fits.

    ``caps`` are the caps of :meth:`~fastsab.costs.BatchCost.caps_for_dtype`, ``exact_caps`` those given.
    """
    single = c.shape[1] == 1
    column = np.ascontiguousarray(c[:, 0]) if single else c
    if c.dtype == np.float64:
        fits = _padded_float_fits(len(c), caps, single)
    else:
        fits = _padded_int_fits(c, [math.floor(cap) for cap in exact_caps], single)

    def count(i: int, hi: int, guess: int) -> int:
        width = max(2 * guess, 16)
        while True:
            stop = min(i + width, hi)
            n_fit = fits(np.maximum.accumulate(column[i:stop], axis=0))
            if n_fit < stop - i or stop == hi:
                return n_fit
            width *= 2

    return count


def _padded_float_fits(m: int, caps: np.ndarray, single: bool) -> Callable[[np.ndarray], int]:
    """How many leading lengths of a window have ``len * running max <= cap`` (float costs).

    The function takes the window's running max (and overwrites it).
    """
    # NOTE: the product is rounded as the loop's Python float product is; past the float
    # range it is inf, above every cap, as in the loop.
    steps = np.arange(1, m + 1, dtype=np.float64)
    if single:
        cap = caps[0]

        def fits(running: np.ndarray) -> int:
            running *= steps[: len(running)]
            return int(running.searchsorted(cap, side="right"))  # non-decreasing padded costs

        return fits
    lengths = steps[:, None]

    def fits_all(running: np.ndarray) -> int:
        running *= lengths[: len(running)]
        return int(np.count_nonzero((running <= caps).all(axis=1)))  # the fits are a prefix

    return fits_all


def _padded_int_fits(c: np.ndarray, caps: list[int], single: bool) -> Callable[[np.ndarray], int]:
    """How many leading lengths of a window have ``len * running max <= cap`` (integer costs).

    Tested as ``running max <= cap // len``, exact for every int64 cost and every cap: the
    product can pass int64 (and so can the caps), the quotients that matter cannot. The
    function takes the window's running max (and overwrites it).
    """
    tops = [int(top) for top in c.max(axis=0)] if len(c) else [0] * len(caps)
    limits = np.empty((0, len(caps)), dtype=np.int64)
    column_limits = limits[:, 0]

    def grow(length: int) -> None:
        # NOTE: the limits grow with the longest window so far, not with the whole call.
        nonlocal limits, column_limits
        limits = _padded_limits(caps, tops, min(max(length, 2 * len(limits)), len(c)))
        if single:
            column_limits = np.ascontiguousarray(limits[:, 0])

    def fits(running: np.ndarray) -> int:
        length = len(running)
        if length > len(limits):
            grow(length)
        # running max - limit is non-decreasing (no overflow: both are in [0, 2**63))
        np.subtract(running, column_limits[:length], out=running)
        return int(running.searchsorted(0, side="right"))

    def fits_all(running: np.ndarray) -> int:
        length = len(running)
        if length > len(limits):
            grow(length)
        return int(np.count_nonzero((running <= limits[:length]).all(axis=1)))  # the fits are a prefix

    return fits if single else fits_all


def _padded_limits(caps: list[int], tops: list[int], size: int) -> np.ndarray:
    """``out[L - 1, j]``: the largest running max with which ``L`` items fit cap ``j``.

    That is ``cap // L``; lengths up to ``cap // top`` (``top``: the column's largest cost)
    fit whatever the items, and get the largest int64 instead.
    """
    out = np.full((size, len(caps)), _INT64_MAX, dtype=np.int64)
    for j, (cap, top) in enumerate(zip(caps, tops, strict=True)):
        free = cap // top if top else size
        if free >= size:
            continue
        if cap <= _INT64_MAX:
            out[free:, j] = cap // np.arange(free + 1, size + 1, dtype=np.int64)
        else:
            # NOTE: past `free` the quotients are below `top`, but the cap does not fit int64:
            # Python ints, only for costs so large that a few of them pass int64.
            out[free:, j] = [cap // length for length in range(free + 1, size + 1)]
    return out


def _padded_feature_counter(
    x: np.ndarray,
    item_costs: Callable[[np.ndarray], np.ndarray],
    caps: np.ndarray,
    exact_caps: list[int | float],
    float_mode: bool,
) -> Callable[[int, int, int], int]:
    """Counter for ``cost="padded"`` over features: a batch of ``L`` items costs ``L * f(max row)``.

    ``x`` holds the items' features ``(m, d)``; ``item_costs`` is ``f``, mapping rows to their
    ``(rows, k)`` costs. The counter stops at the first length that does not fit, as the loop
    does: ``f`` need not grow with the features. ``caps`` and ``exact_caps`` are those of
    :meth:`~fastsab.costs.BatchCost.kernel_caps`.
    """
    # NOTE: products are compared as the loop's Python numbers are: float64 products (rounded
    # alike), or integer costs as `cost <= cap // L`, exact whatever the sizes of L * cost.
    int_caps = [math.floor(cap) for cap in exact_caps]

    def fits(running: np.ndarray) -> np.ndarray:
        costs = item_costs(running)
        lengths = np.arange(1, len(running) + 1)
        if float_mode:
            return np.asarray((costs.astype(np.float64) * lengths[:, None].astype(np.float64) <= caps).all(axis=1))
        limits = np.empty(costs.shape, dtype=np.int64)
        for j, cap in enumerate(int_caps):
            if cap <= _INT64_MAX:
                limits[:, j] = cap // lengths
            else:  # a cap past int64: Python ints, clipped (no int64 cost exceeds the clip)
                limits[:, j] = [min(cap // length, _INT64_MAX) for length in lengths.tolist()]
        return np.asarray((costs <= limits).all(axis=1))

    def count(i: int, hi: int, guess: int) -> int:
        width = max(2 * guess, 16)
        while True:
            stop = min(i + width, hi)
            ok = fits(np.maximum.accumulate(x[i:stop], axis=0))
            n_fit = int(np.argmin(ok)) if not ok.all() else len(ok)  # the first length that does not fit
            if n_fit < stop - i or stop == hi:
                return n_fit
            width *= 2

    return count
