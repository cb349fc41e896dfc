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

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch

from fastsab._checks import check_choice

__all__ = ["WINDOW_STEPS", "EvenBatches", "HasRanks", "StepAssignment", "assign_steps", "resolve_rank", "step_spread"]

EvenBatches = Literal["pad", "drop"]

#: Steps per balancing window: batches are regrouped only within windows of this many steps.
WINDOW_STEPS = 64


class HasRanks(Protocol):
    """What gives ranks: a Lightning trainer's ``global_rank`` and ``world_size``."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


def resolve_rank(rank: int | None, world_size: int | None, *, trainer: HasRanks | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``trainer``, else from ``torch.distributed``.

    Args:
        rank, world_size: The values to use, or ``None`` to look them up.
        trainer: A Lightning trainer (anything with ``global_rank`` and ``world_size``) whose
            ranks fill the values not given, or ``None``. Without a trainer, the values not
            given come from the initialized process group, or are ``0`` and ``1`` (a rank
            is not guessed for a world size above 1).

    Raises:
        TypeError: If ``rank`` or ``world_size`` is not an integer.
        ValueError: If ``world_size`` is not positive, ``rank`` is not in ``[0, world_size)``,
            or ``rank`` is not given, not known from a trainer or a process group, and
            ``world_size`` is above 1.

    Examples:
        >>> resolve_rank(None, None)  # no process group here
        (0, 1)
        >>> resolve_rank(1, 4)
        (1, 4)
        >>> from types import SimpleNamespace
        >>> resolve_rank(None, None, trainer=SimpleNamespace(global_rank=2, world_size=3))
        (2, 3)
    """
    if trainer is not None:
        world_size = trainer.world_size if world_size is None else world_size
        rank = trainer.global_rank if rank is None else rank
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialized else 1
    _check_integer("world_size", world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}.")
    if rank is None:
        if not initialized and world_size != 1:
            # NOTE: rank 0 would be a guess: every process would load rank 0's share
            raise ValueError(
                f"rank=None with world_size={world_size!r}: give rank=, or initialize torch.distributed "
                "(or run under a Lightning trainer) so that this process's rank is known."
            )
        rank = torch.distributed.get_rank() if initialized else 0
    _check_integer("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}.")
    return int(rank), int(world_size)


def _check_integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}.")


@dataclass(frozen=True)
class StepAssignment:
    """Which global batch each rank runs at each step of an epoch.

    Attributes:
        batches: ``(steps, world_size)`` int64 indices into the epoch's global batches.
        padding: ``(steps, world_size)`` bool: the slots that repeat a batch dealt elsewhere.
        num_padded: Step slots filled by repeating batches (``even_batches="pad"``).
        dropped: Indices of the global batches left out (``even_batches="drop"``).
        spread_before: Mean per-step ``(max - min) / max`` cost, batches dealt in plan order.
        spread_after: The same with the balanced assignment.
    """

    batches: npt.NDArray[np.int64]
    padding: npt.NDArray[np.bool_]
    num_padded: int
    dropped: npt.NDArray[np.int64]
    spread_before: float
    spread_after: float

    @property
    def num_steps(self) -> int:
        return len(self.batches)


def step_spread(costs: npt.NDArray[np.float64]) -> float:
    """The mean over steps (rows of ``costs``) of ``(max - min) / max``: how unequal the ranks' batches are."""
    if not len(costs):
        return 0.0
    high = costs.max(axis=1)
    low = costs.min(axis=1)
    ratio = np.divide(high - low, high, out=np.zeros_like(high, dtype=np.float64), where=high > 0)
    return float(ratio.mean())


def assign_steps(
    costs: npt.ArrayLike,
    world_size: int,
    *,
    even_batches: EvenBatches = "pad",
    balance: bool = True,
    seed: int = 0,
    epoch: int = 0,
    spans: npt.NDArray[np.int64] | None = None,
) -> StepAssignment:
    """Deal ``len(costs)`` global batches to ``world_size`` ranks in equal steps.

    Args:
        costs: Cost of each global batch, in plan order.
        world_size: Number of ranks.
        even_batches: ``"pad"`` (repeat the first batches to fill the last step) or
            ``"drop"`` (leave out the surplus batches at the end of the plan).
        balance: Group batches of similar cost into the same step (within windows).
        seed, epoch: Seed the shuffle of steps within windows.
        spans: Optional ``(len(costs), 2)`` first and last group each batch touches, in
            the order groups are read (e.g. chunks of a dataset read chunk by chunk),
            non-decreasing in plan order. Windows then also start where a batch's first
            group changes (rounded up to a whole step), and within a window the steps that
            reach a later group come last, so ranks move through the groups in order.

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
    dropped = np.empty(0, dtype=np.int64)
    surplus = n % world_size
    if surplus and even_batches == "drop":
        n_slots, dropped = n - surplus, np.arange(n - surplus, n, dtype=np.int64)
    elif surplus:
        n_slots = n + world_size - surplus
    else:
        n_slots = n
    # NOTE: slots, not batches, are dealt: slot s holds batch s % n, so the slots past n
    # repeat the epoch's first batches and stay known as repeats wherever they are dealt
    slots = np.arange(n_slots, dtype=np.int64).reshape(-1, world_size)
    naive = slots % max(n, 1)
    before = step_spread(costs[naive]) if len(naive) else 0.0
    if balance and world_size > 1 and len(slots):
        rng = np.random.default_rng([seed, epoch, world_size])
        steps = []
        flat = slots.ravel()
        starts = _window_starts(n_slots, world_size, None if spans is None else spans[:, 0])
        for start, end in zip(starts, [*starts[1:], n_slots]):
            block = flat[start:end]
            ranked = block[np.argsort(costs[block % n], kind="stable")].reshape(-1, world_size)
            ranked = ranked[rng.permutation(len(ranked))]
            if spans is not None:
                ranked = ranked[np.argsort(spans[ranked % n, 1].max(axis=1), kind="stable")]
            steps.append(ranked)
        balanced = np.concatenate(steps)
        # NOTE: rotate each step's batches by the step number, so that no rank always gets
        # the cheapest (or the costliest) batch of its steps.
        shift = np.arange(len(balanced))[:, None] + np.arange(world_size)[None, :]
        slots = np.take_along_axis(balanced, shift % world_size, axis=1)
    batches = slots % max(n, 1)
    after = step_spread(costs[batches]) if len(batches) else 0.0
    return StepAssignment(batches, slots >= n, n_slots - n if n_slots > n else 0, dropped, before, after)


def _window_starts(n_slots: int, world_size: int, groups: npt.NDArray[np.int64] | None) -> list[int]:
    """Slots at which balancing windows start: every ``WINDOW_STEPS`` steps and at group starts."""
    starts = set(range(0, n_slots, WINDOW_STEPS * world_size))
    if groups is not None and len(groups):
        changes = np.flatnonzero(np.diff(groups)) + 1
        rounded = -(-changes // world_size) * world_size
        starts.update(rounded[rounded < n_slots].tolist())
    return sorted(starts)
