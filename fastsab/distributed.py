"""Sharding an epoch's batches over ranks with equal step counts and balanced costs.

Every rank computes the same global batch plan from the shared seed and epoch, then this
module decides which global batch each rank runs at each step:

* **Equal steps.** Variable-size batching gives a number of batches that need not divide
  by the world size; data-parallel training hangs if ranks run different step counts.
  ``even_batches="pad"`` fills the last step by repeating the epoch's first batches;
  ``"drop"`` leaves the surplus batches out. Both are counted in the stats.
* **Balanced steps.** At each step the slowest rank sets the pace. Within windows of
  consecutive global batches, batches are sorted by cost and cut into steps of
  ``world_size`` batches of similar cost; the steps of a window are then shuffled (seeded)
  so that costs do not rise along the epoch. The mean per-step spread ``(max - min) / max``
  is reported before (batches dealt in plan order) and after balancing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch

from fastsab._checks import check_choice
from fastsab.epochs import PlanChunk

__all__ = ["ShardedPlanner", "StepAssignment", "assign_steps", "resolve_rank"]

EvenBatches = Literal["pad", "drop"]

#: Steps per balancing window: batches are regrouped only within windows of this many steps.
WINDOW_STEPS = 64


def resolve_rank(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)``: as given, or from ``torch.distributed`` when initialized.

    Examples:
        >>> resolve_rank(None, None)  # no process group here
        (0, 1)
        >>> resolve_rank(1, 4)
        (1, 4)
    """
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialized else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialized else 0
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {value!r}.")
    if world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}.")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}.")
    return int(rank), int(world_size)


@dataclass(frozen=True)
class StepAssignment:
    """Which global batch each rank runs at each step of an epoch.

    Attributes:
        batches: ``(steps, world_size)`` int64 indices into the epoch's global batches.
        num_padded: Steps slots filled by repeating batches (``even_batches="pad"``).
        dropped: Indices of the global batches left out (``even_batches="drop"``).
        spread_before: Mean per-step ``(max - min) / max`` cost, batches dealt in plan order.
        spread_after: The same with the balanced assignment.
    """

    batches: np.ndarray
    num_padded: int
    dropped: np.ndarray
    spread_before: float
    spread_after: float

    @property
    def num_steps(self) -> int:
        return len(self.batches)


def _spread(costs: np.ndarray) -> float:
    if not len(costs):
        return 0.0
    high = costs.max(axis=1)
    low = costs.min(axis=1)
    ratio = np.divide(high - low, high, out=np.zeros_like(high, dtype=np.float64), where=high > 0)
    return float(ratio.mean())


def assign_steps(
    costs: np.ndarray,
    world_size: int,
    *,
    even_batches: EvenBatches = "pad",
    balance: bool = True,
    seed: int = 0,
    epoch: int = 0,
) -> StepAssignment:
    """Deal ``len(costs)`` global batches to ``world_size`` ranks in equal steps.

    Args:
        costs: Cost of each global batch, in plan order.
        world_size: Number of ranks.
        even_batches: ``"pad"`` (repeat the first batches to fill the last step) or
            ``"drop"`` (leave out the surplus batches at the end of the plan).
        balance: Group batches of similar cost into the same step (within windows).
        seed, epoch: Seed the shuffle of steps within windows.

    Examples:
        >>> plan = assign_steps(np.array([9.0, 1, 8, 2, 7, 3]), 2, balance=True)
        >>> plan.num_steps, sorted(plan.batches.ravel().tolist())
        (3, [0, 1, 2, 3, 4, 5])
        >>> plan.spread_after < plan.spread_before
        True
        >>> assign_steps(np.ones(5), 2, even_batches="drop").dropped.tolist()
        [4]
    """
    check_choice("even_batches", even_batches, ("pad", "drop"))
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    order = np.arange(n, dtype=np.int64)
    dropped = np.empty(0, dtype=np.int64)
    num_padded = 0
    surplus = n % world_size
    if surplus and even_batches == "drop":
        order, dropped = order[: n - surplus], order[n - surplus :]
    elif surplus:
        num_padded = world_size - surplus
        order = np.concatenate([order, np.arange(num_padded, dtype=np.int64) % max(n, 1)])
    if n == 0:
        order = np.empty(0, dtype=np.int64)
        num_padded = 0
    naive = order.reshape(-1, world_size)
    before = _spread(costs[naive]) if len(naive) else 0.0
    if not balance or world_size == 1 or not len(naive):
        return StepAssignment(naive, num_padded, dropped, before, before)
    rng = np.random.default_rng([seed, epoch, world_size])
    window = WINDOW_STEPS * world_size
    steps = []
    for start in range(0, len(order), window):
        block = order[start : start + window]
        ranked = block[np.argsort(costs[block], kind="stable")].reshape(-1, world_size)
        steps.append(ranked[rng.permutation(len(ranked))])
    balanced = np.concatenate(steps)
    # NOTE: rotate each step's batches by the step number, so that no rank always gets the
    # cheapest (or the costliest) batch of its steps.
    shift = np.arange(len(balanced))[:, None] + np.arange(world_size)[None, :]
    balanced = np.take_along_axis(balanced, shift % world_size, axis=1)
    return StepAssignment(balanced, num_padded, dropped, before, _spread(costs[balanced]))


