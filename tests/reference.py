"""Plain-Python loops item by item: the specification the vectorized code is tested against.

The loops take dataset indices in the order an epoch visits them and return batches of
dataset indices. They are deliberately naive (one item at a time, sums accumulated in item
order from the batch start) so that they can be read as the specification.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

Row = tuple[Any, ...]


def as_rows(sizes: Any) -> list[Row]:
    """Per-item sizes (numbers, or sequences of ``k`` numbers) as tuples of Python numbers."""
    rows: list[Row] = []
    for value in sizes:
        if isinstance(value, (tuple, list)):
            rows.append(tuple(value))
        elif hasattr(value, "tolist") and isinstance(value.tolist(), list):
            rows.append(tuple(value.tolist()))
        else:
            rows.append((value.item() if hasattr(value, "item") else value,))
    return rows


#: A function of one item's features (a row) giving its row of costs.
FeatureCost = Callable[[Row], Row]


def above(
    row: Row, caps: Sequence[Any], fixed: Sequence[Any] | None = None, feature_cost: FeatureCost | None = None
) -> bool:
    """Whether one item alone (a batch of one, with the fixed cost) exceeds any of ``caps``."""
    return not fits([row], caps, "sum", None, fixed, feature_cost)


def batch_cost(
    rows: Sequence[Row], column: int, cost: str, fixed: Any = 0, feature_cost: FeatureCost | None = None
) -> Any:
    """The cost of a batch in one column: the fixed cost plus the sum in item order, or ``len * max`` (padded).

    With ``feature_cost`` the rows are features: each item costs ``feature_cost(row)``, and a padded
    batch costs ``len * feature_cost(the row of per-feature maxima)``.
    """
    if feature_cost is not None and cost == "padded":
        top = tuple(max(row[j] for row in rows) for j in range(len(rows[0])))
        return fixed + len(rows) * feature_cost(top)[column]
    if feature_cost is not None:
        rows = [feature_cost(row) for row in rows]
    if cost == "sum":
        total: Any = 0
        for row in rows:
            total += row[column]
        return fixed + total
    return fixed + len(rows) * max(row[column] for row in rows)


def fits(
    rows: Sequence[Row],
    caps: Sequence[Any],
    cost: str,
    max_batch_size: int | None,
    fixed: Sequence[Any] | None = None,
    feature_cost: FeatureCost | None = None,
) -> bool:
    """Whether a batch of ``rows`` stays within every cap (inclusive) and the item cap."""
    if max_batch_size is not None and len(rows) > max_batch_size:
        return False
    fixed = fixed if fixed is not None else [0] * len(caps)
    return all(batch_cost(rows, j, cost, fixed[j], feature_cost) <= cap for j, cap in enumerate(caps))


def greedy_loop(
    order: Sequence[int],
    sizes: Sequence[Row],
    caps: Sequence[Any],
    *,
    cost: str = "sum",
    max_batch_size: int | None = None,
    multiple: int = 1,
    oversize: str = "skip",
    policy_caps: Sequence[Any] | None = None,
    fixed: Sequence[Any] | None = None,
    feature_cost: FeatureCost | None = None,
) -> tuple[list[list[int]], list[int]]:
    """The greedy size-aware loop over ``order`` (dataset indices), one item at a time.

    Args:
        order: Dataset indices in the order the epoch visits them.
        sizes: ``sizes[i]`` is the row of ``k`` sizes of dataset index ``i``.
        caps: The ``k`` inclusive caps batches are formed under.
        cost: ``"sum"`` or ``"padded"`` (``len(batch) * max(size)``).
        max_batch_size: Optional cap on items per batch.
        multiple: A batch closed because the next item does not fit, longer than this
            multiple, is cut down to a multiple of it; the remainder opens the next batch.
        oversize: The policy for an item above ``policy_caps``: ``"skip"``, ``"own_batch"``
            or ``"error"`` (raises ``ValueError`` naming the index).
        policy_caps: The caps that decide the oversize policy (default ``caps``). An item
            within them but above ``caps`` gets a batch of its own: this is what a limit
            lowered mid-epoch does to the items between the lowered and the original cap.
        fixed: The cost each batch pays once, per cap (default 0).
        feature_cost: If given, ``sizes`` are per-item features and this gives a row's costs;
            padded batches pad every feature to the batch's maximum (see :func:`batch_cost`).

    Returns:
        The batches (lists of dataset indices) and the skipped dataset indices.
    """
    policy = list(caps if policy_caps is None else policy_caps)
    batches: list[list[int]] = []
    skipped: list[int] = []
    batch: list[int] = []
    pending = deque(order)
    while pending:
        index = pending.popleft()
        row = sizes[index]
        alone = above(row, policy, fixed, feature_cost)
        if alone and oversize == "skip":
            skipped.append(index)
            continue
        if alone and oversize == "error":
            raise ValueError(f"index {index} is oversize")
        if alone or above(row, caps, fixed, feature_cost):  # a batch of its own; the open batch is closed whole
            if batch:
                batches.append(batch)
                batch = []
            batches.append([index])
            continue
        if batch and not fits([sizes[i] for i in [*batch, index]], caps, cost, max_batch_size, fixed, feature_cost):
            if multiple > 1 and len(batch) > multiple:
                # the remainder opens the next batch: its items join it again one by one (with
                # costs that do not grow with the features, a part of a batch may cost more)
                cut = len(batch) // multiple * multiple
                batches.append(batch[:cut])
                pending.extendleft(reversed([*batch[cut:], index]))
            else:
                batches.append(batch)
                pending.appendleft(index)
            batch = []
            continue
        batch.append(index)
    if batch:
        batches.append(batch)
    return batches, skipped


def sorted_windows(groups: Sequence[Sequence[int]], sizes: Sequence[Row], window: int) -> list[int]:
    """The epoch order with each group cut into windows of ``window`` items, each window sorted by size.

    Windows are counted from each group's start (the last one of a group may be shorter);
    window 0, 2, 4, ... of a group is sorted ascending by the size row (first column, then the
    next), window 1, 3, ... descending; equal sizes keep their order in the group (reversed in
    a descending window).
    """
    order: list[int] = []
    for group in groups:
        for number, start in enumerate(range(0, len(group), window)):
            ascending = sorted(group[start : start + window], key=lambda index: sizes[index])
            order += ascending if number % 2 == 0 else ascending[::-1]
    return order


def fixed_size_loop(order: Sequence[int], batch_size: int, drop_last: bool) -> tuple[list[list[int]], list[int]]:
    """Batches of ``batch_size`` consecutive indices of ``order``; the dropped indices.

    The last partial batch is emitted, or dropped with ``drop_last``.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    for index in order:
        batch.append(index)
        if len(batch) == batch_size:
            batches.append(batch)
            batch = []
    if batch and drop_last:
        return batches, batch
    if batch:
        batches.append(batch)
    return batches, []


