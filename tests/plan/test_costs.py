"""The batch cost (caps, sum and padded costs, lowering) and the sizeof forms turned into costs."""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.plan.cost_sources import make_cost_source, size_array
from fastsab.plan.costs import BatchCost
from fastsab.plan.item_sizes import item_size, oversize_message, per_item_sizeof
from fastsab.position.fingerprint import _plain

# --- caps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [7, 7.5, np.int64(7), np.float64(7.5), np.array(7), torch.tensor(7.5)])
def test_one_cap_is_a_python_number_for_every_column(cap: Any) -> None:
    rule = BatchCost(cap)
    assert not rule.per_column and rule.num_columns == 1
    assert type(rule.caps[0]) in (int, float) and rule.caps[0] == float(cap)
    assert rule.column_caps(3) == [rule.caps[0]] * 3
    assert rule.shown() == rule.caps[0]


@pytest.mark.parametrize("caps", [[4, 9], (4, 9), np.array([4, 9]), [np.int64(4), np.int32(9)]])
def test_caps_per_column(caps: Any) -> None:
    rule = BatchCost(caps)
    assert rule.per_column and rule.caps == [4, 9] and rule.shown() == [4, 9]
    assert all(type(cap) in (int, float) for cap in rule.caps)
    with pytest.raises(ValueError, match=r"max_total_size has 2 caps but costs has 3 columns: \[4, 9\]\."):
        rule.column_caps(3)


