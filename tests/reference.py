"""Plain-Python greedy loops: the specification the vectorized code is tested against."""

from __future__ import annotations

from typing import Any

import torch


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
    """The greedy loop item by item. ``costs`` rows are numbers or tuples of ``k`` numbers.

    Returns the batches (lists of positions) and the skipped positions.
    """
    rows = [row if isinstance(row, (tuple, list)) else (row,) for row in costs]
    k = len(rows[0]) if rows else 1
    caps = list(caps) if isinstance(caps, (tuple, list)) else [caps] * k
    batches: list[list[int]] = []
    skipped: list[int] = []
    batch: list[int] = []

    def batch_cost(positions: list[int], j: int) -> Any:
        if cost == "sum":
            total: Any = 0
            for q in positions:  # accumulate in item order from the batch start
                total += rows[q][j]
            return total
        return len(positions) * max(rows[q][j] for q in positions)

    def fits(positions: list[int]) -> bool:
        if max_batch_size is not None and len(positions) > max_batch_size:
            return False
        return all(batch_cost(positions, j) <= caps[j] for j in range(k))

    for p, row in enumerate(rows):
        if any(row[j] > caps[j] for j in range(k)):
            if oversize == "skip":
                skipped.append(p)
                continue
            if oversize == "error":
                raise ValueError(p)
            if batch:
                batches.append(batch)
                batch = []
            batches.append([p])
            continue
        while batch and not fits([*batch, p]):
            if multiple > 1 and len(batch) > multiple:
                cut = len(batch) // multiple * multiple
                batches.append(batch[:cut])
                batch = batch[cut:]
            else:
                batches.append(batch)
                batch = []
        batch.append(p)
    if batch:
        batches.append(batch)
    return batches, skipped


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
