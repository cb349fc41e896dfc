"""``Mixture``: what it refuses (with the argument, source and value named), and how it reads a batch."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader, Mixture
from fastsab.fetch.mixture import MixtureSamplesError
from fastsab.plan.mixing import MixState

A, B = torch.arange(4), torch.arange(10, 13)


def _mix(**kwargs: Any) -> Mixture:
    return Mixture({"a": A, "b": B}, **kwargs)


@pytest.mark.parametrize(
    ("sources", "error", "match"),
    [
        ({}, TypeError, "sources must be a non-empty mapping {name: dataset}, got {}"),
        ([A, B], TypeError, "sources must be a non-empty mapping {name: dataset}, got [tensor("),
        ({"a": A, 1: B}, TypeError, "source names must be strings, got 1"),
        ({"a": A, "b": torch.arange(0)}, ValueError, "source 'b' has no items"),
        ({"a": A, "b": []}, ValueError, "source 'b' has no items"),
    ],
)
def test_sources_are_refused(sources, error, match):
    with pytest.raises(error, match=re.escape(match)):
        Mixture(sources)


@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        ({"a": -1, "b": 1}, ValueError, "weights['a'] must be a finite number >= 0, got -1"),
        ({"a": math.nan, "b": 1}, ValueError, "weights['a'] must be a finite number >= 0, got nan"),
        ({"a": 1, "b": math.inf}, ValueError, "weights['b'] must be a finite number >= 0, got inf"),
        ({"a": np.float32("nan"), "b": 1}, ValueError, "weights['a'] must be a finite number >= 0, got nan"),
        ({"a": 0, "b": 0}, ValueError, "weights gives every source weight 0"),
        ({}, ValueError, "weights gives every source weight 0"),
        ({"a": 1, "c": 1}, ValueError, "weights names source 'c', which the mixture does not have: it has ['a', 'b']"),
        ({"a": "1", "b": 1}, TypeError, "weights['a'] must be a real number, got '1'"),
        ({"a": True, "b": 1}, TypeError, "weights['a'] must be a real number, got True"),
        ({"a": [1], "b": 1}, TypeError, "weights['a'] must be a real number, got [1]"),
        ("a", TypeError, "weights must be a mapping {source: weight} or a list of points"),
        (3, TypeError, "weights must be a mapping {source: weight} or a list of points"),
        (
            [],
            TypeError,
            "weights must be a mapping {source: weight} or a list of points [(at, {source: weight}), ...], got []",
        ),
        ([(0, {"a": 1}), (10, {"b": -2})], ValueError, "weights[1]['b'] must be a finite number >= 0, got -2"),
        ([(0, {"a": 1}), (5, {"a": 0})], ValueError, "weights[1] gives every source weight 0"),
        ([(0, {"a": 1}), (5, {"z": 1})], ValueError, "weights[1] names source 'z'"),
        ([(0, {"a": 1}), (10, {"b": 1}), (10, {"a": 1})], ValueError, "point 2 is at 10.0, after 10.0"),
        ([(5, {"a": 1}), (1, {"b": 1})], ValueError, "point 1 is at 1.0, after 5.0"),
        ([(0, {"a": 1}, "linear")], ValueError, "weights' first point cannot be 'linear'"),
        (
            [(0, {"a": 1}), (1, {"b": 1}, "cubic")],
            ValueError,
            "weights[1]'s shape must be one of 'step', 'linear', got 'cubic'",
        ),
        ([(0,)], TypeError, "weights[0] must be (at, {source: weight}) or (at, weights, 'linear'), got (0,)"),
        ([(0, {"a": 1}, "step", 1)], TypeError, "weights[0] must be (at, {source: weight})"),
        ([{"a": 1}], TypeError, "weights[0] must be (at, {source: weight}) or (at, weights, 'linear'), got {'a': 1}"),
        ([(0, [1, 2])], TypeError, "weights[0] must map source names to weights, got [1, 2]"),
        ([(-1, {"a": 1})], ValueError, "weights[0]'s 'at' must be a finite number >= 0, got -1"),
        ([(math.nan, {"a": 1})], ValueError, "weights[0]'s 'at' must be a finite number >= 0, got nan"),
        ([(0, {"a": 1}), (math.inf, {"b": 1})], ValueError, "weights[1]'s 'at' must be a finite number >= 0, got inf"),
        ([("0", {"a": 1})], TypeError, "weights[0]'s 'at' must be a real number, got '0'"),
    ],
)
def test_weights_are_refused_with_the_source_and_value_named(weights, error, match):
    with pytest.raises(error, match=re.escape(match)):
        _mix(weights=weights)


def test_numpy_numbers_are_weights_points_and_stops():
    # a schedule computed with numpy (np.arange, np.int64 counts) is taken as its Python numbers
    mix = _mix(
        weights=[(np.int64(0), {"a": np.int64(1)}), (np.int64(3), {"b": np.float32(2)})], stop={"items": np.int64(5)}
    )
    assert mix.schedule.as_list() == [[0.0, {"a": 1.0}, "step"], [3.0, {"b": 2.0}, "step"]]
    assert mix.stop.amount == 5
    assert mix.schedule.at(1).tolist() == _mix(weights={"a": torch.tensor(1.0)}).schedule.at(1).tolist() == [1.0, 0.0]


def test_weights_whose_sum_is_past_the_floats_are_refused():
    with pytest.raises(
        ValueError, match=re.escape("weights sum past the largest float: give weights of a smaller scale")
    ):
        _mix(weights={"a": 1e308, "b": 1e308})


@pytest.mark.parametrize(
    ("stop", "error", "match"),
    [
        ("all", ValueError, "stop must be one of 'first', 'last', got 'all'"),
        (None, TypeError, "stop must be 'first', 'last', {'cost': total} or {'items': count}, got None"),
        (5, TypeError, "stop must be 'first', 'last', {'cost': total} or {'items': count}, got 5"),
        ({"cost": 5, "items": 3}, TypeError, "got {'cost': 5, 'items': 3}"),
        ({"steps": 5}, ValueError, "stop's key must be one of 'cost', 'items', got 'steps'"),
        ({"cost": -5}, ValueError, "stop={'cost': -5} needs a positive finite number."),
        ({"cost": 0}, ValueError, "stop={'cost': 0} needs a positive finite number."),
        ({"cost": math.nan}, ValueError, "stop={'cost': nan} needs a positive finite number."),
        ({"cost": math.inf}, ValueError, "stop={'cost': inf} needs a positive finite number."),
        ({"items": 0}, ValueError, "stop={'items': 0} needs a positive integer."),
        ({"items": 2.5}, ValueError, "stop={'items': 2.5} needs a positive integer."),
        ({"cost": "5"}, TypeError, "stop={'cost': ...} needs a number, got '5'."),
        ({"items": True}, TypeError, "stop={'items': ...} needs a number, got True."),
    ],
)
def test_stops_are_refused(stop, error, match):
    with pytest.raises(error, match=re.escape(match)):
        _mix(stop=stop)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"by": "tokens"}, "by must be one of 'cost', 'items', got 'tokens'"),
        ({"by": 1}, "by must be one of 'cost', 'items', got 1"),
        ({"over": "steps"}, "over must be one of 'cost', 'items', got 'steps'"),
    ],
)
def test_by_and_over_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        _mix(**kwargs)


SIZES = {"a": np.arange(1, 5), "b": np.arange(1, 4)}


@pytest.mark.parametrize(
    ("sizeof", "error", "match"),
    [
        (
            {"a": SIZES["a"]},
            ValueError,
            "sizeof must give the values of every source of the mixture and of no other: missing ['b'], unknown []",
        ),
        ({**SIZES, "c": SIZES["b"]}, ValueError, "missing [], unknown ['c']"),
        ({**SIZES, 1: SIZES["b"], "c": SIZES["b"]}, ValueError, "missing [], unknown [1, 'c']"),
        ({"a": SIZES["a"], "b": SIZES["b"][:2]}, ValueError, "sizeof['b'] has 2 values but source 'b' has 3 items"),
        ({"a": SIZES["a"], "b": np.ones(4)}, ValueError, "sizeof['b'] has 4 values but source 'b' has 3 items"),
        ({"a": SIZES["a"], "b": "abc"}, TypeError, "sizeof['b'] must be an array, tensor or sequence, got 'abc'"),
        ({"a": SIZES["a"], "b": 3}, TypeError, "sizeof['b'] must be an array, tensor or sequence, got 3"),
        (
            {"a": np.ones((4, 2)), "b": SIZES["b"]},
            ValueError,
            "sizeof must give values of one shape for every source: each of sizeof['a'] has shape (2,), each of sizeof['b'] has shape ()",
        ),
    ],
)
def test_sizes_by_source_are_refused(sizeof, error, match):
    with pytest.raises(error, match=re.escape(match)):
        FastSizeAwareLoader(_mix(), sizeof, max_total_size=10)


def test_features_by_source_are_refused():
    with pytest.raises(ValueError, match=re.escape("features['a'] has 3 values but source 'a' has 4 items")):
        _mix().joined("features", {"a": np.ones((3, 2)), "b": np.ones((3, 2))})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "features must give values of one shape for every source: each of features['a'] has shape (2,), each of features['b'] has shape (3,)"
        ),
    ):
        _mix().joined("features", {"a": np.ones((4, 2)), "b": np.ones((3, 3))})
    joined = _mix().joined("features", {"a": np.ones((4, 2)), "b": torch.zeros(3, 2)})
    assert np.array_equal(joined, np.concatenate([np.ones((4, 2)), np.zeros((3, 2))]))


def _loader(**kwargs: Any) -> FastSizeAwareLoader:
    mix = Mixture({"a": torch.arange(20), "b": torch.arange(100, 110)}, {"a": 2, "b": 1})
    return FastSizeAwareLoader(
        mix, {"a": np.arange(1, 21) % 7, "b": np.arange(1, 11)}, max_total_size=12, seed=1, **kwargs
    )


def _saved() -> dict[str, Any]:
    loader = _loader()
    batches = iter(loader)
    next(batches), next(batches)
    return json.loads(json.dumps(loader.state_dict()))


def _at(entry: dict[str, Any], value: Any) -> None:
    entry["at"] = value


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.__setitem__("mixture", "x"), "state['mixture'] must be the mixture's entry of a state, got 'x'"),
        (lambda s: s.__setitem__("mixture", [1]), "state['mixture'] must be the mixture's entry of a state, got [1]"),
        (
            lambda s: s["mixture"].pop("start"),
            "state['mixture'] must be the mixture's entry of a state, got {'weights'",
        ),
        (
            lambda s: s["mixture"].pop("weights"),
            "state['mixture'] must be the mixture's entry of a state, got {'start'",
        ),
        (
            lambda s: s["mixture"].__setitem__("start", "x"),
            "state['mixture']['start'] is not a mixture state of 2 sources: 'x'",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("positions", [0]),
            "state['mixture']['start'] is not a mixture state of 2 sources",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("positions", [-1, 0]),
            "state['mixture']['start'] is not a mixture state of 2 sources",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("positions", [1.5, 0]),
            "state['mixture']['start'] is not a mixture state of 2 sources",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("positions", ["1", 0]),
            "state['mixture']['start'] is not a mixture state of 2 sources",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("positions", [20, 0]),
            "state['mixture']['start'] is not a mixture state of 2 sources",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("deviations", [math.nan, 0]),
            "state['mixture']['start'] is not a mixture state",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("ended", [0, 1]),
            "state['mixture']['start'] is not a mixture state",
        ),
        (
            lambda s: s["mixture"]["start"].__setitem__("began", [1, 1]),
            "state['mixture']['start'] is not a mixture state",
        ),
        (
            lambda s: s["mixture"].__setitem__("weights", "x"),
            "state['mixture']['weights'] is not a schedule of the mixture's weights (weights must be",
        ),
        (
            lambda s: s["mixture"].__setitem__("weights", [5]),
            "state['mixture']['weights'] is not a schedule of the mixture's weights (weights[0] must be",
        ),
        (
            lambda s: s["mixture"].__setitem__("weights", [[0, {"c": 1}, "step"]]),
            "(weights[0] names source 'c', which the mixture does not have",
        ),
        (
            lambda s: s["mixture"].__setitem__("over", "steps"),
            "state['mixture']['over'] must be one of 'cost', 'items', got 'steps'",
        ),
        (
            lambda s: _at(s["mixture"], "x"),
            "state['mixture']['at'] must be [position, mixture state] with a position >= 0, got 'x'",
        ),
        (
            lambda s: _at(s["mixture"], [3]),
            "state['mixture']['at'] must be [position, mixture state] with a position >= 0, got [3]",
        ),
        (
            lambda s: _at(s["mixture"], [-3, s["mixture"]["start"]]),
            "state['mixture']['at'] must be [position, mixture state] with a position >= 0, got [-3, {",
        ),
        (
            lambda s: _at(s["mixture"], ["3", s["mixture"]["start"]]),
            "state['mixture']['at'] must be [position, mixture state] with a position >= 0, got ['3', {",
        ),
        (lambda s: _at(s["mixture"], [3, {}]), "state['mixture']['at'] is not a mixture state of 2 sources: {}"),
    ],
)
def test_a_malformed_mixture_entry_of_a_state_is_refused(change, match):
    state = _saved()
    change(state)
    loader = _loader()
    with pytest.raises(ValueError, match=re.escape(match)):
        loader.load_state_dict(state)


@pytest.mark.parametrize("huge", [10**400, 2**70])
def test_a_mixture_state_of_numbers_past_the_floats_or_the_counts_is_refused(huge):
    state = _saved()
    state["mixture"]["start"]["deviations"] = [huge, 0]
    state["mixture"]["start"]["positions"] = [0, huge]
    with pytest.raises(ValueError, match=re.escape("state['mixture']['start'] is not a mixture state of 2 sources")):
        _loader().load_state_dict(state)


def test_a_malformed_mixture_state_is_refused_under_python_dash_o():
    # (checks that python -O would leave out, if they were asserts)
    entry = MixState.start(1).as_dict() | {"positions": [-1]}
    script = (
        "from fastsab.plan.mixing import MixState\n"
        f"try:\n    MixState.from_dict({entry!r}, [3], 'x')\n"
        "except ValueError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("x is not a mixture state of 1 sources")


def test_a_state_without_a_mixture_entry_replays_the_epoch():
    # (the rule walks to the epoch's start; the resume point names where to go on)
    state, whole = _saved(), [batch.tolist() for batch in _loader()]
    del state["mixture"]
    loader = _loader()
    loader.load_state_dict(state)
    assert [batch.tolist() for batch in loader] == whole[2:]


@pytest.mark.parametrize(
    ("a", "b", "detail"),
    [
        (torch.zeros(4, 3), torch.zeros(3, 5), "Sizes of tensors must match"),
        (torch.zeros(4, 3), torch.zeros(3), "Tensors must have same number of dimensions"),
        (torch.zeros(4, 3), torch.zeros(3, 3, dtype=torch.int64), "dtypes [torch.float32, torch.int64] differ"),
        (np.zeros((4, 2)), np.zeros((3, 2), dtype=np.int32), "dtypes [dtype('float64'), dtype('int32')] differ"),
        (np.zeros((4, 2)), torch.zeros(3, 2), "leaves of types ['ndarray', 'Tensor'] differ"),
        ({"x": torch.zeros(4)}, torch.zeros(3), "Expected an instance of dict"),
        ({"x": torch.zeros(4)}, {"y": torch.zeros(3)}, "dictionary key mismatch"),
    ],
)
def test_samples_that_cannot_share_a_batch_are_refused_naming_the_sources(a, b, detail):
    mix = Mixture({"web": a, "code": b})
    assert isinstance(mix[0], type(a))
    with pytest.raises(
        MixtureSamplesError, match=re.escape(f"the samples of sources ['web', 'code'] cannot share a batch ({detail}")
    ):
        mix.__getitems__([0, 5])


def test_rows_of_gathered_sources_are_joined_in_the_plans_order():
    mix = Mixture(
        {"a": {"x": torch.arange(4), "y": np.arange(4.0)}, "b": {"x": torch.arange(10, 13), "y": np.arange(10.0, 13.0)}}
    )
    batch = mix.__getitems__([5, 0, 4 + 7, 3])  # (the last id: item 4 of the next source epoch's ids)
    assert batch["x"].tolist() == [11, 0, 10, 3]
    assert batch["y"].tolist() == [11.0, 0.0, 10.0, 3.0]


def test_an_item_of_a_pytree_source_is_its_row():
    mix = Mixture(
        {"a": {"x": torch.arange(4), "y": np.arange(4.0)}, "b": {"x": torch.arange(10, 13), "y": np.zeros(3)}}
    )
    row = mix[5]
    assert row["x"].item() == 11 and row["y"] == 0.0
    assert mix[5 + 7]["x"].item() == 11  # (an id of the next source epoch: the same item)


class Texts:
    """Samples as dicts of Python lists, read one at a time (or a list at once with ``__getitems__``)."""

    def __init__(self, base: int, n: int) -> None:
        self.base, self.n = base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"tokens": list(range(self.base, self.base + i + 1))}


class ListedTexts(Texts):
    def __getitems__(self, ids: list[int]) -> list[dict[str, list[int]]]:
        return [self[i] for i in ids]


@pytest.mark.filterwarnings("ignore:dataset .* is read item by item")
def test_sources_of_samples_are_collated_by_the_collate_fn():
    mix = Mixture({"a": Texts(0, 4), "b": ListedTexts(100, 3)}, stop="last")
    assert mix.__getitems__([5, 0, 1]) == [{"tokens": [100, 101]}, {"tokens": [0]}, {"tokens": [0, 1]}]

    def collate(samples: list[dict[str, list[int]]]) -> list[int]:
        return [sample["tokens"][-1] for sample in samples]

    # the same plan over tensors whose rows are the samples' last tokens: batch by batch the same
    twin = Mixture({"a": torch.arange(4), "b": torch.arange(100, 103)}, stop="last")
    for epoch in range(3):
        loader, plain = (
            FastLoader(mix, batch_size=3, collate_fn=collate, seed=2),
            FastLoader(twin, batch_size=3, seed=2),
        )
        loader.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert [batch for batch in loader] == [batch.tolist() for batch in plain]


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ([-1], ValueError, "ids must be >= 0 (a mixture's ids count from 0), got -1."),
        ([0, 1.5], TypeError, "ids must be a sequence of integers (a loader's ids), got [0, 1.5]."),
        (3, TypeError, "ids must be a sequence of integers (a loader's ids), got 3."),
        ([[0, 1]], TypeError, "ids must be a sequence of integers"),
    ],
)
def test_locate_refuses_ids_no_loader_gives(ids, error, match):
    with pytest.raises(error, match=re.escape(match)):
        _mix().locate(ids)


def test_locate_takes_a_loaders_ids_in_any_integer_form():
    expected = [("a", 1), ("b", 0), ("a", 1)]
    assert _mix().locate([1, 4, 8]) == _mix().locate(np.array([1, 4, 8], dtype=np.uint32)) == expected
    assert _mix().locate(torch.tensor([1, 4, 8])) == _mix().locate((1, 4, 8)) == expected
    assert _mix().locate([]) == []
