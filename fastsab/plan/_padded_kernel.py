"""The split kernel for ``cost="padded"``: a batch of ``L`` items costs ``L`` times its largest item.

Over per-item costs, ``_padded_split`` bounds each item's batch length (``cap // cost``,
exact for integer and float costs), finds the end of a batch starting at every position of a
block of items at once (``_padded_ends``) and walks them one lookup per batch, block after block
(``_blocked_walk``). Over features, whose padded
cost ``L * f(running max row)`` need not grow with the row, ``_padded_feature_counter``
is the counter that ``_greedy_ends`` walks. The caps come
converted by ``kernel_caps`` (less any fixed cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from fastsab.plan.compiled import compiled_walk
from fastsab.plan.exact_caps import _INT64_MAX

_FLOAT_EXACT = 2**53  # float64 holds every integer below this exactly
#: Items per block of the numpy walk: its dozen arrays of a block stay in the CPU's cache.
_BLOCK = 2**16


# NOTE: the parameters of _sum_split, by design: split_with calls either one with the same arguments
def _padded_split(
    c: np.ndarray,
    caps: np.ndarray,
    exact_caps: list[int | float],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int], int]:
    """Batch ends and the open start for ``cost="padded"``, the rules of ``_greedy_ends`` vectorized.

    Every position of a block gets the end of a batch that would start there (``_padded_ends``),
    then the block's batches are walked, one list lookup per batch (``_blocked_walk``); or, once
    ``fastsab.plan.compiled.use_compiled`` has compiled it, one compiled loop over the items walks them.
    """
    m = len(c)
    is_over = np.zeros(m, dtype=bool) if over is None else over
    bounds = partial(_length_bounds, c, caps, exact_caps, max_items, is_over)
    compiled = compiled_walk()
    if compiled is not None:
        ends = np.empty(m, dtype=np.int64)
        walked = ends[: compiled(bounds(0, m), is_over, multiple, ends)].tolist()
    else:
        walked = _blocked_walk(bounds, m, is_over, multiple)
    open_start = m
    if not final and walked and not is_over[walked[-2] if len(walked) > 1 else 0]:
        walked.pop()
        open_start = walked[-1] if walked else 0
    return walked, open_start


def _length_bounds(
    c: np.ndarray,
    caps: np.ndarray,
    exact_caps: list[int | float],
    max_items: int | None,
    is_over: np.ndarray,
    start: int,
    stop: int,
) -> np.ndarray:
    """The length bounds ``1 <= q <= stop - start`` of the items ``start:stop`` (1 for an oversize item).

    Raises:
        ValueError: If an item that is not oversize fits in no batch (one from a carry).
    """
    # NOTE: no batch of items start:stop is longer than stop - start: a larger bound gives the same ends
    lengths = _padded_lengths(c[start:stop], caps, exact_caps)
    if max_items is not None:
        # NOTE: `L <= max_items` is one more bound on the length, as `L <= q` is for an item
        np.minimum(lengths, max_items, out=lengths)
    if len(lengths) and not lengths.all():
        stuck = (lengths == 0) & ~is_over[start:stop]
        if stuck.any():
            # NOTE: only a carry from a split under a larger cap can hold an item that fits
            # in no batch; every walk reaches the first such item as a batch start
            raise ValueError(
                f"item at position {start + int(np.argmax(stuck))} of this split costs more than max_total_size "
                "and came in the carry; split a carry's chunk again under the cap it was made with."
            )
        # NOTE: a bound of 1 for an oversize item gives it a batch of its own and leaves every
        # other batch as a bound of 0 would (they stop before it either way)
        np.maximum(lengths, 1, out=lengths)
    return lengths


def _blocked_walk(bounds: Callable[[int, int], np.ndarray], m: int, is_over: np.ndarray, multiple: int) -> list[int]:
    """The batch ends met from position 0 over ``m`` items, found block by block.

    ``bounds(start, stop)`` gives the length bounds of the items ``start:stop``. A block's
    batch ends are exact where they fall inside it: items after a block only end the batches
    that reach its end. The batch that reaches it may grow past it, so the next block starts
    with that batch; a block that closes no batch is tried again twice as long.
    """
    walked: list[int] = []
    start, size = 0, _BLOCK
    while True:
        stop = min(start + size, m)
        ends = _padded_ends(bounds(start, stop))
        if multiple > 1:
            _cut_to_multiple(ends, is_over[start:stop], multiple)
        closed = len(walked)
        _walk(ends, start, walked)
        if stop == m:
            return walked
        walked.pop()  # the batch that reaches the block's end, open
        if len(walked) > closed:
            start, size = walked[-1], _BLOCK
        else:
            size *= 2


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


def _walk(ends: np.ndarray, offset: int, out: list[int]) -> None:
    """Append to ``out`` the batch ends met from position 0, plus ``offset``, given each position's batch end."""
    table = ends.data
    m = len(ends)
    append = out.append
    i = 0
    while i < m:
        i = table[i]
        append(i + offset)


