"""``len()`` after a resume from the epoch's batches a state carries: exact, without planning the epoch, checked."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader
from fastsab.plan import planners
from fastsab.position.batch_count import rest_after
from fastsab.position.epoch_state import Segment
from tests.position.test_resumed import CountedSizes, make, options_strategy, run
from tests.test_differential import examples


def ranks(kind: str, n: int, world: int, options: dict[str, Any]) -> list[Any]:
    if kind == "sized window":
        kind, options = "sized", {**options, "sort_window": 40}
    if world == 1:
        options = {key: value for key, value in options.items() if key not in ("balance", "even_batches")}
    return [make(kind, n, rank, world, **options) for rank in range(world)]


def without_count(state: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in state.items() if key != "batches"}


@settings(max_examples=examples(40), deadline=None)
@given(
    kind=st.sampled_from(["fixed", "sized", "sized window"]),
    n=st.integers(1, 700),
    saved=st.integers(1, 4),
    loaded=st.integers(1, 4),
    options=options_strategy(),
    data=st.data(),
)
def test_len_after_a_resume_is_the_steps_yielded_with_or_without_the_count(
    kind: str, n: int, saved: int, loaded: int, options: dict[str, Any], data: Any
) -> None:
    whole, _ = run(ranks(kind, n, saved, options))
    total = len(whole[0])
    steps = data.draw(st.integers(1, max(total - 1, 1)), label="steps")
    savers = ranks(kind, n, saved, options)
    # invariant: len() is the uninterrupted run's steps, on every rank
    assert [len(loader) for loader in savers] == [total] * saved
    _, state = run(savers, steps)
    assert state is not None
    if steps >= total:  # (an epoch of one step: a state at its end starts the next epoch)
        return
    # invariant: a state of an epoch whose batches were counted carries their number
    assert "batches" in state
    results = []
    for loaded_state in (state, without_count(state)):
        fresh = ranks(kind, n, loaded, options)
        for loader in fresh:
            loader.load_state_dict(json.loads(json.dumps(loaded_state)))
        lengths = [len(loader) for loader in fresh]
        before = [loader.resumed_steps for loader in fresh]
        resumed, _ = run(fresh)
        # invariant: on every rank, len() is the steps run before the save plus the steps the resume yields
        assert lengths == [ran + len(batches) for ran, batches in zip(before, resumed)]
        results.append((lengths, resumed))
    # invariant: with the count or without it (counted as before), the same len() and, rank by rank and
    # step by step, the same batches
    assert results[0] == results[1]
    if loaded == saved:
        # invariant: on the ranks it was saved on, the uninterrupted run's len() and batches after the step
        assert results[0] == ([total] * saved, [batches[steps:] for batches in whole])


def counted_ranks(sizes: CountedSizes, world: int, **options: Any) -> list[FastSizeAwareLoader]:
    n = 2**16
    return [
        FastSizeAwareLoader(torch.arange(n), sizes, 400, rank=r, world_size=world, group_size=2**10, **options)
        for r in range(world)
    ]


@pytest.mark.parametrize("loaded", [2, 3, 1])
def test_len_after_a_resume_reads_no_size_where_the_state_carries_the_count(loaded: int) -> None:
    n, sizes = 2**16, CountedSizes()
    whole, _ = run(counted_ranks(sizes, 2))
    total = len(whole[0])
    savers = counted_ranks(sizes, 2)
    assert [len(loader) for loader in savers] == [total, total]
    _, state = run(savers, total // 2)
    assert state is not None and "batches" in state
    results = []
    for saved, reads in ((state, 0), (without_count(state), n)):
        fresh = counted_ranks(sizes, loaded)
        for loader in fresh:
            loader.load_state_dict(saved)
        sizes.asked = 0
        lengths = [len(loader) for loader in fresh]
        # invariant: with the count, len() plans nothing, on the ranks it was saved on or others (the
        # steps run hold no padding); without it, it plans the epoch (once per rank)
        assert sizes.asked >= reads if reads else sizes.asked == 0, sizes.asked
        resumed, _ = run(fresh)
        assert lengths == [total // 2 + len(batches) for batches in resumed]
        results.append((lengths, resumed))
    # invariant: the same len() and batches, rank by rank and step by step, with the count or without it
    assert results[0] == results[1]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("off", [1, -1, 40])
def test_a_state_whose_count_does_not_match_the_plan_is_refused_at_the_epochs_end(world: int, off: int) -> None:
    whole, _ = run([make("sized", 500, rank, world, seed=1) for rank in range(world)])
    total = len(whole[0])
    savers = [make("sized", 500, rank, world, seed=1) for rank in range(world)]
    for loader in savers:
        len(loader)
    _, state = run(savers, total // 2)
    assert state is not None
    tampered = {**state, "batches": state["batches"] + off}
    loader = make("sized", 500, 0, world, seed=1)
    loader.load_state_dict(tampered)
    length = len(loader)
    yielded = []
    plan = rf"epoch 0's plan has {'more than ' + str(state['batches'] + off) if off < 0 else state['batches']} batches"
    with pytest.raises(ValueError, match=rf"state has batches={state['batches'] + off}, but {plan}: len\(\) counted"):
        for batch in loader:
            yielded.append(batch.tolist())
    # invariant: the batches yielded before the refusal are the uninterrupted run's, none past len()
    assert yielded == whole[0][total // 2 : total // 2 + len(yielded)]
    assert total // 2 + len(yielded) <= min(length, total)


@pytest.mark.parametrize(
    ("batches", "error", "message"),
    [
        (1.5, TypeError, r"state\['batches'\] must be an integer, got 1\.5"),
        (-3, ValueError, r"state\['batches'\] must be a non-negative integer, got -3\."),
    ],
)
def test_a_malformed_count_is_refused(batches: Any, error: type[Exception], message: str) -> None:
    _, state = run([make("sized", 500, seed=1)], 3)
    assert state is not None
    with pytest.raises(error, match=message):
        make("sized", 500, seed=1).load_state_dict({**state, "batches": batches})


def test_a_state_after_a_lowered_limit_carries_no_count() -> None:
    loader = make("sized", 500, seed=1)
    len(loader)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    assert "batches" in loader.state_dict()
    loader.lower_limit(200)
    next(batches)
    state = loader.state_dict()
    # invariant: a lowered limit changes the epoch's batches: the state names none, len() counts them
    assert state["lowered"] and "batches" not in state


def test_the_rest_after_stretches_is_derived_only_where_their_steps_hold_no_padding() -> None:
    # 1000 batches on 4 ranks, padded and balanced: windows of 64 steps (256 batches); the steps of
    # the last window, from step 192 (batch 768) on, may hold padding
    assert rest_after(1000, [Segment(4, 192, "pad", True)]) == 1000 - 768
    assert rest_after(1001, [Segment(4, 193, "pad", True)]) is None  # past 768: padding may be run
    assert rest_after(1001, [Segment(4, 193, "pad", False)]) == 1001 - 772  # unbalanced: padding comes last
    assert rest_after(1001, [Segment(4, 250, "drop", True)]) == 1  # the surplus dropped is left
    assert rest_after(1001, [Segment(4, 251, "pad", True)]) == 0  # run to its end
    assert rest_after(1000, [Segment(1, 10, lowered=[(3, 200)])]) is None  # lowered: another count
    assert rest_after(10, [Segment(1, 11)]) is None  # past the end: counted (and refused) by the caller


@pytest.mark.parametrize("world", [1, 2])
def test_shape_buckets_take_the_count_too_and_check_it(world: int) -> None:
    n, sizes = 3000, torch.arange(3000) % 97 + 1

    def ranks() -> list[FastSizeAwareLoader]:
        options = {"seed": 1, "buckets": [32, 64, 97], "partial": "keep", "world_size": world}
        return [FastSizeAwareLoader(torch.arange(n), sizes, 600, rank=r, **options) for r in range(world)]

    whole, _ = run(ranks())
    savers = ranks()
    assert [len(loader) for loader in savers] == [len(whole[0])] * world
    _, state = run(savers, 7)
    assert state is not None and "batches" in state
    fresh = ranks()
    for loader in fresh:
        loader.load_state_dict(state)
    lengths = [len(loader) for loader in fresh]
    resumed, _ = run(fresh)
    # invariant: the uninterrupted run's len() and batches, rank by rank and step by step (the epoch replayed)
    assert lengths == [len(whole[0])] * world and resumed == [batches[7:] for batches in whole]
    altered = ranks()[0]
    altered.load_state_dict({**state, "batches": state["batches"] - 1})
    with pytest.raises(ValueError, match=rf"state has batches={state['batches'] - 1}, but epoch 0's plan has more"):
        list(altered)


def test_len_after_a_resume_from_a_lowered_limit_plans_the_epoch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planners, "PLAN_CACHE_ITEMS", 0)  # as for a large epoch: no plan kept
    n, sizes = 2**16, CountedSizes()
    loader = counted_ranks(sizes, 1)[0]
    len(loader)
    batches = iter(loader)
    for _ in range(100):
        next(batches)
    loader.lower_limit(200)
    for _ in range(100):
        next(batches)
    state = loader.state_dict()
    assert state["lowered"] and "batches" not in state
    fresh = counted_ranks(sizes, 1)[0]
    fresh.load_state_dict(state)
    sizes.asked = 0
    length = len(fresh)
    # invariant: a lowered limit changed the epoch's batches: len() counts them, in one pass over the
    # epoch (the configured plan's count would not serve)
    assert n <= sizes.asked < 2 * n, sizes.asked
    assert length == 200 + len(list(fresh))
