from __future__ import annotations

import itertools
from unittest.mock import patch

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.bionemo.streaming import size_aware_batching
from fastsab.plan import _sum_kernel
from fastsab.plan.batching import BatchSplit, Carry, split_batches
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


def split_like_the_loop(problem, as_float=False):
    """Split ``problem`` with the kernel; assert the greedy loop's batches and skipped items."""
    rows, caps, options = problem
    expected, expected_skipped = greedy_reference(rows, caps, **options)
    costs, cap, kwargs = kernel_args(rows, caps, options)
    split = split_batches(costs.astype(np.float64) if as_float else costs, cap, **kwargs)
    assert as_lists(split) == expected
    assert split.skipped.tolist() == expected_skipped
    return split


@settings(max_examples=400, deadline=None)
@given(problems())
def test_kernel_equals_greedy_loop(problem):
    # invariant: the vectorized kernel gives exactly the batches of the plain greedy loop
    split = split_like_the_loop(problem)
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


def test_a_carry_holds_its_own_arrays():
    # invariant: a kept carry (a resume point of a planned chunk) holds the open batch, not the
    # chunk's ids and costs it was cut from
    costs, ids = np.ones(10_000, dtype=np.int64), np.arange(10_000, dtype=np.int64)
    carry = split_batches(costs, 3, ids=ids, final=False).carry
    assert carry is not None and carry.ids.tolist() == [9999]
    assert not np.shares_memory(carry.ids, ids) and not np.shares_memory(carry.costs, costs)
    assert carry.ids.base is None and carry.costs.base is None


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


def jumping_rows(cap: int) -> list[int]:
    """One-item batches followed by runs of ones: batches far longer than the previous one,
    some filling the cap exactly, the last one ending the call."""
    rows: list[int] = []
    for length in (1, 2, 3, 4, 5, 7, 9, 17, 40, 100):
        rows += [cap, *[1] * length]
    return [*rows, cap, *([1] * (cap - 1))]


@pytest.mark.parametrize("cap", [3, 5, 7, 9, 64])
@pytest.mark.parametrize("max_batch_size", [None, 2, 4, 8])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_batches_much_longer_than_the_previous_one(cap, max_batch_size, kind):
    # The search for a batch's end starts past twice the previous batch's length.
    rows = jumping_rows(cap)
    costs = np.array(rows, dtype=np.int64 if kind == "int" else np.float64)
    for cost in ("sum", "padded"):
        expected, _ = greedy_reference(rows, cap, cost=cost, max_batch_size=max_batch_size)
        split = split_batches(costs, cap, cost=cost, max_batch_size=max_batch_size)
        assert as_lists(split) == expected
        with_own = split_batches(costs, cap - 0.5, cost=cost, max_batch_size=max_batch_size, oversize="own_batch")
        assert (
            as_lists(with_own)
            == greedy_reference(rows, cap - 0.5, cost=cost, max_batch_size=max_batch_size, oversize="own_batch")[0]
        )