def round_down_last(
    batches: list[list[int]], multiple: int, own_batch: bool = False
) -> tuple[list[list[int]], list[int]]:
    """fairseq's last batch: the last of ``batches`` cut down to a multiple of ``multiple``, the rest dropped.

    ``own_batch``: the last batch is an oversize item's own batch, kept whole. Returns the
    batches and the dropped indices.
    """
    if not batches or own_batch:
        return batches, []
    last = batches[-1]
    kept = len(last) // multiple * multiple
    return batches[:-1] + ([last[:kept]] if kept else []), last[kept:]


def seed_dataset() -> list[torch.Tensor]:
    """The five two-element tensors of the bionemo documentation examples."""
    return [torch.tensor([2 * i + 1, 2 * i + 2]) for i in range(5)]


def greedy_reference(
    costs: list[Any],
    caps: Any,
    *,
    max_batch_size: int | None = None,
    cost: str = "sum",
    multiple: int = 1,
    oversize: str = "skip",
) -> tuple[list[list[int]], list[int]]:
    """:func:`greedy_loop` in position order. ``costs`` rows are numbers or tuples of ``k`` numbers.

    Returns the batches (lists of positions) and the skipped positions.
    """
    rows = as_rows(costs)
    k = len(rows[0]) if rows else 1
    caps = list(caps) if isinstance(caps, (tuple, list)) else [caps] * k
    return greedy_loop(
        range(len(rows)), rows, caps, cost=cost, max_batch_size=max_batch_size, multiple=multiple, oversize=oversize
    )


