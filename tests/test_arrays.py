"""Sizes, costs and sequences of every dtype, byte order and nesting: read exactly, or refused by name."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import (
    FastSizeAwareLoader,
    PackCollator,
    PadCollator,
    RaggedDataset,
    SizeAwareBatchSampler,
    create_buckets,
    size_aware_batching,
)
from fastsab._arrays import as_numpy
from fastsab.memory import PolynomialRegression

# The floating dtypes torch has and numpy lacks (float4_e2m1fn_x2 packs two values per byte: no tensor of
# numbers can be made of it).
NUMPYLESS_FLOATS = [
    dtype
    for dtype in (
        torch.bfloat16,
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e4m3fnuz", None),
        getattr(torch, "float8_e5m2", None),
        getattr(torch, "float8_e5m2fnuz", None),
        getattr(torch, "float8_e8m0fnu", None),
    )
    if dtype is not None
]
COLLATORS = [PadCollator(pad_value=9), PackCollator()]
SEQUENCES = [[1, 2, 70000], [], [-5], [4, 5, 6, 7], [300]]


def _same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def _low_precision_sizes(dtype: torch.dtype, n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Sizes held in ``dtype``, and the same numbers as float32."""
    sizes = (torch.rand(n, generator=torch.Generator().manual_seed(0)) * 6 + 0.5).to(dtype)
    return sizes, sizes.to(torch.float32)


def _batches(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


# -- big-endian values ------------------------------------------------------------------------


@pytest.mark.parametrize("collator", COLLATORS)
def test_big_endian_values_and_offsets_give_the_same_numbers_in_native_order(collator):
    # invariant: a big-endian dataset gives the batches of the native one (same numbers, native dtype)
    native = RaggedDataset.from_sequences(
        {"input_ids": [np.array(s, np.int32) for s in SEQUENCES], "weights": [np.ones(len(s)) for s in SEQUENCES]},
        collator=collator,
        per_sequence={"label": np.arange(5, dtype=np.int16)},
    )
    swapped = RaggedDataset(
        {name: values.astype(values.dtype.newbyteorder(">")) for name, values in native.values.items()},
        native.offsets.astype(">i8"),
        collator=collator,
        per_sequence={"label": np.arange(5, dtype=">i2")},
    )
    assert swapped.values["input_ids"].dtype == np.dtype(">i4")
    for indices in ([3, 1, 0, 4, 2], [4], [0, 3], [1]):  # a full batch takes the row gather, a sparse one the scatter
        _same_batch(swapped.__getitems__(indices), native.__getitems__(indices))
    for index in range(5):
        _same_batch(swapped[index], native[index])
    assert swapped.__getitems__([0])["input_ids"].dtype == torch.int32


def test_big_endian_sequences_are_read_as_their_numbers():
    sequences = [np.array(s, dtype=">i4") for s in SEQUENCES]
    data = RaggedDataset.from_sequences(sequences, collator=PackCollator())
    batch = data.__getitems__(range(5))
    assert batch["input_ids"].dtype == torch.int32
    assert batch["input_ids"].tolist() == [token for s in SEQUENCES for token in s]


@pytest.mark.parametrize("collator", COLLATORS)
@pytest.mark.parametrize("suffix", [".npy", ".bin"])
def test_big_endian_token_files_stay_mapped_and_give_native_batches(tmp_path, collator, suffix):
    tokens = [np.array(s, dtype=np.int64) % 60000 for s in SEQUENCES]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in tokens])])
    flat = np.concatenate(tokens).astype(">u2")
    path = tmp_path / f"tokens{suffix}"
    if suffix == ".npy":
        np.save(path, flat)
    else:
        flat.tofile(path)
    np.save(tmp_path / "offsets.npy", offsets.astype(">i8"))
    data = RaggedDataset.from_memmap(path, tmp_path / "offsets.npy", dtype=">u2", collator=collator)
    assert isinstance(data.values["input_ids"], np.memmap)  # not read whole to convert it
    native = RaggedDataset(flat.astype(np.uint16), offsets, collator=collator)
    for indices in ([3, 1, 0, 4, 2], [4], [0, 3]):
        _same_batch(data.__getitems__(indices), native.__getitems__(indices))
    assert data.__getitems__([0])["input_ids"].dtype == torch.uint16
    assert data[3]["input_ids"].tolist() == SEQUENCES[3]
    copy = pickle.loads(pickle.dumps(data))
    _same_batch(copy.__getitems__([2, 0]), native.__getitems__([2, 0]))


