"""The greedy walks behind :func:`~fastsab.plan.batching.split_batches`.

:func:`_greedy_ends` walks a split's batches, one counter call per batch; a counter says how
many items from a position fit the cap: :func:`_sum_counter` for ``cost="sum"`` (prefix sums
and a galloping binary search, exact for integer and float costs; Python integers where int64
sums would overflow) or :func:`_padded_feature_counter` when features are padded
(``len * f(running max row)``). Columns of integer costs under their caps alone take
:func:`_int_sum_ends` (one column) or :func:`_int_columns_sum_ends`, the same walk inlined
over prefix sums made just ahead of it (:func:`_sum_split` chooses). For ``cost="padded"``
over costs, :func:`_padded_split` finds the end of a batch starting at every position at
once (from each item's bound on a batch's length, ``cap // cost``) and walks them one lookup
per batch. The caps come converted by :meth:`~fastsab.plan.costs.BatchCost.kernel_caps` (less
any fixed cost).
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
_FLOAT_EXACT = 2**53  # float64 holds every integer below this exactly
_CHUNK = 32768  # items whose prefix sums :func:`_int_sum_ends` makes at a time (256 KiB)


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
            _stuck(i)
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


def _sum_split(
    c: np.ndarray,
    caps: np.ndarray,
    exact_caps: list[int | float],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int], int]:
    """Batch ends and the open start for ``cost="sum"``, the rules of :func:`_greedy_ends`.

    Integer columns under their caps alone (the common case) take :func:`_int_sum_ends`;
    every other split walks :func:`_sum_counter`.
    """
    int_caps = [cap.item() for cap in caps]
    plain = over is None and max_items is None and multiple == 1 and c.dtype != np.float64
    if plain and all(_int64_prefix_fits(c[:, j], cap, False) for j, cap in enumerate(int_caps)):
        # NOTE: one column keeps a walk of its own: the loop over columns costs it a quarter more
        if c.shape[1] == 1:
            return _int_sum_ends(c[:, 0], int_caps[0], final)
        return _int_columns_sum_ends(c, int_caps, final)
    count = _sum_counter(c, caps, exact_caps, over is not None)
    return _greedy_ends(len(c), count, max_items, multiple, over, final)


def _int_sum_ends(column: np.ndarray, cap: int, final: bool) -> tuple[list[int], int]:
    """Batch ends and the open start of integer costs under ``cap`` alone (int64 prefix sums that fit).

    The search of :func:`_gallop` inlined, and the prefix sums made a chunk at a time, as far as
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
    """:func:`_int_sum_ends` for integer costs ``(m, k)`` under their ``caps`` alone (int64 sums that fit).

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


def _stuck(i: int) -> None:
    """Refuse an item that fits in no batch."""
    # NOTE: only a carry from a split under a larger cap can hold an item that fits
    # in no batch; going on would emit empty batches forever
    raise ValueError(
        f"item at position {i} of this split costs more than max_total_size and came in the carry; "
        "split a carry's chunk again under the cap it was made with."
    )


def _sum_counter(
    c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float], unbounded: bool
) -> Callable[[int, int, int], int]:
    """Counter for ``cost="sum"``: how many items from ``i`` fit, at most ``hi - i``.

    ``caps`` are the caps of :meth:`~fastsab.plan.costs.BatchCost.caps_for_dtype`, ``exact_caps``
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


def _padded_split(
    c: np.ndarray,
    caps: np.ndarray,
    exact_caps: list[int | float],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int], int]:
    """Batch ends and the open start for ``cost="padded"``, the rules of :func:`_greedy_ends` vectorized.

    Every position gets the end of a batch that would start there (:func:`_padded_ends`), then
    the batches are walked from position 0, one list lookup per batch.
    """
    m = len(c)
    lengths = _padded_lengths(c, caps, exact_caps)
    if max_items is not None:
        # NOTE: `L <= max_items` is one more bound on the length, as `L <= q` is for an item
        np.minimum(lengths, max_items, out=lengths)
    is_over = np.zeros(m, dtype=bool) if over is None else over
    if m and not lengths.all():
        stuck = (lengths == 0) & ~is_over
        if stuck.any():
            # NOTE: only a carry from a split under a larger cap can hold an item that fits
            # in no batch; every walk reaches the first such item as a batch start
            raise ValueError(
                f"item at position {int(np.argmax(stuck))} of this split costs more than max_total_size and came "
                "in the carry; split a carry's chunk again under the cap it was made with."
            )
        # NOTE: a bound of 1 for an oversize item gives it a batch of its own and leaves every
        # other batch as a bound of 0 would (they stop before it either way)
        np.maximum(lengths, 1, out=lengths)
    ends = _padded_ends(lengths)
    if multiple > 1:
        _cut_to_multiple(ends, is_over, multiple)
    walked = _walk(ends)
    open_start = m
    if not final and walked and not is_over[walked[-2] if len(walked) > 1 else 0]:
        walked.pop()
        open_start = walked[-1] if walked else 0
    return walked, open_start


