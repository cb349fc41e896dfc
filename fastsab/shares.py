"""An epoch's batches after the stretches already run, and this rank's share of them.

Resuming never replays a plan item by item: the epoch is planned again from its seed and
number, and each stretch of its history (:class:`~fastsab.epoch_state.Segment`) is applied
in turn. A stretch on one rank runs its stream (lowered limits re-planned where they were
lowered) and leaves the batches after its steps; a stretch on ``w`` ranks deals the batches
left to ``w`` ranks (:func:`~fastsab.distributed.assign_steps`) and leaves those not dealt to
its steps. This is the one place where a state of another world size is resumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fastsab.distributed import DealtWindow, StepAssignment, StepDealer, assign_steps, count_steps
from fastsab.epoch_state import Limit, Segment, check_steps
from fastsab.epochs import EpochOrder, EpochStats
from fastsab.plans import ExplicitPlan, PlanChunk
from fastsab.stream import Plan, Stream

if TYPE_CHECKING:
    from fastsab.cursor import Planner

__all__ = ["DealtShare", "EpochShares"]


class EpochShares:
    """The batches of ``planner``'s epochs left after a history, and ``rank``'s share of them.

    The last epoch dealt to ranks is cached, so that ``len()`` and the iteration that
    follows plan it once.
    """

    def __init__(self, planner: Planner, rank: int) -> None:
        self.planner = planner
        self.rank = rank
        self._cache: tuple[str, tuple[PlanChunk, StepAssignment]] | None = None

    def stream(
        self, epoch: int, history: list[Segment], segment: Segment
    ) -> tuple[Stream, StepAssignment | DealtShare | None]:
        """This rank's stream of ``epoch`` after ``history``, ``segment.steps`` batches in.

        Returns:
            The stream and, for several ranks, how the batches were dealt: the dealing of the
            whole rest of the epoch after a history, else the share that deals the plan's
            chunks as they come (``None`` for one rank).
        """
        if segment.world_size == 1:
            return Stream(self._plan_after(epoch, history), skip=segment.steps, lowered=segment.lowered), None
        if not history:
            # NOTE: dealt window by window as the plan comes, so a rank holds a window's
            # batches, not the epoch's; the steps run before a save are dealt again and skipped
            dealt = DealtShare(self.planner.chunks(epoch), self.planner, self.rank, self._dealer(segment, epoch), epoch)
            return Stream(dealt, skip=segment.steps), dealt
        whole, assignment = self.dealt(epoch, history, segment)
        check_steps(segment, assignment.num_steps, epoch)
        mine = assignment.batches[:, self.rank]
        chunk = whole.select(mine[segment.steps :])
        # NOTE: the repeats of the whole stretch, also those run before the state was saved, as
        # the epoch run without a break reports them (which of two equal slots is the repeat is
        # the dealing's choice, so it may lie before the saved position)
        padded = whole.select(mine[assignment.padding[:, self.rank]]).ids
        dropped = np.concatenate([whole.dropped, whole.select(assignment.dropped).ids])
        share = PlanChunk(chunk.ids, chunk.offsets, whole.skipped, dropped, padded)
        return Stream(ExplicitPlan(share, self.planner)), assignment

    def remaining(self, epoch: int, history: list[Segment], segment: Segment) -> int:
        """Steps of ``epoch`` left after ``history`` and ``segment.steps`` steps of ``segment``.

        Raises:
            ValueError: If a stretch names steps or lowered positions past the end of the epoch.
        """
        if segment.world_size > 1 and not history:
            steps = count_steps(int(self.planner.num_batches(epoch)), segment.world_size, segment.even_batches or "pad")
        elif segment.world_size > 1:
            steps = self.dealt(epoch, history, segment)[1].num_steps
        elif not history and not segment.lowered:
            steps = int(self.planner.num_batches(epoch))
        else:
            stream = Stream(self._plan_after(epoch, history), lowered=segment.lowered)
            steps = stream.count()
            if stream.lowered_past_end:
                raise ValueError(
                    f"state['lowered'] names positions past the {steps} batches of epoch {epoch}: {segment.lowered!r}."
                )
        check_steps(segment, steps, epoch)
        return steps - segment.steps

    def dealt(self, epoch: int, history: list[Segment], segment: Segment) -> tuple[PlanChunk, StepAssignment]:
        """The batches left after ``history``, dealt to ``segment``'s ranks (cached)."""
        # NOTE: reprs tell limits apart by value and kind, so equal keys mean equal histories
        key = repr((epoch, history, segment.dealing()))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        whole = self._left_after(epoch, history)
        if whole is None:
            whole = _with_spans(list(self.planner.chunks(epoch)), self.planner.order, epoch)
        dealt = (whole, self._assign(whole, segment, epoch))
        self._cache = (key, dealt)
        return dealt

    def _plan_after(self, epoch: int, history: list[Segment]) -> Plan:
        rest = self._left_after(epoch, history)
        return self.planner.chunks(epoch) if rest is None else ExplicitPlan(rest, self.planner)

    def _assign(self, whole: PlanChunk, segment: Segment, epoch: int) -> StepAssignment:
        return assign_steps(
            self.planner.batch_costs(whole.ids, whole.offsets),
            segment.world_size,
            even_batches=segment.even_batches or "pad",
            balance=bool(segment.balance),
            seed=self.planner.order.seed,
            epoch=epoch,
            # NOTE: groups that are a dataset's chunks (not rotated) are dealt in order, so each
            # rank reads each chunk about once per epoch
            spans=whole.spans,
        )

    def _dealer(self, segment: Segment, epoch: int) -> StepDealer:
        return StepDealer(
            segment.world_size,
            even_batches=segment.even_batches or "pad",
            balance=bool(segment.balance),
            seed=self.planner.order.seed,
            epoch=epoch,
        )

    def _left_after(self, epoch: int, history: list[Segment]) -> PlanChunk | None:
        """The global batches not run by the stretches of ``history`` (``None``: no history)."""
        left: PlanChunk | None = None
        for segment in history:
            plan = self.planner.chunks(epoch) if left is None else ExplicitPlan(left, self.planner)
            if segment.world_size == 1:
                whole = PlanChunk.concat(list(Stream(plan, lowered=segment.lowered)))
                total = whole.num_batches
                if segment.steps > total:
                    raise ValueError(
                        f"state has steps={segment.steps!r} on one rank, past the {total} batches of epoch {epoch}."
                    )
                left = whole.tail(segment.steps)
                continue
            whole = left if left is not None else _with_spans(list(plan), self.planner.order, epoch)
            assignment = self._assign(whole, segment, epoch)
            check_steps(segment, assignment.num_steps, epoch)
            done = np.unique(assignment.batches[: segment.steps])
            left = whole.select(np.setdiff1d(np.arange(whole.num_batches, dtype=np.int64), done))
        return left