def _chain(ends: np.ndarray) -> list[int]:
    """The positions met from position 0 (itself excluded) stepping to ``ends[i]``, below ``len(ends)``."""
    out: list[int] = []
    _walk(ends, 0, out)
    return out[:-1]


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
    """``_int_lengths`` for ``0 <= cap < 2**53``, from the float64 quotient ``cap / c``, exactly.

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
    """``e[i]``: the end of the greedy batch starting at ``i``, given the items' length bounds ``1 <= q <= len(q)``.

    A batch from ``i`` first fails at the length where some item ``k`` in it has ``q[k]`` below
    it, so ``e[i] = min over k >= i of max(k, i + q[k])`` (at most ``len(q)``). With
    ``K[i]``, the first ``k`` with ``k - q[k] >= i``, this is ``min(K[i], i + min(q[i:K[i]]))``.
    ``K`` is non-decreasing, so the windows ``[i, K[i])`` starting in a stretch between two steps
    of the chain ``0, K[0], K[K[0]], ...`` end in the next stretch: each window minimum is a
    suffix minimum of one stretch and a prefix minimum of the next, all found in a few passes.
    """
    m = len(q)
    positions = np.arange(m, dtype=np.int64)
    work = _running(torch.cummax, np.subtract(positions, q))  # non-decreasing, below each position (q >= 1)
    np.maximum(work, -1, out=work)
    work += 1
    first = np.bincount(work, minlength=m + 1)[:m]
    np.cumsum(first, out=first)  # K[i]: how many reach below i
    offsets = work
    offsets.fill(0)
    offsets[_chain(first)] = m + 1
    # NOTE: offsets growing by m + 1 (above every q) per stretch keep each running minimum
    # inside its stretch
    np.cumsum(offsets, out=offsets)
    # NOTE: a copy, not ascontiguousarray: that keeps a reversed view of one item (torch refuses its stride)
    backward = np.add(q, offsets)[::-1].copy()
    suffix = _running(torch.cummin, backward)[::-1]
    suffix -= offsets
    # prefix[1:], the running minimum of each stretch; K[i] >= i + 1 reads it at K[i] - 1
    prefix = np.empty(m + 1, dtype=np.int64)
    prefix[1:] = _running(torch.cummin, np.subtract(q, offsets))
    # the next stretch's prefix ending at K[i] - 1; above every q when that is still i's own stretch
    ends = np.take(prefix, first)
    ends += offsets
    ends += m + 1
    np.minimum(ends, suffix, out=ends)
    ends += positions
    np.minimum(ends, first, out=ends)
    return ends


def _running(accumulate: Callable[..., Any], values: np.ndarray) -> np.ndarray:
    """``torch.cummax`` or ``torch.cummin`` (``accumulate``) of a contiguous 1-D int64 array, as an array."""
    # NOTE: torch's running maximum and minimum are several times faster than numpy's accumulate
    running: np.ndarray = accumulate(torch.from_numpy(values), 0).values.numpy()
    return running


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
    ``kernel_caps``.
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