def running_sum_reference(costs: list[Any], cap: Any) -> list[list[int]]:
    """The bionemo loop with a running total (linear time), for large inputs."""
    batches: list[list[int]] = []
    batch: list[int] = []
    total: Any = 0
    for p, size in enumerate(costs):
        if size > cap:
            continue
        if size + total > cap:
            batches.append(batch)
            batch, total = [], 0
        batch.append(p)
        total += size
    if batch:
        batches.append(batch)
    return batches


def bucket_loop(
    groups: Sequence[Sequence[int]],
    lengths: Sequence[Any],
    bucket_lengths: Sequence[int],
    batch_sizes: Sequence[int],
    *,
    partial: str = "fill",
    oversize: str = "skip",
    per_group: bool = False,
) -> tuple[list[list[list[int]]], list[int]]:
    """Shape buckets item by item: per group, the batches completed in it; the skipped indices.

    An item of length ``l`` joins the open batch of the first bucket whose length is at least
    ``l``; a bucket's batch is done when it holds its batch size. An item longer than every bucket
    is skipped, or gets a batch of its own (``oversize="own_batch"``, after the group's bucket
    batches). After the last group, each bucket's open batch is made: filled up to its batch size
    with its own items again, in order and cycled (``partial="fill"``), or kept as it is.

    Returns:
        One list of batches per group (those of bucket 0 first, then bucket 1, ..., then the own
        batches), then one more list with the last batches if any bucket had an open batch; and
        the skipped indices. With ``per_group``, each group's last batches are made at its end (after
        its own batches), and no list follows.
    """
    open_batches: list[list[int]] = [[] for _ in bucket_lengths]
    chunks: list[list[list[int]]] = []
    skipped: list[int] = []
    for group in groups:
        done: list[list[list[int]]] = [[] for _ in bucket_lengths]
        own: list[list[int]] = []
        for index in group:
            bucket = next((k for k, length in enumerate(bucket_lengths) if lengths[index] <= length), None)
            if bucket is None:
                if oversize == "error":
                    raise ValueError(f"index {index} is longer than every bucket")
                if oversize == "skip":
                    skipped.append(index)
                else:
                    own.append([index])
                continue
            open_batches[bucket].append(index)
            if len(open_batches[bucket]) == batch_sizes[bucket]:
                done[bucket].append(open_batches[bucket])
                open_batches[bucket] = []
        if per_group:
            for bucket, size in enumerate(batch_sizes):
                done[bucket] += _last_batches(open_batches[bucket : bucket + 1], [size], partial)
                open_batches[bucket] = []
        chunks.append([batch for batches in done for batch in batches] + own)
    last = _last_batches(open_batches, batch_sizes, partial)
    if last:
        chunks.append(last)
    return chunks, skipped


def _last_batches(open_batches: Sequence[list[int]], batch_sizes: Sequence[int], partial: str) -> list[list[int]]:
    """The open batches made: filled up to their batch size with their own items again, cycled, or kept."""
    last = []
    for batch, size in zip(open_batches, batch_sizes):
        if batch and partial == "fill":
            last.append([batch[j % len(batch)] for j in range(size)])
        elif batch:
            last.append(batch)
    return last


