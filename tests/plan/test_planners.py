"""The planners: one Planner protocol, their limits, their fingerprints and the one plan type."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import BatchSplit, split_batches
from fastsab.plan.batching import BatchSplit as BatchingBatchSplit
from fastsab.plan.costs import BatchCost, make_cost_source
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.fixed_size import FixedSizePlanner
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.plan.plans import Carry, PlanChunk, Planner
from fastsab.plan.window_epoch import SortedWindowEpoch
from fastsab.position.fingerprint import plan_fingerprint

SIZES = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])


def order(n: int = 10, shuffle: bool = False) -> EpochOrder:
    return EpochOrder(n, shuffle=shuffle, seed=1, group_size=4)


def size_aware(
    cap: Any = 12, sizes: Any = SIZES, oversize: Any = "skip", sort_window: Any = None, **rule: Any
) -> SizeAwarePlanner:
    costs = make_cost_source(sizes, len(sizes))
    return SizeAwarePlanner(
        order(len(sizes)), costs, BatchCost(cap, **rule), oversize=oversize, sort_window=sort_window
    )


# --- the modules ----------------------------------------------------------------------------


def test_every_planner_name_is_exported_by_the_one_module_that_defines_it():
    from fastsab.plan import fixed_size, planners, window_epoch

    modules = (fixed_size, planners, window_epoch)
    homes = [(name, module) for module in modules for name in module.__all__]
    assert len({name for name, _ in homes}) == len(homes)
    for name, module in homes:
        assert getattr(module, name).__module__ == module.__name__, name
    assert {"FixedSizePlanner", "FixedSizeEpoch"} <= set(fixed_size.__all__)
    assert {"SizeAwarePlanner", "SizeAwareEpoch"} <= set(planners.__all__)
    assert "SortedWindowEpoch" in window_epoch.__all__


# --- the protocol ---------------------------------------------------------------------------

PROTOCOL = [name for name in vars(Planner) if not name.startswith("_") and name not in ("register",)]


def test_the_protocol_names_the_shared_members() -> None:
    assert sorted(PROTOCOL) == sorted(
        [
            "batch_costs",
            "check_limit",
            "check_lowered_limit",
            "chunks",
            "limit",
            "num_batches",
            "order",
            "plan_inputs",
            "smaller_limit",
            "split",
        ]
    )


@pytest.mark.parametrize("planner", [FixedSizePlanner(order(), 3, False), size_aware()], ids=["fixed", "size-aware"])
def test_both_planners_implement_the_protocol(planner: Any) -> None:
    for name in PROTOCOL:
        assert hasattr(planner, name), name
        member = getattr(type(planner), name, None)
        if inspect.isfunction(member):
            wanted = list(inspect.signature(getattr(Planner, name)).parameters)
            assert list(inspect.signature(member).parameters) == wanted, name
    typed: Planner[Any] = planner
    assert sum(chunk.num_batches for chunk in typed.chunks(0)) == typed.num_batches(0)


# --- limits ---------------------------------------------------------------------------------


def test_size_aware_limits() -> None:
    planner = size_aware(np.int64(12))
    assert planner.limit == [12] and type(planner.limit[0]) is int
    assert planner.check_limit(np.array(6)) == [6]
    with pytest.raises(ValueError, match=r"limit must have 1 cap\(s\), got \[1, 2\]\."):
        planner.check_limit([1, 2])
    assert planner.check_lowered_limit(12.0) == [12.0]
    with pytest.raises(ValueError, match=r"a lowered limit must not exceed the configured \[12\], got 13\."):
        planner.check_lowered_limit(13)


def test_fixed_size_limits() -> None:
    planner = FixedSizePlanner(order(), 4, False)
    assert planner.limit == 4 and planner.check_lowered_limit(np.int64(2)) == 2
    with pytest.raises(ValueError, match=r"a lowered limit must not exceed the configured 4, got 5\."):
        planner.check_lowered_limit(5)
    assert planner.smaller_limit(np.arange(4), 4, 2) == 2
    assert [b.tolist() for b in planner.split(np.arange(5), 2)] == [[0, 1], [2, 3], [4]]


def test_size_aware_batch_costs_sum_and_padded() -> None:
    ids, offsets = np.array([0, 1, 2, 5]), np.array([0, 2, 4])
    assert size_aware(8).batch_costs(ids, offsets).tolist() == [0.5, 1.625]
    assert size_aware(8, cost="padded").batch_costs(ids, offsets).tolist() == [0.75, 2.25]
    assert size_aware(8).batch_costs(ids, np.array([0])).size == 0


def test_size_aware_smaller_limit_and_split() -> None:
    planner = size_aware(20, cost="padded")
    assert planner.smaller_limit(np.array([0, 2]), [20], 2) == [4.0]  # 2 * 4 / 2
    # under the lowered cap, the item above it (9) gets a batch of its own
    assert [b.tolist() for b in planner.split(np.array([4, 5, 6, 1]), [6])] == [[4], [5], [6, 1]]


def test_lowering_one_cap_over_two_cost_columns() -> None:
    # one cap applies to every cost column, also once lowered
    planner = size_aware(12, sizes=np.stack([SIZES, SIZES], axis=1))
    epoch = planner.chunks(0)
    assert next(epoch).num_batches == 0  # the first group stays open
    chunk = next(epoch)
    assert [b.tolist() for b in chunk.batches()] == [[0, 1, 2, 3], [4], [5, 6]]
    epoch.lower(chunk.ids[chunk.offsets[1] :], planner.check_lowered_limit(5))
    assert [b.tolist() for chunk in epoch for b in chunk.batches()] == [[4], [5], [6], [7], [8], [9]]


# --- fingerprints ---------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [12, 12.0, np.int64(12), np.float32(12), np.array(12), torch.tensor(12), [12]])
def test_fingerprint_is_equal_across_number_forms(cap: Any) -> None:
    assert plan_fingerprint(size_aware(cap)) == plan_fingerprint(size_aware(12))


@pytest.mark.parametrize("sizes", [SIZES.tolist(), torch.tensor(SIZES), SIZES.astype(np.int32)])
def test_fingerprint_is_equal_across_forms_of_the_sizes(sizes: Any) -> None:
    assert plan_fingerprint(size_aware(12, sizes=sizes)) == plan_fingerprint(size_aware(12))


@pytest.mark.parametrize(
    "other",
    [
        lambda: size_aware(13),
        lambda: size_aware(12, cost="padded"),
        lambda: size_aware(12, oversize="own_batch"),
        lambda: size_aware(12, max_batch_size=3),
        lambda: size_aware(12, batch_size_multiple=2),
        lambda: size_aware(12, sizes=SIZES + 1),
        lambda: size_aware(12, sizes=SIZES * 1.5),
        lambda: size_aware(12, sort_window=4),
    ],
)
def test_fingerprint_changes_with_what_decides_the_batches(other: Any) -> None:
    assert plan_fingerprint(other()) != plan_fingerprint(size_aware(12))


def test_fingerprints_are_pinned() -> None:
    # saved states carry these digests: they must not change
    shuffled = EpochOrder(10, shuffle=True, seed=1, group_size=4)
    assert plan_fingerprint(FixedSizePlanner(shuffled, 3, False)) == "e010229b4d9ffd588d30c646"
    array = make_cost_source(np.arange(10) + 1, 10)
    assert (
        plan_fingerprint(SizeAwarePlanner(shuffled, array, BatchCost([12], cost="padded")))
        == "ec8996141e25cc8329cce8dc"
    )
    computed = make_cost_source(lambda i: i + 1, 10)
    assert plan_fingerprint(SizeAwarePlanner(shuffled, computed, BatchCost(12.0))) == "cf40cb9532d333e8fa3efb42"
    windowed = SizeAwarePlanner(shuffled, array, BatchCost(12), sort_window=4)
    assert plan_fingerprint(windowed) == "7733f2d8012f0a8269c5474b"


def test_fingerprint_tells_window_sizes_apart() -> None:
    assert plan_fingerprint(size_aware(12, sort_window=4)) != plan_fingerprint(size_aware(12, sort_window=5))
    assert plan_fingerprint(size_aware(12, sort_window=4)) == plan_fingerprint(size_aware(12, sort_window=np.int64(4)))


@pytest.mark.parametrize("window", [0, -3])
def test_sort_window_must_be_positive(window: int) -> None:
    with pytest.raises(ValueError, match=rf"sort_window must be a positive integer, got {window}\."):
        size_aware(12, sort_window=window)


@pytest.mark.parametrize("window", [2.0, "4", True])
def test_sort_window_must_be_an_integer(window: Any) -> None:
    with pytest.raises(TypeError, match=rf"sort_window must be an integer, got {window!r}"):
        size_aware(12, sort_window=window)


def test_plan_inputs() -> None:
    assert FixedSizePlanner(order(), 3, True).plan_inputs() == (
        "FixedSizePlanner",
        {"batch_size": 3, "drop_last": True},
        b"",
        (),
    )
    kind, options, sizes, older = size_aware(12, max_batch_size=4).plan_inputs()
    assert older == ()  # (no older form of these batches)
    assert kind == "SizeAwarePlanner" and sizes == SIZES.tobytes()
    assert options == {"limit": [12], "oversize": "skip", "cost": "sum", "max_batch_size": 4, "batch_size_multiple": 1}


# --- one plan type --------------------------------------------------------------------------


def test_split_batches_returns_the_plan_type() -> None:
    assert BatchSplit is PlanChunk is BatchingBatchSplit
    split = split_batches([2, 2, 5, 3], 4, final=False)
    assert isinstance(split, PlanChunk) and isinstance(split.carry, Carry)
    assert split.ids.dtype == np.int64 and split.ids.tolist() == [0, 1]
    assert split.skipped.tolist() == [2] and split.dropped.size == 0 and split.padded.size == 0
    assert repr(split) == "PlanChunk(num_batches=1, num_items=2, num_skipped=1, num_dropped=0, num_padded=0, carry=1)"


def test_positions_become_ids_when_read() -> None:
    chunk = PlanChunk(range(3, 6), np.array([0, 1, 3]))
    assert [b.tolist() for b in chunk.batches()] == [[3], [4, 5]]
    assert chunk.ids is chunk.ids  # made once
    assert [b.tolist() for b in chunk.batches_of(np.array(["a", "b", "c"]))] == [["a"], ["b", "c"]]
    with pytest.raises(TypeError, match="offsets"):
        PlanChunk(np.arange(3))  # type: ignore[call-arg]


@pytest.mark.parametrize("seed", range(20))
def test_select_takes_the_batches_named_in_their_order(seed: int) -> None:
    # invariant: select(which) holds batch which[0], then which[1], ... (repeats and empty batches too)
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 4, rng.integers(1, 9))
    batches = [rng.permutation(100)[:size] for size in sizes]
    chunk = PlanChunk.from_batches(batches)
    which = rng.integers(0, len(batches), rng.integers(0, 12))
    selected = chunk.select(which)
    assert [b.tolist() for b in selected.batches()] == [batches[b].tolist() for b in which]


# --- sorted windows -------------------------------------------------------------------------


def window_planner(n: int = 120, group_size: int = 16, window: int = 3, cap: Any = 20) -> SizeAwarePlanner:
    sizes = np.random.default_rng(0).integers(1, 10, n)
    grouped = EpochOrder(n, shuffle=True, seed=3, group_size=group_size)
    return SizeAwarePlanner(grouped, make_cost_source(sizes, n), BatchCost(cap), sort_window=window)


def stream_batches(stream: Any) -> list[list[int]]:
    return [batch.tolist() for chunk in stream for batch in chunk.batches()]


@pytest.mark.parametrize("ahead", [0, 1, 3])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_sorted_windows_lowered_with_chunks_planned_ahead_replay_alike(ahead: int, position: int) -> None:
    # a lowering with chunks planned ahead (a prefetching loader) gives the batches its
    # replay gives (a resumed loader, which never plans ahead): the rest of the epoch does not
    # depend on how far ahead it was planned
    from fastsab.position.stream import Stream

    planner = window_planner()
    live = Stream(planner.chunks(0))
    first = next(live)
    assert first.num_batches > position
    for _ in range(ahead):
        next(live)
    caps = planner.check_lowered_limit(11)
    live.lower(position, caps)
    done = [batch.tolist() for batch in first.batches()[:position]]
    replayed = stream_batches(Stream(planner.chunks(0), lowered=[(position, caps)]))
    assert done + stream_batches(live) == replayed
    assert sorted(i for batch in replayed for i in batch) == list(range(120))


def test_sorted_windows_cached_and_live_plans_lower_alike() -> None:
    # len() keeps the epoch's plan; a lowering in it continues as the live plan would
    from fastsab.position.stream import Stream

    cached, live = window_planner(), window_planner()
    assert cached.num_batches(0) == live._window_plan(0).num_batches
    caps = cached.check_lowered_limit(9)
    streams = [Stream(cached.chunks(0)), Stream(SortedWindowEpoch(live, 0))]
    for stream in streams:
        next(stream)
        next(stream)
        stream.lower(3, caps)
    assert stream_batches(streams[0]) == stream_batches(streams[1])


def test_sorted_windows_keep_each_group_together() -> None:
    # batches of a later group never come before those of an earlier one: a chunked dataset
    # is read group after group
    planner = window_planner(n=200, group_size=16, window=4, cap=15)
    place = {}
    for number, group in enumerate(planner.order.chunks(0)):
        place.update(dict.fromkeys(group.tolist(), number))
    last_group = [max(place[i] for i in batch) for batch in stream_batches(planner.chunks(0))]
    assert last_group == sorted(last_group)
    assert len(set(last_group)) > 5