class DealtShare:
    """One rank's share of a plan's batches, dealt to the ranks window by window as the chunks come.

    Each chunk of the plan gives the rank's batches of the windows it completes (the
    :class:`~fastsab.distributed.StepDealer` deals exactly as
    :func:`~fastsab.distributed.assign_steps` over the whole plan), with the indices the chunk
    skipped and dropped; the last chunk adds the surplus dropped, or the padding's repeats.
    Only the batches of the window being filled and the epoch's first ``world_size``
    batches (which padding repeats) are held.

    Args:
        plan: The global plan's chunks.
        planner: Gives the batches' costs for balancing.
        rank: The rank whose batches are returned.
        dealer: Deals the global batches (its world size and options).
        epoch: The epoch (with unrotated groups, the order the batches' groups are read in).
    """

    def __init__(self, plan: Iterator[PlanChunk], planner: Planner, rank: int, dealer: StepDealer, epoch: int) -> None:
        self.plan = plan
        self.planner = planner
        self.rank = rank
        self.dealer = dealer
        self.stats: EpochStats | None = None  # receives the padding and spread counts as they are known
        self._place = _group_places(planner.order, epoch)
        self._held = _EMPTY_CHUNK  # the global batches from _start on, not dealt yet
        self._start = 0
        self._first = _EMPTY_CHUNK  # the epoch's first world_size batches
        self._done = False

    def __iter__(self) -> DealtShare:
        return self

    def __next__(self) -> PlanChunk:
        if self._done:
            raise StopIteration
        try:
            chunk = next(self.plan)
        except StopIteration:
            self._done = True
            return self._share(self.dealer.finish(), _EMPTY_CHUNK, last=True)
        costs = self.planner.batch_costs(chunk.ids, chunk.offsets)
        spans = None if self._place is None else _spans(chunk, self._place, self.planner.order.group_size)
        self._hold(chunk)
        return self._share(self.dealer.push(costs, spans), chunk, last=False)

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Refused: under several ranks the limit is kept, so that the ranks run equal steps."""
        raise RuntimeError(f"a rank's dealt share is not planned again under a lowered limit {limit!r}.")

    def _hold(self, chunk: PlanChunk) -> None:
        batches = PlanChunk(chunk.ids, chunk.offsets)  # (its reports go out with it, once)
        if self._first.num_batches < self.dealer.world_size:
            self._first = PlanChunk.concat([self._first, batches]).head(self.dealer.world_size)
        self._held = PlanChunk.concat([self._held, batches])

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
            dropped = np.concatenate([dropped, self._held.select(self.dealer.dropped - self._start).ids])
        padded = source.select(which[repeat]).ids if repeat.any() else _EMPTY_CHUNK.ids
        done = min(self.dealer.start, self._start + self._held.num_batches) - self._start
        self._held, self._start = self._held.tail(done), self._start + done
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


def _with_spans(chunks: list[PlanChunk], order: EpochOrder, epoch: int) -> PlanChunk:
    """The chunks as one; with unrotated groups, each batch labelled with the groups it spans.

    A label is a group's place in the epoch's order of groups: for each batch, the places of
    its first and of its last item's group.
    """
    whole = PlanChunk.concat(chunks)
    place = _group_places(order, epoch)
    if place is None or not whole.num_batches:
        return whole
    return replace(whole, spans=_spans(whole, place, order.group_size))
