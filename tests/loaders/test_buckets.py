"""FastSizeAwareLoader with shape buckets: what it refuses, the collators it pads with, the masks it adds."""

from __future__ import annotations

import collections
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, OutOfCoreDataset, PadCollator, RaggedDataset
from fastsab.plan.shape_buckets import ShapeBuckets
from tests.reference import bucket_loop


class Texts:
    """Sample ``i`` is ``{"index": i, "input_ids": [i] * lengths[i]}``."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"index": i, "input_ids": torch.full((int(self.lengths[i]),), i)} for i in indices]


LENGTHS = np.random.default_rng(0).integers(1, 300, 2000)


def test_a_padcollator_pads_to_the_buckets_and_an_epoch_has_at_most_k_shapes() -> None:
    loader = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 4096, buckets=4, collate_fn=PadCollator(), seed=3)
    assert loader.options.collate_fn.bucket_lengths == loader.buckets.lengths
    shapes = collections.Counter()
    seen = []
    for batch in loader:
        shapes[tuple(batch["input_ids"].shape)] += 1
        assert batch["input_ids"].numel() <= 4096
        seen += batch["index"][batch["sample_mask"]].tolist()
    assert len(shapes) <= 4 and sorted(seen) == list(range(len(LENGTHS)))
    widths = {shape[1] for shape in shapes}
    assert widths <= set(loader.buckets.lengths)


def test_partial_keep_yields_the_last_batches_as_they_are() -> None:
    loader = FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 200, 300], partial="keep", seed=1)
    batches = list(loader)
    assert sorted(torch.cat(batches).tolist()) == list(range(2000))
    full = dict(zip(loader.buckets.lengths, loader.buckets.batch_sizes))
    short = [b for b in batches if len(b) != full[next(L for L in full if LENGTHS[b].max() <= L)]]
    assert len(short) <= 3 and loader.stats.num_filler_rows == 0


def test_the_fetch_of_a_filled_batch_marks_its_repeats() -> None:
    loader = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 4096, buckets=2, collate_fn=PadCollator())
    batch = loader.fetch([5, 9, 5, 9, 5])
    assert batch["sample_mask"].tolist() == [True, True, False, False, False]


def test_the_longest_items_follow_oversize() -> None:
    with pytest.warns(UserWarning, match="longer than the longest bucket"):
        skipping = FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 200], partial="keep")
        kept = torch.cat(list(skipping)).tolist()
    assert sorted(kept) == sorted(np.flatnonzero(LENGTHS <= 200).tolist())
    assert sorted(skipping.stats.skipped) == np.flatnonzero(LENGTHS > 200).tolist()
    with pytest.raises(TypeError, match=r"must be dicts \(got Tensor\)"):  # (refused when made: a tensor's rows)
        FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 200], oversize="own_batch")
    rows = {"index": torch.arange(2000)}  # (a dict of tensors: its batches are dicts, which take the mask)
    masked = list(FastSizeAwareLoader(rows, LENGTHS, 4096, buckets=[100, 200], oversize="own_batch"))
    assert sorted(torch.cat([b["index"][b["sample_mask"]] for b in masked]).tolist()) == list(range(2000))
    own = FastSizeAwareLoader(
        torch.arange(2000), LENGTHS, 4096, buckets=[100, 200], oversize="own_batch", partial="keep"
    )
    batches = list(own)
    assert len(own) == len(batches) and sorted(torch.cat(batches).tolist()) == list(range(2000))
    with pytest.raises(ValueError, match="longer than the longest bucket 200 \\(oversize='error'\\)"):
        list(
            FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 200], oversize="error", partial="keep")
        )


def test_a_table_gives_the_batch_sizes_without_a_budget() -> None:
    table = ShapeBuckets([100, 300], [7, 3])
    loader = FastSizeAwareLoader(torch.arange(2000), LENGTHS, buckets=table, partial="keep", shuffle=False)
    sizes = collections.Counter(len(batch) for batch in loader)
    assert set(sizes) <= {7, 3} | set(range(1, 7)) and sizes[7] and sizes[3]
    assert loader.max_total_size is None and loader.buckets == table


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"buckets": 4, "cost": "sum"}, ValueError, "cost='sum' does not apply"),
        ({"buckets": 4, "sort_window": 64}, ValueError, "either buckets or sort_window"),
        ({"buckets": [100, 300], "max_total_size": 200}, ValueError, "not even one row fits"),
        ({"buckets": [100, 100]}, ValueError, "strictly increasing"),
        ({"buckets": "8"}, TypeError, "buckets must be"),
        ({"buckets": 0}, ValueError, "buckets must be a positive integer, got 0"),
        ({"partial": "keep"}, ValueError, "it needs buckets="),
        ({"buckets": 4, "last_batch": "round_down"}, ValueError, "which partial decides"),
        ({"buckets": 4, "partial": "drop"}, ValueError, "partial"),
        ({"buckets": ShapeBuckets([100, 300], [4, 2]), "max_total_size": 4096}, ValueError, "not both"),
        ({"buckets": [100, 300], "max_total_size": None}, TypeError, "needs max_total_size"),
        (
            {"buckets": ShapeBuckets([100, 300], [4, 2]), "max_total_size": None, "fixed_cost": 5},
            ValueError,
            "fixed_cost=5",
        ),
        ({"buckets": [100, 300], "pad_to_multiple_of": 64}, ValueError, "multiples of pad_to_multiple_of=64"),
        ({"buckets": [100, 300], "max_total_size": [4096, 10]}, ValueError, "one cap"),
        (
            {"buckets": 4, "collate_fn": PadCollator(bucket_lengths=[10, 20])},
            ValueError,
            "other lengths than the buckets",
        ),
        (
            {"buckets": [100, 300], "collate_fn": PadCollator(pad_to_multiple_of=64)},
            ValueError,
            r"multiples of pad_to_multiple_of=64 \(given to the loader, or its collator's\)",
        ),
    ],
)
def test_what_buckets_cannot_honour_is_refused(options: dict[str, Any], error: type, message: str) -> None:
    arguments: dict[str, Any] = {"max_total_size": 4096} | options
    with pytest.raises(error, match=message):
        FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, **arguments)


def test_a_dataset_collator_must_pad_to_the_buckets_itself() -> None:
    sequences = [np.arange(n) for n in LENGTHS[:50]]
    ragged = RaggedDataset.from_sequences(sequences, collator=PadCollator())
    with pytest.raises(ValueError, match="give it bucket_lengths"):
        FastSizeAwareLoader(ragged, LENGTHS[:50], 4096, buckets=[150, 300])
    padded = RaggedDataset.from_sequences(sequences, collator=PadCollator(bucket_lengths=[150, 300]))
    loader = FastSizeAwareLoader(padded, LENGTHS[:50], 4096, buckets=[150, 300])
    widths = {batch["input_ids"].shape[1] for batch in loader}
    assert widths <= {150, 300}


def test_data_loader_refuses_filler_rows_it_cannot_mark() -> None:
    loader = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 4096, buckets=3, collate_fn=PadCollator())
    with pytest.raises(ValueError, match="cannot add the sample_mask"):
        loader.data_loader()
    kept = FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 4096, buckets=3, partial="keep")
    widths = {batch["input_ids"].shape[1] for batch in kept.data_loader(collate_fn=PadCollator())}
    assert widths <= set(kept.buckets.lengths)


def test_a_batch_with_its_own_sample_mask_is_refused() -> None:
    class Masked(Texts):
        def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
            return [sample | {"sample_mask": 1} for sample in super().__getitems__(indices)]

    loader = FastSizeAwareLoader(Masked(LENGTHS), LENGTHS, 4096, buckets=2, collate_fn=PadCollator())
    with warnings.catch_warnings(), pytest.raises(ValueError, match="already has a 'sample_mask' key"):
        next(iter(loader))


def test_a_state_is_refused_by_other_buckets_naming_the_setting() -> None:
    loader = FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 300], partial="keep")
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    same = FastSizeAwareLoader(torch.arange(2000), LENGTHS, 4096, buckets=[100, 300], partial="keep")
    same.load_state_dict(state)
    assert len(list(same)) == len(loader) - 1
    for other in ({"buckets": [150, 300]}, {"buckets": [100, 300], "max_total_size": 2048}):
        arguments: dict[str, Any] = {"max_total_size": 4096, "partial": "keep"} | other
        changed = FastSizeAwareLoader(torch.arange(2000), LENGTHS, **arguments)
        with pytest.raises(ValueError, match=r"bucket_lengths|bucket_batch_sizes|limit"):
            changed.load_state_dict(state)


def test_a_budget_far_above_the_data_makes_batches_of_at_most_every_item() -> None:
    loader = FastSizeAwareLoader(Texts(LENGTHS[:50]), LENGTHS[:50], 10**18, buckets=2, collate_fn=PadCollator())
    assert loader.buckets.batch_sizes == (50, 50)
    rows = [len(batch["index"]) for batch in loader]
    assert rows == [50] * len(rows) and len(rows) == 2


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 300),
    chunk=st.integers(1, 60),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    partial=st.sampled_from(["fill", "keep"]),
)
def test_a_dataset_read_in_chunks_reads_each_chunk_once_and_closes_its_buckets(
    n: int, chunk: int, shuffle: bool, seed: int, partial: str
) -> None:
    lengths = np.random.default_rng(seed).integers(1, 300, n)
    reads: list[int] = []

    def read(i: int) -> dict[str, Any]:
        reads.append(i)
        return {"index": np.array(i)}

    dataset = OutOfCoreDataset(range(n), read, cpu_memory_limit=16 * chunk)
    reads.clear()  # (the dataset reads a first sample when made, to know its rows)
    loader = FastSizeAwareLoader(
        dataset, lengths, 4096, buckets=[100, 200, 300], partial=partial, shuffle=shuffle, seed=seed
    )
    batches = [batch["index"].tolist() for batch in loader]
    # invariant: each item read once an epoch (its chunk read once), every item once in the batches
    assert sorted(reads) == list(range(n))
    real = [i for batch in batches for i in dict.fromkeys(batch)]
    assert sorted(real) == list(range(n)) and len(loader) == len(batches)
    groups = [group.tolist() for group in loader.order.chunks(0)]
    chunks, _ = bucket_loop(
        groups, lengths.tolist(), [100, 200, 300], loader.buckets.batch_sizes, partial=partial, per_group=True
    )
    # invariant: the batches are the plain loop's closing every bucket at the end of each chunk
    position = 0
    for planned in chunks:
        got = batches[position : position + len(planned)]
        assert sorted(got) == sorted(planned)
        position += len(planned)
    assert position == len(batches)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_dataset_read_in_chunks_lowers_and_resumes_exactly(shuffle: bool) -> None:
    lengths = np.random.default_rng(5).integers(1, 300, 400)

    def loader() -> FastSizeAwareLoader:
        rows = OutOfCoreDataset(range(400), lambda i: {"index": np.array(i)}, cpu_memory_limit=16 * 50)
        return FastSizeAwareLoader(rows, lengths, 4096, buckets=[100, 300], shuffle=shuffle, seed=2)

    first = loader()
    iterator = iter(first)
    done = [next(iterator)["index"].tolist() for _ in range(3)]
    first.lower_limit([max(size // 2, 1) for size in first.buckets.batch_sizes])
    done.append(next(iterator)["index"].tolist())
    state = first.state_dict()
    rest = [batch["index"].tolist() for batch in iterator]
    # invariant: every item once over the lowered epoch, and the lowered batches at most half as large
    assert sorted(i for batch in done + rest for i in dict.fromkeys(batch)) == list(range(400))
    assert all(len(batch) <= max(first.buckets.batch_sizes) // 2 for batch in done[3:] + rest)
    resumed = loader()
    resumed.load_state_dict(state)
    assert [batch["index"].tolist() for batch in resumed] == rest


def test_a_state_saved_without_pad_to_multiple_of_resumes_where_it_only_chose_the_lengths() -> None:
    # invariant: a multiple decides a bucket plan only through its bucket lengths: the state of the same
    # lengths saved without it resumes with it, the batches of the uninterrupted epoch
    options: dict[str, Any] = {"buckets": [64, 128, 256], "partial": "keep", "oversize": "own_batch", "seed": 1}

    def made(**more: Any) -> FastSizeAwareLoader:
        return FastSizeAwareLoader(Texts(LENGTHS), LENGTHS, 8192, collate_fn=PadCollator(), **options, **more)

    saved = made()
    iterator = iter(saved)
    next(iterator), next(iterator)
    resumed = made(pad_to_multiple_of=8)
    resumed.load_state_dict(saved.state_dict())
    rest = [batch["index"].tolist() for batch in resumed]
    assert rest == [batch["index"].tolist() for batch in made(pad_to_multiple_of=8)][2:]
    with pytest.raises(ValueError, match=r"pad_to_multiple_of was 8 when the state was saved and is None here"):
        made().load_state_dict(made(pad_to_multiple_of=8).state_dict())