def test_big_endian_sizes_make_the_buckets_of_native_ones():
    sizes = np.array([3, 1, 40, 7, 7, 12, 2], dtype=np.int64)
    swapped = create_buckets(sizes.astype(">i8"), max_width=5, min_bucket_count=2)
    native = create_buckets(sizes, max_width=5, min_bucket_count=2)
    assert swapped.bucket_boundaries.tolist() == native.bucket_boundaries.tolist()
    assert swapped.bucket_sizes.tolist() == native.bucket_sizes.tolist()


def test_a_state_over_padded_features_resumes_over_them_in_the_other_byte_order():
    # the features of a file written on a big-endian machine, mapped as they are, are the same numbers
    features = np.random.default_rng(3).integers(8, 64, (60, 2)).astype(np.float32)

    def area(rows: np.ndarray) -> np.ndarray:
        return rows[:, 0] * rows[:, 1]

    def loader(values: np.ndarray) -> FastSizeAwareLoader:
        return FastSizeAwareLoader(
            torch.arange(60), area, 9000.0, features=values, cost="padded", padding="features", seed=4
        )

    want = _batches(loader(features))
    for saved, resumed in ((features, features.astype(">f4")), (features.astype(">f4"), features)):
        first = loader(saved)
        iterator = iter(first)
        head = [next(iterator).tolist() for _ in range(3)]
        again = loader(resumed)
        again.load_state_dict(first.state_dict())
        assert head + _batches(again) == want


# -- malformed nested sequences --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequences", "message"),
    [
        (
            [[1, 2], [3], [4], [[1, 2], [3]]],
            r"sequences\[3\] must be a one-dimensional sequence of numbers, but sequences\[3\]\[1\] is \[3\] "
            r"of shape \(1,\) where sequences\[3\]\[0\] has shape \(2,\)\.",
        ),
        (
            [[[1, 2], [3]], [4]],
            r"sequences\[0\] must be a one-dimensional sequence of numbers, but sequences\[0\]\[1\] is \[3\] "
            r"of shape \(1,\) where sequences\[0\]\[0\] has shape \(2,\)\.",
        ),
        (
            [[1], [5, [6, 7]]],
            r"sequences\[1\] must be .*, but sequences\[1\]\[1\] is \[6, 7\] of shape \(2,\) where "
            r"sequences\[1\]\[0\] has shape \(\)\.",
        ),
        (
            [[1], [[[1], [2, 3]], [[1], [2, 3]]]],
            r"sequences\[1\] must be .*, but sequences\[1\]\[0\]\[1\] is \[2, 3\] of shape \(2,\) where "
            r"sequences\[1\]\[0\]\[0\] has shape \(1,\)\.",
        ),
        (
            {"input_ids": [[1], [2]], "labels": [[1], [[2], [3, 4]]]},
            r"sequences\['labels'\]\[1\] must be .*, but sequences\['labels'\]\[1\]\[1\] is \[3, 4\]",
        ),
    ],
)
def test_ragged_nested_sequences_are_refused_at_their_position(sequences, message):
    with pytest.raises(ValueError, match=message):
        RaggedDataset.from_sequences(sequences)


def test_ragged_offsets_are_refused_at_their_position():
    with pytest.raises(ValueError, match=r"offsets must be .*, but offsets\[1\] is \[1, 2\] of shape \(2,\)"):
        RaggedDataset(np.arange(2), [0, [1, 2]])


def test_ragged_nested_tensors_are_refused_with_their_shapes():
    with pytest.raises(
        ValueError,
        match=r"sequences\[0\]\[1\] is tensor\(\[3\]\) of shape \(1,\) where sequences\[0\]\[0\] has shape \(2,\)",
    ):
        RaggedDataset.from_sequences([[torch.tensor([1, 2]), torch.tensor([3])]])


