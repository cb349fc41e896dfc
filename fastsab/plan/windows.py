"""Size-sorted windows: items of similar size batched together, batches yielded in random order.

With ``sort_window=W`` a size-aware planner cuts each shuffle group of the epoch order into
consecutive windows of ``W`` items (the group's last window may be shorter; a window never
crosses a group, so a chunked dataset is still read chunk by chunk) and orders every window by
size before the greedy split, so that a batch holds items of similar size and pads little.
Windows are sorted ascending and descending in turn, so that the batch spanning two windows
holds similar sizes too. The batches of each planned chunk are then yielded in a seeded random order, so that the
epoch does not run from small to large sizes window after window.

Sizes with ``k`` columns order a window by the first column, ties by the second, and so on
(put the column that is padded, such as a sequence length, first). Equal sizes keep the order
of the epoch's permutation, which is random: no extra random key is needed.
"""

from __future__ import annotations

import numpy as np

from fastsab._checks import check_optional_positive_int

__all__ = ["batch_order", "check_sort_window", "window_order"]


def check_sort_window(value: object) -> int | None:
    """``value`` checked as a window size: ``None`` or a positive integer.

    Examples:
        >>> check_sort_window(256), check_sort_window(None)
        (256, None)
        >>> check_sort_window(0)
        Traceback (most recent call last):
        ...
        ValueError: sort_window must be a positive integer, got 0.
    """
    return check_optional_positive_int("sort_window", value)


def window_order(costs: np.ndarray, window: int) -> np.ndarray:
    """Positions that order each run of ``window`` consecutive items by size, up and down in turn.

    NOTE: a batch may span two windows (the greedy split runs on over the sorted order);
    windows sorted up and down in turn meet with similar sizes (large with large, small with
    small), where windows all sorted up would put the largest items of one with the smallest
    of the next. Equal sizes keep their order (descending windows: reversed), which the
    epoch's permutation made random.

    Args:
        costs: Sizes, shape ``(m,)`` or ``(m, k)``; ``k`` columns order lexicographically.
        window: Items per window; the last window holds the ``m % window`` items left.

    Returns:
        An ``int64`` permutation of ``range(m)`` that moves no item out of its window:
        ascending in even windows, descending in odd ones.

    Examples:
        >>> window_order(np.array([5, 1, 3, 2, 2, 0, 9]), 3).tolist()
        [1, 2, 0, 4, 3, 5, 6]
        >>> window_order(np.array([[1, 7], [1, 2], [0, 9]]), 3).tolist()
        [2, 1, 0]
    """
    costs = np.asarray(costs)
    rows = costs.reshape(len(costs), -1 if costs.size else max(costs.ndim - 1, 1))
    m = len(rows)
    full = m // window * window
    out = np.empty(m, dtype=np.int64)
    # NOTE: one sort over a (m // window, window) view sorts every full window at once; the
    # short last window is sorted on its own
    if full:
        ranks = _sorted_rows(rows[:full].reshape(full // window, window, -1))
        ranks[1::2] = ranks[1::2, ::-1]
        out[:full] = (ranks + np.arange(0, full, window, dtype=np.int64)[:, None]).ravel()
    if full < m:
        last = _sorted_rows(rows[full:].reshape(1, m - full, -1)).ravel()
        out[full:] = (last[::-1] if full // window % 2 else last) + full
    return out


def _sorted_rows(values: np.ndarray) -> np.ndarray:
    """Per row of ``values`` (``(rows, width, k)``), the stable order by column 0, then 1, ..."""
    width = values.shape[1]
    if values.shape[2] == 1:
        column = values[:, :, 0]
        largest = int(column.max()) if column.dtype.kind in "iu" and column.size else None
        if largest is not None and largest < 2**16 and int(column.min()) >= 0:
            # NOTE: numpy's stable argsort of 16-bit integers is a radix sort (linear time), about
            # twice as fast again as sorting int32 keys; sizes as small as sequence lengths fit
            return np.argsort(column.astype(np.uint16), axis=1, kind="stable")
        if largest is not None and largest < 2**62 // max(width, 1):
            # NOTE: size * width + position orders like a stable sort by size and is unique, and
            # sorting the values is about twice as fast as a stable argsort (in int32 when the
            # keys fit: faster again)
            dtype = np.int32 if largest < 2**31 // max(width, 1) else np.int64
            keys = column.astype(dtype) * dtype(width) + np.arange(width, dtype=dtype)
            keys.sort(axis=1)
            return keys % dtype(width)  # type: ignore[no-any-return]
        return np.argsort(column, axis=1, kind="stable")
    keys = tuple(values[:, :, column] for column in range(values.shape[2] - 1, -1, -1))
    return np.lexsort(keys, axis=-1)


def batch_order(labels: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """A random order of batches that keeps each label's batches together, labels in order.

    Args:
        labels: Per batch, non-decreasing: batches of one label may change places among
            themselves. A negative label stays where it is (give each such batch its own).
        rng: The random source; ``None`` keeps the order (an unshuffled epoch).

    Returns:
        The batches' new order, an ``int64`` permutation of ``range(len(labels))``.

    Examples:
        >>> order = batch_order(np.array([-2, -1, 0, 0, 0, 0, 1]), np.random.default_rng(0))
        >>> order[:2].tolist(), sorted(order[2:6].tolist()), order[6:].tolist()
        ([0, 1], [2, 3, 4, 5], [6])
    """
    if rng is None or len(labels) < 2:
        return np.arange(len(labels), dtype=np.int64)
    keys = rng.random(len(labels))
    keys[labels < 0] = 0.0
    return np.lexsort((keys, labels)).astype(np.int64, copy=False)
