"""The mixing rule and a mixture's order against the plain loop of ``tests/reference.py::mix_loop``.

``MixedOrder`` merges its sources' orders by the rule of ``fastsab.plan.mixing``, epoch after
epoch; every way of reading an epoch (whole, from any position, found by id, resumed from a
state written as JSON into a fresh order) must give the loop's merge, and under constant
weights every prefix must keep each source within the largest item's cost of its share.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.plan.epochs import EpochOrder
from fastsab.plan.mix_weights import WeightSchedule, parse_stop
from fastsab.plan.mixed_order import MixedOrder
from fastsab.plan.mixing import MixState
from tests.reference import mix_loop
from tests.test_differential import examples

_EPOCHS = 3

#: Above this many items an epoch is taken up at a sample of its positions, not at each.
_EVERY_POSITION = 40


@dataclass
class Case:
    """A mixture's sources, costs, weights and stopping rule, and how its orders are grouped."""

    lengths: list[int]
    costs: list[np.ndarray]
    points: list[tuple[Any, ...]]
    over: str
    by_items: bool
    stop: Any
    shuffle: bool
    seed: int
    source_groups: list[int]
    group_size: int

    @property
    def names(self) -> list[str]:
        return [f"s{s}" for s in range(len(self.lengths))]

    def source_orders(self) -> list[EpochOrder]:
        seeds = [MixedOrder.source_seed(self.seed, name) for name in self.names]
        return [
            EpochOrder(n, shuffle=self.shuffle, seed=seed, group_size=size)
            for n, seed, size in zip(self.lengths, seeds, self.source_groups)
        ]

    def order(self) -> MixedOrder:
        """A fresh order of the mixture, reading the case's costs."""
        order = MixedOrder(
            self.names,
            self.source_orders(),
            WeightSchedule(self.names, self.points, self.over),
            parse_stop(self.stop),
            shuffle=self.shuffle,
            seed=self.seed,
            group_size=self.group_size,
            by_items=self.by_items,
        )
        every = np.concatenate(self.costs)
        order.use_costs(lambda ids: every[ids])
        return order

    def reference(self, epochs: int) -> list[list[tuple[int, int, int]]]:
        """The plain loop's epochs: ``(source, item, source epoch)`` each (raises as it raises)."""
        orders = self.source_orders()  # (their own, so that the order's reads do not touch them)
        schedule = WeightSchedule(self.names, self.points, self.over)
        kind, amount = (self.stop, 0) if isinstance(self.stop, str) else next(iter(self.stop.items()))
        return mix_loop(
            [lambda k, order=order: np.concatenate(list(order.chunks(k))).tolist() for order in orders],
            lambda s, item: 1.0 if self.by_items else float(self.costs[s][item]),
            lambda cost, items: schedule.at(items if self.over == "items" else cost).tolist(),
            (kind, amount),
            epochs,
        )

    def ids(self, epoch: list[tuple[int, int, int]]) -> np.ndarray:
        """The ids a mixture's order yields for the loop's ``(source, item, source epoch)``."""
        offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        n = int(offsets[-1])
        return np.array([offsets[s] + item + n * k for s, item, k in epoch], dtype=np.int64)


_COSTS = {
    "integer": st.integers(0, 20).map(float),
    "fractional": st.sampled_from([0.0, 0.1, 0.25, 1 / 3, 0.7, 1.5, 2.2, 9.9]),
}
_WEIGHTS = st.sampled_from([0, 0, 0.5, 1, 1, 2, 3.25])


@st.composite
def _weights(draw: Any, names: Sequence[str]) -> dict[str, float]:
    weights = {name: draw(_WEIGHTS) for name in names}
    if not any(weights.values()):
        weights[draw(st.sampled_from(names))] = draw(st.sampled_from([0.5, 1, 2]))
    return weights


