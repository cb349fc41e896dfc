"""RaggedDataset: its sources, its checks, its batches against the collators, the loaders over it, pickling."""

from __future__ import annotations

import pickle
import threading
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fastsab import FastLoader, FastSizeAwareLoader, RaggedDataset
from fastsab.varlen.collate import PackCollator, PadCollator


def make_sequences(lengths: list[int]) -> list[np.ndarray]:
    """Sequence ``i`` holds distinct values that name it: ``1000 * i + position``."""
    return [np.arange(n, dtype=np.int64) + 1000 * i for i, n in enumerate(lengths)]


def ragged(lengths: list[int], collator: Any = None) -> RaggedDataset:
    sequences = make_sequences(lengths)
    return RaggedDataset.from_sequences(
        {"input_ids": sequences, "labels": [s + 1 for s in sequences]},
        collator=collator,
        per_sequence={"index": np.arange(len(lengths))},
    )


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert type(got[key]) is type(value) and got[key] == value, key


COLLATORS = [PadCollator(), PadCollator({"labels": -100}, pad_to_multiple_of=8), PackCollator()]


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    data=st.data(),
    collator=st.sampled_from(COLLATORS),
)
def test_a_gathered_batch_is_the_collated_samples(lengths, data, collator):
    dataset = ragged(lengths, collator)
    indices = data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=1, max_size=12))
    assert_same_batch(dataset.__getitems__(indices), collator([dataset[i] for i in indices]))


@given(
    shortest=st.integers(1, 15),
    data=st.data(),
    collator=st.sampled_from([PadCollator(), PadCollator({"labels": -1.5, "input_ids": 7}), PadCollator(3, 4)]),
    own_mask=st.booleans(),
)
def test_a_mostly_full_padded_batch_is_the_collated_samples(shortest, data, collator, own_mask):
    # lengths within a factor of two: at least half the cells of a batch are tokens (without a multiple)
    lengths = data.draw(st.lists(st.integers(shortest, 2 * shortest), min_size=1, max_size=30))
    sequences = make_sequences(lengths)
    columns = {
        "input_ids": [(s % 60_000).astype(np.uint16) for s in sequences],
        "labels": [s.astype(np.float32) / 2 for s in sequences],
        "positions": [np.arange(len(s), dtype=np.int64) - 3 for s in sequences],
    }
    if own_mask:
        columns["attention_mask"] = [np.ones(len(s), dtype=np.int8) for s in sequences]
    dataset = RaggedDataset.from_sequences(columns, collator=collator, per_sequence={"index": np.arange(len(lengths))})
    indices = data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=1, max_size=12))
    indices.append(len(lengths) - 1)  # the last sequence: the cells after it lie past the end of the values
    assert_same_batch(dataset.__getitems__(indices), collator([dataset[i] for i in indices]))


def test_padded_gather_reads_rows_only_of_mostly_full_batches_of_numpy_values():
    collator = PadCollator(-1)
    flat = {"input_ids": np.arange(10)}
    batch = collator._gather_rows(flat, np.array([2, 8, 10]), np.array([3, 2, 0]), {"id": torch.tensor([4, 5, 6])})
    assert batch is not None and list(batch) == ["input_ids", "id", "attention_mask"]
    assert batch["input_ids"].tolist() == [[2, 3, 4], [8, 9, -1], [-1, -1, -1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]] and batch["id"].tolist() == [4, 5, 6]
    assert collator._gather_rows(flat, np.array([0, 9, 9]), np.array([4, 0, 0]), {}) is None  # 4 tokens in 12 cells
    # rows past the end of the values, also rows wider than all of them, and values that are not contiguous
    for values, starts, lengths, want in [
        (np.arange(3), [0, 1, 2], [1, 1, 1], [[0, -1], [1, -1], [2, -1]]),
        (np.arange(1), [0], [1], [[0, -1]]),
        (np.arange(10)[::-3], [1, 0], [3, 2], [[6, 3, 0, -1], [9, 6, -1, -1]]),
        (np.zeros(0, dtype=np.int64), [0, 0], [0, 0], [[], []]),
    ]:
        multiple = PadCollator(-1, pad_to_multiple_of=2)
        batch = multiple._gather_rows({"input_ids": values}, np.array(starts), np.array(lengths), {})
        assert batch is not None and batch["input_ids"].tolist() == want
        assert batch["attention_mask"].tolist() == [[int(x >= 0) for x in row] for row in want]
    assert collator._gather_rows({"input_ids": torch.arange(10.0).bfloat16()}, np.array([0]), np.array([4]), {}) is None
    with pytest.raises(ValueError, match=r"pad_value -1 of key 'input_ids' does not fit its dtype uint8"):
        collator._gather_rows({"input_ids": np.arange(10, dtype=np.uint8)}, np.array([0]), np.array([4]), {})


