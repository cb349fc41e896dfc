"""Resuming at a state's resume point: the epoch planned from there, none of it replayed, the same batches."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.plan.epochs import EpochOrder
from tests.test_differential import examples


class CountedSizes:
    """Sizes 1..``top`` from the indices, counting the items whose size was asked for."""

    def __init__(self, top: int = 97) -> None:
        self.top, self.asked = top, 0

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        self.asked += len(indices)
        return np.asarray(indices, dtype=np.int64) % self.top + 1


def make(kind: str, n: int, rank: int = 0, world: int = 1, **options: Any) -> Any:
    """A loader over ``range(n)``: fixed batches of 7, or sizes 1..97 (a few above the budget) under 300."""
    if kind == "fixed":
        return FastLoader(torch.arange(n), 7, rank=rank, world_size=world, **options)
    sizes = np.arange(n) % 97 + 1
    sizes[::53] = 400  # oversize: skipped (or own batches), before and after any resume point
    return FastSizeAwareLoader(torch.arange(n), sizes, 300, rank=rank, world_size=world, **options)


def run(loaders: list[Any], steps: int | None = None) -> tuple[list[list[list[int]]], dict[str, Any] | None]:
    """``steps`` steps (all by default) of every rank in lockstep, and then their (common) state."""
    iterators = [iter(loader) for loader in loaders]
    seen: list[list[list[int]]] = [[] for _ in loaders]
    while steps is None or len(seen[0]) < steps:
        batches = [next(iterator, None) for iterator in iterators]
        # invariant: every rank runs as many steps
        assert len({batch is None for batch in batches}) == 1
        if batches[0] is None:
            break
        for rank, batch in enumerate(batches):
            seen[rank].append(batch.tolist())
    states = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    assert all(state == states[0] for state in states)
    return seen, states[0]


def options_strategy() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "shuffle": st.booleans(),
            "group_size": st.sampled_from([5, 16, 64, 1000]),
            "balance": st.booleans(),
            "even_batches": st.sampled_from(["pad", "drop"]),
            "seed": st.integers(0, 3),
        }
    )


@settings(max_examples=examples(40), deadline=None)
@given(
    kind=st.sampled_from(["fixed", "sized", "sized own"]),
    n=st.integers(1, 700),
    world=st.integers(1, 4),
    options=options_strategy(),
    data=st.data(),
)
def test_a_resume_at_its_point_and_a_replayed_one_run_the_uninterrupted_batches(
    kind: str, n: int, world: int, options: dict[str, Any], data: Any
) -> None:
    if kind == "sized own":
        kind, options = "sized", {**options, "oversize": "own_batch"}
    if world == 1:
        options = {key: value for key, value in options.items() if key not in ("balance", "even_batches")}
    whole, _ = run([make(kind, n, rank, world, **options) for rank in range(world)])
    total = len(whole[0])
    steps = data.draw(st.integers(1, max(total - 1, 1)), label="steps")
    _, state = run([make(kind, n, rank, world, **options) for rank in range(world)], steps)
    assert state is not None
    if steps >= total:  # (an epoch of one step: a state at its end starts the next epoch)
        return
    # invariant: a state saved mid-epoch names the point its plan is taken up at
    assert "resume" in state
    old = {key: value for key, value in state.items() if key != "resume"}  # as an older fastsab saved it
    for saved, fast in ((state, True), (old, False)):
        fresh = [make(kind, n, rank, world, **options) for rank in range(world)]
        for loader in fresh:
            loader.load_state_dict(saved)
        # invariant: the point is taken up where it applies, and a state without it replays the epoch
        assert all((loader._point is not None) == fast for loader in fresh)
        resumed, _ = run(fresh)
        # invariant: rank by rank and step by step, the uninterrupted run's batches after the saved step
        assert resumed == [batches[steps:] for batches in whole], f"fast={fast}"
        # invariant: the resumed epoch reports the whole epoch's skipped items, in the plan's order
        reference = make(kind, n, 0, world, **options)
        run([reference] + [make(kind, n, rank, world, **options) for rank in range(1, world)])
        assert fresh[0].stats.skipped == reference.stats.skipped
        assert fresh[0].stats.dropped == reference.stats.dropped


def test_a_resume_plans_a_window_of_the_epoch_not_the_steps_before_it():
    n, group = 2**16, 2**10
    sizes = CountedSizes()

    def ranks() -> list[Any]:
        return [
            FastSizeAwareLoader(torch.arange(n), sizes, 400, rank=r, world_size=2, group_size=group, prefetch=0)
            for r in (0, 1)
        ]

    whole, _ = run(ranks())
    steps = len(whole[0]) // 2
    _, state = run(ranks(), steps)
    assert state is not None
    resumed = ranks()[1]
    sizes.asked = 0
    resumed.load_state_dict(state)
    first = next(iter(resumed)).tolist()
    # invariant: the first batch after a resume is the uninterrupted run's at that step
    assert first == whole[1][steps]
    # invariant: the resume read the sizes of a few groups (twice: to check the step exists, then
    # to run it): the epoch's first batches, which padding repeats, and the window holding the
    # step; not those of the half epoch before it (an epoch replayed reads them all)
    assert sizes.asked <= n // 4, sizes.asked


def test_steps_past_the_end_are_refused_when_the_plan_ends():
    loaders = [make("sized", 500, rank, 2, seed=1) for rank in range(2)]
    whole, _ = run(loaders)
    total = len(whole[0])
    _, state = run([make("sized", 500, rank, 2, seed=1) for rank in range(2)], total - 1)
    assert state is not None and "resume" in state
    # a point of the last window, with steps past the epoch's end (a tampered state)
    tampered = {**state, "steps": total + 3}
    fresh = make("sized", 500, 0, 2, seed=1)
    with pytest.raises(
        ValueError, match=rf"state has steps={total + 3}, past the {total} steps of epoch 0 on 2 ranks\."
    ):
        fresh.load_state_dict(tampered)
    # a state saved after the epoch's last step (before the loop saw the end) starts the next epoch
    _, end = run([make("sized", 500, rank, 2, seed=1) for rank in range(2)], total)
    assert end is not None and end["steps"] == total
    fresh.load_state_dict(end)
    assert fresh.epoch == 1 and fresh._point is None and fresh.finished_steps == total


@pytest.mark.parametrize(
    ("resume", "error", "message"),
    [
        ([1, 2], TypeError, r"state\['resume'\] must be a dict from state_dict\(\), got \[1, 2\]\."),
        ({"batch": 0, "item": 0}, ValueError, r"state has no 'rng' entry; pass a dict made by state_dict\(\)\."),
        (
            {"batch": 0, "item": 0, "rng": None, "more": 1},
            ValueError,
            r"state\['resume'\] has an unknown entry 'more' \(entries are batch, item, rng\)",
        ),
        ({"batch": -2, "item": 0, "rng": None}, ValueError, r"state\['resume batch'\] must be a non-negative integer"),
        ({"batch": 0, "item": 1.5, "rng": None}, TypeError, r"state\['resume item'\] must be an integer, got 1\.5"),
        ({"batch": 0, "item": 0, "rng": "x"}, TypeError, r"must be None or a list of 4 hexadecimal strings, got 'x'\."),
        ({"batch": 0, "item": 0, "rng": ["g", "1", "0", "0"]}, ValueError, r"must hold hexadecimal strings"),
        ({"batch": 0, "item": 0, "rng": ["1", "1", "2", "0"]}, ValueError, r"is not a random state of the dealer"),
        (
            {"batch": 0, "item": 10**6, "rng": None},
            ValueError,
            r"names item 1000000, past the 500 items of the dataset\.",
        ),
    ],
)
def test_a_malformed_resume_point_is_refused(resume: Any, error: type[Exception], message: str) -> None:
    _, state = run([make("sized", 500, seed=1)], 3)
    assert state is not None
    with pytest.raises(error, match=message):
        make("sized", 500, seed=1).load_state_dict({**state, "resume": resume})


def test_the_point_is_plain_json_and_round_trips():
    from fastsab.position.epoch_state import ResumePoint, parse_resume_point

    point = ResumePoint(16, 5, (2**127 + 3, 2**64 + 1, 1, 2**32 - 1))
    saved = json.loads(json.dumps(point.as_dict()))
    assert saved["rng"] == [format(value, "x") for value in point.rng]  # type: ignore[union-attr]
    assert parse_resume_point({"resume": saved}) == point


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize(("n", "group"), [(1, 1), (10, 3), (17, 4), (100, 16), (257, 64)])
def test_the_order_from_any_position_and_each_index_position(shuffle: bool, rotate: bool, n: int, group: int) -> None:
    order = EpochOrder(n, shuffle=shuffle, group_size=group, seed=n + group, rotate=rotate)
    for epoch in range(2):
        whole = np.concatenate(list(order.chunks(epoch)))
        for position in range(n + 1):
            # invariant: the order taken up at a position is the rest of the epoch's order
            assert np.array_equal(np.concatenate([*order.chunks_from(epoch, position), whole[:0]]), whole[position:])
        # invariant: position_of inverts the order
        assert [order.position_of(epoch, int(index)) for index in whole] == list(range(n))


@pytest.mark.slow
def test_a_resume_at_scale_runs_the_uninterrupted_batches_without_replaying_the_epoch():
    # rank 7 of 8 over 10**8 items: a state saved half-way through the epoch by the batch
    # sampler, which then goes on with the uninterrupted run's next steps; a fresh process
    # loads the state, and its first batches are those
    script = textwrap.dedent(
        """
        import json, resource, sys, time
        import numpy as np
        from fastsab import FastSizeAwareLoader
        from fastsab.bench.workloads import IndexDataset, index_sizes

        n = 10**8
        make = lambda: FastSizeAwareLoader(IndexDataset(n), index_sizes, 4096, rank=7, world_size=8)
        if sys.argv[1] == "save":
            sampler = make().batch_sampler()
            batches = iter(sampler)
            for _ in range(n * 49 // 4096 // 8 // 2):  # about half the epoch's steps
                next(batches)
            state = sampler.state_dict()
            expected = [next(batches) for _ in range(3)]  # the uninterrupted run's next steps
            print(json.dumps([state, expected]))
        else:
            state, expected = json.loads(sys.stdin.read())
            loader = make()
            start = time.perf_counter()
            loader.load_state_dict(state)
            iterator = iter(loader)
            first = next(iterator).tolist()
            seconds = time.perf_counter() - start
            got = [first] + [next(iterator).tolist() for _ in range(2)]
            print(json.dumps([got == expected, seconds, loader._point is not None]))
        """
    )
    saved = subprocess.run(
        [sys.executable, "-c", script, "save"], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    done = subprocess.run(
        [sys.executable, "-c", script, "load"], input=saved, capture_output=True, text=True, check=True, timeout=300
    ).stdout
    same, seconds, taken_up = json.loads(done.strip().splitlines()[-1])
    assert same and taken_up
    assert seconds < 60  # (a hang guard: the replay this replaces took about 12 s here; a resume takes well under 1 s)
