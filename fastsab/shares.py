"""An epoch's batches after the stretches already run, and this rank's share of them.

Resuming never replays a plan item by item: the epoch is planned again from its seed and
number, and each stretch of its history (:class:`~fastsab.epoch_state.Segment`) is applied
in turn. A stretch on one rank runs its stream (lowered limits re-planned where they were
lowered) and leaves the batches after its steps; a stretch on ``w`` ranks deals the batches
left to ``w`` ranks (:func:`~fastsab.distributed.assign_steps`) and leaves those not dealt to
its steps. This is the one place where a state of another world size is resumed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fastsab.distributed import StepAssignment, assign_steps
from fastsab.epoch_state import Segment, check_steps
from fastsab.epochs import EpochOrder
from fastsab.plans import ExplicitPlan, PlanChunk
from fastsab.stream import Plan, Stream

if TYPE_CHECKING:
    from fastsab.cursor import Planner

__all__ = ["EpochShares"]


class EpochShares:
    """The batches of ``planner``'s epochs left after a history, and ``rank``'s share of them.

    The last epoch dealt to ranks is cached, so that ``len()`` and the iteration that
    follows plan it once.
    """

    def __init__(self, planner: Planner, rank: int) -> None:
        self.planner = planner
        self.rank = rank
        self._cache: tuple[str, tuple[PlanChunk, StepAssignment]] | None = None

    def stream(self, epoch: int, history: list[Segment], segment: Segment) -> tuple[Stream, StepAssignment | None]:
        """This rank's stream of ``epoch`` after ``history``, ``segment.steps`` batches in.

        Returns:
            The stream and, for several ranks, how the batches were dealt (``None`` for one).
        """
        if segment.world_size == 1:
            return Stream(self._plan_after(epoch, history), skip=segment.steps, lowered=segment.lowered), None
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
        if segment.world_size > 1:
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


def _with_spans(chunks: list[PlanChunk], order: EpochOrder, epoch: int) -> PlanChunk:
    """The chunks as one; with unrotated groups, each batch labelled with the groups it spans.

    A label is a group's place in the epoch's order of groups: for each batch, the places of
    its first and of its last item's group.
    """
    whole = PlanChunk.concat(chunks)
    if order.rotate or not whole.num_batches:
        return whole
    place = np.empty(order.permutation.num_groups, dtype=np.int64)
    place[order.group_order(epoch)] = np.arange(len(place))
    ends = np.stack([whole.ids[whole.offsets[:-1]], whole.ids[whole.offsets[1:] - 1]], axis=1)
    return replace(whole, spans=place[ends // order.group_size])