@st.composite
def jumping_problems(draw):
    cap = draw(st.sampled_from([3, 4, 5, 7, 10, 33]))
    runs = draw(
        st.lists(
            st.tuples(st.sampled_from(["big", "small"]), st.integers(1, 60)),
            min_size=1,
            max_size=12,
        )
    )
    rows = []
    for kind, length in runs:
        value = st.integers(cap // 2, cap + 1) if kind == "big" else st.integers(0, 1)
        rows += [(draw(value),) for _ in range(length)]
    options = {
        "max_batch_size": draw(st.sampled_from([None, None, 3, 16, 50])),
        "cost": draw(st.sampled_from(["sum", "padded"])),
        "multiple": draw(st.sampled_from([1, 1, 2, 4])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, (cap,), options


@settings(max_examples=250, deadline=None)
@given(jumping_problems(), st.booleans())
def test_batch_lengths_that_jump_equal_greedy_loop(problem, as_float):
    # invariant: however much a batch's length differs from the previous one's, the kernel
    # finds the loop's end (exact fills of the cap included)
    split_like_the_loop(problem, as_float)


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


@pytest.mark.parametrize("oversize", ["skip", "own_batch", "error"])
@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_items_right_at_the_cap_are_not_oversize(oversize, cost):
    for costs, cap in (([1, 3, 1], 3), ([0.5, 3.0, 0.5], 3.0), ([[1, 1], [3, 2], [1, 2]], [3, 2])):
        split = split_batches(costs, cap, cost=cost, oversize=oversize)
        assert as_lists(split) == [[0], [1], [2]] and split.skipped.size == 0


@pytest.mark.parametrize("oversize", ["skip", "own_batch", "error"])
@pytest.mark.parametrize("cost", ["sum", "padded"])
@pytest.mark.parametrize("where", [0, 3, 6])
@pytest.mark.parametrize("big", [9, 8, 15])
def test_one_oversize_int_item_anywhere_under_each_policy(oversize, cost, where, big):
    # 7 | 1 and 4 | 2 stay at the cap of 7, so only the one item above it can pass it
    for costs, cap in (([1, 2, 4, 2, 1, 2, 1], 7), ([[1, 1], [2, 4], [4, 2], [2, 1], [1, 1], [2, 2], [1, 1]], [7, 7])):
        rows = [list(row) if isinstance(row, list) else row for row in costs]
        rows[where] = [big, 1] if isinstance(rows[where], list) else big
        if oversize == "error":
            with pytest.raises(ValueError, match=rf"item {where} has cost .* above max_total_size .*oversize='error'"):
                split_batches(np.array(rows), cap, cost=cost, oversize=oversize)
            continue
        expected, skipped = greedy_reference(rows, cap, cost=cost, oversize=oversize)
        split = split_batches(np.array(rows), cap, cost=cost, oversize=oversize)
        assert as_lists(split) == expected and split.skipped.tolist() == skipped
        assert skipped == [where] if oversize == "skip" else [where] in expected


@pytest.mark.parametrize(
    ("costs", "message"),
    [
        ([3, -1, 2], r"costs must be non-negative, got -1 at position 1\."),
        ([[3, 1], [2, -5], [-2, 0]], r"costs must be non-negative, got -5 at position \(1, 1\)\."),
        ([-(2**63), 1], r"costs must be non-negative, got -9223372036854775808 at position 0\."),
        ([1.0, -0.5], r"costs must be non-negative, got -0.5 at position 1\."),
        ([1.0, -0.5, float("nan")], r"costs must be finite, got nan at position 2\."),
    ],
)
@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_negative_and_nan_costs_are_refused_by_name_and_position(costs, message, cost):
    for values in (costs, np.array(costs), torch.tensor(costs)):
        with pytest.raises(ValueError, match=message):
            split_batches(values, 100, cost=cost)


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
        ({"costs": [1], "max_total_size": -1}, ValueError, r"max_total_size must be a finite number >= 0, got -1"),
        (
            {"costs": [1], "max_total_size": float("nan")},
            ValueError,
            r"max_total_size must be a finite number >= 0, got nan",
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


def test_batching_names_are_those_of_their_modules():
    # the public names are the kernel's and the streaming generator's own
    import fastsab
    import fastsab.bionemo.streaming
    import fastsab.plan.batching

    for name in fastsab.plan.batching.__all__:
        assert getattr(fastsab, name) is getattr(fastsab.plan.batching, name)
    assert fastsab.size_aware_batching is fastsab.bionemo.streaming.size_aware_batching


# --- size_aware_batching (bionemo API) -------------------------------------------------


def test_size_aware_batching_seed_example():
    from torch.utils.data import default_collate

    batches = list(size_aware_batching(seed_dataset(), lambda x: x.numel(), 4, collate_fn=default_collate))
    assert [b.tolist() for b in batches] == [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10]]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([*ADVERSARIAL_FLOATS, 2, 5, 7]), max_size=40),
    st.sampled_from([0.3, 1.0, 5, 7.5]),
    st.one_of(st.none(), st.integers(1, 4)),
)
def test_generator_equals_kernel(sizes, cap, max_batch_size):
    # invariant: the streaming generator (BatchCost.fits per item) and the vectorized kernel make the same batches
    generated = list(size_aware_batching(range(len(sizes)), sizes.__getitem__, cap, max_batch_size=max_batch_size))
    costs = np.array(sizes, dtype=np.float64)
    assert generated == as_lists(split_batches(costs, cap, max_batch_size=max_batch_size))


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
    with pytest.raises(ValueError, match="max_total_size must be a finite number >= 0, got -4"):
        size_aware_batching([1], len, -4)
    with pytest.raises(RuntimeError, match="sizeof raised an error for data=1"):
        list(size_aware_batching([1], len, 4))


# --- padded cost: long batches and int64 extremes ------------------------------------------


def test_padded_batches_longer_than_the_first_search_window():
    # A batch of 500 items needs several widenings of the running-max window.
    assert np.diff(split_batches(np.ones(1000, dtype=np.int64), 500, cost="padded").offsets).tolist() == [500, 500]
    rows = [1] * 700 + [2] * 300 + [0] * 900 + [3] * 5
    expected, _ = greedy_reference(rows, 1400, cost="padded")
    assert as_lists(split_batches(rows, 1400, cost="padded")) == expected
    assert max(len(b) for b in expected) > 600


def test_multi_column_padded_batches_longer_than_the_first_search_window():
    rows = [(1, 2)] * 900 + [(2, 1)] * 400 + [(1, 1)] * 700
    for caps in ([1000, 1800], [900, 5000], [2000, 700]):
        expected, _ = greedy_reference(rows, caps, cost="padded")
        assert as_lists(split_batches(np.array(rows), caps, cost="padded")) == expected
        assert max(len(b) for b in expected) >= 350


@st.composite
def long_padded_problems(draw):
    k = draw(st.integers(1, 2))
    runs = draw(
        st.lists(
            st.tuples(st.tuples(*[st.integers(0, 4)] * k), st.integers(1, 400)),
            min_size=1,
            max_size=8,
        )
    )
    rows = [row for row, length in runs for _ in range(length)]
    caps = tuple(draw(st.sampled_from([150, 400, 1000, 1999, 4000])) for _ in range(k))
    options = {
        "max_batch_size": draw(st.sampled_from([None, None, 200, 700])),
        "cost": "padded",
        "multiple": draw(st.sampled_from([1, 1, 8, 3])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, caps, options


@settings(max_examples=80, deadline=None)
@given(long_padded_problems())
def test_long_runs_of_equal_padded_costs_equal_greedy_loop(problem):
    # invariant: batches of hundreds of items (many window widenings) are the loop's batches
    split_like_the_loop(problem)


@st.composite
def padded_float_cap_problems(draw):
    # float costs whose products with a batch length land on the cap, one float below or above it
    base = draw(st.sampled_from([0.1, 0.2, 0.3, 1 / 3, 2 / 3, 0.7, 1.1, 3.0000000000000004, 1e-3, 123.456]))
    length = draw(st.integers(1, 60))
    cap = float(np.nextafter(length * base, draw(st.sampled_from([-np.inf, 0.0, np.inf]))))
    value = st.one_of(st.just(base), st.sampled_from([0.0, base / 2, base * 0.999999, float(np.nextafter(base, 2))]))
    rows = [(draw(value),) for _ in range(draw(st.integers(0, 150)))]
    options = {
        "max_batch_size": draw(st.sampled_from([None, None, 7, 40])),
        "cost": "padded",
        "multiple": draw(st.sampled_from([1, 1, 2, 8])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, (cap if draw(st.booleans()) else cap * (1 + 2**-52),), options


@settings(max_examples=300, deadline=None)
@given(padded_float_cap_problems())
def test_padded_float_products_at_the_cap_equal_greedy_loop(problem):
    # invariant: lengths where float64 rounds `len * max` onto or past the cap are the loop's
    split_like_the_loop(problem)


@st.composite
def padded_block_problems(draw):
    # many short and long batches: steady costs, spikes, zeros and oversize items in k columns
    k = draw(st.integers(1, 3))
    cost = st.one_of(st.integers(0, 3), st.integers(4, 40), st.sampled_from([0, 100, 250, 1000]), st.integers(0, 1200))
    rows = [tuple(draw(cost) for _ in range(k)) for _ in range(draw(st.integers(0, 300)))]
    caps = tuple(draw(st.sampled_from([0, 1, 99, 250, 1000, 3001])) for _ in range(k))
    options = {
        "max_batch_size": draw(st.sampled_from([None, None, 1, 5, 64])),
        "cost": "padded",
        "multiple": draw(st.sampled_from([1, 1, 2, 3, 8])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, caps, options


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(padded_block_problems(), st.booleans(), st.lists(st.integers(0, 300), max_size=5))
def test_padded_blocks_equal_greedy_loop_whole_and_in_chunks(problem, as_float, cuts):
    # invariant: padded batches equal the loop's, in one call and chunk by chunk with carries
    split = split_like_the_loop(problem, as_float=as_float)
    rows, caps, options = problem
    costs, cap, kwargs = kernel_args(rows, caps, options)
    if as_float:
        costs = costs.astype(np.float64)
    bounds = sorted({min(c, len(rows)) for c in cuts} | {0, len(rows)})
    batches, carry = [], None
    for lo, hi in itertools.pairwise(bounds):
        part = split_batches(costs[lo:hi], cap, carry=carry, final=False, **kwargs)
        batches += as_lists(part)
        carry = part.carry
    batches += as_lists(split_batches(costs[len(rows) :], cap, carry=carry, **kwargs))
    assert batches == as_lists(split)


def test_padded_carry_item_above_the_cap_names_its_position():
    first = split_batches([1, 1, 9], 20, cost="padded", final=False)
    with pytest.raises(ValueError, match=r"item at position 0 of this split costs more than max_total_size"):
        split_batches([1, 1], 5, cost="padded", carry=first.carry)


def test_padded_nan_costs_are_refused_before_splitting():
    with pytest.raises(ValueError, match=r"costs must be finite, got nan at position 2\."):
        split_batches([1.0, 2.0, float("nan")], 10.0, cost="padded")


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("costs", "cap"),
    [
        ([2**62] * 3, INT64_MAX),  # 2 * 2**62 wraps to -2**63 in int64
        ([INT64_MAX, 1, 1], INT64_MAX),
        ([1, INT64_MAX, INT64_MAX], INT64_MAX),
        ([3 * 2**61, 3 * 2**61, 1], 2**62 + 2**61),
        ([2**61 + 1] * 5, 2**63 - 4),
        ([5, 2**62 - 1, 2**62 - 1, 7], 2**63 - 2),
    ],
)
def test_padded_int64_costs_never_wrap(costs, cap):
    expected, expected_skipped = greedy_reference(costs, cap, cost="padded")
    split = split_batches(np.array(costs, dtype=np.int64), cap, cost="padded")
    assert as_lists(split) == expected
    assert split.skipped.tolist() == expected_skipped


INT64_EXTREMES = [0, 1, 3, 2**31, 2**61, 3 * 2**60, 2**62 - 1, 2**62, 2**62 + 1, 3 * 2**61, INT64_MAX - 1, INT64_MAX]


@st.composite
def int64_extreme_problems(draw):
    k = draw(st.integers(1, 2))
    value = st.one_of(st.sampled_from(INT64_EXTREMES), st.integers(0, INT64_MAX))
    rows = draw(st.lists(st.tuples(*[value] * k), max_size=30))
    cap = st.one_of(
        st.sampled_from([2**62, 2**62 + 1, 3 * 2**61, INT64_MAX, 2**63, 2**64 + 1, 1e19, 2**70]),
        st.integers(1, INT64_MAX),
        st.integers(1, 2**72),
    )
    caps = tuple(draw(cap) for _ in range(k))
    options = {
        "max_batch_size": draw(st.sampled_from([None, 2, 5])),
        "cost": "padded",
        "multiple": draw(st.sampled_from([1, 2])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }
    return rows, caps, options


@settings(max_examples=300, deadline=None)
@given(int64_extreme_problems())
def test_padded_int64_extremes_equal_greedy_loop(problem):
    # invariant: padded costs are compared exactly, whatever len * max would be in int64
    split_like_the_loop(problem)


# --- caps past int64 ----------------------------------------------------------------------

HUGE_CAPS = [2**63, 2**64 + 3, 2**70, 1e19, 1.5e30, pytest.param(10**400, id="10**400")]


@pytest.mark.parametrize("cap", HUGE_CAPS)
@pytest.mark.parametrize("cost", ["sum", "padded"])
@pytest.mark.parametrize("max_batch_size", [None, 3])
def test_integer_costs_with_caps_past_int64(cap, cost, max_batch_size):
    rows = [5, 0, 2**40, 7, 1, 2**33, 9]
    expected, _ = greedy_reference(rows, cap, cost=cost, max_batch_size=max_batch_size)
    split = split_batches(np.array(rows), cap, cost=cost, max_batch_size=max_batch_size)
    assert as_lists(split) == expected and split.skipped.size == 0
    floats = split_batches(np.array(rows, dtype=np.float64), cap, cost=cost, max_batch_size=max_batch_size)
    assert as_lists(floats) == expected


@pytest.mark.parametrize(
    "cap", [2**70, 2**63 * 300, 2**63 * 1000 + 5, 10**25], ids=["2**70", "2**63*300", "2**63*1000+5", "10**25"]
)
def test_padded_huge_costs_with_caps_past_int64(cap):
    # len * max passes int64 long before it passes these caps
    rows = [2**62] * 400 + [INT64_MAX] * 50 + [1] * 600
    expected, _ = greedy_reference(rows, cap, cost="padded")
    assert as_lists(split_batches(np.array(rows), cap, cost="padded")) == expected
    two_columns = [(r, 1) for r in rows]
    expected, _ = greedy_reference(two_columns, [cap, 2**70], cost="padded")
    assert as_lists(split_batches(np.array(two_columns), [cap, 2**70], cost="padded")) == expected


def test_caps_past_int64_in_chunks_and_columns():
    rows = np.array([[3, 2**40], [4, 1], [2**50, 2]])
    for cost in ("sum", "padded"):
        expected, _ = greedy_reference(rows.tolist(), [2**70, 2**40], cost=cost)
        assert as_lists(split_batches(rows, [2**70, 2**40], cost=cost)) == expected == [[0], [1, 2]]
    first = split_batches(rows[:2, 0], 2**64, final=False)
    assert first.num_batches == 0
    assert as_lists(split_batches(rows[2:, 0], 2**64, carry=first.carry)) == [[0, 1, 2]]


@pytest.mark.parametrize(
    ("costs", "cap"),
    [
        ([2**62, 2**62, 1], 2**70),  # one batch whose sum passes int64
        ([2**61] * 5, 3 * 2**61),  # the epoch's sum passes int64, every batch's fits
        ([INT64_MAX, INT64_MAX, 0, 1], INT64_MAX),
        ([2**62] * 7 + [0] * 3, 2**64 + 1),
    ],
)
def test_integer_sums_past_int64_are_batched_exactly(costs, cap):
    expected, _ = greedy_reference(costs, cap)
    assert as_lists(split_batches(np.array(costs, dtype=np.int64), cap)) == expected
    halves = split_batches(np.array(costs[:3], dtype=np.int64), cap, final=False)
    rest = split_batches(np.array(costs[3:], dtype=np.int64), cap, carry=halves.carry)
    assert as_lists(halves) + as_lists(rest) == expected


@settings(max_examples=300, deadline=None)
@given(int64_extreme_problems())
def test_sum_int64_extremes_equal_greedy_loop(problem):
    # invariant: summed integer costs are compared exactly, whatever their sums would be in int64
    rows, caps, options = problem
    split_like_the_loop((rows, caps, {**options, "cost": "sum"}))


@pytest.mark.parametrize("cap", [float("inf"), -float("inf"), np.float64("inf"), [1, float("inf")]])
def test_non_finite_caps_are_refused(cap):
    with pytest.raises(ValueError, match=r"max_total_size must be a finite number >= 0, got -?inf"):
        split_batches(np.ones((3, 2)) if isinstance(cap, list) else [1, 2], cap)
    if not isinstance(cap, list):
        with pytest.raises(ValueError, match=r"max_total_size must be a finite number >= 0, got -?inf"):
            size_aware_batching([1], len, cap)


@pytest.mark.parametrize("cap", HUGE_CAPS)
def test_generator_with_caps_past_int64(cap):
    sizes = [2**62, 2**62, 2**62, 1, 2.5, 2**63, 3]
    expected, _ = greedy_reference(sizes, cap)
    assert list(size_aware_batching(range(len(sizes)), sizes.__getitem__, cap)) == expected


# --- size_aware_batching: sizes checked one by one ------------------------------------------


@pytest.mark.parametrize(
    ("size", "error", "message"),
    [
        (float("nan"), ValueError, r"sizeof must return a finite number >= 0, got nan for the element 'b'\."),
        (-1, ValueError, r"sizeof must return a finite number >= 0, got -1 for the element 'b'\."),
        (-0.5, ValueError, r"sizeof must return a finite number >= 0, got -0\.5 for the element 'b'\."),
        (float("inf"), ValueError, r"sizeof must return a finite number >= 0, got inf for the element 'b'\."),
        (np.float32("nan"), ValueError, r"sizeof must return a finite number >= 0, got nan for the element 'b'\."),
        (np.int64(-3), ValueError, r"sizeof must return a finite number >= 0, got -3 for the element 'b'\."),
        (torch.tensor(-2.5), ValueError, r"sizeof must return a finite number >= 0, got -2\.5 for the element 'b'\."),
        ("3", TypeError, r"sizeof must return a real number, got '3' of type str for the element 'b'\."),
        (None, TypeError, r"sizeof must return a real number, got None of type NoneType for the element 'b'\."),
        (True, TypeError, r"sizeof must return a real number, got True of type bool for the element 'b'\."),
        (np.bool_(True), TypeError, r"sizeof must return a real number, got True of type bool for the element 'b'\."),
        (1 + 2j, TypeError, r"sizeof must return a real number, got \(1\+2j\) of type complex for the element 'b'\."),
        (
            torch.tensor([1, 2]),
            TypeError,
            r"sizeof must return a single number, got tensor\(\[1, 2\]\) of shape \(2,\) for the element 'b'\.",
        ),
        (
            np.array([1.0, 2.0]),
            TypeError,
            r"sizeof must return a single number, got array\(\[1\., 2\.\]\) of shape \(2,\) for the element 'b'\.",
        ),
    ],
    ids=[
        "nan",
        "negative-int",
        "negative-float",
        "inf",
        "numpy-nan",
        "numpy-negative",
        "tensor-negative",
        "str",
        "none",
        "bool",
        "numpy-bool",
        "complex",
        "tensor-2",
        "array-2",
    ],
)
def test_generator_refuses_bad_sizes(size, error, message):
    sizes = {"a": 1, "b": size, "c": 1}
    batches = size_aware_batching(["a", "b", "c"], sizes.__getitem__, 4)
    with pytest.raises(error, match=message):
        list(batches)


def test_generator_refuses_nan_and_negative_sizes_before_they_join_a_batch():
    # A NaN total would let every later item in; a negative size would hide others' cost.
    for bad in (float("nan"), -3):
        sizes = [2, bad, 2, 2, 2]
        with pytest.raises(ValueError, match=rf"sizeof must return a finite number >= 0, got {bad} for the element 1"):
            list(size_aware_batching(range(5), sizes.__getitem__, 4))


def test_bad_size_messages_shorten_long_reprs():
    element = "x" * 10_000
    with pytest.raises(ValueError, match=r"got -1 for the element 'x+\.\.\.\.$") as info:
        list(size_aware_batching([element], lambda _: -1, 4))
    assert len(str(info.value)) < 200
    with pytest.raises(TypeError, match=r"got tensor\(\[0\., 0\., [0., ]+\.\.\. of shape \(500,\)") as info:
        list(size_aware_batching([element], lambda _: torch.zeros(500), 4))
    assert len(str(info.value)) < 300


def test_generator_accepts_scalar_tensors_and_numpy_numbers():
    numbers = [2, 1.5, 0, 3, 1, 0.25]
    wrapped = [torch.tensor(2), np.float32(1.5), np.uint8(0), torch.tensor(3.0), np.int64(1), torch.tensor([0.25])]
    expected = list(size_aware_batching(range(6), numbers.__getitem__, 4))
    assert list(size_aware_batching(range(6), wrapped.__getitem__, 4)) == expected == [[0, 1, 2], [3, 4], [5]]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 12), st.sampled_from(ADVERSARIAL_FLOATS)), max_size=50),
    st.sampled_from([0.3, 1.0, 2, 5, 7.5, 12]),
    st.one_of(st.none(), st.integers(1, 7)),
)
def test_generator_max_batch_size_equals_greedy_loop(sizes, cap, max_batch_size):
    # invariant: the streaming generator makes the loop's batches and warns once per skipped item
    expected, skipped = greedy_reference(sizes, cap, max_batch_size=max_batch_size)
    warnings: list[str] = []
    items = [f"item{p}" for p in range(len(sizes))]
    batches = size_aware_batching(
        items, dict(zip(items, sizes)), cap, warn_logger=warnings.append, max_batch_size=max_batch_size
    )
    assert list(batches) == [[items[p] for p in batch] for batch in expected]
    per_item = [f"Size of element {items[p]} exceeds max_total_size ({sizes[p]} > {cap}), skipping" for p in skipped]
    assert warnings[: len(per_item)] == per_item
    assert len(warnings) == len(per_item) + (1 if skipped else 0)


def test_a_carry_holding_an_item_above_a_smaller_cap_is_an_error_not_a_hang():
    carry = split_batches([50, 50], 200, final=False).carry
    with pytest.raises(ValueError, match="costs more than max_total_size and came in the carry"):
        split_batches([1], 10, carry=carry)


@pytest.mark.parametrize(
    ("costs", "shown"),
    [
        ([2**63, 1], 2**63),
        ([[1, 2**63 + 1], [2, 3]], 2**63 + 1),
        ([2**64, 1], 2**64),
    ],
)
def test_integer_costs_past_int64_in_a_list_are_refused_not_rounded(costs, shown):
    # float64 would round 2**63 + 1 to 2**63 and batch it under a cap of 2**63
    with pytest.raises(ValueError, match=rf"costs has values too large for int64: {shown}\."):
        split_batches(costs, 2**63)


@pytest.mark.parametrize(
    ("costs", "cap", "expected"),
    [
        # 3 * (2**52 + 1) passes the cap by 1, yet float64 rounds cap / cost up to 3.0
        ([2**52 + 1] * 3, 3 * 2**52 + 2, [[0, 1], [2]]),
        ([2**52 + 1] * 3, 3 * 2**52 + 3, [[0, 1, 2]]),
        # just under 2**53: 2 * (2**52 - 1) + 1 leaves room for 2 items, not 3
        ([2**52 - 1] * 3, 2**53 - 1, [[0, 1], [2]]),
        ([3, 2**52, 3, 3], 2**53 - 1, [[0], [1], [2, 3]]),
        ([0, 0, 0, 5, 0], 0, [[0, 1, 2, 4]]),
    ],
)
def test_padded_int_lengths_near_float_precision_equal_greedy_loop(costs, cap, expected):
    want, skipped = greedy_reference(costs, cap, cost="padded")
    split = split_batches(np.array(costs, dtype=np.int64), cap, cost="padded")
    assert as_lists(split) == want == expected and split.skipped.tolist() == skipped


@pytest.mark.parametrize(
    ("cost", "cap", "fits"),
    [
        (15.400000000000002, 46.2, 3),  # 46.2 / cost rounds below 3, yet 3 * cost rounds to 46.2
        (0.35, 4.199999999999999, 12),
        (0.35, 1.7499999999999998, 4),  # 1.75 / 0.35 rounds to 5.0, yet 5 * 0.35 rounds above the cap
        (2.4499999999999997, 14.699999999999998, 5),
    ],
)
def test_padded_float_lengths_where_the_quotient_rounds_across_an_integer(cost, cap, fits):
    costs = [cost] * (fits + 2)
    expected, _ = greedy_reference(costs, cap, cost="padded")
    assert len(expected[0]) == fits
    assert as_lists(split_batches(costs, cap, cost="padded")) == expected


@pytest.mark.parametrize("oversize", ["skip", "own_batch"])
def test_padded_int_costs_past_float_precision_under_a_cap_below_it(oversize):
    # a cost past 2**53 turns to a float at or above 2**53: still above every cap below it
    costs = [1, 2**53 + 1, 2**53, 2**62, 3, 2**53 - 1]
    for cap in (2**53 - 1, 2**53 - 2, 2**52):
        expected, skipped = greedy_reference(costs, cap, cost="padded", oversize=oversize)
        split = split_batches(np.array(costs, dtype=np.int64), cap, cost="padded", oversize=oversize)
        assert as_lists(split) == expected and split.skipped.tolist() == skipped


@st.composite
def chunked_sum_problems(draw):
    """One column of integer costs (runs of zeros, items at the cap) under its cap alone, and a chunk size."""
    cap = draw(st.integers(0, 20))
    value = st.one_of(st.integers(0, cap), st.just(0), st.just(cap))
    rows = draw(st.lists(value, max_size=60))
    return rows, cap, draw(st.integers(1, 7)), draw(st.lists(st.integers(0, 60), max_size=3))


@settings(max_examples=300, deadline=None)
@given(chunked_sum_problems())
def test_int_sums_made_chunk_by_chunk_equal_greedy_loop(problem):
    # invariant: prefix sums made a chunk at a time ahead of the walk give the loop's batches, whole and in chunks
    rows, cap, chunk, cuts = problem
    expected, _ = greedy_reference(rows, cap)
    with patch.object(_sum_kernel, "_CHUNK", chunk):
        assert as_lists(split_batches(np.array(rows, dtype=np.int64), cap)) == expected
        got, carry, start = [], None, 0
        for stop in [*sorted(cut for cut in cuts if cut <= len(rows)), len(rows)]:
            split = split_batches(np.array(rows[start:stop], dtype=np.int64), cap, carry=carry, final=stop == len(rows))
            got += as_lists(split)
            carry, start = split.carry, stop
    assert got == expected


@st.composite
def chunked_multi_sum_problems(draw):
    """Two or three columns of integer costs, each under its own cap (0 included), and a chunk size."""
    k = draw(st.integers(2, 3))
    caps = [draw(st.integers(0, 20)) for _ in range(k)]
    row = st.tuples(*(st.one_of(st.integers(0, cap), st.just(0), st.just(cap)) for cap in caps))
    return (
        draw(st.lists(row, max_size=60)),
        caps,
        draw(st.integers(1, 7)),
        draw(st.lists(st.integers(0, 60), max_size=3)),
    )


@settings(max_examples=300, deadline=None)
@given(chunked_multi_sum_problems())
def test_int_column_sums_made_chunk_by_chunk_equal_greedy_loop(problem):
    # invariant: each batch ends where the first column to pass its cap says, across chunk ends, whole and in chunks
    rows, caps, chunk, cuts = problem
    expected, _ = greedy_reference(rows, caps)
    costs = np.array(rows, dtype=np.int64).reshape(len(rows), len(caps))
    with patch.object(_sum_kernel, "_CHUNK", chunk):
        assert as_lists(split_batches(costs, caps)) == expected
        got, carry, start = [], None, 0
        for stop in [*sorted(cut for cut in cuts if cut <= len(rows)), len(rows)]:
            split = split_batches(costs[start:stop], caps, carry=carry, final=stop == len(rows))
            got += as_lists(split)
            carry, start = split.carry, stop
    assert got == expected


@pytest.mark.parametrize("n", [_sum_kernel._CHUNK - 1, _sum_kernel._CHUNK, 3 * _sum_kernel._CHUNK + 5])
def test_int_sums_past_one_chunk_equal_running_loop(n):
    rng = np.random.default_rng(n)
    costs = np.where(rng.random(n) < 0.3, 0, rng.integers(0, 1000, n))  # runs of zeros across chunk ends
    for cap in (999, 1000, 250_000, 10**6, 2**62):
        assert as_lists(split_batches(costs, cap)) == running_sum_reference(costs.tolist(), cap)
        first = split_batches(costs[: n // 2], cap, final=False)
        rest = split_batches(costs[n // 2 :], cap, carry=first.carry)
        assert as_lists(first) + as_lists(rest) == running_sum_reference(costs.tolist(), cap)


def test_int_sums_near_int64_are_exact_under_a_cap_past_the_sums():
    costs = np.array([2**60, 2**60, 2**61, 0, 2**61], dtype=np.int64)  # sum 2**62 + 2**61: fits int64
    for cap in (2**61, 2**62, 2**63 - 1):
        expected, _ = greedy_reference(costs.tolist(), cap)
        assert as_lists(split_batches(costs, cap)) == expected


def test_a_carry_item_above_the_cap_is_an_error_in_the_chunked_walk():
    carry = split_batches([5, 50], 200, final=False).carry
    with pytest.raises(ValueError, match="item at position 1 of this split costs more than max_total_size"):
        split_batches([1, 1], 10, carry=carry)