def test_items_are_the_sequences():
    dataset = ragged([3, 0, 2])
    assert dataset[0]["input_ids"].tolist() == [0, 1, 2] and dataset[0]["labels"].tolist() == [1, 2, 3]
    assert dataset[1]["input_ids"].tolist() == [] and dataset[2]["index"].item() == 2
    assert dataset.lengths.tolist() == [3, 0, 2] and dataset.lengths.dtype == np.int64


def test_sources_flat_offsets_tensors_arrays_and_lists_give_the_same_batches():
    lengths = [4, 1, 0, 3]
    sequences = make_sequences(lengths)
    flat = np.concatenate(sequences)
    offsets = np.array([0, 4, 5, 5, 8])
    datasets = [
        RaggedDataset(flat, offsets),
        RaggedDataset(torch.from_numpy(flat), torch.from_numpy(offsets)),
        RaggedDataset({"input_ids": flat}, offsets.tolist()),
        RaggedDataset(flat, offsets.astype(np.uint32)),
        RaggedDataset.from_sequences(sequences),
        RaggedDataset.from_sequences([torch.from_numpy(s) for s in sequences]),
        RaggedDataset.from_sequences([s.tolist() for s in sequences]),
    ]
    want = PadCollator()([{"input_ids": torch.from_numpy(s)} for s in sequences])
    for dataset in datasets:
        assert_same_batch(dataset.__getitems__([0, 1, 2, 3]), want)


@pytest.mark.parametrize(
    ("offsets", "error", "match"),
    [
        ([[0, 2], [2, 4]], ValueError, r"offsets must be one-dimensional, got shape \(2, 2\)"),
        ([0.0, 2.0, 4.0], TypeError, r"offsets must be integers, got dtype float64: \[0.0, 2.0, 4.0\]"),
        ([], ValueError, r"offsets must hold n \+ 1 >= 1 entries \(the first is 0\), got \[\]"),
        ([1, 2, 4], ValueError, r"offsets must start at 0, got offsets\[0\] = np.int64\(1\)"),
        (
            [0, 3, 2, 4],
            ValueError,
            r"offsets must be non-decreasing, got offsets\[2\] = np.int64\(2\) after offsets\[1\]",
        ),
        ([0, 2, 3], ValueError, r"offsets must end at the length of the values, 4, got offsets\[-1\] = np.int64\(3\)"),
        ([0, 2, 5], ValueError, r"offsets must end at the length of the values, 4, got offsets\[-1\] = np.int64\(5\)"),
    ],
)
def test_bad_offsets_are_named(offsets, error, match):
    with pytest.raises(error, match=match):
        RaggedDataset(np.arange(4), offsets)


def test_bad_values_and_options_are_named():
    with pytest.raises(ValueError, match=r"values\['input_ids'\] must be one-dimensional, got shape \(2, 2\)"):
        RaggedDataset(np.zeros((2, 2)), [0, 2])
    with pytest.raises(
        TypeError, match=r"values\['input_ids'\] must be a tensor or a numpy array, got \[1, 2\] of type list"
    ):
        RaggedDataset([1, 2], [0, 2])
    with pytest.raises(ValueError, match=r"values must have one length for every key .*'input_ids': 3, 'labels': 2"):
        RaggedDataset({"input_ids": np.arange(3), "labels": np.arange(2)}, [0, 3])
    with pytest.raises(ValueError, match=r"per_sequence\['y'\] has 3 values for 2 sequences"):
        RaggedDataset(np.arange(3), [0, 1, 3], per_sequence={"y": np.arange(3)})
    with pytest.raises(TypeError, match=r"collator must be a PadCollator or a PackCollator, got 'padded' of type str"):
        RaggedDataset(np.arange(3), [0, 3], collator="padded")
    with pytest.raises(ValueError, match=r"PackCollator makes the key 'position_ids'; rename that column"):
        RaggedDataset({"input_ids": np.arange(3), "position_ids": np.arange(3)}, [0, 3], collator=PackCollator())
    with pytest.raises(ValueError, match=r"sequences\[1\] must be one-dimensional, got shape \(1, 2\): \[\[1, 2\]\]"):
        RaggedDataset.from_sequences([[1], [[1, 2]]])
    with pytest.raises(ValueError, match=r"sequences\['labels'\] differ in number or length"):
        RaggedDataset.from_sequences({"input_ids": [[1, 2], [3]], "labels": [[1], [2, 3]]})
    with pytest.raises(TypeError, match=r"sequences must be a list of sequences, got 'abc' of type str"):
        RaggedDataset.from_sequences("abc")


