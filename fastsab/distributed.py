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

from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch

from fastsab._checks import check_choice

__all__ = ["DealtWindow", "EvenBatches", "HasRanks", "StepAssignment", "StepDealer", "assign_steps", "resolve_rank"]

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


def _spread(costs: npt.NDArray[np.float64]) -> float:
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
    before = _spread(costs[naive]) if len(naive) else 0.0
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
    after = _spread(costs[batches]) if len(batches) else 0.0
    return StepAssignment(batches, slots >= n, n_slots - n if n_slots > n else 0, dropped, before, after)


def _window_starts(n_slots: int, world_size: int, groups: npt.NDArray[np.int64] | None) -> list[int]:
    """Slots at which balancing windows start: every ``WINDOW_STEPS`` steps and at group starts."""
    starts = set(range(0, n_slots, WINDOW_STEPS * world_size))
    if groups is not None and len(groups):
        changes = np.flatnonzero(np.diff(groups)) + 1
        rounded = -(-changes // world_size) * world_size
        starts.update(rounded[rounded < n_slots].tolist())
    return sorted(starts)


def count_steps(num_batches: int, world_size: int, even_batches: EvenBatches) -> int:
    """Steps of ``num_batches`` global batches dealt to ``world_size`` ranks (as :func:`assign_steps`)."""
    if even_batches == "drop":
        return num_batches // world_size
    return -(-num_batches // world_size)


@dataclass(frozen=True)
class DealtWindow:
    """Consecutive steps dealt by :class:`StepDealer`: rows of :attr:`StepAssignment.batches`.

    Attributes:
        first_step: The epoch's step number of the first row.
        batches: ``(steps, world_size)`` int64 global batch indices.
        padding: ``(steps, world_size)`` bool: the slots that repeat a batch dealt elsewhere.
    """

    first_step: int
    batches: npt.NDArray[np.int64]
    padding: npt.NDArray[np.bool_]


class StepDealer:
    """:func:`assign_steps` over batches that come chunk by chunk: the same assignment, window by window.

    Feed the global batches' costs (and spans) in plan order with :meth:`push`; each
    balancing window is dealt as soon as its batches are all known, so the dealer holds one
    window's costs (and the costs of the epoch's first ``world_size`` batches, which padding
    repeats), not the epoch's. :meth:`finish` deals the rest once the number of batches is
    known. The windows, one after the other, are the rows of ``assign_steps``'s ``batches``
    and ``padding`` over the whole plan; :attr:`num_padded`, :attr:`dropped` and the spreads
    are those it reports (the spreads up to rounding, as running means).

    Examples:
        >>> costs = np.random.default_rng(0).random(300)
        >>> dealer = StepDealer(4, seed=1, epoch=2)
        >>> windows = dealer.push(costs[:100]) + dealer.push(costs[100:]) + dealer.finish()
        >>> whole = assign_steps(costs, 4, seed=1, epoch=2)
        >>> np.array_equal(np.concatenate([w.batches for w in windows]), whole.batches)
        True
    """

    def __init__(
        self,
        world_size: int,
        *,
        even_batches: EvenBatches = "pad",
        balance: bool = True,
        seed: int = 0,
        epoch: int = 0,
        window_steps: int = WINDOW_STEPS,
    ) -> None:
        self.world_size = world_size
        self.even_batches: EvenBatches = check_choice("even_batches", even_batches, ("pad", "drop"))  # type: ignore[assignment]
        self.balance = balance and world_size > 1
        self._rng = np.random.default_rng([seed, epoch, world_size])
        self._window = window_steps * world_size
        self.start = 0  # global index of the first batch not dealt
        self.seen = 0  # global batches pushed
        self._costs = np.empty(0, dtype=np.float64)  # of batches [start, seen)
        self._lasts = np.empty(0, dtype=np.int64)  # their last groups (with spans)
        self._first_costs = np.empty(0, dtype=np.float64)  # of the epoch's first world_size batches
        self._first_lasts = np.empty(0, dtype=np.int64)
        self._changes: deque[int] = deque()  # batches past start whose first group differs from the one before
        self._group: int | None = None  # first group of the last batch pushed
        self._spans = False
        self._sum_before = self._sum_after = 0.0
        self._step_costs: list[tuple[np.ndarray, np.ndarray]] = []  # of the windows dealt, not counted yet
        self.num_steps = 0
        self.num_padded = 0
        self.dropped = np.empty(0, dtype=np.int64)
        self.finished = False

    @property
    def spread_before(self) -> float:
        """Mean per-step spread of the steps dealt so far, batches in plan order."""
        return self._sum_before / self.num_steps if self.num_steps else 0.0

    @property
    def spread_after(self) -> float:
        """The same with the steps as dealt."""
        return self._sum_after / self.num_steps if self.num_steps else 0.0

    def push(self, costs: npt.ArrayLike, spans: npt.NDArray[np.int64] | None = None) -> list[DealtWindow]:
        """Take the next global batches' costs (and spans); the windows now complete, dealt.

        Raises:
            ValueError: If spans are given for some batches and not for others.
        """
        costs = np.asarray(costs, dtype=np.float64)
        if not len(costs):
            return []
        self._take_spans(spans, len(costs))
        if len(self._first_costs) < self.world_size:
            take = self.world_size - len(self._first_costs)
            self._first_costs = np.concatenate([self._first_costs, costs[:take]])
            if spans is not None:
                self._first_lasts = np.concatenate([self._first_lasts, spans[:take, 1]])
        self._costs = np.concatenate([self._costs, costs])
        if spans is not None:
            self._lasts = np.concatenate([self._lasts, spans[:, 1]])
        self.seen += len(costs)
        windows: list[DealtWindow] = []
        while True:
            end = self._window_end(self.seen)
            if end > self.seen:
                self._count_spreads()
                return windows
            windows.append(self._deal(end, self.seen))

    def finish(self) -> list[DealtWindow]:
        """Deal the rest once every batch was pushed: the last steps, padded or with the surplus dropped."""
        n = self.seen
        surplus = n % self.world_size
        if surplus and self.even_batches == "drop":
            n_slots = n - surplus
            self.dropped = np.arange(n_slots, n, dtype=np.int64)
        else:
            n_slots = n + (self.world_size - surplus if surplus else 0)
        self.num_padded = max(n_slots - n, 0)
        self.finished = True
        windows: list[DealtWindow] = []
        while self.start < n_slots:
            windows.append(self._deal(self._window_end(n_slots), n))
        self._count_spreads()
        return windows

    def _count_spreads(self) -> None:
        """Add the spreads of the windows just dealt (at once: one window's steps are few)."""
        if not self._step_costs:
            return
        before, after = (np.concatenate(costs) for costs in zip(*self._step_costs))
        self._step_costs = []
        self._sum_before += _spread(before) * len(before)
        self._sum_after += _spread(after) * len(after)
        self.num_steps += len(before)

    def _take_spans(self, spans: npt.NDArray[np.int64] | None, count: int) -> None:
        if self.seen and (spans is not None) != self._spans:
            raise ValueError(f"spans must be given for all batches or for none, got {spans!r} after other batches.")
        self._spans = spans is not None
        if spans is None:
            return
        firsts = spans[:, 0]
        changes = np.flatnonzero(np.diff(firsts)) + 1 + self.seen
        if self._group is not None and firsts[0] != self._group:
            self._changes.append(self.seen)
        self._changes.extend(changes.tolist())
        self._group = int(firsts[-1])

    def _window_end(self, limit: int) -> int:
        """End of the window starting at :attr:`start`, at most ``limit`` (a slot count or the batches seen)."""
        end = (self.start // self._window + 1) * self._window
        while self._changes and self._changes[0] <= self.start:
            self._changes.popleft()
        if self._changes:
            change = self._changes[0]
            end = min(end, -(-change // self.world_size) * self.world_size)
        return min(end, limit) if self.finished else end

    def _deal(self, end: int, n: int) -> DealtWindow:
        """Deal slots ``[start, end)`` (slot ``s`` holds batch ``s % n``) and forget their batches."""
        world = self.world_size
        slots = np.arange(self.start, end, dtype=np.int64)
        batches = slots % max(n, 1)
        costs = self._cost_of(batches)
        naive = costs.reshape(-1, world)
        first_step = self.start // world
        dealt = slots.reshape(-1, world)
        if self.balance:
            order = np.argsort(costs, kind="stable")
            ranked = order.reshape(-1, world)[self._rng.permutation(len(naive))]
            if self._spans:
                lasts = self._last_of(batches)
                ranked = ranked[np.argsort(lasts[ranked].max(axis=1), kind="stable")]
            # NOTE: rotated by the epoch's step number, as assign_steps rotates the whole epoch's steps
            shift = np.arange(first_step, first_step + len(ranked))[:, None] + np.arange(world)[None, :]
            positions = ranked[np.arange(len(ranked))[:, None], shift % world]
            dealt = slots[positions]
        self._step_costs.append((naive, costs[dealt - self.start]))
        done = min(end, self.seen) - self.start
        self._costs = self._costs[done:]
        if self._spans:
            self._lasts = self._lasts[done:]
        self.start = end
        return DealtWindow(first_step, dealt % max(n, 1), dealt >= n)

    def _cost_of(self, batches: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return _held(batches, self.start, self._costs, self._first_costs)

    def _last_of(self, batches: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return _held(batches, self.start, self._lasts, self._first_lasts)


def _held(batches: npt.NDArray[np.int64], start: int, held: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Values of ``batches``: those from ``start`` in ``held``, the epoch's first ones (repeats) in ``first``."""
    # NOTE: a window holds batches from start on, then (padding, at the end) the epoch's first
    # batches again; batch s % n of a padding slot is below world_size unless n < world_size,
    # when nothing was dealt before and held starts at batch 0 too
    repeat = batches < start
    if not repeat.any():
        return held[batches - start]
    values = np.empty(len(batches), dtype=held.dtype)
    values[~repeat] = held[batches[~repeat] - start]
    values[repeat] = first[batches[repeat]]
    return values
