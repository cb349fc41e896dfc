"""An epoch resumed at a ``ResumePoint``: its plan taken up there, none of the steps before it planned again.

A state saved mid-epoch names the first global batch of the dealing window that holds its
last step (on one rank: of the plan chunk), that batch's first item and the dealer's random
state there. The planner plans the epoch from that item on (``Restarts``: a greedy split
starts afresh at each batch, fixed-size batches at each multiple of the batch size), the
dealer deals from that window on as it did in the run, and the stream skips the window's
steps already run: the work of a resume is a window's, wherever in the epoch it stands.

Where a point does not apply (no point in the state, another world size or dealing, earlier
stretches, lowered limits, sorted windows, shape buckets), ``EpochShares`` replays the epoch.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from fastsab.plan.plans import PlanChunk, Restarts
from fastsab.position.batch_count import BatchCount
from fastsab.position.epoch_state import Limit, ResumePoint, Segment, parse_resume_point
from fastsab.position.shares import DealtShare, EpochShares, Planner, _group_places, _spans, restarts
from fastsab.position.stream import HasPoints, MarkedPlan, Stream

__all__ = ["epoch_stream", "loaded_point", "resumed_stream", "saved_point", "steps_left"]


def loaded_point(
    shares: EpochShares, state: dict[str, Any], history: list[Segment], segment: Segment, own: Segment
) -> ResumePoint | None:
    """The resume point of ``state`` (read by ``parse_state``) where this object takes it up, else ``None``.

    ``history`` and ``segment`` are the state's stretches, ``own`` a stretch of this object's
    ranks and dealing. Without a point the epoch is replayed (``EpochShares.stream``).

    Raises:
        TypeError, ValueError: If the state's ``"resume"`` entry is malformed or names an item
            past the dataset's end.
    """
    point = parse_resume_point(state)
    if point is None:
        return None
    n = shares.planner.order.id_bound
    if point.item >= n:
        raise ValueError(f"state['resume'] names item {point.item!r}, past the {n} items of the dataset.")
    world = segment.world_size
    # NOTE: the point is where this stretch's dealing stood: other ranks or dealing, earlier
    # stretches, lowered limits (the rest planned under another limit) and planners that do
    # not restart (sorted windows, shape buckets) replay the epoch instead, and so does a
    # point this stretch cannot have saved
    taken = (
        segment.dealing() == own.dealing()
        and not history
        and not segment.lowered
        and restarts(shares.planner)
        and point.batch % world == 0
        and point.batch // world < segment.steps
        and (world == 1 or not segment.balance or point.rng is not None)
    )
    return point if taken else None


def saved_point(stream: Stream, planner: Planner, steps: int) -> ResumePoint | None:
    """The resume point of the window (or chunk) of ``stream`` that holds the last of ``steps`` steps, if kept.

    ``stream`` is an epoch's from its start (no earlier stretch, no lowered limit).
    """
    plan = stream.plan
    if isinstance(plan, HasPoints) and restarts(planner):
        return plan.points.holding(steps)
    return None


def resumed_stream(
    shares: EpochShares, epoch: int, segment: Segment, point: ResumePoint, count: BatchCount | None = None
) -> tuple[Stream, DealtShare | None]:
    """The stream of ``shares.rank`` after ``segment.steps`` steps of ``epoch``, its plan taken up at ``point``.

    ``count``: the epoch's batches as ``len()`` counted them, checked as the plan comes.

    Returns:
        The stream and, for several ranks, the share that deals the batches (as ``EpochShares.stream``).
    """
    planner = shares.planner
    plan = _FromPoint(cast(Restarts, planner), epoch, point.item)  # (loaded_point checked that it restarts)
    world = segment.world_size
    if world == 1:
        marked = MarkedPlan(plan, point.batch, segment, epoch)
        plan.stream = Stream(marked, skip=segment.steps, start=point.batch, batch_count=count)
        return plan.stream, None
    # NOTE: taken up at the epoch's first batch, the plan itself gives the first batches to the dealer
    first = _first_batches(shares, epoch, world) if point.batch else PlanChunk.concat([])
    spans = not planner.order.rotate
    place = _group_places(planner.order, epoch) if spans else None
    lasts = None if place is None else _spans(first, place, planner.order.group_size)[:, 1]
    dealer = shares.dealer(segment, epoch)
    dealer.resume_at(point.batch, planner.batch_costs(first.ids, first.offsets), lasts, point.rng)
    dealt = DealtShare(plan, planner, shares.rank, dealer, epoch, spans=spans)
    dealt.take_up(point.batch, first, segment)
    dealt.batch_count = count
    plan.stream = Stream(dealt, skip=segment.steps, start=point.batch // world)
    return plan.stream, dealt


def epoch_stream(
    shares: EpochShares,
    epoch: int,
    history: list[Segment],
    segment: Segment,
    point: ResumePoint | None,
    count: BatchCount | None = None,
) -> tuple[Stream, DealtShare | None]:
    """This rank's stream of ``epoch`` after ``history`` and ``segment.steps`` steps: from ``point``, or replayed.

    ``count``: the batches of the plan after ``history`` as ``len()`` counted them, checked as they come.
    """
    if point is None:
        return shares.stream(epoch, history, segment, count)
    return resumed_stream(shares, epoch, segment, point, count)


def steps_left(
    shares: EpochShares,
    epoch: int,
    history: list[Segment],
    segment: Segment,
    point: ResumePoint | None,
    batches: int | None = None,
) -> int | None:
    """Steps of ``epoch`` left after the stretches; taken up at ``point``, ``None`` if some are left (not counted).

    ``batches``: the epoch's global batches where known (the steps left are derived from them where exact).

    Raises:
        ValueError: If a stretch names steps past the end of the epoch.
    """
    if point is None:
        return shares.remaining(epoch, history, segment, batches)
    # NOTE: planned from the point through the next step only: whether the epoch has one (else
    # the state was saved at its end); steps past its end are refused there
    stream, _ = resumed_stream(shares, epoch, segment, point)
    return None if any(chunk.num_batches for chunk in stream) else 0


def _first_batches(shares: EpochShares, epoch: int, count: int) -> PlanChunk:
    """The first ``count`` batches of ``epoch`` (which padding repeats), planned from its start."""
    chunks, batches = [], 0
    for chunk in shares.planner.chunks(epoch):
        chunks.append(PlanChunk(chunk.ids, chunk.offsets))
        batches += chunk.num_batches
        if batches >= count:
            break
    return PlanChunk.concat(chunks).head(count)


class _FromPoint:
    """A planner's chunks of an epoch from a resume point on; at their end, the items skipped before it.

    The oversize items the epoch skipped before the point are reported (in ``stream``'s stats,
    before those reported since) once the plan ends: the order before the point is read only
    there, not on the way to the first batch.
    """

    def __init__(self, planner: Restarts, epoch: int, item: int) -> None:
        self.planner, self.epoch, self.item = planner, epoch, item
        self.plan = planner.chunks_from(epoch, item)
        self.stream: Stream | None = None

    def __next__(self) -> PlanChunk:
        try:
            return next(self.plan)
        except StopIteration:
            stats = None if self.stream is None else self.stream.stats
            if stats is not None:
                stats.skipped_before(self.planner.skipped_before(self.epoch, self.item))
                self.stream = None  # (reported once)
            raise

    def lower(self, pending: np.ndarray, limit: Limit) -> None:
        """Plan ``pending`` and the rest under ``limit``."""
        self.plan.lower(pending, limit)
