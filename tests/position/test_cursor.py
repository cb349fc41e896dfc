"""Epochs, positions and resuming: states across world sizes, dealing options, lowered limits."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastsab import FastLoader, FastSizeAwareLoader, adaptive
from fastsab.plan.plans import PlanChunk

N = 1000
LENGTHS = np.random.default_rng(0).lognormal(np.log(40), 0.8, N).clip(1, 400).astype(np.int64)
BUDGET = 1200


def sized(rank=0, world_size=1, **options):
    options = {"seed": 7, **options}
    return FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, rank=rank, world_size=world_size, **options)


def unit_cost_loader(kind, n, limit, **options):
    """An unshuffled loader over ``range(n)``: batches of ``limit`` items, fixed or size-aware."""
    if kind == "fixed":
        return FastLoader(torch.arange(n), limit, shuffle=False, **options)
    return FastSizeAwareLoader(torch.arange(n), np.ones(n, dtype=np.int64), limit, shuffle=False, **options)


def run_steps(loaders, steps):
    """Every rank runs ``steps`` batches in lockstep; returns the indices and the (common) state."""
    seen = []
    states = []
    for loader in loaders:
        iterator = iter(loader)
        seen += [i for _ in range(steps) for i in next(iterator).tolist()]
        states.append(loader.state_dict())
    # every rank saves the same state, with the epoch's batches where the rank counted them (here: rank 0's len())
    common = [{key: value for key, value in state.items() if key != "batches"} for state in states]
    assert all(state == common[0] for state in common)
    assert len({state["batches"] for state in states if "batches" in state}) <= 1
    return seen, states[0]


def run_rest(loaders, state):
    seen = []
    for loader in loaders:
        loader.load_state_dict(json.loads(json.dumps(state)))
        seen += [i for batch in loader for i in batch.tolist()]
    assert len({loader.stats.num_batches for loader in loaders}) == 1  # equal steps
    return seen


# --- chains of resumes over world sizes and dealing options ------------------------------------


@pytest.mark.parametrize("chain", [[(3, 2), (1, 3), (1, None)], [(2, 4), (3, 2), (1, 5), (2, None)]])
def test_resume_chains_over_world_sizes_yield_every_index_once(chain):
    # invariant: a job preempted and resumed on any sequence of world sizes runs every index once
    # (the steps stop before any padding, so no repeats are expected)
    seen = []
    state = None
    for world, steps in chain:
        loaders = [sized(r, world, even_batches="drop") for r in range(world)]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        if steps is None:
            seen += [i for loader in loaders for batch in loader for i in batch.tolist()]
            dropped = loaders[0].stats.dropped
        else:
            part, state = run_steps(loaders, steps)
            seen += part
    counts = Counter(seen)
    assert max(counts.values()) == 1
    assert sorted(seen + dropped) == list(range(N))


@pytest.mark.parametrize(
    ("saved", "loaded"),
    [({"balance": True}, {"balance": False}), ({"even_batches": "drop"}, {"even_batches": "pad"})],
)
def test_a_state_resumes_exactly_under_other_dealing_options(saved, loaded):
    # invariant: the state keeps how its steps were dealt, so other options deal only the rest
    before, state = run_steps([sized(r, 2, **saved) for r in range(2)], 5)
    after_loaders = [sized(r, 2, **loaded) for r in range(2)]
    after = run_rest(after_loaders, state)
    stats = after_loaders[0].stats
    repeats = sum(len(loader.stats.padded) for loader in after_loaders)
    assert len(before) + len(after) == N - stats.num_dropped + repeats
    assert set(before) | set(after) | set(stats.dropped) == set(range(N))
    assert not set(before) & set(after)


def test_state_is_the_same_for_any_spelling_of_the_configuration():
    state = sized(max_batch_size=50).state_dict()
    spelled = FastSizeAwareLoader(
        torch.arange(N), LENGTHS, np.int64(BUDGET), seed=np.int64(7), max_batch_size=np.int64(50)
    )
    spelled.load_state_dict(state)
    as_float = FastSizeAwareLoader(torch.arange(N), LENGTHS, float(BUDGET), seed=7, max_batch_size=50)
    as_float.load_state_dict(state)


def test_a_state_is_refused_when_a_callable_gives_the_last_item_another_size():
    # invariant: the fingerprint of sizes computed by a callable samples items up to the last one
    other = LENGTHS.copy()
    other[-1] += 1
    state = FastSizeAwareLoader(torch.arange(N), lambda ids: LENGTHS[ids], BUDGET).state_dict()
    FastSizeAwareLoader(torch.arange(N), lambda ids: LENGTHS[ids], BUDGET).load_state_dict(state)
    with pytest.raises(ValueError, match="state was saved for another dataset, sizes or batching configuration"):
        FastSizeAwareLoader(torch.arange(N), lambda ids: other[ids], BUDGET).load_state_dict(state)


@pytest.mark.parametrize(("saved", "loaded"), [(1, 2), (2, 3), (3, 1)])
def test_a_state_saved_at_the_last_step_starts_the_next_epoch_on_any_world_size(saved, loaded):
    # invariant: a state taken at an epoch's last step (before the loop saw its end) resumes at
    # the start of the next epoch, whatever world size loads it
    savers = [sized(r, saved) for r in range(saved)]
    _, state = run_steps(savers, len(savers[0]))
    assert state["epoch"] == 0 and state["steps"] == len(savers[0])
    loaders = [sized(r, loaded) for r in range(loaded)]
    fresh = [sized(r, loaded) for r in range(loaded)]
    for loader, other in zip(loaders, fresh):
        loader.load_state_dict(json.loads(json.dumps(state)))
        other.set_epoch(1)
        assert loader.state_dict()["epoch"] == 1 and len(loader) == len(other)
        assert [b.tolist() for b in loader] == [b.tolist() for b in other]


def test_position_counts_the_batches_handed_out_from_the_start_of_the_epoch():
    # invariant: (epoch, batches handed out) while an epoch runs, counted from the epoch's
    # start after a resume; None before and after
    loader = sized()
    assert loader.position is None
    positions = [loader.position for _ in loader]
    assert positions == [(0, step) for step in range(1, len(positions) + 1)] and loader.position is None
    _, state = run_steps([sized()], 5)
    resumed = sized()
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed.position == (0, 6) and resumed.start_position == (0, 5)


# --- malformed states ---------------------------------------------------------------------------


def saved_state():
    loader = sized()
    iterator = iter(loader)
    next(iterator)
    return loader.state_dict()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"steps": 10**6}, ValueError, r"state has steps=1000000, past the \d+ steps of epoch 0 on 1 rank\.$"),
        ({"steps": 2.0}, TypeError, r"state\['steps'\] must be an integer, got 2.0"),
        ({"steps": "abc"}, TypeError, r"state\['steps'\] must be an integer, got 'abc'"),
        ({"steps": None}, TypeError, r"state\['steps'\] must be an integer, got None"),
        ({"steps": True}, TypeError, r"state\['steps'\] must be an integer, got True"),
        ({"steps": -1}, ValueError, r"state\['steps'\] must be a non-negative integer, got -1"),
        (
            {"world_size": 10**6, "steps": 2, "even_batches": "pad", "balance": True},
            ValueError,
            r"state has steps=2, past the 1 steps of epoch 0 on 1000000 ranks",
        ),
        ({"world_size": 0}, ValueError, r"state has world_size=0"),
        (
            {"world_size": 2**24 + 1, "steps": 0, "even_batches": "pad", "balance": True},
            ValueError,
            r"state has world_size=16777217; it must be from 1 to 16777216",
        ),
        ({"epoch": -2}, ValueError, r"state\['epoch'\] must be a non-negative integer, got -2"),
        ({"epoch": 2**63}, ValueError, r"state\['epoch'\] must be below 2\*\*63, got 9223372036854775808"),
        ({"lowered": [[0, -5]]}, ValueError, r"limit must be a positive finite number, got -5"),
        ({"lowered": [[3, 100], [2, 50]]}, ValueError, r"state\['lowered'\] positions must not decrease"),
        ({"lowered": [[2, 100], [2, 50], [1, 40]]}, ValueError, r"state\['lowered'\] positions must not decrease"),
        ({"history": [{"world_size": 2}]}, ValueError, r"state has no 'steps' entry"),
    ],
)
def test_malformed_states_are_refused_with_the_key_named(change, error, message):
    state = {**saved_state(), **change}
    with pytest.raises(error, match=message):
        sized().load_state_dict(state)


@pytest.mark.parametrize("key", ["steps", "world_size", "epoch", "seed", "fingerprint", "history", "lowered"])
def test_a_state_missing_a_key_names_it(key):
    state = saved_state()
    del state[key]
    with pytest.raises(ValueError, match=f"state has no '{key}' entry"):
        sized().load_state_dict(state)


def test_a_state_of_the_largest_world_size_at_its_first_step_loads():
    # invariant: world sizes from 1 to 2**24 are accepted; a state of 0 steps starts its epoch
    state = {**sized().state_dict(), "world_size": 2**24, "even_batches": "pad", "balance": True}
    loader = sized()
    loader.load_state_dict(state)
    other = sized()
    assert len(loader) == len(other) and loader.state_dict() == other.state_dict()


def test_a_loaded_state_is_saved_again_unchanged():
    # invariant: state_dict() right after load_state_dict() keeps the lowered limits and the
    # stretches run on other world sizes, so a job preempted before its first step resumes alike
    loader = FastLoader(torch.arange(40), 8, shuffle=False)
    iterator = iter(loader)
    next(iterator)
    loader.lower_limit(3)
    next(iterator)
    lowered = json.loads(json.dumps(loader.state_dict()))
    _, dealt = run_steps([sized(r, 2) for r in range(2)], 3)
    for make, state in [(lambda: FastLoader(torch.arange(40), 8, shuffle=False), lowered), (sized, dealt)]:
        first = make()
        first.load_state_dict(state)
        saved = json.loads(json.dumps(first.state_dict()))
        again = make()
        again.load_state_dict(saved)
        assert again.state_dict() == saved and len(again) == len(first)
        assert [b.tolist() for b in again] == [b.tolist() for b in first]
    assert saved["history"] and saved["steps"] == 0


def test_plan_chunks_keep_one_span_per_batch():
    # invariant: head, tail and select keep each batch's row of spans (the groups it reads);
    # an epoch of no items, joined from its (no) chunks, is a plan of 0 batches
    batches = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5])]
    chunk = replace(PlanChunk.from_batches(batches), spans=np.array([[0, 0], [0, 1], [1, 1]]))
    assert chunk.head(2).spans.tolist() == [[0, 0], [0, 1]] and chunk.head(2).num_batches == 2
    assert chunk.tail(1).spans.tolist() == [[0, 1], [1, 1]] and chunk.tail(1).ids.tolist() == [2, 3, 4, 5]
    assert chunk.select(np.array([2, 0])).spans.tolist() == [[1, 1], [0, 0]]
    empty = PlanChunk.concat([])
    assert empty.num_batches == 0 and empty.batches() == [] and empty.tail(0).num_batches == 0


# --- lengths and stats of a resumed epoch -------------------------------------------------------


def test_len_after_a_resume_is_the_whole_epoch_as_a_trainer_counts_it():
    # as torch's StatefulDataLoader: a trainer restores its step count and stops at len()
    loader = sized(group_size=64)
    total = len(loader)
    iterator = iter(loader)
    for _ in range(2):
        next(iterator)
    resumed = sized(group_size=64)
    resumed.load_state_dict(loader.state_dict())
    assert len(resumed) == total
    assert len(list(resumed)) == total - 2  # the steps left
    sampler = sized(group_size=64).batch_sampler()
    sampler.load_state_dict(loader.state_dict())
    assert len(sampler) == total


@pytest.mark.parametrize("world_size", [1, 2])
def test_epoch_steps_are_each_whole_epochs_steps_wherever_the_iteration_stands(world_size):
    sizes = np.random.default_rng(0).integers(1, 9, 48)

    def make():
        return FastSizeAwareLoader(torch.arange(48), sizes, 11, rank=0, world_size=world_size)

    loader = make()
    counted = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        counted.append(len(list(loader)))
    assert len(set(counted)) > 1  # size-aware epochs differ in length
    iterator = iter(loader)  # epoch 3, mid-way
    next(iterator)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert [loader.epoch_steps(e) for e in range(3)] == [resumed.epoch_steps(e) for e in range(3)] == counted
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer, got -1\."):
        loader.epoch_steps(-1)


def test_a_resumed_epoch_reports_the_oversize_items_of_the_chunks_it_skipped_over():
    sizes = np.ones(200, dtype=np.int64)
    sizes[[3, 150]] = 100  # oversize, in the first and in a late chunk
    make = lambda: FastSizeAwareLoader(torch.arange(200), sizes, 10, shuffle=False, group_size=16)  # noqa: E731
    loader = make()
    iterator = iter(loader)
    for _ in range(8):  # past the first chunk
        next(iterator)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    with pytest.warns(UserWarning, match="2 items were larger than max_total_size"):
        list(resumed)
    assert resumed.stats.skipped == [3, 150]


def test_drop_last_under_ranks_reports_the_dropped_items():
    loaders = [FastLoader(torch.arange(103), 10, drop_last=True, rank=r, world_size=2, seed=1) for r in range(2)]
    seen = [i for loader in loaders for batch in loader for i in batch.tolist()]
    assert len(seen) == 100 and len(set(seen)) == 100
    assert loaders[0].stats.num_dropped == 3
    assert sorted(seen + loaders[0].stats.dropped) == list(range(103))


# --- lowering the limit -------------------------------------------------------------------------


def test_lowering_after_a_resume_from_another_world_size():
    # invariant: a one-rank loader resumed from a 2-rank state can still lower its limit
    before, state = run_steps([sized(r, 2) for r in range(2)], 3)
    loader = sized()
    loader.load_state_dict(state)
    after = []
    for count, batch in enumerate(loader):
        after += batch.tolist()
        if count == 2:
            loader.lower_limit(300)
    assert sorted(before + after) == list(range(N))
    assert loader.stats.limit_changes[0][2] == [300]


def test_lowering_a_fixed_batch_size_after_a_resume_from_another_world_size_cuts_the_rest_in_order():
    # invariant: the rest of a resumed epoch (a one-rank share after a 2-rank stretch), lowered to
    # batch size 3 after its first batch, is cut into consecutive batches of 3 items, in order
    def make(rank=0, world_size=1):
        return FastLoader(torch.arange(100), 10, seed=2, rank=rank, world_size=world_size)

    before, state = run_steps([make(r, 2) for r in range(2)], 2)
    unlowered, loader = make(), make()
    unlowered.load_state_dict(state)
    loader.load_state_dict(state)
    rest = [i for batch in unlowered for i in batch.tolist()]
    batches = []
    for batch in loader:
        batches.append(batch.tolist())
        if len(batches) == 1:
            loader.lower_limit(3)
    assert batches[0] == rest[:10] and batches[1:] == [rest[i : i + 3] for i in range(10, len(rest), 3)]
    assert sorted(before + rest) == list(range(100))


def test_lowering_below_an_item_that_is_still_pending_ends_and_keeps_every_item():
    sizes = np.full(100, 50, dtype=np.int64)
    loader = FastSizeAwareLoader(torch.arange(100), sizes, 1000, shuffle=False, group_size=7)
    seen = []
    for count, batch in enumerate(loader):
        seen += batch.tolist()
        if count == 0:
            loader.lower_limit(10)  # every pending item (cost 50) is now above the cap
        assert count < 200
    assert seen == list(range(100))
    assert loader.stats.num_batches == 1 + 80  # the first batch of 20, then one batch each


def test_lowering_a_fixed_batch_size_splits_the_rest_of_a_single_group():
    loader = FastLoader(torch.arange(1000), 64, seed=0)
    sizes = []
    for batch in loader:
        sizes.append(len(batch))
        if len(sizes) == 1:
            loader.lower_limit(16)
    assert sizes[0] == 64 and max(sizes[1:]) == 16 and sum(sizes) == 1000


def test_lowering_keeps_drop_last_to_the_items_planned_at_the_start():
    loader = FastLoader(torch.arange(100), 30, drop_last=True, seed=0, group_size=8)
    seen = []
    for batch in loader:
        seen += batch.tolist()
        if len(seen) == 30:
            loader.lower_limit(7)
    assert len(seen) == 90 and len(set(seen)) == 90
    assert sorted(seen + loader.stats.dropped) == list(range(100))


@pytest.mark.parametrize("kind", ["fixed", "size-aware"])
def test_lowering_twice_at_the_end_of_an_epoch_keeps_every_item(kind):
    # invariant: the items a lowering takes back are batched again even when the epoch's
    # order has no chunk left (the second lowering falls in the epoch's last planned chunk)
    def make():
        return unit_cost_loader(kind, 100, 32)

    def run(loader, stop=None):
        seen = []
        for count, batch in enumerate(loader):
            seen.append(batch.tolist())
            if count in (0, 2):  # 32, 16, 16, then the rest in fours
                loader.lower_limit(16 if count == 0 else 4)
            if count == stop:
                break
        return seen

    whole = run(make())
    assert [len(b) for b in whole] == [32, 16, 16] + [4] * 9
    assert [i for b in whole for i in b] == list(range(100))
    interrupted = make()
    done = run(interrupted, stop=5)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(interrupted.state_dict())))
    assert len(resumed) == len(whole)  # the 6 steps run, then the 6 left
    assert done + [b.tolist() for b in resumed] == whole


@pytest.mark.parametrize("prefetch", [0, 2])
def test_resume_after_lowering_the_limit_runs_the_rest_exactly(prefetch):
    # invariant: a state taken after a lowering resumes with exactly the batches the run went
    # on with. NOTE: with prefetch the lowering takes effect after the batches already fetched
    # ahead, how many depends on thread timing: the rest is compared within one run
    def make():
        return sized(prefetch=prefetch, group_size=128)

    whole = []
    loader = make()
    for count, batch in enumerate(loader):
        whole.append(batch.tolist())
        if count == 2:
            loader.lower_limit(100)
        if count == 12:
            state = json.loads(json.dumps(loader.state_dict()))
    assert state["steps"] == 13 and len(state["lowered"]) == 1 and state["lowered"][0][1] == [100]
    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == len(whole)
    assert [batch.tolist() for batch in resumed] == whole[13:]
    assert sorted(i for batch in whole for i in batch) == list(range(N))
    # the lowering lands at the next batch, with or without a prefetch thread: the same every run
    again = make()
    batches = []
    for count, batch in enumerate(again):
        batches.append(batch.tolist())
        if count == 2:
            again.lower_limit(100)
    assert batches == whole


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_lowering_applies_at_the_next_batch_and_a_state_taken_right_after_has_it(prefetch):
    loader = FastLoader(torch.arange(40), 8, shuffle=False, prefetch=prefetch)
    iterator = iter(loader)
    assert next(iterator).tolist() == list(range(8))
    loader.lower_limit(3)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["lowered"] == [[1, 3]]
    rest = [batch.tolist() for batch in iterator]
    expected = [list(range(i, min(i + 3, 40))) for i in range(8, 40, 3)]
    assert rest == expected  # the batches prefetched under batch size 8 are not yielded
    assert loader.stats.limit_changes == [(1, 8, 3)]
    resumed = FastLoader(torch.arange(40), 8, shuffle=False, prefetch=prefetch)
    resumed.load_state_dict(state)
    assert len(resumed) == 1 + len(expected) and [batch.tolist() for batch in resumed] == expected


def test_lowering_the_limit_outside_an_epoch_is_an_error():
    loader = FastLoader(torch.arange(40), 8)
    with pytest.raises(RuntimeError, match="needs an epoch being iterated"):
        loader.lower_limit(4)
    list(loader)
    with pytest.raises(RuntimeError, match="needs an epoch being iterated"):
        loader.retry_last_batch(4)


def test_a_batch_retried_twice_before_the_next_is_counted_once():
    loader = FastLoader(torch.arange(20), 8, shuffle=False)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    loader.retry_last_batch(4)
    loader.retry_last_batch(2)  # the same failed batch: it is not rewound twice
    rest = [batch.tolist() for batch in iterator]
    assert rest == [[8, 9], [10, 11], [12, 13], [14, 15], [16, 17], [18, 19]]
    assert loader.stats.num_batches == 7 and loader.stats.num_items == 20


def test_a_state_whose_rest_gives_the_new_ranks_no_step_runs_an_empty_epoch_that_reports_the_drop():
    # 1 rank runs 8 of the 10 batches; the rest is 2 batches, 0 steps for 4 ranks with "drop"
    one = FastLoader(torch.arange(100), 10, seed=1)
    iterator = iter(one)
    done = [i for _ in range(8) for i in next(iterator).tolist()]
    state = json.loads(json.dumps(one.state_dict()))
    ranks = [FastLoader(torch.arange(100), 10, seed=1, rank=r, world_size=4, even_batches="drop") for r in range(4)]
    for loader in ranks:
        loader.load_state_dict(state)
    assert [len(loader) for loader in ranks] == [8] * 4  # the 8 steps run, none left
    assert [list(loader) for loader in ranks] == [[]] * 4
    for loader in ranks:  # the epoch that ran empty reports the two batches it left out
        assert loader.stats.epoch == 0 and sorted(done + loader.stats.dropped) == list(range(100))
    assert [loader.epoch for loader in ranks] == [1] * 4
    # a state saved before that empty epoch ran (its steps 0, its rest dealt to no step) runs it too
    saved = FastLoader(torch.arange(100), 10, seed=1, rank=0, world_size=4, even_batches="drop")
    saved.load_state_dict(state)
    again = FastLoader(torch.arange(100), 10, seed=1, rank=0, world_size=4, even_batches="drop")
    again.load_state_dict(json.loads(json.dumps(saved.state_dict())))
    assert len(again) == 8 and list(again) == [] and sorted(done + again.stats.dropped) == list(range(100))


@pytest.mark.parametrize("kind", ["fixed", "size-aware"])
def test_a_lowering_after_the_last_batch_resumes_at_the_next_epoch(kind):
    # invariant: a limit lowered right after an epoch's last batch is recorded at its end, and
    # the state taken then starts the next epoch
    def make():
        return unit_cost_loader(kind, 40, 8)

    loader = make()
    for count, _ in enumerate(loader):
        if count == 4:
            loader.lower_limit(3)
            state = json.loads(json.dumps(loader.state_dict()))
    assert state["steps"] == 5 and state["lowered"] == [[5, 3 if kind == "fixed" else [3]]]
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and len(resumed) == 5


@pytest.mark.parametrize("kind", ["fixed", "size-aware"])
def test_resume_after_a_lowering_at_the_end_of_a_chunk(kind):
    # invariant: a lowering right after a chunk's last batch is replayed there on resume
    # groups of 20 items, batches of 10: a fixed-size chunk holds two batches; a size-aware chunk
    # holds the batch left open by the chunk before and its own first (the first chunk: one)
    def make():
        return unit_cost_loader(kind, 100, 10, group_size=20)

    last_of_a_chunk = 1 if kind == "fixed" else 2
    whole = []
    loader = make()
    for count, batch in enumerate(loader):
        whole.append(batch.tolist())
        if count == last_of_a_chunk:
            loader.lower_limit(4)
        if count == 4:
            state = json.loads(json.dumps(loader.state_dict()))
    assert state["lowered"] == [[last_of_a_chunk + 1, 4 if kind == "fixed" else [4]]]
    assert {len(b) for b in whole[: last_of_a_chunk + 1]} == {10} and max(len(b) for b in whole[3:]) == 4
    resumed = make()
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == whole[5:]
    assert [i for batch in whole for i in batch] == list(range(100))


@pytest.mark.slow
@pytest.mark.parametrize("columns", [1, 2])
def test_adaptive_run_splits_batches_that_cost_nothing(columns):
    sizes = np.zeros((N, columns), dtype=np.int64)
    if columns == 2:
        sizes[:, 0] = 1  # one column costs, the other is all zero
    loader = FastSizeAwareLoader(torch.arange(N), sizes if columns == 2 else sizes[:, 0], [N] * columns, seed=3)

    def step(batch):
        if len(batch) > 100:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return batch.tolist()

    seen = [i for part in adaptive.run(loader, step) for i in part]
    assert sorted(seen) == list(range(N))


def test_adaptive_run_with_a_factor_above_the_batch_size_lowers_it_to_one_item():
    # invariant: a failing batch of 3 items with factor 4 goes on one item at a time
    loader = FastLoader(torch.arange(6), 3, shuffle=False)

    def step(batch):
        if len(batch) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return batch.tolist()

    assert list(adaptive.run(loader, step, factor=4)) == [[i] for i in range(6)]
    assert loader.stats.limit_changes == [(0, 3, 1)]  # the failed first batch is run again: 0 done


def test_adaptive_run_lowers_caps_of_fractional_costs():
    # invariant: costs below one (fractions of a GiB, say) lower their cap as any other: a
    # batch of 16 items of cost 1/16 that runs out of memory halves the cap to 0.5
    loader = FastSizeAwareLoader(torch.arange(64), np.full(64, 1 / 16), 1.0, shuffle=False)

    def step(batch):
        if len(batch) > 8:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return batch.tolist()

    parts = list(adaptive.run(loader, step))
    assert parts == [list(range(start, start + 8)) for start in range(0, 64, 8)]
    assert loader.stats.limit_changes == [(0, [1.0], [0.5])]


# --- DataLoader with worker processes ----------------------------------------------------------


def test_a_sampler_under_a_dataloader_with_workers_refuses_a_position_it_cannot_know():
    loader = FastLoader(torch.arange(200), 10, seed=2)
    sampler = loader.batch_sampler()
    data = DataLoader(TensorDataset(torch.arange(200)), batch_sampler=sampler, num_workers=2)
    iterator = iter(data)
    for _ in range(3):
        next(iterator)
    with pytest.raises(RuntimeError, match="DataLoader with worker processes"):
        sampler.state_dict()
    del iterator


def test_data_loader_counts_the_batches_the_loop_received():
    loader = FastLoader(torch.arange(200), 10, seed=2)
    whole = [batch.tolist() for batch in loader.data_loader(num_workers=0)]
    data = loader.data_loader(num_workers=2)
    iterator = iter(data)
    done = [next(iterator).tolist() for _ in range(3)]
    state = data.state_dict()
    assert state["steps"] == 3
    del iterator
    resumed = FastLoader(torch.arange(200), 10, seed=2).data_loader(num_workers=2)
    resumed.load_state_dict(state)
    assert len(resumed) == 20
    assert done + [batch.tolist() for batch in resumed] == whole


# --- lowering more than once, retrying failed batches, positions under worker processes --------


@pytest.mark.parametrize("kind", ["fixed", "size-aware"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_lowering_several_times_in_one_epoch_keeps_every_item(kind, shuffle):
    if kind == "fixed":
        loader = FastLoader(torch.arange(100), 16, shuffle=shuffle)
    else:
        loader = FastSizeAwareLoader(torch.arange(100), np.ones(100, dtype=np.int64), 16, shuffle=shuffle)
    seen = []
    for count, batch in enumerate(loader, 1):
        seen += batch.tolist()
        if count in (1, 2, 5):
            loader.lower_limit({1: 8, 2: 4, 5: 3}[count])
    assert sorted(seen) == list(range(100))
    assert [change[2] for change in loader.stats.limit_changes] in ([8, 4, 3], [[8], [4], [3]])


def fake_oom_above(limit):
    def step(batch):
        if len(batch) > limit:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return batch.tolist()

    return step


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [0, 2])
def test_adaptive_run_with_prefetch_processes_every_item_once(prefetch):
    loader = FastSizeAwareLoader(torch.arange(1000), torch.full((1000,), 10), 640, prefetch=prefetch, seed=1)
    seen = [i for part in adaptive.run(loader, fake_oom_above(20)) for i in part]
    assert sorted(seen) == list(range(1000))
    assert loader.stats.num_items == 1000 and loader.stats.limit_changes[-1][2] == [160.0]


def test_a_state_saved_between_the_parts_of_a_failed_batch_resumes_exactly():
    def make():
        return FastLoader(torch.arange(64), 16, shuffle=False)

    loader = make()
    results = adaptive.run(loader, fake_oom_above(8))
    done = [i for _ in range(3) for i in next(results)]  # two halves of batch 0, one of batch 1
    state = json.loads(json.dumps(loader.state_dict()))
    assert done == list(range(24)) and state["steps"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == 3 + 5  # the steps run, then 5 left: the second half of batch 1 and batches 2 and 3
    assert done + [i for part in adaptive.run(resumed, fake_oom_above(8)) for i in part] == list(range(64))


@pytest.mark.parametrize("kind", ["fixed", "sized"])
def test_a_lowered_limit_above_the_one_in_force_is_refused(kind):
    if kind == "fixed":
        loader = FastLoader(torch.arange(40), 8, shuffle=False)
        lowered, above, shown = 4, 6, "4"
    else:
        loader = FastSizeAwareLoader(torch.arange(40), np.ones(40), 8, shuffle=False)
        lowered, above, shown = 4, 6, r"\[4\]"
    batches = iter(loader)
    next(batches)
    loader.lower_limit(lowered)
    assert len(next(batches)) == 4
    with pytest.raises(ValueError, match=rf"a lowered limit must not exceed the current {shown}, got {above}\."):
        loader.lower_limit(above)
    with pytest.raises(ValueError, match=rf"a lowered limit must not exceed the current {shown}, got {above}\."):
        loader.retry_last_batch(above)
    loader.lower_limit(lowered)  # the limit in force: nothing changes
    assert [len(batch) for batch in batches] == [4] * 7
    assert [change[1:] for change in loader.stats.limit_changes] == [(8, 4) if kind == "fixed" else ([8], [4])]


@pytest.mark.parametrize("kind", ["fixed", "sized"])
@pytest.mark.parametrize("retry", [False, True])
def test_a_lowering_above_one_not_applied_yet_keeps_the_smaller(kind, retry):
    # two lowerings before the next batch (a memory monitor's, then the loop's): the smaller holds
    if kind == "fixed":
        loader = FastLoader(torch.arange(12), 4, shuffle=False)
    else:
        loader = FastSizeAwareLoader(torch.arange(12), np.ones(12), 4, shuffle=False)
    batches = iter(loader)
    next(batches)
    lower = loader.retry_last_batch if retry else loader.lower_limit
    lower(2)
    lower(3)
    assert [batch.tolist() for batch in batches] == [[0, 1], [2, 3]] * retry + [[4, 5], [6, 7], [8, 9], [10, 11]]
    assert [change[1:] for change in loader.stats.limit_changes] == [(4, 2) if kind == "fixed" else ([4], [2])]


def test_a_lowered_limit_above_the_configured_one_is_refused():
    with pytest.raises(ValueError, match=r"a lowered limit must not exceed the configured \[40\], got 1000"):
        FastSizeAwareLoader(torch.arange(10), np.ones(10), 40).lower_limit(1000)
    with pytest.raises(ValueError, match=r"a lowered limit must not exceed the configured 4, got 50"):
        FastLoader(torch.arange(10), 4).lower_limit(50)
    state = {**saved_state(), "lowered": [[3, BUDGET + 1]]}
    with pytest.raises(ValueError, match="a lowered limit must not exceed the configured"):
        sized().load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lowered": [[10**6, 50]]}, r"state\['lowered'\] names positions past the \d+ batches of epoch 0"),
        ({"world_size": 2**40, "even_batches": "pad", "balance": True}, r"state has world_size=1099511627776"),
    ],
)
def test_states_naming_impossible_positions_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        sized().load_state_dict({**saved_state(), **change})


def test_samplers_and_data_loaders_of_a_resumed_loader_start_where_it_stands():
    loader = FastLoader(torch.arange(100), 10, seed=4)
    iterator = iter(loader)
    done = [next(iterator).tolist() for _ in range(5)]
    resumed = FastLoader(torch.arange(100), 10, seed=4)
    resumed.load_state_dict(loader.state_dict())
    assert len(resumed) == len(resumed.batch_sampler()) == len(resumed.data_loader()) == 10
    rest = list(resumed.batch_sampler())
    assert sorted(i for batch in done + rest for i in batch) == list(range(100))


def test_data_loader_state_after_a_resume_from_another_world_size_keeps_the_history():
    before, state = run_steps([sized(r, 2) for r in range(2)], 3)
    data = sized().data_loader(num_workers=2)
    data.load_state_dict(state)
    total = len(data)  # the 3 steps of 2 ranks, then those left for one
    iterator = iter(data)
    middle = [i for _ in range(total - 3 - 2) for i in next(iterator).tolist()]
    saved = data.state_dict()
    del iterator
    assert saved["history"] and saved["steps"] == total - 3 - 2
    final = sized().data_loader(num_workers=2)
    final.load_state_dict(saved)
    assert len(final) == total
    rest = [i for batch in final for i in batch.tolist()]
    assert sorted(before + middle + rest) == list(range(N))


def test_data_loader_with_workers_on_an_epoch_shorter_than_their_read_ahead():
    data = FastLoader(torch.arange(40), 16, seed=0).data_loader(num_workers=2)
    batches = [batch.tolist() for batch in data]
    assert sorted(i for batch in batches for i in batch) == list(range(40))
    assert data.state_dict()["epoch"] == 1


# --- lowering from elsewhere, cheaply, and what a resume keeps of it ------------------------------


class _Gated(torch.utils.data.Dataset):
    """Serves ``indices`` as a tensor; the fetch of the batch starting at ``hold`` waits for ``gate``."""

    def __init__(self, n, hold):
        self.n, self.hold = n, hold
        self.entered, self.gate = threading.Event(), threading.Event()
        self.on_hold = None  # called in the fetch of the held batch, before it waits

    def __len__(self):
        return self.n

    def __getitems__(self, indices):
        if indices[0] == self.hold:
            self.entered.set()
            if self.on_hold is not None:
                self.on_hold()
            self.gate.wait(10)
        return torch.tensor(indices)


def test_lowering_from_another_thread_while_a_batch_is_fetched_applies_after_that_batch():
    dataset = _Gated(20, hold=8)
    loader = FastLoader(dataset, 4, shuffle=False, prefetch=0)
    iterator = iter(loader)
    got = [next(iterator).tolist(), next(iterator).tolist()]

    def monitor():
        dataset.entered.wait(10)
        loader.lower_limit(2)
        dataset.gate.set()

    thread = threading.Thread(target=monitor)
    thread.start()
    got += [batch.tolist() for batch in iterator]
    thread.join()
    # invariant: the batch being fetched is handed out whole, the lowering applies after it
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13], [14, 15], [16, 17], [18, 19]]
    assert loader.stats.limit_changes == [(3, 4, 2)]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_lowering_from_inside_the_dataset_keeps_every_sample_once(prefetch):
    dataset = _Gated(20, hold=8)
    loader = FastLoader(dataset, 4, shuffle=False, prefetch=prefetch)
    dataset.gate.set()
    dataset.on_hold = lambda: loader.lower_limit(2)
    got = [i for batch in loader for i in batch.tolist()]
    assert got == list(range(20)) and loader.stats.limit_changes[0][1:] == (4, 2)


def test_a_retried_first_batch_can_be_lowered_again_before_the_next():
    loader = FastLoader(torch.arange(20), 8, shuffle=False)
    iterator = iter(loader)
    next(iterator)
    loader.retry_last_batch(4)
    loader.lower_limit(2)
    assert [batch.tolist() for batch in iterator] == [[i, i + 1] for i in range(0, 20, 2)]
    assert loader.stats.limit_changes == [(0, 8, 2)] and loader.limit == 2


def test_a_lowering_late_in_an_epoch_plans_only_what_is_left(monkeypatch):
    monkeypatch.setattr("fastsab.plan.planners.PLAN_CACHE_ITEMS", 0)  # as for an epoch too long to keep its plan
    evaluated = []

    def sizeof(indices):
        evaluated.append(len(indices))
        return np.ones(len(indices), dtype=np.int64)

    loader = FastSizeAwareLoader(torch.arange(50_000), sizeof, 100, seed=0, group_size=1000)
    iterator = iter(loader)
    for _ in range(len(loader) - 3):
        next(iterator)
    assert loader.planner._cache is None  # the plan was not kept: the epoch is planned as it runs
    before = sum(evaluated)
    loader.lower_limit(10)
    rest = [batch.tolist() for batch in iterator]
    # invariant: the items of the last 3 batches are planned again, not the epoch from its start
    assert sum(len(batch) for batch in rest) == 300 and sum(evaluated) - before <= 300
    assert max(len(batch) for batch in rest) == 10


@pytest.mark.parametrize("steps", [2, 3])
def test_setting_the_epoch_of_a_loaded_state_keeps_its_position(steps):
    loader = FastLoader(torch.arange(10), 4, seed=0)
    loader.set_epoch(5)
    iterator = iter(loader)
    done = [next(iterator).tolist() for _ in range(steps)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = FastLoader(torch.arange(10), 4, seed=0)
    resumed.load_state_dict(state)
    resumed.set_epoch(5)  # a trainer that restores its own epoch counter from the checkpoint
    rest = [batch.tolist() for batch in resumed]
    # invariant: epoch 5 is not run twice, also when the state was saved after its last step
    assert sorted(i for batch in done + rest for i in batch) == list(range(10))
    assert resumed.epoch == 6


def test_the_limit_in_force_survives_a_resume_through_another_world_size():
    def make(**options):
        return FastLoader(torch.arange(40), 8, seed=0, **options)

    first = make()
    iterator = iter(first)
    next(iterator)
    first.lower_limit(2)
    next(iterator)
    ranks = [make(rank=r, world_size=2) for r in range(2)]
    for loader in ranks:
        loader.load_state_dict(first.state_dict())
        next(iter(loader))
    last = make()
    last.load_state_dict(ranks[0].state_dict())
    assert len(next(iter(last))) == 2 and last.limit == 2


def test_a_bad_lowered_limit_in_a_state_names_the_key_and_one_cap_may_be_a_0_d_array():
    state = {**FastLoader(torch.arange(20), 4).state_dict(), "steps": 2, "lowered": [[1, 0]]}
    with pytest.raises(ValueError, match=r"state\['lowered'\] has a bad limit 0: limit must be a positive integer"):
        FastLoader(torch.arange(20), 4).load_state_dict(state)
    loader = FastSizeAwareLoader(torch.arange(20), np.arange(20) % 4, np.array(6), shuffle=False)
    iterator = iter(loader)
    next(iterator)
    loader.lower_limit(np.array(3))
    assert all(int((np.arange(20) % 4)[batch.numpy()].sum()) <= 3 for batch in iterator)


def test_samplers_and_data_loaders_report_skipped_items_as_the_loader_does():
    sizes = np.array([1, 50, 2, 3, 1, 2])
    loader = FastSizeAwareLoader(torch.arange(6), sizes, 5, shuffle=False)
    sampler = loader.batch_sampler()
    with pytest.warns(UserWarning, match="1 items were larger than max_total_size and were skipped in epoch 0"):
        assert list(sampler) == [[0, 2], [3, 4], [5]]
    assert sampler.stats.skipped == [1] and sampler.stats.num_batches == 3 and sampler.stats.num_items == 5
    data = FastSizeAwareLoader(torch.arange(6), sizes, 5, shuffle=False).data_loader()
    with pytest.warns(UserWarning, match="skipped in epoch 0"):
        assert [batch.tolist() for batch in data] == [[0, 2], [3, 4], [5]]
    assert data.stats.skipped == [1]


def test_the_start_limit_is_the_last_lowered_before_the_resumed_position():
    def make(**options):
        return FastLoader(torch.arange(40), 8, shuffle=False, **options)

    first = make()
    assert first.start_limit() == 8  # no epoch started
    iterator = iter(first)
    next(iterator)
    first.lower_limit(4)
    next(iterator), next(iterator)
    first.lower_limit(2)
    next(iterator)
    saved = first.state_dict()  # lowered to 4 at step 1, to 2 at step 3; 4 steps run
    early = make()
    early.load_state_dict({**saved, "steps": 2})  # resumed between the two lowerings
    next(iter(early))
    assert early.start_limit() == 4
    late = make()
    late.load_state_dict(saved)
    next(iter(late))
    assert late.start_limit() == 2 == late.limit
    ranks = [make(rank=r, world_size=2) for r in range(2)]
    for loader in ranks:  # the lowerings are now in the history
        loader.load_state_dict(saved)
        next(iter(loader))
    assert ranks[0].start_limit() == 2
    fresh = make()
    next(iter(fresh))
    assert fresh.start_limit() == 8


def _stretch(make, world, state, steps):
    """Run ``steps`` steps of every rank of ``world`` from ``state``; their items and the state after them."""
    ranks = [make(world, rank) for rank in range(world)]
    items = []
    for loader in ranks:
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)
        items += [i for _ in range(steps) for i in next(batches).tolist()]
    return items, json.loads(json.dumps(ranks[0].state_dict()))


@pytest.mark.parametrize("oversize", ["skip", "own_batch"])
@pytest.mark.parametrize("even_batches", ["pad", "drop"])
def test_a_lowering_on_one_rank_between_stretches_of_two_keeps_the_epoch_report(oversize, even_batches):
    sizes = np.array([(i * 7) % 11 for i in range(60)])
    oversize_items = sorted(int(i) for i in np.flatnonzero(sizes > 9))

    def make(world, rank):
        options = {"seed": 3, "group_size": 8, "oversize": oversize, "even_batches": even_batches}
        return FastSizeAwareLoader(torch.arange(60), sizes, 9, world_size=world, rank=rank, **options)

    seen, state = _stretch(make, 2, None, 2)
    one = make(1, 0)
    one.load_state_dict(state)
    batches = iter(one)
    seen += next(batches).tolist()
    one.lower_limit(4)  # the rest of the epoch is planned again on one rank
    seen += next(batches).tolist()
    state = json.loads(json.dumps(one.state_dict()))
    items, state = _stretch(make, 2, state, 1)  # the lowering is replayed inside the history
    seen += items
    last = make(1, 0)
    last.load_state_dict(state)
    seen += [i for batch in last for i in batch.tolist()]
    skipped = oversize_items if oversize == "skip" else []
    # every item once, or reported skipped, whatever was re-planned
    assert sorted(last.stats.skipped) == skipped and list(last.stats.dropped) == list(last.stats.padded) == []
    assert sorted(seen) == sorted(set(range(60)) - set(skipped))


def _retried_twice(stop_before_last: bool, first: int = 3):
    """A sorted-window loader whose ``first``-th batch is retried, then the first of its parts retried again.

    Returns the loader, its iterator and the batches handed out and kept (retried ones removed);
    with ``stop_before_last`` the second retry is asked but not applied yet.
    """
    loader = sized(sort_window=16, group_size=64)
    iterator = loader.iter_with_indices()
    kept = [next(iterator)[0].tolist() for _ in range(first)]
    loader.retry_last_batch(BUDGET // 2)
    kept[-1] = next(iterator)[0].tolist()  # the first part of the retried batch
    loader.retry_last_batch(BUDGET // 5)
    if not stop_before_last:
        kept[-1] = next(iterator)[0].tolist()
    return loader, iterator, kept


@pytest.mark.parametrize("stop_before_last", [False, True])
def test_two_retries_at_one_position_are_both_saved_and_replayed(stop_before_last):
    # invariant: lowerings applied one after the other at one position are all in the state (a
    # retry asked but not applied yet too), in order, and a resume re-plans the rest under each in turn
    loader, iterator, kept = _retried_twice(stop_before_last=False)
    rest = [ids.tolist() for ids, _ in iterator]
    whole = kept + rest
    loader, iterator, kept = _retried_twice(stop_before_last)
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    assert state["lowered"] == [[2, [BUDGET // 2]], [2, [BUDGET // 5]]]
    assert state["steps"] == len(kept) - stop_before_last
    resumed = sized(sort_window=16, group_size=64)
    resumed.load_state_dict(state)
    assert len(resumed) == len(whole)
    assert [ids.tolist() for ids, _ in resumed.iter_with_indices()] == whole[state["steps"] :]


@pytest.mark.parametrize("first", [1, 3])
def test_a_retry_after_resuming_at_a_replayed_retry_re_plans_what_the_replay_planned(first):
    # invariant: a state saved with a retry asked, resumed, then the resumed loader's first batch
    # retried again gives the batches of the run that retried twice without a break
    _, iterator, kept = _retried_twice(stop_before_last=False, first=first)
    whole = kept + [ids.tolist() for ids, _ in iterator]
    loader = sized(sort_window=16, group_size=64)
    iterator = loader.iter_with_indices()
    done = [next(iterator)[0].tolist() for _ in range(first - 1)]
    next(iterator)
    loader.retry_last_batch(BUDGET // 2)
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    resumed = sized(sort_window=16, group_size=64)
    resumed.load_state_dict(state)
    iterator = resumed.iter_with_indices()
    next(iterator)
    resumed.retry_last_batch(BUDGET // 5)
    assert done + [ids.tolist() for ids, _ in iterator] == whole


# --- iterations without set_epoch under ranks ------------------------------------------------


def _two_ranks(**options):
    return [FastLoader(torch.arange(50), 4, seed=3, rank=r, world_size=2, **options) for r in range(2)]


def _epochs(loader, count):
    return [[b.tolist() for b in loader] for _ in range(count)]


def test_under_ranks_a_peek_changes_no_epoch():
    # invariant: a rank that iterates once more (a peek) runs the epochs of the others
    plain, peeking = _two_ranks(), _two_ranks()
    lengths = [len(loader) for loader in peeking]
    next(iter(peeking[1]))
    assert [len(loader) for loader in peeking] == lengths
    assert peeking[1].state_dict()["epoch"] == 0
    assert [_epochs(loader, 3) for loader in peeking] == [_epochs(loader, 3) for loader in plain]


def test_under_ranks_set_epoch_after_a_peek_chooses_the_epoch():
    plain, peeking = _two_ranks()[1], _two_ranks()[1]
    next(iter(peeking))
    peeking.set_epoch(4)
    plain.set_epoch(4)
    assert _epochs(peeking, 2) == _epochs(plain, 2)


def test_under_ranks_a_left_epoch_starts_again_at_its_loaded_position():
    whole = _epochs(_two_ranks()[0], 2)
    first = _two_ranks()[0]
    iterator = iter(first)
    for _ in range(2):
        next(iterator)
    resumed = _two_ranks()[0]
    resumed.load_state_dict(first.state_dict())
    next(iter(resumed))  # a peek: the next iteration resumes at step 2 again
    iterator = iter(resumed)
    rest = [next(iterator).tolist() for _ in range(2)]
    state = resumed.state_dict()
    assert (state["epoch"], state["steps"]) == (0, 4)
    again = _two_ranks()[0]
    again.load_state_dict(state)
    assert whole[0][2:] == rest + [b.tolist() for b in iterator]
    assert _epochs(again, 2) == [whole[0][4:], whole[1]]


def test_in_one_process_each_iteration_still_starts_the_next_epoch():
    loader = FastLoader(torch.arange(50), 4, seed=3)
    next(iter(loader))
    assert loader.epoch == 1
    plain = FastLoader(torch.arange(50), 4, seed=3)
    plain.set_epoch(1)
    assert _epochs(loader, 1) == _epochs(plain, 1)


def test_under_ranks_a_peek_at_a_batch_sampler_changes_no_epoch():
    plain, peeking = (_two_ranks()[1].batch_sampler() for _ in range(2))
    next(iter(peeking))
    assert [list(peeking) for _ in range(2)] == [list(plain) for _ in range(2)]


def test_a_state_digests_the_sizes_without_copying_them():
    # invariant: saving or loading a state holds no second copy of the sizes (8 GB at 10**9 items)
    import tracemalloc

    n = 2_000_000
    sizes = np.random.default_rng(0).integers(1, 100, n)
    loader = FastSizeAwareLoader(torch.arange(n), sizes, 1_000)
    tracemalloc.start()
    try:
        state = loader.state_dict()
        FastSizeAwareLoader(torch.arange(n), sizes, 1_000).load_state_dict(state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < sizes.nbytes / 8, f"{peak} bytes traced while the sizes are {sizes.nbytes}"


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("left_after", [1, 3])  # a peek, a loop left mid-epoch
def test_set_epoch_after_an_iteration_left_mid_epoch_moves_the_state_to_the_chosen_epoch(world_size, left_after):
    def make():
        return FastLoader(torch.arange(50), 4, seed=3, rank=0, world_size=world_size)

    whole = make()
    epochs = []
    for epoch in range(3):
        whole.set_epoch(epoch)
        epochs.append([b.tolist() for b in whole])
    loader = make()
    for count, _ in enumerate(loader, 1):
        if count == left_after:
            break
    loader.set_epoch(1)  # the next iteration runs epoch 1 whole: so does a resume from here
    state = loader.state_dict()
    assert (state["epoch"], state["steps"]) == (1, 0)
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    assert _epochs(resumed, 2) == epochs[1:] == _epochs(loader, 2)
    again = make()
    next(iter(again))
    again.set_epoch(0)  # a peek, then the epoch chosen again: it runs whole, and a resume too
    resumed = make()
    resumed.load_state_dict(again.state_dict())
    assert _epochs(resumed, 1) == epochs[:1] == _epochs(again, 1)


def test_set_epoch_after_a_peek_at_a_batch_sampler_moves_its_state_to_the_chosen_epoch():
    sampler, plain = (FastLoader(torch.arange(50), 4, seed=3).batch_sampler() for _ in range(2))
    next(iter(sampler))
    sampler.set_epoch(0)
    state = sampler.state_dict()
    assert (state["epoch"], state["steps"]) == (0, 0)
    resumed = FastLoader(torch.arange(50), 4, seed=3).batch_sampler()
    resumed.load_state_dict(state)
    assert list(resumed) == list(plain)
