"""An epoch's number of batches once known: ``len()`` without planning the epoch again.

Counting an epoch's batches plans the whole epoch (seconds at 10**8 items). A cursor keeps the
number of global batches of an epoch's configured plan once it knows it (``len()`` counted it,
or a state carried it as ``"batches"``), and a resume derives from it the batches left after
the stretches already run, where that is exact (``rest_after``). A number taken from a state is
checked against the plan as the iteration reaches the epoch's end (``BatchCount.check``): a
count that does not match is refused, never yielded as another number of steps than ``len()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastsab.plan.plans import Planner
from fastsab.position.dealing import count_steps
from fastsab.position.distributed import WINDOW_STEPS
from fastsab.position.epoch_state import Segment, _state_int

__all__ = ["BatchCount", "KnownBatches", "counted", "rest_after", "rest_of"]


class KnownBatches:
    """The global batches of an epoch's configured plan (``planner``'s), once counted or loaded from a state."""

    def __init__(self, planner: Planner[Any]) -> None:
        self.planner = planner
        self.known: tuple[int, int] | None = None  # (epoch, its batches)

    def get(self, epoch: int, *, count: bool = False) -> int | None:
        """``epoch``'s batches where known, else counted now (and kept) if ``count``, else ``None``."""
        if (self.known is None or self.known[0] != epoch) and count:
            self.known = (epoch, int(self.planner.num_batches(epoch)))
        return self.known[1] if self.known is not None and self.known[0] == epoch else None

    def entry(self, epoch: int, segments: list[Segment]) -> dict[str, int]:
        """A state's ``"batches"`` entry for ``epoch`` run in ``segments``: where known and no limit was lowered."""
        batches = self.get(epoch)
        return {} if batches is None or any(segment.lowered for segment in segments) else {"batches": batches}

    def load(self, epoch: int, state: dict[str, Any]) -> int | None:
        """The ``"batches"`` entry of a state of ``epoch`` read by ``parse_state``, kept (``None`` where it has none).

        Raises:
            TypeError: If it is not an integer.
            ValueError: If it is negative.
        """
        raw = state.get("batches")
        if raw is None:
            return None
        # NOTE: kept unchecked: the iteration checks it against the plan as it reaches the epoch's end
        self.known = (epoch, _state_int("batches", raw))
        return self.known[1]


@dataclass(frozen=True)
class BatchCount:
    """The batches ``len()`` counted an epoch's iteration with.

    Attributes:
        epoch: The epoch.
        batches: Its global batches (the configured plan's, as a state names them).
        rest: Those the iteration's plan holds: after the stretches of the epoch's history.
    """

    epoch: int
    batches: int
    rest: int

    def check(self, seen: int, *, ended: bool) -> None:
        """Refuse a plan that gave ``seen`` batches (``ended``: all of its batches) unlike the count.

        Raises:
            ValueError: If ``seen`` is past the count, or the plan ``ended`` short of it.
        """
        if seen > self.rest or (ended and seen != self.rest):
            planned = f"{self.batches - self.rest + seen}" if ended else f"more than {self.batches}"
            raise ValueError(
                f"state has batches={self.batches!r}, but epoch {self.epoch}'s plan has {planned} batches: "
                "len() counted the epoch's steps from the state's number, and the iteration would run another "
                "number of steps. The state was altered or saved for another plan: load it as state_dict() "
                "saved it, or without its 'batches' entry (len() then counts the epoch)."
            )


def counted(epoch: int, batches: int | None, history: list[Segment], segment: Segment) -> BatchCount | None:
    """What an iteration of ``epoch`` after ``history`` is checked against: where ``batches`` is known, its rest."""
    rest = rest_of(batches, history, segment)
    return None if batches is None or rest is None else BatchCount(epoch, batches, rest)


def rest_of(batches: int | None, history: list[Segment], segment: Segment) -> int | None:
    """``rest_after``, where ``batches`` is known and ``segment`` (the stretch run now) lowered no limit."""
    return None if batches is None or segment.lowered else rest_after(batches, history)


def rest_after(batches: int, history: list[Segment]) -> int | None:
    """The global batches left of an epoch of ``batches`` after the stretches of ``history``; ``None`` if not derived.

    A stretch on one rank ran one batch a step; a stretch on ``w`` ranks ran ``w`` batches a
    step, except for the padding of its last steps (``even_batches="pad"``), which repeats
    batches run before. Where a step run may hold padding (a balanced last window that was
    not run to its end), a lowered limit, or steps past a stretch's end (refused by the count
    that the caller makes then), the rest is not derived.

    Examples:
        >>> rest_after(1000, [Segment(1, 10), Segment(4, 5, "pad", True)])
        970
        >>> rest_after(1000, [Segment(4, 250, "pad", True)]), rest_after(1001, [Segment(4, 250, "pad", True)])
        (0, None)
    """
    rest = batches
    for segment in history:
        world, steps = segment.world_size, segment.steps
        ends = count_steps(rest, world, segment.even_batches or "pad")
        if segment.lowered or steps > ends:
            return None
        run = steps * world
        # NOTE: windows of dealing never straddle a multiple of WINDOW_STEPS steps, so the steps
        # before the last such multiple below the batches' end hold no padding, balanced or not
        full = rest // (WINDOW_STEPS * world) * (WINDOW_STEPS * world)
        if segment.even_batches != "drop" and segment.balance and full < run and steps < ends:
            return None
        rest -= min(run, rest)
    return rest
