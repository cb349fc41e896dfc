"""A rank's stream of plan chunks: skipping the batches already run, replaying and recording lowerings."""

from __future__ import annotations

from fastsab.plan.cost_sources import make_cost_source
from fastsab.plan.costs import BatchCost
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.fixed_size import FixedSizePlanner
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.position.stats import EpochStats
from fastsab.position.stream import Stream


def plan(n=20, batch_size=4, group_size=8):
    """An unshuffled epoch of ``range(n)`` in batches of ``batch_size``, planned ``group_size`` items at a time."""
    return FixedSizePlanner(EpochOrder(n, shuffle=False, group_size=group_size), batch_size, False).chunks(0)


def batches(stream):
    return [batch.tolist() for chunk in stream for batch in chunk.batches()]


def test_a_stream_without_skip_or_lowering_is_the_plan():
    assert batches(Stream(plan())) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


def test_skipping_drops_whole_chunks_and_the_head_of_the_chunk_it_lands_in():
    # chunks of 2 batches: a skip of 3 drops the first chunk and the first batch of the second
    stream = Stream(plan(), skip=3)
    assert batches(stream) == [[12, 13, 14, 15], [16, 17, 18, 19]]
    assert stream.position == 5


def test_a_skip_past_the_end_leaves_nothing():
    assert batches(Stream(plan(), skip=9)) == []


def test_a_lowering_is_replayed_where_it_was_recorded_also_inside_the_skipped_batches():
    whole = Stream(plan(), lowered=[(1, 3)])
    assert batches(whole) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15], [16, 17, 18], [19]]
    resumed = Stream(plan(), skip=3, lowered=[(1, 3)])
    assert batches(resumed) == [[10, 11, 12], [13, 14, 15], [16, 17, 18], [19]]
    assert not resumed.lowered_past_end


def test_a_lowering_past_the_end_is_reported():
    stream = Stream(plan(), lowered=[(7, 2)])
    assert stream.count() == 5
    assert stream.lowered_past_end


def test_lower_plans_again_the_batches_of_chunks_returned_but_not_released():
    stream = Stream(plan())
    first = next(stream)  # batches 0 and 1, both handed out ahead
    assert first.num_batches == 2
    stream.release(1)  # batch 0 consumed; the chunk still holds batch 1
    stream.lower(1, 2)
    assert stream.lowered == [(1, 2)]
    assert batches(stream) == [[4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15], [16, 17], [18, 19]]


def test_a_second_lowering_replaces_the_record_from_its_position_on():
    stream = Stream(plan(), lowered=[(1, 3), (4, 2)])
    next(stream)
    stream.lower(2, 1)
    assert stream.lowered == [(1, 3), (2, 1)]


class Recorded:
    """A plan that records what each lowering re-plans: ``(pending ids, limit)``."""

    def __init__(self, plan):
        self.plan = plan
        self.lowerings = []

    def __next__(self):
        return next(self.plan)

    def lower(self, pending, limit):
        self.lowerings.append((pending.tolist(), limit))
        self.plan.lower(pending, limit)


def test_lowerings_at_one_position_are_recorded_and_replayed_in_turn():
    # a live stream lowered twice at batch 1: the second lowering re-plans what the first planned
    live = Stream(Recorded(plan()))
    next(live)
    live.lower(1, 3)
    next(live)
    live.lower(1, 2)
    rest = batches(live)
    assert live.lowered == [(1, 3), (1, 2)]
    # invariant: a stream replaying the record re-plans the same items under each limit in turn
    replayed = Stream(Recorded(plan()), lowered=live.lowered)
    assert batches(replayed)[1:] == rest
    assert (
        replayed.plan.lowerings
        == live.plan.lowerings
        == [([4, 5, 6, 7], 3), ([4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], 2)]
    )
    assert not replayed.lowered_past_end


def test_release_lets_go_only_of_chunks_wholly_before_the_position():
    stream = Stream(plan())
    next(stream), next(stream)  # batches 0-1, then 2-3
    stream.release(3)  # the second chunk still holds batch 3
    stream.lower(3, 1)
    assert batches(stream)[:4] == [[12], [13], [14], [15]]


def test_the_stream_reports_what_the_chunks_it_skips_over_hold():
    # drop_last: the last chunk has no batch, only the items it drops; skipped over, it is still reported
    order = EpochOrder(10, shuffle=False, group_size=8)
    stream = Stream(FixedSizePlanner(order, 4, True).chunks(0), skip=2)
    stream.stats = EpochStats(0)
    assert stream.count() == 0
    assert stream.stats.dropped == [8, 9]


def test_a_chunk_without_batches_at_the_start_is_returned_with_what_it_skipped():
    # the first group is one oversize item: its chunk has no batch, only the item it skips
    planner = SizeAwarePlanner(EpochOrder(3, shuffle=False, group_size=1), make_cost_source([5, 1, 1], 3), BatchCost(1))
    chunks = list(Stream(planner.chunks(0)))
    assert chunks[0].skipped.tolist() == [0]
    assert [batch.tolist() for chunk in chunks for batch in chunk.batches()] == [[1], [2]]