def largest_batch(cap: Any, fixed: Any, unit: Any, max_batch_size: int | None, multiple: int) -> int:
    """The most rows of cost ``unit`` a batch holds under ``cap`` with ``fixed``, counted one by one."""
    rows = 0
    while fixed + (rows + 1) * unit <= cap and (max_batch_size is None or rows + 1 <= max_batch_size):
        rows += 1
    return rows - rows % multiple if rows >= multiple else rows


def mix_loop(
    permutations: Sequence[Callable[[int], Sequence[int]]],
    cost: Callable[[int, int], float],
    weights: Callable[[float, int], Sequence[float]],
    stop: tuple[str, float],
    epochs: int,
) -> list[list[tuple[int, int, int]]]:
    """The mixing rule, one item at a time: ``epochs`` mixture epochs of ``(source, item, source epoch)``.

    ``permutations[s](k)`` is source ``s``'s order in its source epoch ``k`` (its items, each
    once); ``cost(s, item)`` an item's cost for the weights; ``weights(cost, items)`` the weights
    in force after ``cost`` and ``items`` since the mixture's start. ``stop``: ``("first", 0)``,
    ``("last", 0)``, ``("cost", total)`` or ``("items", count)``.

    Each source's deviation is its cost so far minus its target: the sum, over every item taken,
    of the item's cost times the source's share of the weights then. The next item comes from the
    sources with a positive weight that are not ahead (deviation <= 0; all with a positive weight
    where none is), the one whose deviation after its next item, over its weight, is least (the
    source named first on a tie).
    """
    sources = len(permutations)
    deviation = [0.0] * sources
    source_epoch = [0] * sources
    position = [0] * sources
    orders = [list(permutations[s](0)) for s in range(sources)]
    total_cost, total_items = 0.0, 0
    result = []
    for _ in range(epochs):
        epoch: list[tuple[int, int, int]] = []
        epoch_cost, ended = 0.0, [False] * sources
        # a source epoch begun in an earlier mixture epoch, finished in this one, does not end it
        began = [position[s] == 0 for s in range(sources)]
        while True:
            w = list(weights(total_cost, total_items))
            positive = [s for s in range(sources) if w[s] > 0]
            behind = [s for s in positive if deviation[s] <= 0] or positive
            heads = {s: cost(s, orders[s][position[s]]) for s in behind}
            chosen = min(behind, key=lambda s: ((deviation[s] + heads[s]) / w[s], s))
            c = heads[chosen]
            epoch.append((chosen, orders[chosen][position[chosen]], source_epoch[chosen]))
            for s in positive:
                deviation[s] -= w[s] / sum(w) * c
            deviation[chosen] += c
            total_cost += c
            total_items += 1
            epoch_cost += c
            position[chosen] += 1
            finished = position[chosen] == len(orders[chosen])
            if finished:
                if kind_stops_forever(stop, chosen, permutations, cost, source_epoch[chosen]):
                    raise ValueError(f"source {chosen} costs nothing")
                source_epoch[chosen] += 1
                position[chosen] = 0
                orders[chosen] = list(permutations[chosen](source_epoch[chosen]))
                finished = began[chosen]
                ended[chosen] = ended[chosen] or finished
                began[chosen] = True
            kind, amount = stop
            if (
                (kind == "first" and finished)
                or (kind == "last" and finished and all(ended[s] or not w[s] for s in range(sources)))
                or (kind == "cost" and epoch_cost >= amount)
                or (kind == "items" and len(epoch) >= amount)
            ):
                break
        result.append(epoch)
    return result


def kind_stops_forever(
    stop: tuple[str, float], s: int, permutations: Sequence[Callable[[int], Sequence[int]]], cost: Any, epoch: int
) -> bool:
    """Whether source ``s``, which just ended a source epoch costing nothing, would hold ``stop`` off forever."""
    return stop[0] in ("last", "cost") and sum(cost(s, item) for item in permutations[s](epoch)) == 0
