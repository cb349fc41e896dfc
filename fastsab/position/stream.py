"""A rank's plan chunks of one epoch: ``Stream`` skips the batches already run and lowers limits.

A stream wraps a plan (a planner's epoch, or an ``ExplicitPlan`` of batches
known up front) and counts positions in batches. It replays the limits lowered in the run it
resumes, at the positions they were lowered at, and records new lowerings, so that the record
is what a state saves.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fastsab.plan.plans import PlanChunk
from fastsab.position.batch_count import BatchCount
from fastsab.position.epoch_state import Limit, Lowered, ResumePoint, ResumePoints, Segment, check_steps, lowered_at
from fastsab.position.stats import EpochStats

__all__ = ["HasPoints", "MarkedPlan", "Plan", "Stream"]


class Plan(Protocol):
    """Plan chunks one after the other, whose not yet returned items can be planned again."""

    def __next__(self) -> PlanChunk: ...

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Plan ``pending`` (ids not returned yet, in order) and the rest under ``limit``."""


@runtime_checkable
class HasPoints(Protocol):
    """A plan that notes where a state of each of its steps resumes (``ResumePoint``)."""

    points: ResumePoints


@runtime_checkable
class GivesBack(Protocol):
    """A plan that re-plans the chunks returned ahead of a lowering from where they began."""

    def __next__(self) -> PlanChunk: ...

    def mark(self) -> Any:
        """Where the plan stands before its next chunk."""

    def lower_giving_back(self, pending: np.ndarray, limit: Limit, given_back: Any) -> None:
        """Plan ``pending`` (the current chunk's ids not yet yielded) and the rest under ``limit``.

        ``given_back`` is the ``mark`` before the first chunk returned after the current
        one (``None``: none was): the items from there on are planned again, as if those
        chunks had never been returned.
        """


class Stream:
    """This rank's plan chunks of one epoch, after ``skip`` batches, with limits lowered.

    ``lowered`` limits are re-applied where they were lowered (also inside the skipped
    batches), so that a resumed stream has the batches the interrupted one had. A plan
    taken up at a ``ResumePoint`` starts at position ``start`` (positions count from the
    epoch's start all the same). With ``batch_count``, the plan's batches are checked against the
    number ``len()`` counted (``BatchCount``), until a limit is lowered.
    ``lower`` plans the batches from a position on again, also those of chunks already
    returned (fetched ahead): the chunks returned are kept until ``release`` lets them go,
    each with the plan's mark before it (``GivesBack``), so that what a plan may be asked
    to give back is held no longer than its chunks.

    Examples:
        >>> from fastsab.plan.plans import ExplicitPlan
        >>> class Planner:  # what ExplicitPlan needs to re-plan: batches of at most `limit` ids
        ...     def split(self, ids, limit):
        ...         return np.split(ids, range(limit, len(ids), limit))
        >>> plan = ExplicitPlan(PlanChunk.from_batches([np.arange(4), np.arange(4, 8)]), Planner())
        >>> stream = Stream(plan, skip=1, lowered=[(1, 3)])
        >>> [batch.tolist() for chunk in stream for batch in chunk.batches()]
        [[4, 5, 6], [7]]
    """

    def __init__(
        self,
        plan: Plan,
        *,
        skip: int = 0,
        lowered: Lowered | None = None,
        start: int = 0,
        batch_count: BatchCount | None = None,
    ) -> None:
        self.plan = plan
        self.batch_count = batch_count  # (one rank) the plan's batches len() counted
        self.skip = skip
        self.lowered: Lowered = list(lowered or [])  # the record: replayed and new lowerings
        self._replay = deque(self.lowered)
        self.position = start  # batches of the stream before the next chunk
        self.stats: EpochStats | None = None
        # (first, end position, chunk, the plan's mark before it) not released
        self._returned: deque[tuple[int, int, PlanChunk, Any]] = deque()
        self._gives_back = plan if isinstance(plan, GivesBack) else None
        # (position, count): the first `count` chunks returned ended at or before `position`,
        # where a replayed lowering applied after them
        self._cut: tuple[int, int] = (0, 0)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> PlanChunk:
        while True:
            mark = None if self._gives_back is None else self._gives_back.mark()
            try:
                chunk = next(self.plan)
            except StopIteration:
                if self.batch_count is not None and not self.lowered:  # (a lowering changes the count)
                    self.batch_count.check(self.position, ended=True)
                raise
            if self.stats is not None:
                self.stats.add(chunk)
            start = self.position
            end = start + chunk.num_batches
            if self.batch_count is not None and not self.lowered:
                self.batch_count.check(end, ended=False)
            # NOTE: one lowering per chunk: the chunk ends where it applies, and another one of
            # that position re-plans what the plan hands out next, as it did in the run
            replayed = bool(self._replay) and self._replay[0][0] <= end
            if replayed:
                position, limit = self._replay.popleft()
                cut = position - start
                self.plan.lower(chunk.ids[chunk.offsets[cut] :], limit)
                chunk, end = chunk.head(cut), position
            self.position = end
            if self.skip >= end and self.skip > start:  # ran before the state was saved
                # NOTE: a chunk without batches at the stream's start is returned, not passed
                # over: what it skipped is reported by those who read the chunks
                if end == self.skip:
                    # NOTE: kept (with no batches) as the chunk ending where the stream resumes, as
                    # in the run: a lowering there re-plans from after it, whatever came after it
                    self._returned.append((end, end, chunk.tail(chunk.num_batches), mark))
                if replayed:
                    self._cut = (end, len(self._returned))
                continue
            if self.skip > start:
                chunk, start = chunk.tail(self.skip - start), self.skip
            self._returned.append((start, end, chunk, mark))
            if replayed:
                self._cut = (end, len(self._returned))
            if self.stats is not None:
                self.stats.planned(start - self.skip, chunk)
            return chunk

    def release(self, position: int) -> None:
        """Let go of the chunks whose batches all come before ``position``."""
        returned = self._returned
        while returned and returned[0][1] <= position:
            returned.popleft()
            self._cut = (self._cut[0], max(self._cut[1] - 1, 0))

    def lower(self, position: int, limit: Limit) -> None:
        """Plan the batches from ``position`` on again under ``limit``.

        ``position`` must not be released; nothing may iterate the stream meanwhile.
        """
        if isinstance(self.plan, GivesBack):
            self._give_back(self.plan, position, limit)
            return
        pending = [
            chunk.ids[chunk.offsets[max(position - start, 0)] :]
            for start, end, chunk, _ in self._returned
            if end > position
        ]
        self._returned.clear()
        self._cut = (0, 0)
        self.plan.lower(np.concatenate(pending) if pending else np.empty(0, dtype=np.int64), limit)
        self._lowered_at(position, limit)

    def _give_back(self, plan: GivesBack, position: int, limit: Limit) -> None:
        """Lower ``plan`` at ``position``: the chunk holding it is current, those after it are given back."""
        # NOTE: a replayed lowering applies to the first chunk ending at or after its position,
        # with nothing returned after it; the chunks returned after that one (planned ahead) go
        # back, so that a run and its resume plan the rest of the epoch alike
        # NOTE: the chunks returned before a replayed lowering at this same position are not
        # current: in the run, that lowering took them back and what the plan handed out next is
        returned = list(self._returned)
        cut_at, before = self._cut
        current = next(
            (
                i
                for i, (_, end, _, _) in enumerate(returned)
                if end > position or (end == position and not (end == cut_at and i < before))
            ),
            len(returned),
        )
        pending = np.empty(0, dtype=np.int64)
        if current < len(returned):
            start, _, chunk, _ = returned[current]
            pending = chunk.ids[chunk.offsets[max(position - start, 0)] :]
        self._returned.clear()
        self._cut = (0, 0)
        plan.lower_giving_back(pending, limit, returned[current + 1][3] if current + 1 < len(returned) else None)
        self._lowered_at(position, limit)

    def _lowered_at(self, position: int, limit: Limit) -> None:
        """Record ``limit`` lowered at ``position``, from where the plan goes on."""
        self.position = position
        self.lowered = lowered_at(self.lowered, position, limit)
        if self.stats is not None:
            self.stats.replanned(position - self.skip)

    def copied(self) -> Stream:
        """A stream with this one's record (skipped batches, lowerings, resume points) and nothing more to hand out."""
        return Stream(_Copied(self.plan), skip=self.skip, lowered=self.lowered)

    @property
    def lowered_past_end(self) -> bool:
        """Whether lowered limits remain that the stream never reached."""
        return bool(self._replay)

    def count(self) -> int:
        """Number of batches left (consumes the stream)."""
        total = 0
        for chunk in self:
            total += chunk.num_batches
        return total


