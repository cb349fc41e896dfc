"""The mixing rule's inner loop: items taken one by one until something needs the caller.

``take_run`` is plain Python on plain indexing, so the same source runs as it is over lists
(``fastsab.plan.mixing.mix_walk`` without numba) and compiled by numba over arrays
(``fastsab.plan.compiled``): one loop, so both take the same items, with the same float
operations in the same order.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["take_run"]


def take_run(
    d: Any,
    shares: Any,
    weights: Any,
    positive: Any,
    source_costs: Any,
    offsets: Any,
    ends: Any,
    head_costs: Any,
    head_ids: Any,
    totals: Any,
    change: float,
    stop_cost: float,
    out: Any,
    n: int,
    count: int,
) -> tuple[int, int]:
    """Take items by the mixing rule into ``out[n:count]``, under weights that hold, until the caller is needed.

    Per source ``s``: ``d[s]`` its deviation and ``source_costs[s]`` its cost; its next items'
    costs and ids are ``head_costs`` and ``head_ids`` at ``offsets[s]`` up to ``ends[s]``.
    ``weights`` and ``shares`` (weights over their sum) are those in force, ``positive`` the
    sources with a positive weight, in order. ``totals`` holds the mixture's cost since its
    start and since its epoch's start. All these are updated in place.

    The first item is taken with these weights; a run stops before an item where the mixture's
    cost has reached ``change`` (where the weights may change), and after the item that ends its
    source's block of heads, that fills ``out`` up to ``count`` (the caller stops a run by items
    so), or that brings the epoch's cost to ``stop_cost``.

    Returns:
        Where ``out`` is filled to, and the source of the last item taken.
    """
    cost, epoch_cost = totals[0], totals[1]
    s = -1
    while n < count:
        if s >= 0 and cost >= change:
            break
        # NOTE: the rule's choice, its key (d + c) / w computed only once a second source may be
        # taken (the first alone is taken whatever its key): a pass over the sources behind, then,
        # where none is (weights that changed), over all with a positive weight
        s, known, best_key, behind = -1, False, math.inf, True
        while s < 0:
            for r in positive:
                if behind and d[r] > 0:
                    continue
                if s < 0:
                    s = r
                    continue
                if not known:
                    best_key, known = (d[s] + head_costs[offsets[s]]) / weights[s], True
                key = (d[r] + head_costs[offsets[r]]) / weights[r]
                if key < best_key:
                    s, best_key = r, key
            behind = False
        at = offsets[s]
        c = head_costs[at]
        out[n] = head_ids[at]
        n += 1
        for r in positive:
            d[r] -= shares[r] * c
        d[s] += c
        source_costs[s] += c
        cost += c
        epoch_cost += c
        offsets[s] = at + 1
        if at + 1 == ends[s] or epoch_cost >= stop_cost:
            break
    totals[0], totals[1] = cost, epoch_cost
    return n, s