def test_bad_indices_are_named():
    dataset = ragged([2, 3])
    with pytest.raises(IndexError, match=r"index 2 is out of range for 2 sequences: indices must be in \[0, 2\)"):
        dataset.__getitems__([0, 2])
    with pytest.raises(IndexError, match=r"index -1 is out of range for 2 sequences"):
        dataset[-1]
    with pytest.raises(TypeError, match=r"index must be an integer, got 0.5 of type float"):
        dataset[0.5]
    with pytest.raises(TypeError, match=r"indices must be integers, got dtype float64: \[0.5\]"):
        dataset.__getitems__([0.5])


def test_empty_sequences_padded_and_packed():
    padded = ragged([0, 2, 0])
    batch = padded.__getitems__([0, 2])
    assert batch["input_ids"].shape == (2, 0) and batch["attention_mask"].shape == (2, 0)
    assert batch["index"].tolist() == [0, 2]
    packed = ragged([0, 2, 0], PackCollator())
    batch = packed.__getitems__([0, 1, 2])
    assert batch["cu_seqlens"].tolist() == [0, 0, 2, 2] and batch["max_seqlen"] == 2
    assert batch["input_ids"].tolist() == [1000, 1001] and batch["position_ids"].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("sequences", "dtype"),
    [
        ([np.zeros(0, np.float32), np.zeros(0, np.float32)], torch.float32),
        ([torch.zeros(0), torch.zeros(0)], torch.float32),
        ([torch.zeros(0, dtype=torch.int16), []], torch.int16),  # a list has no dtype of its own
        ([np.zeros(0, np.uint8), torch.zeros(0, dtype=torch.float64)], torch.float64),  # promoted, as when filled
        ([[], []], torch.int64),
        ([np.zeros(0, np.float32), [1.5]], torch.float64),  # filled sequences decide, as before
    ],
)
def test_a_column_of_empty_sequences_keeps_their_dtype(sequences, dtype):
    for collator in (PadCollator(), PackCollator()):
        data = RaggedDataset.from_sequences(sequences, collator=collator)
        assert data.__getitems__([0, 1])["input_ids"].dtype == dtype
    keyed = RaggedDataset.from_sequences({"input_ids": [[1], []], "weights": [np.ones(1, np.float16), []]})
    assert keyed.__getitems__([1])["weights"].dtype == torch.float16


def test_sequences_of_a_dtype_numpy_lacks_are_refused_with_the_way_that_takes_them():
    sequences = [torch.tensor([1.5, 2.0], dtype=torch.bfloat16), torch.tensor([3.0], dtype=torch.bfloat16)]
    with pytest.raises(TypeError, match=r"sequences\[0\] is a tensor of dtype torch.bfloat16, which numpy cannot hold"):
        RaggedDataset.from_sequences(sequences)
    data = RaggedDataset(torch.cat(sequences), torch.tensor([0, 2, 3]), collator=PadCollator())
    batch = data.__getitems__([1, 0])
    assert batch["input_ids"].dtype == torch.bfloat16
    assert batch["input_ids"].tolist() == [[3.0, 0.0], [1.5, 2.0]]


def sequences_of(batch: dict[str, Any]) -> dict[int, list[int]]:
    """Sequence index -> its tokens, read back from a padded or a packed batch."""
    if "cu_seqlens" in batch:
        cu = batch["cu_seqlens"].tolist()
        tokens = batch["input_ids"].tolist()
        return {i: tokens[cu[b] : cu[b + 1]] for b, i in enumerate(batch["index"].tolist())}
    mask = batch["attention_mask"].bool()
    return {i: batch["input_ids"][b][mask[b]].tolist() for b, i in enumerate(batch["index"].tolist())}


