from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.batching import BatchSplit, Carry, size_aware_batching, split_batches
from tests.reference import greedy_reference, running_sum_reference, seed_dataset

# Values that make float sums land right at the cap (0.1 + 0.2 > 0.3, and so on).
ADVERSARIAL_FLOATS = [0.0, 0.1, 0.2, 0.3, 0.7, 1 / 3, 2 / 3, 1.0, 0.5, 1e-17, 3.0000000000000004]


def as_lists(split: BatchSplit) -> list[list[int]]:
    return [b.tolist() for b in split.batches()]


@st.composite
def problems(draw):
    k = draw(st.integers(1, 2))
    n = draw(st.integers(0, 40))
    kind = draw(st.sampled_from(["int", "float", "adversarial"]))
    if kind == "int":
        value = st.integers(0, 12)
        cap = draw(st.one_of(st.integers(1, 30), st.floats(0.5, 30.0)))
    elif kind == "float":
        value = st.floats(0.0, 10.0, allow_nan=False)
        cap = draw(st.floats(0.25, 30.0))
    else:
        value = st.sampled_from(ADVERSARIAL_FLOATS)
        cap = draw(st.sampled_from([0.3, 0.6, 1.0, 0.9, 1 / 3, 2.0, 3.0000000000000004]))
    rows = [tuple(draw(value) for _ in range(k)) for _ in range(n)]
    caps = tuple([cap] * k) if draw(st.booleans()) else tuple(draw(st.sampled_from([cap, cap * 2])) for _ in range(k))
    options = {
        "max_batch_size": draw(st.one_of(st.none(), st.integers(1, 6))),
        "cost": draw(st.sampled_from(["sum", "padded"])),
        "multiple": draw(st.sampled_from([1, 1, 2, 3, 4])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, caps, options


def kernel_args(rows, caps, options):
    costs = np.array(rows, dtype=type(rows[0][0]) if rows else np.int64).reshape(len(rows), len(caps))
    if costs.shape[1] == 1:
        costs = costs[:, 0]
    kwargs = {
        "max_batch_size": options["max_batch_size"],
        "cost": options["cost"],
        "batch_size_multiple": options["multiple"],
        "oversize": options["oversize"],
    }
    return costs, (caps[0] if len(caps) == 1 else list(caps)), kwargs


@settings(max_examples=400, deadline=None)
@given(problems())
def test_kernel_equals_greedy_loop(problem):
    # invariant: the vectorized kernel gives exactly the batches of the plain greedy loop
    rows, caps, options = problem
    expected, expected_skipped = greedy_reference(rows, caps, **options)
    costs, cap, kwargs = kernel_args(rows, caps, options)
    split = split_batches(costs, cap, **kwargs)
    assert as_lists(split) == expected
    assert split.skipped.tolist() == expected_skipped
    assert split.carry is None


@settings(max_examples=300, deadline=None)
@given(problems(), st.lists(st.integers(0, 12), max_size=6))
def test_chunked_split_equals_whole_split(problem, cuts):
    # invariant: splitting chunk by chunk with carry equals splitting the whole order
    rows, caps, options = problem
    costs, cap, kwargs = kernel_args(rows, caps, options)
    whole = split_batches(costs, cap, **kwargs)
    bounds = sorted({min(c, len(rows)) for c in cuts} | {0, len(rows)})
    batches, skipped, carry = [], [], None
    for lo, hi in itertools.pairwise(bounds):
        part = split_batches(costs[lo:hi], cap, carry=carry, final=False, **kwargs)
        batches += as_lists(part)
        skipped += part.skipped.tolist()
        carry = part.carry
    last = split_batches(costs[len(rows) :], cap, carry=carry, final=True, **kwargs)
    batches += as_lists(last)
    assert batches == as_lists(whole)
    assert skipped == whole.skipped.tolist()


@settings(max_examples=200, deadline=None)
@given(problems())
def test_every_item_once_and_no_batch_over_budget(problem):
    # invariant: each position is batched once or skipped once; no batch exceeds its caps
    rows, caps, options = problem
    costs, cap, kwargs = kernel_args(rows, caps, options)
    split = split_batches(costs, cap, **kwargs)
    seen = sorted(split.ids.tolist() + split.skipped.tolist())
    assert seen == list(range(len(rows)))
    assert all(len(b) > 0 for b in split.batches())
    if options["max_batch_size"] is not None:
        assert all(len(b) <= options["max_batch_size"] for b in split.batches())
    for batch in split.batches():
        members = [rows[p] for p in batch.tolist()]
        if len(members) == 1 and any(v > c for v, c in zip(members[0], caps)):
            continue  # an oversize item in a batch of its own (oversize="own_batch")
        for j, cap_j in enumerate(caps):
            if options["cost"] == "sum":
                total = 0
                for row in members:  # in item order, as the loop accumulates
                    total += row[j]
            else:
                total = len(members) * max(row[j] for row in members)
            assert total <= cap_j


def test_large_float_costs_match_running_loop():
    rng = np.random.default_rng(0)
    costs = np.clip(rng.lognormal(np.log(150), 0.7, 200_000), 8, 4000)
    loop_batches = running_sum_reference(costs.tolist(), 45_000.0)
    assert as_lists(split_batches(costs, 45_000.0)) == loop_batches


def test_float_caps_right_at_running_sums():
    # Caps equal to sums the loop actually computes: ties decided by float rounding.
    rng = np.random.default_rng(1)
    costs = rng.choice(np.array(ADVERSARIAL_FLOATS[1:8]) * 1e3, size=50_000)
    running = np.cumsum(costs[:7])
    for cap in running[2:]:
        assert as_lists(split_batches(costs, float(cap))) == running_sum_reference(costs.tolist(), float(cap))


def test_large_integer_costs_match_running_loop():
    rng = np.random.default_rng(2)
    costs = rng.integers(0, 500, 100_000)
    assert as_lists(split_batches(costs, 10_000)) == running_sum_reference(costs.tolist(), 10_000)


def test_torch_and_list_inputs_and_ids():
    costs = torch.tensor([3, 1, 2, 4])
    split = split_batches(costs, 4, ids=np.array([10, 11, 12, 13]))
    assert as_lists(split) == [[10, 11], [12], [13]]
    assert as_lists(split_batches([3.0, 1.0], torch.tensor(4.0))) == [[0, 1]]


def test_integer_cap_above_float_precision():
    cap = 2**53 + 1
    costs = np.array([2.0**53, 1.0, 1.0])
    expected, _ = greedy_reference(costs.tolist(), cap)
    assert as_lists(split_batches(costs, cap)) == expected


def test_oversize_policies():
    assert as_lists(split_batches([1, 9, 1], 3, oversize="own_batch")) == [[0], [1], [2]]
    split = split_batches([1, 9, 1], 3)
    assert as_lists(split) == [[0, 2]] and split.skipped.tolist() == [1]
    with pytest.raises(ValueError, match=r"item 1 has cost 9 above max_total_size 3 \(oversize='error'\)"):
        split_batches([1, 9, 1], 3, oversize="error")


def test_multi_column_caps():
    costs = np.array([[1, 5], [1, 5], [1, 1], [9, 1]])
    assert as_lists(split_batches(costs, [10, 10])) == [[0, 1], [2, 3]]
    assert as_lists(split_batches(costs, [10, 6])) == [[0], [1, 2], [3]]


def test_empty_input_gives_no_batches():
    split = split_batches([], 3)
    assert split.num_batches == 0 and split.ids.size == 0 and split.skipped.size == 0
    open_split = split_batches([1, 1], 3, final=False)
    assert open_split.num_batches == 0 and len(open_split.carry) == 2
    assert as_lists(split_batches([], 3, carry=open_split.carry)) == [[0, 1]]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"costs": [1, -1], "max_total_size": 2}, ValueError, r"costs must be non-negative, got -1 at position 1"),
        (
            {"costs": [1.0, float("nan")], "max_total_size": 2},
            ValueError,
            r"costs must be finite, got nan at position 1",
        ),
        ({"costs": [1.0, float("inf")], "max_total_size": 2}, ValueError, r"costs must be finite, got inf"),
        (
            {"costs": [True, False], "max_total_size": 2},
            TypeError,
            r"costs must hold integers or floats, got dtype bool",
        ),
        ({"costs": ["a"], "max_total_size": 2}, TypeError, r"costs must hold integers or floats"),
        (
            {"costs": np.ones((2, 2, 2)), "max_total_size": 2},
            ValueError,
            r"costs must be 1-D or 2-D, got shape \(2, 2, 2\)",
        ),
        ({"costs": [1], "max_total_size": 0}, ValueError, r"max_total_size must be a positive finite number, got 0"),
        (
            {"costs": [1], "max_total_size": float("nan")},
            ValueError,
            r"max_total_size must be a positive finite number, got nan",
        ),
        ({"costs": [1], "max_total_size": "4"}, TypeError, r"max_total_size must be a real number, got '4'"),
        ({"costs": [[1, 2]], "max_total_size": [3]}, ValueError, r"max_total_size has 1 caps but costs has 2 columns"),
        (
            {"costs": [1], "max_total_size": 2, "max_batch_size": 0},
            ValueError,
            r"max_batch_size must be a positive integer, got 0",
        ),
        (
            {"costs": [1], "max_total_size": 2, "max_batch_size": 2.5},
            TypeError,
            r"max_batch_size must be an integer, got 2.5",
        ),
        (
            {"costs": [1], "max_total_size": 2, "batch_size_multiple": 0},
            ValueError,
            r"batch_size_multiple must be a positive integer",
        ),
        (
            {"costs": [1], "max_total_size": 2, "cost": "max"},
            ValueError,
            r"cost must be one of 'sum', 'padded', got 'max'",
        ),
        (
            {"costs": [1], "max_total_size": 2, "oversize": "drop"},
            ValueError,
            r"oversize must be one of 'skip', 'own_batch', 'error', got 'drop'",
        ),
        (
            {"costs": [1], "max_total_size": 2, "ids": [1, 2]},
            ValueError,
            r"ids must be 1-D with one id per item \(1\), got shape \(2,\)",
        ),
        (
            {"costs": [1], "max_total_size": 2, "carry": [1]},
            TypeError,
            r"carry must be a Carry from a previous split, got list",
        ),
        ({"costs": [1], "max_total_size": 2, "final": 1}, TypeError, r"final must be a bool, got 1"),
    ],
)
def test_bad_input_messages(kwargs, error, message):
    costs = kwargs.pop("costs")
    cap = kwargs.pop("max_total_size")
    with pytest.raises(error, match=message):
        split_batches(costs, cap, **kwargs)