class _Copied:
    """The plan of a copied stream: nothing more to hand out (the original's iteration is not copied).

    It keeps the resume points the original's plan noted, so that the copy's state names one too.
    """

    def __init__(self, plan: Plan) -> None:
        self.points = plan.points.copy() if isinstance(plan, HasPoints) else ResumePoints()

    def __next__(self) -> PlanChunk:
        raise StopIteration

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Nothing to plan again: a copied stream has returned no chunk, so ``pending`` is empty."""


class MarkedPlan:
    """One rank's plan of an epoch that notes where its chunks begin, as resume points.

    A state of a step in a chunk resumes from the chunk's first batch (``ResumePoint``).
    Taken up at a point, ``position`` is that point's batch, and ``segment`` (with ``epoch``)
    is the stretch resumed, whose steps past the plan's end are refused when it ends.
    """

    def __init__(self, plan: Plan, position: int = 0, segment: Segment | None = None, epoch: int = 0) -> None:
        self.plan, self.position, self.segment, self.epoch = plan, position, segment, epoch
        self.points = ResumePoints()
        self._lowered = False

    def __iter__(self) -> MarkedPlan:
        return self

    def __next__(self) -> PlanChunk:
        try:
            chunk = next(self.plan)
        except StopIteration:
            if self.segment is not None and not self._lowered:
                check_steps(self.segment, self.position, self.epoch)
            raise
        if not self._lowered and chunk.num_batches:
            first = ResumePoint(self.position, int(chunk.ids[0]))
            self.points.add(self.position, self.position + chunk.num_batches, first)
        self.position += chunk.num_batches
        return chunk

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Plan ``pending`` and the rest under ``limit``; no chunk is a resume point from then on."""
        # NOTE: a state saved after a lowering replays it (its batches differ from the configured plan's)
        self._lowered = True
        self.points.clear()
        self.plan.lower(pending, limit)