@pytest.mark.parametrize("collator", [PadCollator(), PackCollator()])
@pytest.mark.parametrize("world_size", [1, 2])
def test_size_aware_loader_yields_every_sequence_once_within_the_token_budget(collator, world_size):
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(3, 1, 500), 0, 200).astype(int).tolist()
    lengths[:3] = [0, 0, 0]
    dataset = ragged(lengths, collator)
    want = {i: s.tolist() for i, s in enumerate(make_sequences(lengths))}
    seen: list[int] = []
    for rank in range(world_size):
        loader = FastSizeAwareLoader(
            dataset, dataset.lengths, 400, cost="sum", seed=3, rank=rank, world_size=world_size, even_batches="drop"
        )
        planned, n_batches = len(loader), 0
        for batch in loader:
            n_batches += 1
            found = sequences_of(batch)
            assert all(found[i] == want[i] for i in found)
            assert sum(len(tokens) for tokens in found.values()) <= 400
            if "cu_seqlens" in batch:
                assert len(batch["input_ids"]) == batch["cu_seqlens"][-1]  # no padded token at all
            seen += list(found)
        assert n_batches == planned == loader.stats.num_batches
        dropped = [int(i) for i in loader.stats.dropped]
    assert sorted(seen + dropped) == list(range(len(lengths)))


