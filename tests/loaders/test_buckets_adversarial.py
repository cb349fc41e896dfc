"""Shape buckets given what users pass them: numpy numbers, float lengths, several columns, empty data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, PadCollator, RaggedDataset
from fastsab.memory.batch import fit_batch_memory
from fastsab.plan.shape_buckets import ShapeBuckets, choose_lengths
from tests.loaders.test_buckets import Texts

LENGTHS = np.random.default_rng(7).integers(1, 120, 300)


def epoch(loader: FastSizeAwareLoader[Any]) -> tuple[list[list[int]], set[tuple[int, ...]]]:
    """The real items of each batch (``sample_mask``), and the batch shapes."""
    batches, shapes = [], set()
    for batch in loader:
        shapes.add(tuple(batch["input_ids"].shape))
        batches.append(batch["index"][batch["sample_mask"]].tolist())
    return batches, shapes


def test_a_numpy_integer_is_a_number_of_buckets() -> None:
    given = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=np.int64(3), collate_fn=PadCollator(), seed=1)
    plain = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=3, collate_fn=PadCollator(), seed=1)
    assert given.buckets == plain.buckets and epoch(given) == epoch(plain)


@pytest.mark.parametrize("kind", ["sizeof", "features"])
def test_float_lengths_choose_the_buckets_of_their_rounded_up_lengths(kind: str) -> None:
    # a length of 40.5 pads to 41 tokens: chosen buckets hold it exactly as given ones do
    fractional = LENGTHS - 0.5
    if kind == "sizeof":
        loader = FastSizeAwareLoader(Texts(fractional), fractional, 2048, buckets=3, collate_fn=PadCollator(), seed=2)
    else:
        loader = FastSizeAwareLoader(
            Texts(fractional), lambda x: np.asarray(x, dtype=np.float64).reshape(-1), 2048, features=fractional,
            buckets=3, collate_fn=PadCollator(), seed=2,
        )  # fmt: skip
    expected = choose_lengths(LENGTHS, 3)
    assert loader.buckets.lengths == expected
    batches, shapes = epoch(loader)
    # invariant: every item once, in at most K shapes, each within the budget
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    assert len(batches) == len(loader) and len(shapes) <= 3
    assert all(rows * width <= 2048 and width in expected for rows, width in shapes)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(0, 40)), min_size=1, max_size=60).map(np.array),
    k=st.integers(1, 4),
    multiple=st.sampled_from([2, 3, 8]),
)
def test_buckets_chosen_with_pad_to_multiple_of_are_taken_with_lengths_of_0(
    lengths: np.ndarray, k: int, multiple: int
) -> None:
    # a length of 0 once chose a bucket length of 1, which the loader then refused as not a multiple
    loader = FastSizeAwareLoader(
        Texts(lengths), lengths, 4096, buckets=k, pad_to_multiple_of=multiple, collate_fn=PadCollator(), seed=4
    )
    assert all(length % multiple == 0 and length >= multiple for length in loader.buckets.lengths)
    batches, shapes = epoch(loader)
    # invariant: every item once, in batches padded to the chosen lengths, within the budget
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert len(batches) == len(loader)
    assert all(rows * width <= 4096 and width in loader.buckets.lengths for rows, width in shapes)


def test_a_bucket_length_past_int64_is_refused_naming_buckets() -> None:
    with pytest.raises(ValueError, match=r"buckets must be at most 2\*\*63 - 1 .*, got 100000000000000000000"):
        FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[64, 10**20], collate_fn=PadCollator())


@pytest.mark.parametrize("sizeof", [np.stack([LENGTHS, LENGTHS], 1), lambda ids: np.stack([LENGTHS[ids]] * 2, 1)])
@pytest.mark.parametrize("buckets", [3, [40, 80, 119]])
def test_lengths_of_several_columns_are_refused_when_made(sizeof: Any, buckets: Any) -> None:
    with pytest.raises(ValueError, match=r"buckets pad one length per item, but sizeof gives 2 per item"):
        FastSizeAwareLoader(Texts(LENGTHS), sizeof, 2048, buckets=buckets, collate_fn=PadCollator())


def test_an_empty_dataset_has_no_lengths_to_choose_buckets_from() -> None:
    empty = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match=r"the dataset is empty.*give the bucket lengths"):
        FastSizeAwareLoader(Texts(empty), empty, 2048, buckets=3, collate_fn=PadCollator())
    given = FastSizeAwareLoader(Texts(empty), empty, 2048, buckets=[40, 80], collate_fn=PadCollator())
    assert len(given) == 0 and list(given) == []


def test_a_table_without_lengths_is_not_a_table() -> None:
    with pytest.raises(ValueError, match=r"not a ShapeBuckets table: it has no 'lengths'"):
        ShapeBuckets.from_json('{"format": "fastsab.ShapeBuckets/1", "batch_sizes": [4]}')


@pytest.mark.parametrize("counts", [[1, -5, 1], [0.5, 0.5, 1]])
def test_counts_must_be_non_negative_integers(counts: list[float]) -> None:
    with pytest.raises(ValueError, match=r"counts must be non-negative integers \(how many items have each length\)"):
        choose_lengths([1, 2, 3], 2, counts=counts)


def test_fractional_lengths_say_how_to_choose_from_them() -> None:
    with pytest.raises(ValueError, match=r"got dtype float64: round them up \(np.ceil\)"):
        choose_lengths([1.5, 2.0], 2)


@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_a_memory_model_of_either_cost_gives_its_loader_options_to_buckets(cost: str) -> None:
    # as the recipe says: features=lengths, buckets=K, **model.loader_options(budget), whatever the model's cost
    rng = np.random.default_rng(0)
    batches = [rng.integers(1, 120, rng.integers(1, 30)) for _ in range(40)]
    row = lambda x: 50 * x + 0.1 * x**2  # noqa: E731
    peaks = [1000 + (len(b) * row(b.max()) if cost == "padded" else row(b).sum()) for b in batches]
    model = fit_batch_memory(batches, peaks, cost=cost)  # type: ignore[arg-type]
    budget = 150_000
    options = model.loader_options(budget)
    options.pop("sizeof")
    loader = FastSizeAwareLoader(
        Texts(LENGTHS), model.per_item, features=LENGTHS, buckets=3, collate_fn=PadCollator(), seed=4, **options
    )
    batches_seen, shapes = epoch(loader)
    assert sorted(i for batch in batches_seen for i in batch) == list(range(len(LENGTHS)))
    # invariant: the model's peak of every padded (B, L) batch, its rows of length L, is within the budget
    for rows, width in shapes:
        assert model.predict([np.full(rows, width)])[0] <= budget
        assert model.predict([np.full(rows + 1, width)])[0] > budget  # the largest count that fits


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[119, 40]), ValueError,
         r"buckets must be strictly increasing, got \[119, 40\]"),
        (lambda: FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[]), ValueError,
         r"buckets must hold at least one positive integer, got \[\]"),
        (lambda: FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[40.0, 119.0]), TypeError,
         r"buckets must be an integer, got 40.0"),
        (lambda: FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[0, 119]), ValueError,
         r"buckets must be a positive integer, got 0"),
        (lambda: PadCollator(bucket_lengths=[119, 40]), ValueError, r"bucket_lengths must be strictly increasing"),
    ],
)  # fmt: skip
def test_bad_bucket_lengths_are_named_as_the_argument_given(make: Any, error: type, message: str) -> None:
    # the sizeof lengths are "lengths" too: an error about the bucket lengths names the argument they came in
    with pytest.raises(error, match=message):
        make()


def test_data_loader_of_a_ragged_dataset_keeps_the_default_collate() -> None:
    # the dataset pads to the buckets itself: DataLoader's batches are the loader's own, with no collate_fn given
    collator = PadCollator(bucket_lengths=[40, 80, 119])
    ragged = RaggedDataset.from_sequences(
        [np.arange(n) for n in LENGTHS], per_sequence={"index": np.arange(len(LENGTHS))}, collator=collator
    )
    loader = FastSizeAwareLoader(ragged, ragged.lengths, 2048, buckets=[40, 80, 119], partial="keep", seed=5)
    data_loader = loader.data_loader()  # (at the loader's next epoch: the one iterated here)
    expected = [batch["index"].tolist() for batch in loader]
    batches = list(data_loader)
    assert [batch["index"].tolist() for batch in batches] == expected
    assert {batch["input_ids"].shape[1] for batch in batches} <= {40, 80, 119}


def test_a_fixed_cost_over_the_budget_is_named_as_the_fix() -> None:
    with pytest.raises(ValueError, match=r"plus fixed_cost 2000: not even one row fits .* lower fixed_cost"):
        FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 1024, buckets=[30, 119], fixed_cost=2000)


def test_lengths_of_several_columns_choose_no_buckets() -> None:
    # a (length, label) table is not lengths: choosing from both columns at once would be silent nonsense
    with pytest.raises(ValueError, match=r"lengths must be 1-D \(one length per item\), got shape \(300, 2\)"):
        choose_lengths(np.stack([LENGTHS, LENGTHS % 2], 1), 3)
    assert choose_lengths(LENGTHS[:, None], 3) == choose_lengths(LENGTHS, 3)


def test_bucket_lengths_may_be_a_tensor_as_lengths_may() -> None:
    import torch

    lengths = torch.tensor([40, 80, 119])
    loader = FastSizeAwareLoader(
        Texts(LENGTHS), torch.from_numpy(LENGTHS), 2048, buckets=lengths, collate_fn=PadCollator()
    )
    assert loader.buckets.lengths == (40, 80, 119) == ShapeBuckets(lengths).lengths
    assert PadCollator(bucket_lengths=lengths).bucket_lengths == (40, 80, 119)
    _, shapes = epoch(loader)
    assert {width for _, width in shapes} <= {40, 80, 119}
    with pytest.raises(
        TypeError, match=r"buckets must be a sequence of positive integers, got tensor\(\[\[40, 80\]\]\)"
    ):
        FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=torch.tensor([[40, 80]]))


def test_a_lowered_limit_may_be_a_tensor_and_a_scalar_is_the_wrong_type() -> None:
    import torch

    def lowered(limit: Any) -> list[list[int]]:
        loader = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[40, 80, 119], collate_fn=PadCollator())
        iterator = iter(loader)
        first = next(iterator)["index"].tolist()
        loader.lower_limit(limit)
        return [first] + [batch["index"].tolist() for batch in iterator]

    sizes = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 2048, buckets=[40, 80, 119]).buckets.batch_sizes
    half = [max(size // 2, 1) for size in sizes]
    # invariant: a 1-d tensor of batch sizes lowers as the same list does, batch for batch
    assert lowered(torch.tensor(half)) == lowered(half) == lowered(np.array(half))
    for scalar in (torch.tensor(5), 5.0, None):
        with pytest.raises(TypeError, match=r"limit must be a sequence of 3 batch sizes, one per bucket"):
            lowered(scalar)
    with pytest.raises(TypeError, match=r"limit must be an integer, got 5.0"):
        lowered(torch.tensor([5.0, 3.0, 2.0]))
    with pytest.raises(ValueError, match=r"limit must give one batch size per bucket \(3\), got \[5, 3\]"):
        lowered([5, 3])
