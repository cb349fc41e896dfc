"""Shape buckets: the table, the chosen lengths, the padded-length rule and each bucket's batch size."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, PadCollator
from fastsab.memory import fit_batch_memory
from fastsab.plan.cost_sources import padded_length
from fastsab.plan.shape_buckets import MAX_CANDIDATES, ShapeBuckets, choose_lengths
from tests.reference import largest_batch


def padded_tokens(lengths: list[int], ladder: tuple[int, ...]) -> int:
    """Tokens of ``lengths`` each padded to the first of ``ladder`` that holds it."""
    return sum(next(bucket for bucket in ladder if max(length, 1) <= bucket) for length in lengths)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40), k=st.integers(1, 5))
def test_chosen_lengths_pad_the_fewest_tokens(lengths: list[int], k: int) -> None:
    chosen = choose_lengths(lengths, k)
    distinct = sorted({max(length, 1) for length in lengths})
    # invariant: the longest length is the last bucket, and K lengths (fewer if fewer distinct)
    assert chosen[-1] == distinct[-1] and len(chosen) == min(k, len(distinct))
    best = min(
        padded_tokens(lengths, (*combo, distinct[-1]))
        for combo in itertools.combinations(distinct[:-1], min(k, len(distinct)) - 1)
    )
    # invariant: no other choice of bucket lengths pads fewer tokens (brute force)
    assert padded_tokens(lengths, chosen) == best


def test_chosen_lengths_of_many_distinct_lengths_come_from_quantiles() -> None:
    lengths = np.random.default_rng(0).integers(1, 50_000, 200_000)
    chosen = choose_lengths(lengths, 8)
    assert len(chosen) == 8 and chosen[-1] == lengths.max() and list(chosen) == sorted(set(chosen))
    # a choice among MAX_CANDIDATES quantiles is near the best of evenly spaced quantiles
    quantiles = tuple(int(q) for q in np.quantile(lengths, np.linspace(0, 1, 9)[1:], method="higher"))
    assert padded_tokens(lengths.tolist(), chosen) <= padded_tokens(lengths.tolist(), quantiles)
    assert MAX_CANDIDATES < len(np.unique(lengths))


def test_chosen_lengths_are_multiples_with_pad_to_multiple_of() -> None:
    assert choose_lengths([5, 17, 30, 31], 3, pad_to_multiple_of=8) == (8, 24, 32)
    assert choose_lengths([3, 3, 9], 2, counts=[1, 5, 1]) == (3, 9)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(0, 40)), min_size=1, max_size=40),
    k=st.integers(1, 5),
    multiple=st.sampled_from([1, 2, 3, 8, 64]),
)
def test_chosen_lengths_are_multiples_of_pad_to_multiple_of_for_every_length(
    lengths: list[int], k: int, multiple: int
) -> None:
    chosen = choose_lengths(lengths, k, pad_to_multiple_of=multiple)
    # invariant: each chosen length is a positive multiple (a length of 0 pads to the multiple)
    assert all(length % multiple == 0 and length >= multiple for length in chosen)
    assert ShapeBuckets.fit(lengths, k, pad_to_multiple_of=multiple).lengths == chosen
    padded = [max(padded_length(length, multiple), multiple) for length in lengths]
    distinct = sorted(set(padded))
    assert chosen[-1] == distinct[-1] and len(chosen) == min(k, len(distinct))
    best = min(
        padded_tokens(padded, (*combo, distinct[-1]))
        for combo in itertools.combinations(distinct[:-1], min(k, len(distinct)) - 1)
    )
    # invariant: no other ladder of multiples pads fewer tokens (brute force)
    assert padded_tokens(padded, chosen) == best


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(
        st.one_of(st.integers(0, 40), st.integers(2**40, 2**62), st.just(2**63 - 1)), min_size=1, max_size=12
    ),
    k=st.integers(1, 4),
)
def test_chosen_lengths_of_huge_lengths_pad_the_fewest_tokens(lengths: list[int], k: int) -> None:
    # lengths near int64's largest: the padded tokens sum past int64, which once wrapped around
    # and chose one length twice (a ladder ShapeBuckets refuses)
    chosen = choose_lengths(lengths, k)
    distinct = sorted({max(length, 1) for length in lengths})
    assert list(chosen) == sorted(set(chosen)) and chosen[-1] == distinct[-1]
    assert len(chosen) == min(k, len(distinct))
    best = min(
        padded_tokens(lengths, (*combo, distinct[-1]))
        for combo in itertools.combinations(distinct[:-1], min(k, len(distinct)) - 1)
    )
    # invariant: within float64's rounding of sums past int64, no other ladder pads fewer tokens
    assert padded_tokens(lengths, chosen) <= best * (1 + 2**-40)
    assert ShapeBuckets.fit(lengths, k).lengths == chosen


def test_chosen_lengths_of_huge_lengths_are_distinct() -> None:
    lengths = [3] * 100 + [2**58, 2**59, 2**60]
    assert choose_lengths(lengths, 2) == (3, 2**60)


@pytest.mark.parametrize("multiple", [3, 8, 2**40])
def test_a_length_that_pads_past_int64_is_refused_naming_it(multiple: int) -> None:
    # 2**63 - 1 rounded up to a multiple of 8 is past int64: it once wrapped around to a negative
    # length, and the chosen ladder left the longest item out
    with pytest.raises(ValueError, match=rf"lengths\[1\] = {2**63 - 1} padded to a multiple of {multiple} .* past"):
        choose_lengths([5, 2**63 - 1], 2, pad_to_multiple_of=multiple)
    with pytest.raises(ValueError, match="past"):
        FastSizeAwareLoader({"x": torch.arange(2)}, [5, 2**63 - 1], 2**200, buckets=2, pad_to_multiple_of=multiple)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: choose_lengths([], 2), "lengths is empty"),
        (lambda: choose_lengths([1.5, 2.0], 2), "non-negative integers"),
        (lambda: choose_lengths([1, 2], 0), "num_buckets"),
        (lambda: ShapeBuckets([4, 4]), "strictly increasing"),
        (lambda: ShapeBuckets([4, 8], [1]), "one batch size per bucket length"),
        (lambda: ShapeBuckets([0, 8]), "lengths"),
        (lambda: ShapeBuckets("48"), "sequence of positive integers"),
        (lambda: ShapeBuckets.from_json("[1, 2]"), "not a ShapeBuckets table"),
        (lambda: ShapeBuckets.from_json('{"format": "other"}'), "its format is 'other'"),
        (lambda: ShapeBuckets.from_json("{"), "invalid JSON"),
    ],
)
def test_bad_tables_are_refused_naming_what_is_wrong(call: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("field", ["lengths", "batch_sizes"])
@pytest.mark.parametrize("value", [2**63, 10**20])
def test_a_table_past_int64_is_refused_on_load_naming_the_field(field: str, value: int) -> None:
    # a typo such as 10**20 once loaded, and the loader failed at len() with numpy's OverflowError
    table = {"format": "fastsab.ShapeBuckets/1", "lengths": [8, 16], "batch_sizes": [32, 16], "source": ""}
    table[field] = [table[field][0], value]
    with pytest.raises(ValueError, match=rf"{field} must be at most 2\*\*63 - 1 .*, got {value} at position 1"):
        ShapeBuckets.from_json(json.dumps(table))
    with pytest.raises(ValueError, match=rf"{field} must be at most"):
        ShapeBuckets(**{"lengths": [8, 16], "batch_sizes": [32, 16], field: table[field]})
    # the largest int64 is a table (a loader pads to it, or batches that many rows at most)
    table[field] = [table[field][0], 2**63 - 1]
    assert ShapeBuckets.from_json(json.dumps(table)).to_json() == json.dumps(table, indent=1)


def test_a_table_is_saved_and_loaded_as_json(tmp_path: object) -> None:
    table = ShapeBuckets([64, 128], [32, 16], source="measured on cpu")
    path = tmp_path / "buckets.json"  # type: ignore[operator]
    table.save(path)
    loaded = ShapeBuckets.load(path)
    assert loaded == table and loaded.source == "measured on cpu"
    assert json.loads(path.read_text())["batch_sizes"] == [32, 16]


def test_one_padded_length_rule_for_collator_budget_and_buckets() -> None:
    lengths = np.array([0, 1, 7, 8, 9, 16, 17, 40])
    ladder = (8, 16, 24)
    # the rule: rounded up to the multiple, then to the first bucket that holds it
    assert padded_length(lengths, 8, ladder).tolist() == [8, 8, 8, 8, 16, 16, 24, 40]
    assert padded_length(lengths, None, ladder).tolist() == [8, 8, 8, 8, 16, 16, 24, 40]
    collator = PadCollator(pad_to_multiple_of=8, bucket_lengths=ladder)
    for longest in lengths.tolist():
        assert collator.width(np.array([longest, 0])) == padded_length(longest, 8, ladder)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60),
    cap=st.integers(50, 500),
    fixed=st.integers(0, 30),
    max_batch_size=st.one_of(st.none(), st.integers(1, 20)),
    multiple=st.sampled_from([1, 2, 4]),
)
def test_each_bucket_holds_the_largest_batch_its_budget_allows(
    lengths: list[int], cap: int, fixed: int, max_batch_size: int | None, multiple: int
) -> None:
    ladder = sorted(set(lengths))[-3:]
    if fixed + ladder[-1] > cap:
        return
    loader = FastSizeAwareLoader(
        torch.arange(len(lengths)), lengths, cap, buckets=ladder, fixed_cost=fixed,
        max_batch_size=max_batch_size, batch_size_multiple=multiple, partial="keep",
    )  # fmt: skip
    rows = len(lengths) if max_batch_size is None else min(max_batch_size, len(lengths))  # (at most the items)
    expected = [largest_batch(cap, fixed, length, rows, multiple) for length in ladder]
    assert list(loader.buckets.batch_sizes) == expected


@pytest.mark.timeout(60)
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60),
    cap=st.sampled_from([2**53 + 1, 2**63, 2**70, 2**200, 1e19, 1e30, 1e300]),
    fixed=st.sampled_from([0, 7, 0.5, 2**40]),
    max_batch_size=st.one_of(st.none(), st.integers(1, 20), st.just(2**63 + 1)),
)
def test_a_budget_past_int64_holds_every_item_in_each_buckets_batch(
    lengths: list[int], cap: int | float, fixed: int | float, max_batch_size: int | None
) -> None:
    # a budget of 1e30 once searched its batch sizes one row at a time where floats step by more (forever)
    ladder = sorted(set(lengths))[-3:]
    loader = FastSizeAwareLoader(
        torch.arange(len(lengths)), lengths, cap, buckets=ladder, fixed_cost=fixed, max_batch_size=max_batch_size,
        partial="keep",
    )  # fmt: skip
    rows = len(lengths) if max_batch_size is None else min(max_batch_size, len(lengths))  # (at most the items)
    assert list(loader.buckets.batch_sizes) == [largest_batch(cap, fixed, length, rows, 1) for length in ladder]
    assert sorted(i for batch in loader for i in batch.tolist()) == list(range(len(lengths)))


def test_a_fitted_batch_memory_model_gives_each_bucket_its_batch_size() -> None:
    # peaks of padded batches: 150 kB once, plus 1000 + 40 L + 0.5 L**2 bytes per row
    rng = np.random.default_rng(1)
    batches = [[int(v) for v in rng.integers(1, 200, int(size))] for size in rng.integers(1, 9, 40)]
    peaks = [150_000 + len(b) * (1000 + 40 * max(b) + 0.5 * max(b) ** 2) for b in batches]
    model = fit_batch_memory(batches, peaks, cost="padded", degree=2)
    lengths = rng.integers(1, 200, 500)
    budget = 2_000_000
    loader = FastSizeAwareLoader(
        torch.arange(500), features=lengths, buckets=4, partial="keep", **model.loader_options(budget)
    )
    ladder = loader.buckets.lengths

    def row_cost(length: int) -> float:
        return float(np.asarray(model.per_item(np.array([float(length)]))).reshape(-1)[0])

    # invariant: B_k is the largest count with fixed + B_k * per_item(L_k) within the budget
    expected = [largest_batch(budget, model.fixed, row_cost(length), None, 1) for length in ladder]
    assert list(loader.buckets.batch_sizes) == expected
    for batch in loader:
        longest = int(lengths[batch.numpy()].max())
        bucket = next(length for length in ladder if longest <= length)
        # invariant: the padded batch's predicted peak is within the budget
        assert model.fixed + len(batch) * row_cost(bucket) <= budget