def _cut_to_multiple(ends: np.ndarray, is_over: np.ndarray, multiple: int) -> None:
    """Cut each full batch of ``ends`` longer than ``multiple`` down to a multiple of it, in place."""
    m = len(ends)
    positions = np.arange(m, dtype=np.int64)
    # a batch is full unless it stops at an own-batch item or at the end of the items
    hi = np.where(is_over, positions, m)
    np.minimum.accumulate(hi[::-1], out=hi[::-1])
    size = ends - positions
    cut = (ends < hi) & (size > multiple)
    ends[cut] -= size[cut] % multiple


def _walk(ends: np.ndarray) -> list[int]:
    """The batch ends met from position 0, given the end of a batch starting at each position."""
    table = ends.data
    m = len(ends)
    out: list[int] = []
    append = out.append
    i = 0
    while i < m:
        i = table[i]
        append(i)
    return out


def _chain(ends: np.ndarray) -> list[int]:
    """The positions met from position 0 (itself excluded) stepping to ``ends[i]``, below ``len(ends)``."""
    return _walk(ends)[:-1]


def _padded_lengths(c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float]) -> np.ndarray:
    """``q[i]``: the most items a batch holding item ``i`` may have (``L * c[i] <= cap`` in every column).

    Clipped to ``len(c)``; 0 for an item above the cap. A batch of ``L`` items fits iff ``L <= q``
    for each of its items, since ``L * max`` is the largest of the items' ``L * c``.
    """
    m = len(c)
    q = None
    for j in range(c.shape[1]):
        if c.dtype == np.float64:
            column = _float_lengths(c[:, j], float(caps[j]), m)
        else:
            column = _int_lengths(c[:, j], math.floor(exact_caps[j]), m)
        q = column if q is None else np.minimum(q, column, out=q)
    assert q is not None  # costs have at least one column
    return q


