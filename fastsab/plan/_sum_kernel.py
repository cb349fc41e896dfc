"""The split kernel for ``cost="sum"``: a batch's cost is the sum of its items' costs.

``_sum_split`` chooses the walk. Once ``fastsab.plan.compiled.use_compiled`` has compiled it, one
compiled loop over the items walks every split whose caps int64 or float64 hold. Else columns of
integer costs under their caps alone take
``_int_sum_ends`` (one column) or ``_int_columns_sum_ends``, a galloping binary search
inlined over prefix sums made just ahead of it. Every other split walks
``_greedy_ends`` with ``_sum_counter`` (prefix sums and a
galloping binary search, exact for integer and float costs; Python integers where int64 sums
would overflow). The caps come converted by ``kernel_caps``
(less any fixed cost).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from fastsab.plan._greedy_walk import _greedy_ends, _stuck
from fastsab.plan.compiled import SumWalk, compiled_sum_walk
from fastsab.plan.exact_caps import _INT64_MAX

_UNIT_ROUNDOFF = 2.0**-53
_CHUNK = 32768  # items whose prefix sums ``_int_sum_ends`` makes at a time (256 KiB)


def _sum_split(
    c: np.ndarray,
    caps: np.ndarray,
    exact_caps: list[int | float],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int] | np.ndarray, int]:
    """Batch ends and the open start for ``cost="sum"``, the rules of ``_greedy_ends``.

    The compiled walk, once compiled, takes every split whose caps are exact in the costs'
    dtype; else integer columns under their caps alone (the common case) take ``_int_sum_ends``,
    and every other split walks ``_sum_counter``.
    """
    int_caps = [cap.item() for cap in caps]
    compiled = compiled_sum_walk()
    # NOTE: an integer cap past int64 is held as int64's largest (dtype_caps): a batch may pass it
    if compiled is not None and (c.dtype == np.float64 or all(math.floor(cap) <= _INT64_MAX for cap in exact_caps)):
        return _compiled_ends(compiled, c, caps, max_items, multiple, over, final)
    plain = over is None and max_items is None and multiple == 1 and c.dtype != np.float64
    if plain and all(_int64_prefix_fits(c[:, j], cap, False) for j, cap in enumerate(int_caps)):
        # NOTE: one column keeps a walk of its own: the loop over columns costs it a quarter more
        if c.shape[1] == 1:
            return _int_sum_ends(c[:, 0], int_caps[0], final)
        return _int_columns_sum_ends(c, int_caps, final)
    count = _sum_counter(c, caps, exact_caps, over is not None)
    return _greedy_ends(len(c), count, max_items, multiple, over, final)


def _compiled_ends(
    walk: SumWalk,
    c: np.ndarray,
    caps: np.ndarray,
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[np.ndarray, int]:
    """Batch ends (an array) and the open start by the compiled ``walk`` (``fastsab.plan.compiled._walk_sums``)."""
    ends = np.empty(len(c), dtype=np.int64)
    is_over = _NO_OVER if over is None else over
    count = walk(np.ascontiguousarray(c), caps, c.dtype == np.float64, max_items or 0, multiple, is_over, final, ends)
    if count < 0:
        _stuck(-1 - count)
    # NOTE: an array, not a list: split_with copies the ends into its offsets (a list would cost a
    # Python int per batch, made and read back)
    return ends[:count], int(ends[count - 1]) if count else 0


_NO_OVER = np.zeros(0, dtype=bool)


def _int_sum_ends(column: np.ndarray, cap: int, final: bool) -> tuple[list[int], int]:
    """Batch ends and the open start of integer costs under ``cap`` alone (int64 prefix sums that fit).

    The search of ``_gallop`` inlined, and the prefix sums made a chunk at a time, as far as
    the walk needs them.
    """
    # NOTE: the walk reads a few prefix sums per batch, scattered over the whole array: summed
    # just ahead of the walk, they are still in cache when it reads them (one cumsum over all
    # the items first leaves the walk a cache miss per read)
    m = len(column)
    prefix = np.empty(m + 1, dtype=np.int64)
    prefix[0] = 0
    sums = prefix.data
    ends: list[int] = []
    append = ends.append
    i = done = 0  # the prefix sums up to done are made
    guess = 64
    while i < m:
        reach = sums[i] + cap
        while done < m and sums[done] <= reach:
            done = _sum_chunk(column, prefix, done)
        probe = i + 2 * guess + 1
        if probe >= done:
            end = bisect_right(sums, reach, i, done + 1) - 1
        elif sums[probe] > reach:
            end = bisect_right(sums, reach, i, probe) - 1
        else:
            end = bisect_right(sums, reach, probe, done + 1) - 1
        if end <= i:
            _stuck(i)
        if end == m and not final:
            break
        append(end)
        guess = end - i
        i = end
    return ends, i


def _sum_chunk(column: np.ndarray, prefix: np.ndarray, done: int) -> int:
    """Make the prefix sums after ``done`` for up to ``_CHUNK`` items; returns the new ``done``."""
    stop = min(done + _CHUNK, len(column))
    chunk = prefix[done + 1 : stop + 1]
    np.cumsum(column[done:stop], out=chunk)
    chunk += prefix[done]
    return stop


def _int_columns_sum_ends(c: np.ndarray, caps: list[int], final: bool) -> tuple[list[int], int]:
    """``_int_sum_ends`` for integer costs ``(m, k)`` under their ``caps`` alone (int64 sums that fit).

    Each batch searches the columns in turn, each within the end the columns before allow.
    """
    # NOTE: the same walk as _int_sum_ends with a loop over the columns; one column keeps its own
    # walk, where this loop costs about a quarter more time
    m, k = c.shape
    prefix = np.empty((k, m + 1), dtype=np.int64)
    prefix[:, 0] = 0
    columns = [(prefix[j].data, caps[j]) for j in range(k)]
    ends: list[int] = []
    append = ends.append
    i = done = 0  # the prefix sums up to done are made
    guess = 64
    while i < m:
        end = done
        for sums, cap in columns:
            reach = sums[i] + cap
            if sums[end] <= reach:
                continue
            probe = i + 2 * guess + 1
            if probe >= end or sums[probe] <= reach:
                end = bisect_right(sums, reach, i if probe >= end else probe, end) - 1
            else:
                end = bisect_right(sums, reach, i, probe) - 1
        if end == done < m:
            # NOTE: every column lets the batch reach the last prefix sum made: make more
            done = _sum_rows_chunk(c, prefix, done)
            continue
        if end <= i:
            _stuck(i)
        if end == m and not final:
            break
        append(end)
        guess = end - i
        i = end
    return ends, i


def _sum_rows_chunk(c: np.ndarray, prefix: np.ndarray, done: int) -> int:
    """Make the prefix sums ``prefix[:, done + 1:]`` of up to ``_CHUNK`` rows of ``c``; returns the new ``done``."""
    stop = min(done + _CHUNK, len(c))
    chunk = prefix[:, done + 1 : stop + 1]
    # NOTE: the rows copied column-major first: numpy sums a contiguous row several times
    # faster than a column strided through an (m, k) array
    np.copyto(chunk, c[done:stop].T)
    for row in chunk:
        np.cumsum(row, out=row)
    chunk += prefix[:, done : done + 1]
    return stop


def _sum_counter(
    c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float], unbounded: bool
) -> Callable[[int, int, int], int]:
    """Counter for ``cost="sum"``: how many items from ``i`` fit, at most ``hi - i``.

    ``caps`` are the caps of ``caps_for_dtype``, ``exact_caps``
    those given; ``unbounded`` says that some items (``own_batch`` ones) may cost more than the cap.
    """
    k = c.shape[1]
    counters = []
    for j in range(k):
        column = c[:, j]
        cap = caps[j].item()
        if c.dtype == np.float64:
            counters.append(_float_column_counter(_prefix_sums(column).data, column, cap))
        elif _int64_prefix_fits(column, cap, unbounded):
            counters.append(_int_column_counter(_prefix_sums(column).data, cap))
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


def _prefix_sums(column: np.ndarray) -> np.ndarray:
    """``0`` and the running sums of ``column``."""
    # NOTE: empty, not zeros: writing into fresh zeroed pages costs a page fault each
    prefix = np.empty(len(column) + 1, dtype=column.dtype)
    prefix[0] = 0
    np.cumsum(column, out=prefix[1:])
    return prefix


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