def test_carry_with_other_columns_is_refused():
    carry = Carry(np.array([0]), np.array([[1, 1]]), 1)
    with pytest.raises(ValueError, match="carry has 2 cost columns but costs has 1"):
        split_batches([1], 3, carry=carry)


# --- size_aware_batching (bionemo API) -------------------------------------------------


def test_size_aware_batching_seed_example():
    from torch.utils.data import default_collate

    batches = list(size_aware_batching(seed_dataset(), lambda x: x.numel(), 4, collate_fn=default_collate))
    assert [b.tolist() for b in batches] == [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10]]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*ADVERSARIAL_FLOATS, 2, 5, 7]), max_size=40), st.sampled_from([0.3, 1.0, 5, 7.5]))
def test_generator_equals_kernel(sizes, cap):
    # invariant: the streaming generator and the vectorized kernel make the same batches
    generated = list(size_aware_batching(range(len(sizes)), sizes.__getitem__, cap))
    costs = np.array(sizes, dtype=np.float64)
    assert generated == as_lists(split_batches(costs, cap))


def test_generator_logs_skips_and_summary():
    info, warn = [], []
    batches = list(
        size_aware_batching([1, 5, 2], {1: 1, 5: 5, 2: 2}, 3, info_logger=info.append, warn_logger=warn.append)
    )
    assert batches == [[1, 2]]
    assert warn[0] == "Size of element 5 exceeds max_total_size (5 > 3), skipping"
    assert warn[1].startswith("2 samples were batched from 3 of the input data")
    assert info == [
        "Batched 2 samples into 1 batches. If this doesn't match your expectation, "
        "consider adjusting max_total_size or the sizeof functor"
    ]


def test_generator_bad_input():
    with pytest.raises(TypeError, match="sizeof must be a callable or a mapping, got int"):
        size_aware_batching([1], 3, 4)
    with pytest.raises(ValueError, match="max_total_size must be a positive finite number, got -4"):
        size_aware_batching([1], len, -4)
    with pytest.raises(RuntimeError, match="sizeof raised an error for data=1"):
        list(size_aware_batching([1], len, 4))