def _int_lengths(column: np.ndarray, cap: int, m: int) -> np.ndarray:
    """``min(cap // c, m)`` for integer costs (``m`` for a cost of 0), exact for every cap."""
    if cap < 0:
        return np.zeros(len(column), dtype=np.int64)
    if cap < _FLOAT_EXACT:
        return _int_lengths_by_float(column, cap, m)
    if cap <= _INT64_MAX:
        q: np.ndarray = np.int64(cap) // np.maximum(column, 1)
        q[column == 0] = m
        np.clip(q, 0, m, out=q)
        return q
    # NOTE: a cap past int64 fits `m` items of every cost up to int64_max // m; the few larger
    # costs get exact Python quotients
    q = np.full(len(column), m, dtype=np.int64)
    large = np.flatnonzero(column > _INT64_MAX // max(m, 1))
    q[large] = [min(cap // value, m) for value in column[large].tolist()]
    return q


def _int_lengths_by_float(column: np.ndarray, cap: int, m: int) -> np.ndarray:
    """:func:`_int_lengths` for ``0 <= cap < 2**53``, from the float64 quotient ``cap / c``, exactly.

    float64 holds ``cap`` and every cost up to ``2**53`` exactly, so ``cap / c`` is the exact
    quotient rounded once, and rounding never reaches the next integer: with
    ``k = cap // c + 1`` and ``d = k * c - cap >= 1``, the quotient ``k - d / c`` rounds up to
    ``k`` only if ``d / c`` is below half the spacing of the floats just below ``k``, at most
    ``2**(e - 53)`` for ``2**e < k <= 2**(e + 1)``; then ``c > 2**(53 - e)`` and
    ``cap > c * (k - 2**(e - 53)) >= 2**53`` (``k = 1`` would need ``c > 2**54``). So its floor
    is ``cap // c``. A cost past ``2**53`` rounds to at least ``2**53 > cap``: its quotient
    stays below 1, a bound of 0, as it should be.
    """
    # NOTE: numpy's int64 floor division is several times slower than a float division
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient: np.ndarray = np.divide(float(cap), column)
    # fmin takes m over nan (0 / 0) and inf (a cost of 0): a cost of 0 fits every length
    np.fmin(quotient, m, out=quotient)
    # NOTE: truncation toward 0 is the floor of a quotient >= 0
    return quotient.astype(np.int64)


def _float_lengths(column: np.ndarray, cap: float, m: int) -> np.ndarray:
    """The largest ``L <= m`` with ``float(L) * c <= cap`` as float64 rounds the product (float costs)."""
    # NOTE: with r = cap / c (exact), the rounded quotient's floor and the answer are each
    # floor(r) or one off it: one below when r is just above an integer, one above when r is
    # just below one, never both (the lengths are far below 2**52). One step down and one up
    # make it exact; inf and 0 / 0 (a cost of 0) clip to m.
    if cap < 0:
        return np.zeros(len(column), dtype=np.int64)
    # NOTE: float64 throughout (the lengths are exact in it), converted once at the end
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q: np.ndarray = np.divide(cap, column)
        np.floor(np.fmin(q, m, out=q), out=q)
        product = np.multiply(q, column)
        q -= product > cap  # a product of 0 never passes a cap >= 0
        np.add(q, 1.0, out=product)
        product *= column
        q += product <= cap
    np.minimum(q, m, out=q)
    return q.astype(np.int64)


def _padded_ends(q: np.ndarray) -> np.ndarray:
    """``e[i]``: the end of the greedy batch starting at ``i``, given the items' length bounds ``q >= 1``.

    A batch from ``i`` first fails at the length where some item ``k`` in it has ``q[k]`` below
    it, so ``e[i] = min over k >= i of max(k, i + q[k])`` (at most ``len(q)``). With
    ``K[i]``, the first ``k`` with ``k - q[k] >= i``, this is ``min(K[i], i + min(q[i:K[i]]))``.
    ``K`` is non-decreasing, so the windows ``[i, K[i])`` starting in a block between two steps
    of the chain ``0, K[0], K[K[0]], ...`` end in the next block: each window minimum is a
    suffix minimum of one block and a prefix minimum of the next, all found in a few passes.
    """
    m = len(q)
    positions = np.arange(m, dtype=np.int64)
    # NOTE: each pass writes into an array made before where it can (out=): a fresh array of
    # m int64 costs its page faults on top of the pass
    work = np.subtract(positions, q)
    np.maximum.accumulate(work, out=work)  # non-decreasing, below each position
    np.clip(work, -1, m - 1, out=work)
    work += 1
    first = np.bincount(work, minlength=m + 1)[:m]
    np.cumsum(first, out=first)  # K[i]: how many reach below i
    offsets = work
    offsets.fill(0)
    offsets[_chain(first)] = m + 1
    # NOTE: offsets growing by m + 1 (above every q) per block keep each accumulated minimum
    # inside its block
    np.cumsum(offsets, out=offsets)
    suffix: np.ndarray = np.add(q, offsets)
    np.minimum.accumulate(suffix[::-1], out=suffix[::-1])
    suffix -= offsets
    # prefix[1:], the running minimum of each block; K[i] >= i + 1 reads it at K[i] - 1
    prefix = np.empty(m + 1, dtype=np.int64)
    np.subtract(q, offsets, out=prefix[1:])
    np.minimum.accumulate(prefix[1:], out=prefix[1:])
    # the next block's prefix ending at K[i] - 1; above every q when that is still i's own block
    ahead = np.take(prefix, first)
    ahead += offsets
    ahead += m + 1
    np.minimum(suffix, ahead, out=suffix)
    suffix += positions
    np.minimum(suffix, first, out=suffix)
    return suffix


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
    :meth:`~fastsab.plan.costs.BatchCost.kernel_caps`.
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