@st.composite
def cases(draw: Any, constant: bool = False) -> Case:
    """Random mixtures: 1 to 5 sources of 1 to 30 items, schedules over cost or items, every stop."""
    sources = draw(st.integers(1, 5))
    lengths = [draw(st.integers(1, 30)) for _ in range(sources)]
    values = _COSTS[draw(st.sampled_from(sorted(_COSTS)))]
    costs = [np.array(draw(st.lists(values, min_size=n, max_size=n))) for n in lengths]
    names = [f"s{s}" for s in range(sources)]
    first = draw(st.sampled_from([0, 0, 3]))
    points: list[tuple[Any, ...]] = [(first, draw(_weights(names)))]
    at = float(first)
    for _ in range(0 if constant else draw(st.integers(0, 3))):
        at += draw(st.sampled_from([0.5, 1, 4, 10, 25, 60]))
        shape = draw(st.sampled_from(["step", "linear"]))
        points.append((at, draw(_weights(names)), shape))
    stop = draw(
        st.one_of(
            st.sampled_from(["first", "last"]),
            st.builds(lambda x: {"cost": x}, st.sampled_from([0.5, 1, 7, 40.5, 120])),
            st.builds(lambda x: {"items": x}, st.integers(1, 40)),
        )
    )
    return Case(
        lengths=lengths,
        costs=costs,
        points=points,
        over=draw(st.sampled_from(["cost", "items"])),
        by_items=draw(st.booleans()),
        stop=stop,
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        source_groups=[draw(st.integers(1, 6)) for _ in range(sources)],
        group_size=draw(st.integers(1, 7)),
    )


def _expected(case: Case, epochs: int) -> list[np.ndarray] | None:
    """The loop's epochs as ids, or ``None`` where the loop refuses a source that costs nothing."""
    try:
        return [case.ids(epoch) for epoch in case.reference(epochs)]
    except ValueError as error:
        assert "costs nothing" in str(error)
        return None


def _joined(chunks: Any) -> np.ndarray:
    return np.concatenate([np.empty(0, np.int64), *chunks])