def test_ragged_sizes_are_refused_at_their_position():
    with pytest.raises(ValueError, match=r"sizeof must be a 1-D or 2-D array of numbers, but sizeof\[2\] is \[3\]"):
        FastSizeAwareLoader(torch.arange(3), [[1, 2], [1, 2], [3]], 10)


# -- floating dtypes numpy lacks -------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPYLESS_FLOATS, ids=str)
def test_numpyless_float_sizes_batch_as_their_float_values(dtype):
    sizes, floats = _low_precision_sizes(dtype)
    assert as_numpy("sizes", sizes).tolist() == floats.tolist()  # exact
    for options in ({"shuffle": False}, {"seed": 3}, {"seed": 3, "cost": "padded"}):
        want = _batches(FastSizeAwareLoader(torch.arange(200), floats, 12.0, **options))
        assert _batches(FastSizeAwareLoader(torch.arange(200), sizes, 12.0, **options)) == want
        vectorized = FastSizeAwareLoader(torch.arange(200), lambda ids: sizes[torch.as_tensor(ids)], 12.0, **options)
        assert _batches(vectorized) == want


def test_bfloat16_sizes_of_the_bionemo_api_batch_as_their_float_values():
    sizes, floats = _low_precision_sizes(torch.bfloat16, 60)
    want = list(SizeAwareBatchSampler(range(60), floats.tolist(), 10.0))
    assert list(SizeAwareBatchSampler(range(60), sizes, 10.0)) == want
    assert list(SizeAwareBatchSampler(range(60), lambda i: sizes[i], 10.0)) == want
    streamed = size_aware_batching(range(60), lambda i: sizes[i], 10.0, collate_fn=list)
    assert list(streamed) == want


@pytest.mark.parametrize("dtype", NUMPYLESS_FLOATS)
def test_a_list_of_numpyless_float_tensors_is_read_as_their_float_values(dtype):
    sizes, floats = _low_precision_sizes(dtype, n=60)
    want = _batches(FastSizeAwareLoader(torch.arange(60), floats, 10.0, seed=2))
    assert _batches(FastSizeAwareLoader(torch.arange(60), list(sizes), 10.0, seed=2)) == want
    rows = [[size, size] for size in sizes]  # rows of scalar tensors: one row per item
    assert as_numpy("sizes", rows).tolist() == [[value, value] for value in floats.tolist()]
    with pytest.raises(
        ValueError,
        match=r"sizes must be an array of numbers, but sizes\[1\] is .* of shape \(1,\) where sizes\[0\] has shape \(2,\)\.",
    ):
        as_numpy("sizes", [rows[0], rows[1][:1]])


def test_bfloat16_features_are_padded_and_given_back_in_their_dtype():
    # small integers: their products are exact in bfloat16, so both runs cost the same
    features = torch.randint(1, 16, (120, 2), generator=torch.Generator().manual_seed(1))
    seen = set()

    def area(rows: torch.Tensor) -> torch.Tensor:
        seen.add(rows.dtype)
        return rows[:, 0] * rows[:, 1]

    options = {"cost": "padded", "padding": "features", "seed": 5}
    want = _batches(FastSizeAwareLoader(torch.arange(120), area, 400.0, features=features.float(), **options))
    got = _batches(FastSizeAwareLoader(torch.arange(120), area, 400.0, features=features.bfloat16(), **options))
    assert got == want
    assert seen == {torch.float32, torch.bfloat16}


def test_the_bfloat16_predictions_of_a_memory_model_batch_as_their_float_values():
    model = PolynomialRegression(1)
    model.fit(torch.arange(1.0, 20.0), 3 * torch.arange(1.0, 20.0) + 2)
    lengths = torch.randint(1, 16, (80,), generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    predicted = model(lengths)
    assert predicted.dtype == torch.bfloat16
    want = _batches(FastSizeAwareLoader(torch.arange(80), predicted.float(), 100.0, seed=1))
    assert _batches(FastSizeAwareLoader(torch.arange(80), predicted, 100.0, seed=1)) == want
    assert _batches(FastSizeAwareLoader(torch.arange(80), model, 100.0, features=lengths, seed=1))
