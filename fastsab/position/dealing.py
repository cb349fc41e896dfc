"""Dealing a plan to ranks window by window as its chunks come: ``StepDealer``.

The streaming form of ``assign_steps``: the same windows, the same
random stream in the same order and the same rotation, so that dealing chunk by chunk gives
exactly the assignment of the whole plan, while holding only the window being filled and the
epoch's first batches (which padding repeats).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fastsab._checks import check_choice
from fastsab.position.distributed import WINDOW_STEPS, EvenBatches, step_spread

__all__ = ["DealtWindow", "StepDealer", "count_steps"]


def count_steps(num_batches: int, world_size: int, even_batches: EvenBatches) -> int:
    """Steps of ``num_batches`` global batches dealt to ``world_size`` ranks (as ``assign_steps``)."""
    if even_batches == "drop":
        return num_batches // world_size
    return -(-num_batches // world_size)


@dataclass(frozen=True)
class DealtWindow:
    """Consecutive steps dealt by ``StepDealer``: rows of ``StepAssignment.batches``.

    Attributes:
        first_step: The epoch's step number of the first row.
        batches: ``(steps, world_size)`` int64 global batch indices.
        padding: ``(steps, world_size)`` bool: the slots that repeat a batch dealt elsewhere.
        rng: The dealer's random state before it dealt the window (``None`` without balancing):
            a dealer ``resume_at`` its first batch deals the same windows from there.
    """

    first_step: int
    batches: npt.NDArray[np.int64]
    padding: npt.NDArray[np.bool_]
    rng: tuple[int, int, int, int] | None = None


class StepDealer:
    """``assign_steps`` over batches that come chunk by chunk: the same assignment, window by window.

    Feed the global batches' costs (and spans) in plan order with ``push``; each
    balancing window is dealt as soon as its batches are all known, so the dealer holds one
    window's costs (and the costs of the epoch's first ``world_size`` batches, which padding
    repeats), not the epoch's. ``finish`` deals the rest once the number of batches is
    known. The windows, one after the other, are the rows of ``assign_steps``'s ``batches``
    and ``padding`` over the whole plan; ``num_padded``, ``dropped`` and the spreads
    are those it reports (the spreads up to rounding, as running means).

    Examples:
        >>> costs = np.random.default_rng(0).random(300)
        >>> dealer = StepDealer(4, seed=1, epoch=2)
        >>> windows = dealer.push(costs[:100]) + dealer.push(costs[100:]) + dealer.finish()
        >>> from fastsab.position.distributed import assign_steps
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

    def resume_at(
        self,
        start: int,
        first_costs: npt.NDArray[np.float64],
        first_lasts: npt.NDArray[np.int64] | None,
        rng: tuple[int, int, int, int] | None,
    ) -> None:
        """Go on as the dealer that dealt the windows before global batch ``start`` (a window's first).

        ``first_costs`` (and ``first_lasts``, with spans) are those of the epoch's first
        ``world_size`` batches, which padding repeats; ``rng`` is the window's ``DealtWindow.rng``.
        Push the batches from ``start`` on. The spreads count the steps dealt from there.
        """
        self.start = self.seen = start
        self._first_costs = np.asarray(first_costs, dtype=np.float64)[: self.world_size]
        self._spans = first_lasts is not None
        if first_lasts is not None:
            self._first_lasts = first_lasts[: self.world_size]
        if rng is not None:
            state, inc, has_uint32, uinteger = rng
            self._rng.bit_generator.state = {
                "bit_generator": "PCG64",
                "state": {"state": state, "inc": inc},
                "has_uint32": has_uint32,
                "uinteger": uinteger,
            }

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
        self._sum_before += step_spread(before) * len(before)
        self._sum_after += step_spread(after) * len(after)
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
        """End of the window starting at ``start``, at most ``limit`` (a slot count or the batches seen)."""
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
        rng = None
        if self.balance:
            state = self._rng.bit_generator.state
            rng = (state["state"]["state"], state["state"]["inc"], state["has_uint32"], state["uinteger"])
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
        return DealtWindow(first_step, dealt % max(n, 1), dealt >= n, rng)

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
