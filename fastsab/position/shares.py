"""An epoch's batches after the stretches already run, and this rank's share of them.

Resuming never replays a plan item by item: the epoch is planned again from its seed and
number, and each stretch of its history (``Segment``) is applied
in turn. A stretch on one rank runs its stream (lowered limits re-planned where they were
lowered) and leaves the batches after its steps; a stretch on ``w`` ranks deals the batches
left to ``w`` ranks (``StepDealer``, as
``assign_steps`` deals them whole) and leaves those not dealt to its
steps. Each stretch is applied chunk by chunk as the plan comes, so no rank holds an epoch's
plan. This is the one place where a state of another world size is resumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastsab.plan.epochs import EpochOrder
from fastsab.plan.plans import PlanChunk, Restarts
from fastsab.plan.plans import Planner as _Planner
from fastsab.position.batch_count import BatchCount, rest_of
from fastsab.position.dealing import DealtWindow, StepDealer, count_steps
from fastsab.position.epoch_state import Limit, ResumePoint, ResumePoints, Segment, check_steps
from fastsab.position.stats import EpochStats
from fastsab.position.stream import MarkedPlan, Plan, Stream

Planner = _Planner[Any]

__all__ = ["DealtShare", "EpochShares"]


class EpochShares:
    """The batches of ``planner``'s epochs left after a history, and ``rank``'s share of them.

    Every stretch is applied as the plan's chunks come: nothing holds an epoch's plan, but
    a limit lowered on one rank after a stretch on several (whose rest is then planned again
    at once).
    """

    def __init__(self, planner: Planner, rank: int) -> None:
        self.planner = planner
        self.rank = rank

    def stream(
        self, epoch: int, history: list[Segment], segment: Segment, count: BatchCount | None = None
    ) -> tuple[Stream, DealtShare | None]:
        """This rank's stream of ``epoch`` after ``history``, ``segment.steps`` batches in.

        ``count``: the batches of the plan after ``history`` as ``len()`` counted them, checked
        as the plan comes.

        Returns:
            The stream and, for several ranks, the share that deals the batches as they come
            (``None`` for one rank).
        """
        plan, spans = self._plan_after(epoch, history)
        if segment.world_size == 1:
            if not history and restarts(self.planner):
                plan = MarkedPlan(plan)
            return Stream(plan, skip=segment.steps, lowered=segment.lowered, batch_count=count), None
        # NOTE: dealt window by window as the plan comes, so a rank holds a window's batches,
        # not the epoch's; the steps run before a save are dealt again and skipped
        dealt = DealtShare(plan, self.planner, self.rank, self.dealer(segment, epoch), epoch, spans=spans)
        dealt.batch_count = count
        return Stream(dealt, skip=segment.steps), dealt

    def remaining(self, epoch: int, history: list[Segment], segment: Segment, batches: int | None = None) -> int:
        """Steps of ``epoch`` left after ``history`` and ``segment.steps`` steps of ``segment``.

        From ``batches``, the epoch's global batches where known, where the rest after
        ``history`` is derived from them (``rest_after``); else counted in one pass over the
        plan's chunks (none without a history or lowered limits).

        Raises:
            ValueError: If a stretch names steps or lowered positions past the end of the epoch.
        """
        rest = rest_of(batches, history, segment)
        if rest is not None:
            batches = rest
        elif not history and not segment.lowered:
            batches = int(self.planner.num_batches(epoch))
        else:
            stream = Stream(self._plan_after(epoch, history)[0], lowered=segment.lowered)
            batches = stream.count()
            if stream.lowered_past_end:
                raise ValueError(
                    f"state['lowered'] names positions past the {batches} batches of epoch {epoch}: "
                    f"{segment.lowered!r}."
                )
        steps = count_steps(batches, segment.world_size, segment.even_batches or "pad")
        check_steps(segment, steps, epoch)
        return steps - segment.steps

    def _plan_after(self, epoch: int, history: list[Segment]) -> tuple[Plan, bool]:
        """The plan of the global batches not run by the stretches of ``history``, and whether spans apply.

        Batches carry the groups they span (for dealing that follows a dataset's chunks) while
        every stretch before ran on several ranks: a stretch on one rank plans its rest anew.
        """
        plan: Plan = self.planner.chunks(epoch)
        spans = not self.planner.order.rotate
        for segment in history:
            if segment.world_size == 1:
                plan, spans = (
                    _AfterSteps(Stream(plan, lowered=segment.lowered), self.planner, segment.steps, epoch),
                    False,
                )
            else:
                dealer = self.dealer(segment, epoch)
                plan = _NotDealt(plan, self.planner, dealer, segment, epoch, spans=spans)
        return plan, spans

    def dealer(self, segment: Segment, epoch: int) -> StepDealer:
        """A dealer of ``epoch``'s batches as ``segment`` deals them."""
        return StepDealer(
            segment.world_size,
            even_batches=segment.even_batches or "pad",
            balance=bool(segment.balance),
            seed=self.planner.order.seed,
            epoch=epoch,
        )


class _Dealing:
    """Deals a plan's chunks to ranks as they come, holding the global batches not dealt yet."""

    plan: Plan
    planner: Planner
    dealer: StepDealer

    def _deal(self, plan: Plan, planner: Planner, dealer: StepDealer, epoch: int, *, spans: bool) -> None:
        self.plan, self.planner, self.dealer = plan, planner, dealer
        self._place = _group_places(planner.order, epoch) if spans else None
        self._held = _EMPTY_CHUNK  # the global batches from _start on, not dealt yet
        self._start = 0
        self._done = False

    def _deal_next(self) -> tuple[list[DealtWindow], PlanChunk | None]:
        """The windows the plan's next chunk completes, and that chunk; at its end, the last windows and ``None``."""
        if self._done:
            raise StopIteration
        try:
            chunk = next(self.plan)
        except StopIteration:
            self._done = True
            return self.dealer.finish(), None
        costs = self.planner.batch_costs(chunk.ids, chunk.offsets)
        spans = None if self._place is None else _spans(chunk, self._place, self.planner.order.group_size)
        self._hold(chunk)
        return self.dealer.push(costs, spans), chunk

    def _hold(self, chunk: PlanChunk) -> None:
        self._held = PlanChunk.concat([self._held, PlanChunk(chunk.ids, chunk.offsets)])  # (reports go out once)

    def _release_dealt(self) -> None:
        """Let go of the held batches every dealt window has passed."""
        done = min(self.dealer.start, self._start + self._held.num_batches) - self._start
        self._held, self._start = self._held.tail(done), self._start + done


class _Rest:
    """A plan made of another's chunks; lowered, the rest of it is planned again at once.

    ``pending`` and every batch still to come are split under the lowered limit as one
    sequence (as ``ExplicitPlan`` splits a rest given whole), keeping the
    reports of the chunks still to come.
    """

    planner: Planner
    _lowered: PlanChunk | None = None  # the rest planned again under a lowered limit
    _exhausted = False

    def __iter__(self) -> _Rest:
        return self

    def __next__(self) -> PlanChunk:
        if self._lowered is not None:
            chunk, self._lowered = self._lowered, None
            self._exhausted = True
            return chunk
        if self._exhausted:
            raise StopIteration
        return self._next()

    def _next(self) -> PlanChunk:
        raise NotImplementedError

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Plan ``pending`` and the rest under ``limit``."""
        # NOTE: the one place a rest is held whole: a limit lowered on one rank after a stretch
        # on several, where greedy batches of the rest depend on all of it
        rest = PlanChunk.concat(list(_Drain(self)))
        ids = np.concatenate([pending, rest.ids])
        batches = PlanChunk.from_batches(self.planner.split(ids, limit))
        self._lowered = PlanChunk(batches.ids, batches.offsets, rest.skipped, rest.dropped)


class _Drain:
    """The chunks a ``_Rest`` still has, without what a lowering planned."""

    def __init__(self, rest: _Rest) -> None:
        self.rest = rest

    def __iter__(self) -> Iterator[PlanChunk]:
        while True:
            try:
                yield self.rest._next()
            except StopIteration:
                return


class _AfterSteps(_Rest):
    """The batches of a stream after its first ``steps`` (those before, run on one rank).

    Raises (once the stream ends):
        ValueError: If ``steps`` is past the stream's end.
    """

    def __init__(self, stream: Stream, planner: Planner, steps: int, epoch: int) -> None:
        self.stream, self.planner, self.steps, self.epoch = stream, planner, steps, epoch
        self.position = 0

    def _next(self) -> PlanChunk:
        try:
            chunk = next(self.stream)
        except StopIteration:
            if self.steps > self.position:
                raise ValueError(
                    f"state has steps={self.steps!r} on one rank, past the {self.position} batches "
                    f"of epoch {self.epoch}."
                ) from None
            raise
        start, self.position = self.position, self.position + chunk.num_batches
        batches = chunk.tail(min(max(self.steps - start, 0), chunk.num_batches))
        return PlanChunk(batches.ids, batches.offsets, chunk.skipped, chunk.dropped)


class _NotDealt(_Rest, _Dealing):
    """The batches of a plan not dealt in the first ``segment.steps`` steps of a stretch on several ranks.

    They come in plan order, window by window as the plan is dealt again: each window's
    batches not named in the steps run (a padded step names repeats of the first batches,
    which count as run); at the end, the surplus a stretch with ``even_batches="drop"``
    left out.

    Raises (once the plan ends):
        ValueError: If ``segment.steps`` is past the stretch's steps.
    """

    def __init__(
        self, plan: Plan, planner: Planner, dealer: StepDealer, segment: Segment, epoch: int, *, spans: bool
    ) -> None:
        self.segment, self.epoch = segment, epoch
        self._deal(plan, planner, dealer, epoch, spans=spans)

    def _next(self) -> PlanChunk:
        windows, chunk = self._deal_next()
        if chunk is None:
            check_steps(self.segment, self.dealer.num_steps, self.epoch)
            return self._left(windows, _EMPTY_CHUNK, last=True)
        return self._left(windows, chunk, last=False)

    def _left(self, windows: list[DealtWindow], chunk: PlanChunk, *, last: bool) -> PlanChunk:
        world, n = self.dealer.world_size, self.dealer.seen
        left = []
        for window in windows:
            first = window.first_step * world
            run = window.batches[: max(min(self.segment.steps - window.first_step, len(window.batches)), 0)]
            batches = np.arange(first, min(first + window.batches.size, n), dtype=np.int64)
            left.append(batches[~np.isin(batches, run)])
        if last:  # the surplus left out (even_batches="drop")
            left.append(np.arange(min(self.dealer.start, n), n, dtype=np.int64))
        which = np.concatenate(left) if left else _NO_BATCHES
        rest = self._held.select(which - self._start)
        self._release_dealt()
        return PlanChunk(rest.ids, rest.offsets, chunk.skipped, chunk.dropped)


class DealtShare(_Dealing):
    """One rank's share of a plan's batches, dealt to the ranks window by window as the chunks come.

    Each chunk of the plan gives the rank's batches of the windows it completes (the
    ``StepDealer`` deals exactly as
    ``assign_steps`` over the whole plan), with the indices the chunk
    skipped and dropped; the last chunk adds the surplus dropped, or the padding's repeats.
    Only the batches of the window being filled and the epoch's first ``world_size``
    batches (which padding repeats) are held.

    Args:
        plan: The global plan's chunks.
        planner: Gives the batches' costs for balancing.
        rank: The rank whose batches are returned.
        dealer: Deals the global batches (its world size and options).
        epoch: The epoch (with unrotated groups, the order the batches' groups are read in).
        spans: Whether the dealing follows the groups the batches span (with unrotated groups).
    """

    def __init__(
        self, plan: Plan, planner: Planner, rank: int, dealer: StepDealer, epoch: int, *, spans: bool = True
    ) -> None:
        self.rank = rank
        self.stats: EpochStats | None = None  # receives the padding and spread counts as they are known
        self.points = ResumePoints()  # the windows' first batches, where a state resumes
        self.segment: Segment | None = None  # taken up at a point: the stretch resumed (steps past the end refused)
        self.batch_count: BatchCount | None = None  # the plan's batches as len() counted them, checked as they come
        self._first = _EMPTY_CHUNK  # the epoch's first world_size batches
        self._deal(plan, planner, dealer, epoch, spans=spans)
        self.epoch = epoch

    def __iter__(self) -> DealtShare:
        return self

    def __next__(self) -> PlanChunk:
        windows, chunk = self._deal_next()
        if self.batch_count is not None:  # (seen counts from the first batch of the plan dealt: its start)
            self.batch_count.check(self.dealer.seen, ended=chunk is None)
        if chunk is None and self.segment is not None:
            check_steps(self.segment, self.dealer.start // self.dealer.world_size, self.epoch)
        return self._share(windows, _EMPTY_CHUNK if chunk is None else chunk, last=chunk is None)

    def take_up(self, start: int, first: PlanChunk, segment: Segment) -> None:
        """Deal a plan that begins at global batch ``start`` (a window's first), resuming ``segment``.

        ``first`` holds the epoch's first ``world_size`` batches, which padding repeats; the
        dealer was set there (``StepDealer.resume_at``). Steps of ``segment`` past the end of
        the epoch are refused when the plan ends.
        """
        self._start, self._first, self.segment = start, first.head(self.dealer.world_size), segment

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Refused: under several ranks the limit is kept, so that the ranks run equal steps."""
        raise RuntimeError(f"a rank's dealt share is not planned again under a lowered limit {limit!r}.")

    def _hold(self, chunk: PlanChunk) -> None:
        super()._hold(chunk)
        if self._first.num_batches < self.dealer.world_size:
            self._first = PlanChunk.concat([self._first, PlanChunk(chunk.ids, chunk.offsets)]).head(
                self.dealer.world_size
            )

    def _share(self, windows: list[DealtWindow], chunk: PlanChunk, *, last: bool) -> PlanChunk:
        """The rank's batches of ``windows``; ``chunk``'s reports, and at the ``last`` the dealing's."""
        mine = np.concatenate([w.batches[:, self.rank] for w in windows]) if windows else _NO_BATCHES
        repeat = np.concatenate([w.padding[:, self.rank] for w in windows]) if windows else _NO_FLAGS
        source, which = self._held, mine - self._start
        if repeat.any():
            # NOTE: padding repeats the epoch's first batches, which may no longer be held
            source = PlanChunk.concat([self._first, self._held])
            which = np.where(mine < self._start, mine, mine - self._start + self._first.num_batches)
        share = source.select(which)
        dropped = chunk.dropped
        if last and len(self.dealer.dropped):
            dropped = np.concatenate([dropped, self._held.select(self.dealer.dropped - self._start).distinct_ids()])
        padded = source.select(which[repeat]).distinct_ids() if repeat.any() else _EMPTY_CHUNK.ids
        for window in windows:  # where a state of a step in the window resumes
            first, steps = window.first_step * self.dealer.world_size, window.first_step + len(window.batches)
            if first - self._start < self._held.num_batches:
                item = int(self._held.ids[self._held.offsets[first - self._start]])
                self.points.add(window.first_step, steps, ResumePoint(first, item, window.rng))
        self._release_dealt()
        self._report()
        return PlanChunk(share.ids, share.offsets, chunk.skipped, dropped, padded)

    def _report(self) -> None:
        stats = self.stats
        if stats is not None:
            stats.num_padded = self.dealer.num_padded
            stats.spread_before, stats.spread_after = self.dealer.spread_before, self.dealer.spread_after


_EMPTY_CHUNK = PlanChunk(np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
_NO_BATCHES = np.empty(0, dtype=np.int64)
_NO_FLAGS = np.empty(0, dtype=np.bool_)


def _group_places(order: EpochOrder, epoch: int) -> np.ndarray | None:
    """Each group's place in ``epoch``'s order of groups; ``None`` for rotated groups (no spans)."""
    if order.rotate:
        return None
    place = np.empty(order.permutation.num_groups, dtype=np.int64)
    place[order.group_order(epoch)] = np.arange(len(place))
    return place


def _spans(chunk: PlanChunk, place: np.ndarray, group_size: int) -> np.ndarray:
    """The places of the groups of each batch's first and last item."""
    if not chunk.num_batches:
        return np.empty((0, 2), dtype=np.int64)
    ends = np.stack([chunk.ids[chunk.offsets[:-1]], chunk.ids[chunk.offsets[1:] - 1]], axis=1)
    return place[ends // group_size]  # type: ignore[no-any-return]


def restarts(planner: Planner) -> bool:
    """Whether ``planner`` plans an epoch from one of its batches on (``Restarts``)."""
    return isinstance(planner, Restarts) and planner.restarts
