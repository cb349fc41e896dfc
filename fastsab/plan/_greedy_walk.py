"""The greedy walk of a split's batches, one counter call per batch.

``_greedy_ends`` applies the rules every split shares (items that take a batch of their own,
``max_items``, a batch length cut to a ``multiple``, the open batch left at the end of a chunk)
and asks a counter how many items from a batch's start fit the caps: the sum-cost counters of
``fastsab.plan._sum_kernel``, or the padded-feature counter of ``fastsab.plan._padded_kernel``.
``_stuck`` refuses an item that fits in no batch, for every walk.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

import numpy as np


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


def _stuck(i: int) -> None:
    """Refuse an item that fits in no batch."""
    # NOTE: only a carry from a split under a larger cap can hold an item that fits
    # in no batch; going on would emit empty batches forever
    raise ValueError(
        f"item at position {i} of this split costs more than max_total_size and came in the carry; "
        "split a carry's chunk again under the cap it was made with."
    )