class ShardedPlanner:
    """One rank's share of a planner's epochs, with resume from a step.

    With ``world_size == 1`` the planner's chunks stream through (and can be lowered by
    the out-of-memory adaptation). With more ranks the epoch's global plan is made whole
    (8 bytes per item), dealt by :func:`assign_steps`, and this rank's batches are returned
    as one :class:`~fastsab.epochs.PlanChunk`.

    Args:
        planner: A :class:`~fastsab.epochs.FixedSizePlanner` or ``SizeAwarePlanner``.
        rank, world_size: This process's place in the job.
        even_batches: ``"pad"`` or ``"drop"`` (see :func:`assign_steps`).
        balance: Balance the per-step costs across ranks.
    """

    def __init__(self, planner: Any, rank: int, world_size: int, even_batches: EvenBatches, balance: bool) -> None:
        if not isinstance(balance, bool):
            raise TypeError(f"balance must be a bool, got {balance!r}.")
        self.planner = planner
        self.rank, self.world_size = rank, world_size
        self.even_batches: EvenBatches = check_choice("even_batches", even_batches, ("pad", "drop"))  # type: ignore[assignment]
        self.balance = balance
        self.assignment: StepAssignment | None = None
        self._cache: tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, StepAssignment]] | None = None

    def num_batches(self, epoch: int) -> int:
        """Steps of ``epoch`` for every rank."""
        if self.world_size == 1:
            return int(self.planner.num_batches(epoch))
        return self._global(epoch, None)[4].num_steps

    def chunks(self, epoch: int, skip: int = 0, saved_world_size: int | None = None) -> Any:
        """This rank's plan chunks of ``epoch``, starting after ``skip`` steps.

        ``saved_world_size`` is the world size those ``skip`` steps were taken with (by
        default this one): a different one continues the same global plan with the
        batches the old ranks had not run yet.
        """
        resume = None if not skip else (saved_world_size or self.world_size, skip)
        if self.world_size == 1 and (resume is None or resume[0] == 1):
            plan = self.planner.chunks(epoch)
            return plan if not skip else _SkipBatches(plan, skip)
        ids, offsets, skipped, dropped_items, assignment = self._global(epoch, resume)
        self.assignment = assignment
        mine = assignment.batches[:, self.rank]
        sizes = offsets[mine + 1] - offsets[mine]
        rank_offsets = np.zeros(len(mine) + 1, dtype=np.int64)
        np.cumsum(sizes, out=rank_offsets[1:])
        rank_ids = np.concatenate([ids[offsets[b] : offsets[b + 1]] for b in mine.tolist()]) if len(mine) else ids[:0]
        return iter([PlanChunk(rank_ids, rank_offsets, skipped, dropped_items)])

    def _global(self, epoch: int, resume: tuple[int, int] | None) -> Any:
        key = (epoch, resume)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        chunks = list(self.planner.chunks(epoch))
        ids = np.concatenate([c.ids for c in chunks]) if chunks else np.empty(0, dtype=np.int64)
        sizes = np.concatenate([np.diff(c.offsets) for c in chunks]) if chunks else np.empty(0, dtype=np.int64)
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        skipped = np.concatenate([c.skipped for c in chunks]) if chunks else np.empty(0, dtype=np.int64)
        costs = self.planner.batch_costs(ids, offsets)
        options = {"even_batches": self.even_batches, "balance": self.balance, "seed": self.planner.order.seed}
        if resume is None:
            assignment = assign_steps(costs, self.world_size, epoch=epoch, **options)
        elif resume[0] == self.world_size:  # the same assignment, from the step it stopped at
            full = assign_steps(costs, self.world_size, epoch=epoch, **options)
            assignment = replace(full, batches=full.batches[resume[1] :])
        else:  # deal the batches the old ranks had not run yet to the new ranks
            old = assign_steps(costs, resume[0], epoch=epoch, **options)
            done = np.unique(old.batches[: resume[1]].ravel())
            remaining = np.setdiff1d(np.arange(len(costs), dtype=np.int64), done)
            dealt = assign_steps(costs[remaining], self.world_size, epoch=epoch, **options)
            assignment = replace(dealt, batches=remaining[dealt.batches], dropped=remaining[dealt.dropped])
        dropped_items = (
            np.concatenate([ids[offsets[b] : offsets[b + 1]] for b in assignment.dropped.tolist()])
            if len(assignment.dropped)
            else np.empty(0, dtype=np.int64)
        )
        result = (ids, offsets, skipped, dropped_items, assignment)
        self._cache = (key, result)
        return result


class _SkipBatches:
    """A plan's chunks without their first ``skip`` batches (resume); ``lower`` passes through."""

    def __init__(self, plan: Any, skip: int) -> None:
        self.plan, self.skip = plan, skip

    def __iter__(self) -> _SkipBatches:
        return self

    def __next__(self) -> PlanChunk:
        while True:
            chunk = next(self.plan)
            if self.skip == 0:
                return chunk
            if self.skip >= chunk.num_batches:  # ran before the state was saved
                self.skip -= chunk.num_batches
                continue
            start = int(chunk.offsets[self.skip])
            offsets = chunk.offsets[self.skip :] - start
            self.skip = 0
            return PlanChunk(chunk.ids[start:], offsets, chunk.skipped, chunk.dropped)

    def lower(self, pending: np.ndarray, limit: Any) -> None:
        self.plan.lower(pending, limit)