@pytest.mark.parametrize("collator", [PadCollator(), PackCollator()])
def test_fixed_loader_and_worker_processes_yield_every_sequence_once(collator):
    lengths = [5, 0, 3, 9, 1, 7, 2, 2, 4, 6, 8]
    dataset = ragged(lengths, collator)
    loader = FastLoader(dataset, batch_size=3, seed=1)
    assert sorted(i for batch in loader for i in sequences_of(batch)) == list(range(len(lengths)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a multi-threaded process
        workers = FastSizeAwareLoader(dataset, dataset.lengths, 12, seed=2).data_loader(num_workers=2)
        assert sorted(i for batch in workers for i in sequences_of(batch)) == list(range(len(lengths)))


def test_batches_are_made_in_the_loop_thread_by_default_and_are_the_same_with_a_prefetch_thread(tmp_path):
    lengths = np.clip(np.random.default_rng(1).lognormal(3, 1, 300), 0, 150).astype(int).tolist()
    for collator in COLLATORS:
        dataset = ragged(lengths, collator)
        assert dataset.getitems_in_memory
        for world_size, rank in [(1, 0), (2, 0), (2, 1)]:
            for sort_window in (None, 64):
                sized = {
                    prefetch: FastSizeAwareLoader(
                        dataset, dataset.lengths, 500, cost="sum", seed=4, sort_window=sort_window,
                        rank=rank, world_size=world_size, prefetch=prefetch,
                    )
                    for prefetch in (None, 0, 2)
                }  # fmt: skip
                fixed = {
                    prefetch: FastLoader(dataset, 7, seed=4, rank=rank, world_size=world_size, prefetch=prefetch)
                    for prefetch in (None, 0, 2)
                }
                for loaders in (sized, fixed):
                    with_thread = list(loaders[2])
                    for prefetch in (None, 0):
                        batches = []
                        for batch in loaders[prefetch]:
                            assert not [t for t in threading.enumerate() if t.name == "fastsab-prefetch"]
                            batches.append(batch)
                        assert len(batches) == len(with_thread) > 0
                        for got, want in zip(batches, with_thread):
                            assert_same_batch(got, want)
    tokens, offsets, _ = write_token_file(tmp_path, [3, 0, 5])
    assert not RaggedDataset.from_memmap(tokens, offsets).getitems_in_memory  # may wait on the disk


def test_pickled_dataset_gives_the_same_batches():
    for collator in COLLATORS:
        dataset = ragged([3, 0, 5, 2], collator)
        copy = pickle.loads(pickle.dumps(dataset))
        assert_same_batch(copy.__getitems__([3, 1, 2]), dataset.__getitems__([3, 1, 2]))


def write_token_file(tmp_path, lengths: list[int]) -> tuple[Any, Any, list[np.ndarray]]:
    sequences = [(s % 60000).astype(np.uint16) for s in make_sequences(lengths)]
    tokens = tmp_path / "tokens.bin"
    np.concatenate(sequences).tofile(tokens)
    offsets = tmp_path / "offsets.npy"
    np.save(offsets, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    return tokens, offsets, sequences


@pytest.mark.parametrize("collator", [PadCollator(), PackCollator()])
def test_memory_mapped_token_file(tmp_path, collator):
    lengths = [50_000, 0, 30_000, 20_000]
    tokens, offsets, sequences = write_token_file(tmp_path, lengths)
    dataset = RaggedDataset.from_memmap(tokens, offsets, dtype=np.uint16, collator=collator)
    assert isinstance(dataset.values["input_ids"], np.memmap) and isinstance(dataset.offsets, np.memmap)
    want = collator([{"input_ids": torch.from_numpy(sequences[i])} for i in (2, 1, 0)])
    assert_same_batch(dataset.__getitems__([2, 1, 0]), want)
    assert dataset.__getitems__([0])["input_ids"].dtype == torch.uint16
    pickled = pickle.dumps(dataset)
    assert len(pickled) < 10_000  # the file name, not its 200,000 bytes
    copy = pickle.loads(pickled)
    assert isinstance(copy.values["input_ids"], np.memmap) and isinstance(copy.offsets, np.memmap)
    assert_same_batch(copy.__getitems__([2, 1, 0]), want)
    npy = tmp_path / "tokens.npy"
    np.save(npy, np.concatenate(sequences))
    assert_same_batch(RaggedDataset.from_memmap(npy, offsets, collator=collator).__getitems__([2, 1, 0]), want)
    two_keys = RaggedDataset.from_memmap({"input_ids": tokens, "labels": npy}, offsets, collator=collator)
    assert torch.equal(two_keys.__getitems__([2])["labels"], two_keys.__getitems__([2])["input_ids"])


def test_hugging_face_columns():
    datasets = pytest.importorskip("datasets")
    lengths = [3, 0, 5, 2, 4]
    sequences = [s.tolist() for s in make_sequences(lengths)]
    columns = {"input_ids": sequences, "labels": [[t + 1 for t in s] for s in sequences], "index": list(range(5))}
    tokens = datasets.Sequence(datasets.Value("int64"))
    features = datasets.Features({"input_ids": tokens, "labels": tokens, "index": datasets.Value("int64")})
    table = datasets.Dataset.from_dict(columns, features=features)
    small = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int16"))})
    narrow = RaggedDataset.from_hf(datasets.Dataset.from_dict({"input_ids": sequences[:1]}, features=small))
    assert narrow.__getitems__([0])["input_ids"].dtype == torch.int16  # the column's own dtype
    for collator in (PadCollator(), PackCollator()):
        dataset = RaggedDataset.from_hf(table, ["input_ids", "labels"], per_sequence=["index"], collator=collator)
        assert dataset.lengths.tolist() == lengths
        want = ragged(lengths, collator).__getitems__([4, 1, 0])
        assert_same_batch(dataset.__getitems__([4, 1, 0]), want)
    shuffled = table.shuffle(seed=0).select([0, 1, 2])
    dataset = RaggedDataset.from_hf(shuffled, "input_ids", per_sequence=["index"])
    order = shuffled["index"]
    assert dataset.lengths.tolist() == [lengths[i] for i in order]
    assert dataset[1]["input_ids"].tolist() == sequences[order[1]]
    with pytest.raises(TypeError, match=r"column 'index' must be a list column"):
        RaggedDataset.from_hf(table, ["index"])
    with pytest.raises(TypeError, match=r"dataset must be a Hugging Face datasets.Dataset, got \[1\] of type list"):
        RaggedDataset.from_hf([1])
    with_gap = datasets.Dataset.from_dict({"input_ids": [[1], None]})
    with pytest.raises(ValueError, match=r"column 'input_ids' has 1 missing rows"):
        RaggedDataset.from_hf(with_gap)


def test_hugging_face_fixed_length_columns():
    # a Sequence of a fixed length (tokenized with padding="max_length") is a fixed-size list in Arrow
    datasets = pytest.importorskip("datasets")
    rows = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"), length=3)})
    table = datasets.Dataset.from_dict({"input_ids": rows}, features=features)
    for part, order in ((table, [0, 1, 2, 3]), (table.select([3, 1]), [3, 1]), (table.select(range(1, 3)), [1, 2])):
        dataset = RaggedDataset.from_hf(part, collator=PackCollator())
        assert dataset.lengths.tolist() == [3] * len(order)
        assert [dataset[i]["input_ids"].tolist() for i in range(len(order))] == [rows[i] for i in order]
        assert dataset.__getitems__([0])["input_ids"].dtype == torch.int32


def test_the_collator_is_checked_against_the_keys_and_dtypes_when_the_dataset_is_made():
    with pytest.raises(ValueError, match=r"pad_value names \['label'\], which are not per-token keys"):
        RaggedDataset(np.arange(3), [0, 3], collator=PadCollator({"label": -100}))
    with pytest.raises(ValueError, match=r"pad_value -100 of key 'labels' does not fit its dtype uint16"):
        RaggedDataset({"labels": np.arange(3, dtype=np.uint16)}, [0, 3], collator=PadCollator({"labels": -100}))