@pytest.mark.parametrize(
    ("cap", "error", "message"),
    [
        (-1, ValueError, r"max_total_size must be a finite number >= 0, got -1\."),
        ([1, float("inf")], ValueError, r"max_total_size must be a finite number >= 0, got inf\."),
        ("5", TypeError, r"max_total_size must be a real number, got '5' of type str\."),
        (torch.tensor([1, 2]), TypeError, r"max_total_size must be a real number"),
    ],
)
def test_bad_caps_are_refused(cap: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        BatchCost(cap)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cost": "max"}, r"cost must be one of 'sum', 'padded', got 'max'"),
        ({"max_batch_size": 0}, r"max_batch_size must be a positive integer"),
        ({"batch_size_multiple": 1.5}, r"batch_size_multiple must be an integer, got 1\.5 of type float\."),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        BatchCost(10, **kwargs)


def test_caps_for_the_costs_dtype_keep_comparisons_exact() -> None:
    # an int total is within 7.5 iff within 7; a float total within 2**53 + 1 iff within 2**53
    assert BatchCost(7.5).caps_for_dtype(1, False).tolist() == [7]
    assert BatchCost(2**53 + 1).caps_for_dtype(1, True).tolist() == [2.0**53]
    assert BatchCost(2**53).caps_for_dtype(1, True).tolist() == [2.0**53]  # exact as a float: kept
    assert BatchCost(2**70).caps_for_dtype(2, False).tolist() == [2**63 - 1] * 2
    assert BatchCost(2**1100).caps_for_dtype(1, True).tolist() == [sys.float_info.max]


def test_fits_is_the_streaming_rule() -> None:
    rule = BatchCost(10, max_batch_size=2)
    assert rule.fits(10, 2) and not rule.fits(11, 1) and not rule.fits(3, 3)
    assert BatchCost(0).fits(0, 1) and BatchCost(10).fits(10, 10**9)


# --- batch costs ----------------------------------------------------------------------------

COSTS = np.array([[3, 1], [5, 0], [2, 2], [4, 0]])
OFFSETS = np.array([0, 2, 4])


def test_sum_and_padded_batch_costs() -> None:
    assert BatchCost([10, 10]).per_batch(COSTS, OFFSETS).tolist() == [[8, 1], [6, 2]]
    assert BatchCost([10, 10], cost="padded").per_batch(COSTS, OFFSETS).tolist() == [[10, 2], [8, 4]]
    assert BatchCost(10).per_batch(np.array([1, 2, 3]), np.array([0, 1, 3])).tolist() == [[1], [5]]


def test_balance_costs_divide_by_the_caps_and_keep_the_largest_column() -> None:
    assert BatchCost([16, 2]).balance_costs(COSTS, OFFSETS).tolist() == [0.5, 1.0]
    assert BatchCost([10, 4], cost="padded").balance_costs(COSTS, OFFSETS).tolist() == [1.0, 1.0]
    # a column capped at 0 counts as it is
    assert BatchCost([16, 0]).balance_costs(COSTS, OFFSETS).tolist() == [1.0, 2.0]
    assert BatchCost(5).balance_costs(np.empty(0), np.array([0])).size == 0
    assert BatchCost(0.5).balance_costs(np.array([0.25, 0.5]), np.array([0, 2])).tolist() == [1.5]  # one batch


def test_smaller_caps_sum_and_padded() -> None:
    costs = np.array([[3, 0], [5, 0]])
    assert BatchCost([20, 7]).smaller_caps(costs, [20, 7], 4) == [2.0, 7]  # the unused column keeps its cap
    assert BatchCost([20, 7], cost="padded").smaller_caps(costs, [20, 7], 4) == [2.5, 7]
    assert BatchCost(20).smaller_caps(np.array([30]), [6], 2) == [6]  # never above the current caps
    assert BatchCost(20).smaller_caps(np.empty(0), [6], 2) == [6]
    assert BatchCost(20).smaller_caps(np.array([0.25, 0.5]), [6], 3) == [0.25]  # a cost below 1 counts


def test_checked_and_lowered_caps() -> None:
    rule = BatchCost([10, 4.5], cost="padded", max_batch_size=3, batch_size_multiple=2)
    assert rule.check_caps(np.array([2, 4])) == [2, 4]
    assert BatchCost(10).check_caps(np.float64(2.5)) == [2.5] == BatchCost(10).check_caps([2.5])
    with pytest.raises(ValueError, match=r"limit must have 2 cap\(s\), got 3\."):
        rule.check_caps(3)
    with pytest.raises(ValueError, match=r"limit must be a positive finite number, got 0\."):
        rule.check_caps([0, 1])
    assert rule.check_lowered([10, 4.5]) == [10, 4.5]
    with pytest.raises(
        ValueError, match=r"a lowered limit must not exceed the configured \[10, 4\.5\], got \[10, 5\]\."
    ):
        rule.check_lowered([10, 5])
    lowered = rule.lowered([5, 2])
    assert lowered.caps == [5, 2] and rule.caps == [10, 4.5]
    assert lowered.options() == rule.options() == {"cost": "padded", "max_batch_size": 3, "batch_size_multiple": 2}
    one = BatchCost(10).lowered([4])
    assert not one.per_column and one.column_caps(2) == [4, 4]


@pytest.mark.parametrize("cap", [100, 100.0, np.int64(100), np.float32(100), np.array(100), torch.tensor(100)])
def test_fingerprint_options_are_equal_across_number_forms(cap: Any) -> None:
    expected = json.dumps(_plain(BatchCost(100).fingerprint_options("skip")))
    assert json.dumps(_plain(BatchCost(cap).fingerprint_options("skip"))) == expected
    assert json.dumps(_plain(BatchCost([cap]).fingerprint_options("skip"))) == expected
    assert list(BatchCost(cap).fingerprint_options("skip")) == [
        "limit",
        "oversize",
        "cost",
        "max_batch_size",
        "batch_size_multiple",
    ]
    assert BatchCost(cap).fingerprint_options() != BatchCost(cap, cost="padded").fingerprint_options()


def test_a_rule_pickles() -> None:
    rule = pickle.loads(pickle.dumps(BatchCost([3, 4], max_batch_size=2)))
    assert rule.caps == [3, 4] and rule.per_column and rule.max_batch_size == 2


# --- sizeof forms ---------------------------------------------------------------------------

SIZES = [4, 1, 3]


class _Model:
    num_features = 1

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return 2 * x


@pytest.mark.parametrize(
    ("sizeof", "features"),
    [
        (np.array(SIZES), None),
        (torch.tensor(SIZES), None),
        (SIZES, None),
        (tuple(SIZES), None),
        (lambda ids: np.asarray(SIZES)[ids], None),  # vectorized
        (lambda ids: torch.tensor(SIZES)[torch.from_numpy(ids)], None),
        (lambda features: features + 1, np.array([3, 0, 2])),
        (_Model(), np.array([2.0, 0.5, 1.5])),
    ],
)
def test_every_sizeof_form_gives_its_costs(sizeof: Any, features: Any) -> None:
    costs = make_cost_source(sizeof, 3, features)
    assert costs(np.array([2, 0])).tolist() == [3, 4]


def test_array_costs_pickle() -> None:
    costs = pickle.loads(pickle.dumps(make_cost_source(torch.tensor(SIZES), 3)))
    assert costs(np.array([1, 2])).tolist() == [1, 3]


def test_a_per_item_sizeof_is_warned_about_and_gives_its_costs() -> None:
    with pytest.warns(UserWarning, match=r"sizeof is called once per item, which is slow"):
        costs = make_cost_source(SIZES.__getitem__, 3)
    assert costs(np.array([2, 0, 1])).tolist() == [3, 4, 1]


def test_a_mapping_is_a_per_item_sizeof() -> None:
    sizes = {"a": 2, "b": 5}
    assert per_item_sizeof(sizes, "x")("b") == 5
    assert per_item_sizeof(len, "x") is len
    with pytest.raises(TypeError, match=r"sizeof must be a callable or a mapping, got int\."):
        per_item_sizeof(3, "a callable or a mapping")


def test_size_array_takes_arrays_tensors_and_sequences_only() -> None:
    assert size_array(torch.tensor([1.5, 2.0])).tolist() == [1.5, 2.0]  # type: ignore[union-attr]
    assert size_array((1, 2)).dtype == np.int64  # type: ignore[union-attr]
    assert size_array("12") is None and size_array(len) is None and size_array({0: 1}) is None
    with pytest.raises(ValueError, match=r"sizeof must be non-negative, got -1 at position 1"):
        size_array([1, -1])


def test_item_size_checks_and_names_the_item() -> None:
    assert item_size(len, "abc", repr) == 3
    assert item_size(lambda x: np.float32(0.5), "a", repr) == 0.5
    with pytest.raises(ValueError, match=r"sizeof must return a finite number >= 0, got inf for the element 'b'\."):
        item_size(lambda x: float("inf"), "b", repr)

    def boom(item: object) -> int:
        raise KeyError(item)

    with pytest.raises(RuntimeError, match=r"sizeof raised an error for index 'k': 'k'") as info:
        item_size(boom, "k", lambda i: f"index {i!r}")
    assert isinstance(info.value.__cause__, KeyError)


def test_oversize_message_is_bionemos() -> None:
    assert oversize_message(3, 9, 4) == "Size of element 3 exceeds max_total_size (9 > 4), skipping"


def test_cost_source_fingerprints() -> None:
    sizes = np.arange(5000) % 7
    array = make_cost_source(sizes, 5000)
    assert array.fingerprint(5000) == sizes.tobytes()
    computed = make_cost_source(lambda ids: ids % 7, 5000)
    sample = np.unique(np.linspace(0, 4999, 4096).astype(np.int64))
    assert computed.fingerprint(5000) == (sample % 7).tobytes()
    assert make_cost_source(lambda x: x, 0, features=np.empty(0)).fingerprint(0) == b""


@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_smaller_caps_below_a_batch_whose_cost_passes_int64(cost):
    rule = BatchCost(2**70, cost=cost)
    costs = np.array([2**62, 2**62, 2**62], dtype=np.int64)
    assert rule.smaller_caps(costs, rule.caps, 2) == [3 * 2**61]


@pytest.mark.parametrize(
    ("sizeof", "returned"),
    [
        (lambda ids: np.ones(len(ids) + 1), 3),
        (lambda ids: torch.ones(5), 5),
        (lambda ids: np.ones((1, 2)), 1),
        (lambda ids: np.ones(0), 0),
    ],
)
def test_a_vectorized_sizeof_of_the_wrong_length_is_refused(sizeof: Any, returned: int) -> None:
    message = rf"sizeof returned {returned} sizes \(shape \(.*\)\) for 2 indices; expected one size"
    with pytest.raises(ValueError, match=message):
        make_cost_source(sizeof, 4)
    with pytest.raises(ValueError, match=message):
        FastSizeAwareLoader(torch.arange(4), sizeof, 10)


@pytest.mark.parametrize("shape", [(50,), (50, 2)])
def test_tensor_and_array_features_give_the_same_costs(shape: tuple[int, ...]) -> None:
    # invariant: features' rows are the same rows whether the features are a tensor or an array
    features = np.random.default_rng(len(shape)).integers(1, 9, shape)
    ids = np.random.default_rng(1).permutation(50)[:30]

    def sizeof(rows: Any) -> np.ndarray:
        values = np.asarray(rows)
        return values if values.ndim == 1 else values[:, 0] * values[:, 1]

    expected = sizeof(features[ids]).tolist()
    strided = torch.from_numpy(np.repeat(features, 2, axis=0))[::2]  # (a view that skips every other row)
    for given in (features, torch.from_numpy(features), strided):
        assert make_cost_source(sizeof, 50, given)(ids).tolist() == expected