def _positions(length: int, group_size: int) -> list[int]:
    """Every position of an epoch; where it is long, its first chunks' edges, its last ones and a sample between."""
    if length <= _EVERY_POSITION:
        return list(range(length + 1))
    edges = {k * group_size + d for k in range(1, 4) for d in (-1, 0, 1)} | set(range(length - 2, length + 1))
    return sorted(edges | set(range(0, length, length // 20)))


def _counted(case: Case, epochs: list[np.ndarray]) -> list[list[dict[str, Any]]]:
    """The ``MixState`` (as a dict) at every position of every epoch, counted plainly item by item."""
    offsets = np.concatenate([[0], np.cumsum(case.lengths)])
    sources = range(len(case.lengths))
    schedule = WeightSchedule(case.names, case.points, case.over)
    all_costs = np.ones(int(offsets[-1])) if case.by_items else np.concatenate(case.costs)
    taken, costs, deviations, starts = ([0.0] * len(sources) for _ in range(4))
    cost, items, found = 0.0, 0, []
    for ids in epochs:
        epoch_cost, ended, states = 0.0, [False] * len(sources), []
        began = [taken[s] % case.lengths[s] == 0 for s in sources]  # (a source epoch carried over has not)
        for item in [*(ids % offsets[-1]).tolist(), None]:
            states.append(
                {
                    "source_epochs": [int(taken[s] // case.lengths[s]) for s in sources],
                    "positions": [int(taken[s] % case.lengths[s]) for s in sources],
                    "deviations": list(deviations),
                    "costs": list(costs),
                    "source_starts": list(starts),
                    "cost": cost,
                    "items": items,
                    "epoch_cost": epoch_cost,
                    "epoch_items": len(states),
                    "ended": list(ended),
                    "began": list(began),
                }
            )
            if item is None:
                break
            s = int(np.searchsorted(offsets, item, side="right")) - 1
            c = float(all_costs[item])
            weights = schedule.at(items if case.over == "items" else cost)
            for r in sources:
                deviations[r] -= weights[r] / weights.sum() * c
            deviations[s] += c
            costs[s] += c
            cost, items, epoch_cost = cost + c, items + 1, epoch_cost + c
            taken[s] += 1
            if taken[s] % case.lengths[s] == 0:
                starts[s], ended[s], began[s] = costs[s], ended[s] or began[s], True
        found.append(states)
    return found


def _same_state(state: MixState, counted: dict[str, Any]) -> None:
    saved = state.as_dict()
    assert saved.keys() == counted.keys()
    for key, value in counted.items():
        assert saved[key] == pytest.approx(value, abs=1e-9), key


@settings(max_examples=examples(100))
@given(cases())
def test_a_mixtures_epochs_are_the_plain_loops(case):
    # every epoch, read whole, is the loop's merge: chunks of group_size items (the last one
    # shorter), each id naming its source, item and source epoch; the loop and the order refuse
    # a source that costs nothing alike
    expected = _expected(case, _EPOCHS)
    order = case.order()
    if expected is None:
        with pytest.raises(ValueError, match="costs nothing"):
            for epoch in range(_EPOCHS):
                order.epoch_length(epoch)
        return
    loop = case.reference(_EPOCHS)
    for epoch, ids in enumerate(expected):
        chunks = list(order.chunks(epoch))
        assert [len(chunk) for chunk in chunks[:-1]] == [case.group_size] * (len(chunks) - 1)
        assert np.array_equal(_joined(chunks), ids)
        assert order.epoch_length(epoch) == len(ids)
        located = zip(*(part.tolist() for part in order.locate(ids)))
        assert list(located) == loop[epoch]
        skip = len(chunks) // 2
        assert np.array_equal(_joined(order.chunks(epoch, skip)), ids[skip * case.group_size :])
        assert np.array_equal(_joined(order.chunks_first_small(epoch)), ids)


@settings(max_examples=examples(60))
@given(cases(), st.permutations(range(_EPOCHS)))
def test_an_epoch_is_taken_up_at_any_position(case, visits):
    # from every position of every epoch (epochs visited in any order, each walked to from the
    # ones before it), the order yields the rest of the epoch, its rule stands where the loop
    # stood, and every id's position is found; ids of the epochs around it are refused
    expected = _expected(case, _EPOCHS)
    if expected is None:
        return
    order = case.order()
    counted = _counted(case, expected)
    for epoch in visits:
        ids = expected[epoch]
        for position in _positions(len(ids), case.group_size):
            rest = list(order.chunks_from(epoch, position))
            assert np.array_equal(_joined(rest), ids[position:])
            if rest:
                assert len(rest[0]) == min(case.group_size - position % case.group_size, len(ids) - position)
            _same_state(order.state_at(epoch, position), counted[epoch][position])
            if position < len(ids):
                assert order.position_of(epoch, int(ids[position])) == position
        with pytest.raises(ValueError, match=f"mixture epoch {epoch} has {len(ids)} items, not {len(ids) + 1}"):
            order.state_at(epoch, len(ids) + 1)
        for other in (epoch - 1, epoch + 1):
            if 0 <= other < _EPOCHS:
                with pytest.raises(ValueError, match=f"mixture epoch {epoch} does not yield id"):
                    order.position_of(epoch, int(expected[other][-1 if other < epoch else 0]))


@settings(max_examples=examples(40))
@given(cases(), st.data())
def test_a_saved_state_resumes_a_fresh_order(case, data):
    # the mixture's entry of a state, written as JSON and taken up by a fresh order, gives the
    # rest of the epoch and the epochs after it (the entry without an item: the whole epoch)
    expected = _expected(case, _EPOCHS)
    if expected is None:
        return
    epoch = data.draw(st.integers(0, _EPOCHS - 1))
    ids = expected[epoch]
    order = case.order()
    for position in _positions(len(ids), case.group_size):
        item = int(ids[position]) if position < len(ids) else None
        entry = json.loads(json.dumps(order.state_entry(epoch, item)))
        fresh = case.order()
        fresh.load_entry(epoch, entry["mixture"], None)
        if item is None:
            assert np.array_equal(_joined(fresh.chunks(epoch)), ids)
        else:
            assert np.array_equal(_joined(fresh.chunks_from(epoch, position)), ids[position:])
        for later in range(epoch + 1, _EPOCHS):
            assert np.array_equal(_joined(fresh.chunks(later)), expected[later])


def _largest_deviation(sources: np.ndarray, costs: np.ndarray, weights: Sequence[float]) -> float:
    """The largest ``|cost_s - w_s / W * total|`` over sources and over every prefix of a merged order."""
    total = np.cumsum(costs)
    shares = np.asarray(weights, dtype=float) / sum(weights)
    own = [np.cumsum(np.where(sources == s, costs, 0.0)) for s in range(len(shares))]
    return max(float(np.abs(own[s] - shares[s] * total).max(initial=0.0)) for s in range(len(shares)))


def _within_items(case: Case, order: MixedOrder, epochs: Sequence[int], bound: int) -> bool:
    """Whether every prefix of ``epochs`` of ``order`` (read one after another) keeps each source within ``bound`` items.

    (Items of the largest cost of a source with a positive weight under the case's constant weights; 1 by items.)
    """
    sources, items, _ = order.locate(_joined([_joined(order.chunks(epoch)) for epoch in epochs]))
    weights = WeightSchedule(case.names, case.points, case.over).at(0)
    costs = np.ones(len(sources)) if case.by_items else np.array([case.costs[s][i] for s, i in zip(sources, items)])
    largest = 1.0 if case.by_items else max(float(case.costs[s].max()) for s in np.flatnonzero(weights))
    return _largest_deviation(sources, costs, weights) <= bound * largest + 1e-9 * max(1.0, costs.sum())


@settings(max_examples=examples(100))
@given(cases(constant=True), st.integers(2, 5))
def test_every_prefix_keeps_each_source_within_an_item_of_its_share(case, epochs):
    # the rule's bound: under constant weights, after every prefix of the merged order (epochs
    # one after another, the sources running on across them), each source's cost is within the
    # largest item's cost of a source with a positive weight of its share of the total; by
    # items, within 1
    if _expected(case, epochs) is None:
        return
    order = case.order()
    assert _within_items(case, order, range(epochs), 1)


@settings(max_examples=examples(100))
@given(cases(constant=True), st.integers(2, 5))
def test_counted_from_an_epochs_start_each_source_is_within_two_items_of_its_share(case, epochs):
    # the deviations run on across epochs (the bound above is the run's), so an epoch starts
    # where the one before left them: counted from its own start, within two items
    if _expected(case, epochs) is None:
        return
    order = case.order()
    assert all(_within_items(case, order, [epoch], 2) for epoch in range(epochs))


def test_an_epoch_after_the_first_may_start_more_than_an_item_off_its_share():
    # sources of 1, 1 and 2 items at equal weights, by items, stop="first": the epochs are
    # [a], [b], [c, c]; after epoch 2's second item c has 2 of a share of 2/3 (the run's counts,
    # 1, 1 and 2 of 4, are within an item)
    points: list[tuple[Any, ...]] = [(0, {"s0": 1, "s1": 1, "s2": 1})]
    case = Case([1, 1, 2], [np.ones(1), np.ones(1), np.ones(2)], points, "cost", True, "first", False, 0, [1, 1, 2], 4)
    order = case.order()
    epochs = [order.locate(_joined(order.chunks(epoch)))[0].tolist() for epoch in range(3)]
    assert epochs == [[0], [1], [2, 2]]
    assert _largest_deviation(np.array(epochs[2]), np.ones(2), [1, 1, 1]) == pytest.approx(4 / 3)


def _finish_time_merge(costs: Sequence[Sequence[float]], weights: Sequence[float], count: int) -> np.ndarray:
    """Plain weighted fair queueing: the next item is the one that would finish first, eligible or not.

    Each source runs on through its items again and again; the sources of the first ``count`` items.
    """
    taken, cost, chosen = [0] * len(costs), [0.0] * len(costs), []
    for _ in range(count):
        heads = [source[taken[s] % len(source)] for s, source in enumerate(costs)]
        s = min(range(len(costs)), key=lambda s: ((cost[s] + heads[s]) / weights[s], s))
        chosen.append(s)
        cost[s] += heads[s]
        taken[s] += 1
    return np.array(chosen)


def test_the_plain_finish_time_order_runs_past_the_bound_with_three_sources():
    # why the rule keeps sources that are ahead out: by finish times alone, a heavy source
    # runs ahead of its share by about two items before the light ones' first items (unit
    # costs, so the bound is 1); the rule, on the same sources, stays within it
    weights = [0.98, 0.01, 0.01]
    plain = _finish_time_merge([[1.0], [1.0], [1.0]], weights, 300)
    assert _largest_deviation(plain, np.ones(300), weights) > 1.9
    names = ["s0", "s1", "s2"]
    case = Case(
        [1] * 3, [np.ones(1)] * 3, [(0, dict(zip(names, weights)))], "cost", False, {"items": 300}, False, 0, [1] * 3, 8
    )
    sources, _, _ = case.order().locate(_joined(case.order().chunks(0)))
    assert len(sources) == 300
    assert _largest_deviation(sources, np.ones(300), weights) <= 1.0


@settings(max_examples=examples(100))
@given(
    st.lists(st.lists(st.integers(1, 20).map(float), min_size=1, max_size=10), min_size=2, max_size=2),
    st.lists(st.sampled_from([0.01, 0.5, 1, 3, 50]), min_size=2, max_size=2),
)
def test_the_plain_finish_time_order_keeps_the_bound_with_two_sources(costs, weights):
    # with two sources, what one is ahead the other is behind, and the finish times keep that
    # within an item: the rule's eligibility is needed from three sources on
    plain = _finish_time_merge(costs, weights, 200)
    taken = [0, 0]
    item_costs = []
    for s in plain.tolist():
        item_costs.append(costs[s][taken[s] % len(costs[s])])
        taken[s] += 1
    largest = max(max(source) for source in costs)
    assert _largest_deviation(plain, np.array(item_costs), weights) <= largest + 1e-9
