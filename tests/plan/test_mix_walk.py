"""The mixing rule's walk (``fastsab.plan.mixing.mix_walk``), in Python and compiled: the reference loop's items."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, Mixture
from fastsab.plan import compiled
from fastsab.plan.compiled import use_compiled
from fastsab.plan.mix_weights import StopRule, WeightSchedule
from fastsab.plan.mixing import MixState, SourceHeads, mix_walk
from tests.reference import mix_loop


@contextlib.contextmanager
def walking(way):
    """``mix_walk`` takes items ``way``: ``"python"`` or ``"compiled"`` (by numba; skipped without it)."""
    if way == "compiled":
        pytest.importorskip("numba")
        assert use_compiled(wait=True) and compiled.compiled_take_run() is not None
    else:
        use_compiled(False)
    try:
        yield
    finally:
        use_compiled(False)


# NOTE: weights and nonzero costs within a factor of 40 of each other: stop="last" upsamples a heavy
# source until the lightest ends, a few thousand items at most
weight = st.one_of(st.just(0.0), st.integers(1, 5).map(float), st.floats(0.25, 4.0))


@st.composite
def mixtures(draw):
    """Sources (their items' costs), a weight schedule over cost or items, a stopping rule."""
    k = draw(st.integers(1, 4))
    cost = st.one_of(st.integers(0, 20).map(float), st.floats(0.5, 20.0), st.just(0.0))
    costs = [draw(st.lists(cost, min_size=1, max_size=10)) for _ in range(k)]
    over = draw(st.sampled_from(["cost", "items"]))
    points = []
    for number in range(draw(st.integers(1, 4))):
        values = draw(st.lists(weight, min_size=k, max_size=k).filter(lambda v: sum(v) > 0))
        at = (points[-1][0] if points else 0.0) + (draw(st.floats(0.5, 60.0)) if points else draw(st.just(0.0)))
        shape = draw(st.sampled_from(["step", "linear"])) if number else "step"
        points.append((at, dict(zip(map(str, range(k)), values)), shape))
    schedule = WeightSchedule([str(s) for s in range(k)], points, over)
    kind = draw(st.sampled_from(["first", "last", "cost", "items"]))
    amount = {"first": 0, "last": 0, "cost": draw(st.floats(0.5, 150.0)), "items": draw(st.integers(1, 40))}[kind]
    return costs, schedule, StopRule(kind, amount), draw(st.integers(0, 2**32 - 1))


def permutation(seed, s, source_epoch, n):
    """Source ``s``'s order in ``source_epoch`` (a seeded permutation of ``n`` items)."""
    return np.random.default_rng([seed, s, source_epoch]).permutation(n).tolist()


def reference_ids(costs, schedule, stop, seed, epochs):
    """The ids ``mix_loop`` gives, epoch by epoch (``offsets[s] + item + n * source_epoch``), or its error."""
    offsets = np.cumsum([0] + [len(c) for c in costs]).tolist()
    n = offsets[-1]
    permutations = [lambda e, s=s: permutation(seed, s, e, len(costs[s])) for s in range(len(costs))]
    at = (lambda cost, items: items) if schedule.over == "items" else (lambda cost, items: cost)
    try:
        result = mix_loop(
            permutations,
            lambda s, item: costs[s][item],
            lambda cost, items: schedule.at(at(cost, items)).tolist(),
            (stop.kind, stop.amount),
            epochs,
        )
    except ValueError:
        return None
    return [[offsets[s] + item + n * e for s, item, e in epoch] for epoch in result]


def walked_ids(costs, schedule, stop, seed, epochs, counts, states=None):
    """The ids ``mix_walk`` gives, epoch by epoch, called for ``counts`` items at a time, reads cut short; or None.

    The rule's state after each call is appended to ``states`` (as JSON).
    """
    offsets = np.cumsum([0] + [len(c) for c in costs]).tolist()
    n = offsets[-1]
    shorts = iter(counts)

    def read(s, source_epoch, start, count):
        # NOTE: a read may give fewer items than asked for (up to its chunk's end): cut short here
        count = min(count, next(shorts, count))
        items = permutation(seed, s, source_epoch, len(costs[s]))[start : start + count]
        ids = np.array(items, dtype=np.int64) + offsets[s] + n * source_epoch
        return ids, np.array([costs[s][i] for i in items], dtype=np.float64)

    heads = SourceHeads([len(c) for c in costs], read)
    state, result = MixState.start(len(costs)), []
    sizes = iter(counts)
    try:
        for _ in range(epochs):
            epoch, ended = [], False
            while not ended:
                ids, ended = mix_walk(state, heads, schedule, stop, next(sizes, 7))
                epoch += ids.tolist()
                if states is not None:
                    states.append(state.as_dict())
            result.append(epoch)
            state = state.next_epoch()
    except ValueError as error:
        assert "costs nothing" in str(error)
        return None
    return result


@pytest.mark.parametrize("way", ["python", "compiled"])
@settings(max_examples=300, deadline=None)
@given(mixture=mixtures(), epochs=st.integers(1, 3), counts=st.lists(st.integers(1, 9), max_size=50))
def test_walk_takes_the_reference_loops_items(way, mixture, epochs, counts):
    """Under any weights, schedule (steps, linear segments, zero weights), costs (zero too) and stopping rule.

    Called for any number of items at a time and fed in blocks of any size, the walk takes the
    items the plain loop takes, epoch after epoch, and refuses where it refuses.
    """
    costs, schedule, stop, seed = mixture
    expected = reference_ids(costs, schedule, stop, seed, epochs)
    with walking(way):
        assert walked_ids(costs, schedule, stop, seed, epochs, counts) == expected


@settings(max_examples=100, deadline=None)
@given(
    costs=st.lists(st.lists(st.floats(0.0, 1e9), min_size=1, max_size=30), min_size=1, max_size=5),
    weights=st.data(),
    amount=st.integers(1, 400),
    counts=st.lists(st.integers(1, 90), max_size=20),
)
def test_compiled_walk_rounds_as_python(costs, weights, amount, counts):
    """The compiled walk's deviations, costs and totals are Python's to the last bit, under any float costs and weights.

    (No fastmath: a fused multiply-add or a reordered sum would round otherwise, and turn a
    choice at a near tie.)
    """
    names = [str(s) for s in range(len(costs))]
    values = weights.draw(st.lists(st.floats(1e-3, 1e3), min_size=len(costs), max_size=len(costs)))
    schedule = WeightSchedule(names, dict(zip(names, values)))
    walks = []
    for way in ("python", "compiled"):
        states: list = []
        with walking(way):
            walks.append((walked_ids(costs, schedule, StopRule("items", amount), 0, 2, counts, states), states))
    assert walks[0] == walks[1]


def test_compiled_walk_plans_the_same_epochs_as_python():
    """A loader over a mixture with the compiled walk has the batches it has without it (lognormal token costs)."""
    rng = np.random.default_rng(0)
    lengths = {
        name: np.clip(rng.lognormal(5, 1, n), 1, 4096).astype(np.int64) for name, n in zip("abc", (900, 600, 400))
    }
    weights = [
        (0, {"a": 5, "b": 3, "c": 2}),
        (2e4, {"a": 1, "b": 1, "c": 1}),
        (6e4, {"a": 0, "b": 1, "c": 3}, "linear"),
    ]

    def batches():
        mix = Mixture({name: torch.arange(len(v)) for name, v in lengths.items()}, weights, stop="last")
        loader = FastSizeAwareLoader(mix, sizeof=lengths, max_total_size=2048, shuffle=True, seed=3)
        return [[batch.tolist() for batch in loader] for _ in range(2)]

    with walking("python"):
        python = batches()
    with walking("compiled"):
        assert batches() == python
