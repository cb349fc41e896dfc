from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from fastsab.bionemo import samplers as samplers_module
from fastsab.bionemo.buckets import BucketBatchSampler, create_buckets
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from tests.reference import running_sum_reference, seed_dataset

DATASET = seed_dataset()


def test_seed_example():
    sampler = SizeAwareBatchSampler(SequentialSampler(DATASET), lambda i: DATASET[i].numel(), 4)
    assert list(sampler) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    "sizeof",
    [
        lambda i: [3, 1, 2, 4, 1, 9, 2][i],
        {0: 3, 1: 1, 2: 2, 3: 4, 4: 1, 5: 9, 6: 2},
        [3, 1, 2, 4, 1, 9, 2],
        (3, 1, 2, 4, 1, 9, 2),
        np.array([3, 1, 2, 4, 1, 9, 2]),
        torch.tensor([3, 1, 2, 4, 1, 9, 2]),
    ],
    ids=["callable", "dict", "list", "tuple", "ndarray", "tensor"],
)
def test_every_sizeof_form_gives_the_greedy_batches(sizeof):
    warnings_seen = []
    sampler = SizeAwareBatchSampler(range(7), sizeof, 4, warn_logger=warnings_seen.append)
    assert list(sampler) == [[0, 1], [2], [3], [4, 6]]
    assert sampler.skipped == [5] and sampler.num_skipped == 1
    assert warnings_seen[0] == "Size of element 5 exceeds max_total_size (9 > 4), skipping"


def test_default_warn_logger_warns():
    with pytest.warns(UserWarning, match=r"Size of element 1 exceeds max_total_size \(9 > 4\), skipping"):
        list(SizeAwareBatchSampler(range(3), [1, 9, 1], 4))


def test_chunked_iteration_matches_loop_and_is_repeatable(monkeypatch):
    # invariant: chunk-by-chunk planning equals one greedy pass; two passes give the same batches
    monkeypatch.setattr(samplers_module, "CHUNK_SIZE", 97)
    rng = np.random.default_rng(0)
    sizes = rng.uniform(0, 10, 5000)
    order = rng.permutation(5000).tolist()
    sampler = SizeAwareBatchSampler(order, sizes, 37.5, warn_logger=None)
    expected = [[order[p] for p in batch] for batch in running_sum_reference(sizes[order].tolist(), 37.5)]
    assert list(sampler) == expected
    assert list(sampler) == expected


def test_callable_sizes_in_floats_match_loop():
    sizes = [0.1, 0.2, 0.3, 0.1, 0.2, 0.3]
    sampler = SizeAwareBatchSampler(range(6), lambda i: sizes[i], 0.3)
    assert list(sampler) == running_sum_reference(sizes, 0.3)


def test_random_sampler_covers_every_index_once():
    sizes = torch.randint(1, 10, (1000,))
    sampler = SizeAwareBatchSampler(RandomSampler(range(1000), generator=torch.Generator().manual_seed(0)), sizes, 30)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert all(int(sizes[b].sum()) <= 30 for b in batches)


def test_works_as_dataloader_batch_sampler_and_pickles():
    sampler = SizeAwareBatchSampler(range(5), [2, 2, 2, 2, 2], 4)
    loader = DataLoader(torch.arange(10, 15), batch_sampler=sampler)
    assert [b.tolist() for b in loader] == [[10, 11], [12, 13], [14]]
    clone = pickle.loads(pickle.dumps(SizeAwareBatchSampler(range(5), np.array([2, 2, 2, 2, 2]), 4)))
    assert list(clone) == [[0, 1], [2, 3], [4]]


def test_summary_logs():
    info = []
    list(SizeAwareBatchSampler(range(4), [1, 1, 1, 1], 2, info_logger=info.append))
    assert info[0].startswith("Batched 4 samples into 2 batches.")


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((5, [1], 3), TypeError, r"sampler must be a torch.utils.data.Sampler or an iterable of indices, got int"),
        (("abc", [1], 3), TypeError, r"sampler must be .* got str"),
        (
            (range(1), 3, 3),
            TypeError,
            r"sizeof must be a callable, a mapping, a sequence, a numpy array or a tensor, got int",
        ),
        ((range(1), [1], -1), ValueError, r"max_total_size must be a finite number >= 0, got -1"),
        ((range(1), [1], -2.5), ValueError, r"max_total_size must be a finite number >= 0, got -2.5"),
        ((range(1), [1], "3"), TypeError, r"max_total_size must be a real number, got '3'"),
        ((range(1), [1, -1], 3), ValueError, r"sizeof must be non-negative, got -1 at position 1"),
        ((range(1), [float("nan")], 3), ValueError, r"sizeof must be finite, got nan at position 0"),
    ],
)
def test_bad_constructor_arguments(args, error, message):
    with pytest.raises(error, match=message):
        SizeAwareBatchSampler(*args)


def test_non_numeric_budget_is_a_type_error_and_a_value_error_as_in_bionemo():
    for error in (TypeError, ValueError):
        with pytest.raises(error, match=r"max_total_size must be a real number, got '4'"):
            SizeAwareBatchSampler(range(3), [1, 1, 1], "4")


def test_bad_indices_and_sizes_during_iteration():
    with pytest.raises(IndexError, match=r"sampler yielded index 5, outside the 2 sizes of sizeof"):
        list(SizeAwareBatchSampler([0, 5], [1, 1], 3))
    with pytest.raises(IndexError, match=r"sampler yielded index -1"):
        list(SizeAwareBatchSampler([-1], [1, 1], 3))
    with pytest.raises(ValueError, match=r"sizeof must return a finite number >= 0, got -1 for the element 0"):
        list(SizeAwareBatchSampler([0], lambda i: -1, 3))
    with pytest.raises(RuntimeError, match=r"sizeof raised an error for index 0"):
        list(SizeAwareBatchSampler([0], lambda i: 1 / 0, 3))


# --- BucketBatchSampler and create_buckets -----------------------------------------------


def bucket_sampler(**kwargs):
    base = {
        "sizes": torch.arange(25),
        "bucket_boundaries": torch.tensor([0, 6, 15, 25]),
        "base_batch_sampler_class": BatchSampler,
        "base_batch_sampler_shared_kwargs": {"drop_last": False},
        "base_batch_sampler_individual_kwargs": {"batch_size": [2, 3, 5]},
        "shuffle": False,
    }
    base.update(kwargs)
    return BucketBatchSampler(**base)


def test_bucket_seed_example_and_len():
    sampler = bucket_sampler()
    expected = [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7, 8],
        [9, 10, 11],
        [12, 13, 14],
        [15, 16, 17, 18, 19],
        [20, 21, 22, 23, 24],
    ]
    assert list(sampler) == expected
    assert len(sampler) == 8


def test_bucket_shuffle_is_seeded_and_keeps_buckets():
    first = list(bucket_sampler(shuffle=True, generator=torch.Generator().manual_seed(0)))
    again = list(bucket_sampler(shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert first == again
    assert sorted(i for b in first for i in b) == list(range(25))
    bucket_of = {i: (0 if i < 6 else 1 if i < 15 else 2) for i in range(25)}
    assert all(len({bucket_of[i] for i in b}) == 1 for b in first)
    assert [len(b) for b in first if bucket_of[b[0]] == 2] == [5, 5]


def test_bucket_with_size_aware_base_sampler():
    sizes = torch.arange(25)
    sampler = bucket_sampler(
        base_batch_sampler_class=SizeAwareBatchSampler,
        base_batch_sampler_shared_kwargs={"sizeof": sizes.tolist().__getitem__, "max_total_size": 40},
        base_batch_sampler_individual_kwargs={},
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(25))
    assert all(sum(b) <= 40 for b in batches)


def test_empty_bucket_keeps_its_own_kwargs():
    # sizes leave the middle bucket empty: bucket 3 must still get batch_size 5
    sizes = torch.tensor([0, 1, 2, 20, 21, 22, 23, 24])
    sampler = bucket_sampler(sizes=sizes)
    assert list(sampler) == [[0, 1], [2], [3, 4, 5, 6, 7]]


def test_bucket_out_of_range_warns_and_all_out_raises():
    with pytest.warns(UserWarning, match="2 elements are outside the buckets provided and will be skipped"):
        sampler = bucket_sampler(sizes=torch.tensor([1, 2, 30, 40]))
    assert sampler.num_skipped == 2 and list(sampler) == [[0, 1]]
    with pytest.raises(ValueError, match=r"all 2 sizes lie outside the bucket ranges \[0, 6, 15, 25\]"):
        bucket_sampler(sizes=torch.tensor([30, 40]))
    with pytest.raises(RuntimeError, match="outside the bucket ranges"):  # as bionemo raises it
        bucket_sampler(sizes=torch.tensor([30, 40]))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sizes": [1, 2]}, TypeError, r"sizes must be a torch tensor or numpy array, got list"),
        ({"sizes": torch.ones(2, 2)}, ValueError, r"sizes must be 1-D, got shape \(2, 2\)"),
        ({"sizes": torch.tensor([True])}, ValueError, r"sizes must hold integers or floats, got dtype torch.bool"),
        (
            {"bucket_boundaries": torch.tensor([3])},
            ValueError,
            r"bucket_boundaries must have at least 2 values, got \[3\]",
        ),
        ({"bucket_boundaries": torch.tensor([0, 3, 3])}, ValueError, r"bucket_boundaries must not repeat a value"),
        (
            {"base_batch_sampler_class": list},
            TypeError,
            r"base_batch_sampler_class must be a subclass of torch.utils.data.Sampler",
        ),
        ({"base_batch_sampler_shared_kwargs": [1]}, TypeError, r"base_batch_sampler_shared_kwargs must be a dict"),
        (
            {"base_batch_sampler_individual_kwargs": {"batch_size": [2]}},
            ValueError,
            r"must have 3 entries \(one per bucket\), got lengths \{'batch_size': 1\}",
        ),
        ({"base_batch_sampler_individual_kwargs": {1: [2, 2, 2]}}, TypeError, r"must have string keys, got \[1\]"),
        ({"shuffle": 1}, TypeError, r"shuffle must be a bool, got 1"),
    ],
)
def test_bucket_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        bucket_sampler(**kwargs)


def test_create_buckets_seed_examples():
    sizes = torch.tensor([1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 22, 22, 22, 22])
    boundaries, counts = create_buckets(sizes, max_width=5, min_bucket_count=10)
    assert boundaries.tolist() == [1, 6, 11, 16, 21, 23] and counts.tolist() == [12, 0, 0, 0, 4]
    boundaries, counts = create_buckets(torch.arange(20), max_width=10, min_bucket_count=5)
    assert boundaries.tolist() == [0, 5, 10, 15, 20] and counts.tolist() == [5, 5, 5, 5]


def test_create_buckets_properties():
    # invariant: every size falls in exactly one bucket; counts match; widths <= max_width
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = torch.from_numpy(rng.integers(0, 200, rng.integers(1, 300)))
        max_width, min_count = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        boundaries, counts = create_buckets(sizes, max_width, min_count)
        assert bool((boundaries[1:] - boundaries[:-1] <= max_width).all())
        assert bool((boundaries[1:] > boundaries[:-1]).all())
        hist = torch.bucketize(sizes, boundaries, right=True) - 1
        assert torch.bincount(hist, minlength=len(counts)).tolist() == counts.tolist()


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((torch.tensor([1.5]), 2, 2), ValueError, r"sizes must hold integers, got dtype torch.float32"),
        ((torch.tensor([], dtype=torch.int64), 2, 2), ValueError, r"sizes must not be empty"),
        ((torch.tensor([1]), 0, 2), ValueError, r"max_width must be a positive integer, got 0"),
        ((torch.tensor([1]), 2, 1.5), TypeError, r"min_bucket_count must be an integer, got 1.5"),
    ],
)
def test_create_buckets_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        create_buckets(*args)


def test_every_skip_is_reported_for_float_sizes_past_2_53_and_an_integer_cap():
    # 2**53 + 4 > 2**53 + 3 exactly, while float(2**53 + 3) rounds up to 2**53 + 4
    messages: list[str] = []
    sampler = SizeAwareBatchSampler(range(3), [1.0, float(2**53 + 4), 1.0], 2**53 + 3, warn_logger=messages.append)
    assert list(sampler) == [[0, 2]]
    assert sampler.skipped == [1]
    assert len(messages) == 2
    assert messages[0] == "Size of element 1 exceeds max_total_size (9007199254740996.0 > 9007199254740995), skipping"


@pytest.mark.parametrize("name", samplers_module.__all__)
def test_every_name_of_fastsab_samplers_is_the_public_one(name):
    import fastsab
    from fastsab.bionemo import buckets
    from fastsab.loaders import planned

    home = buckets if name in buckets.__all__ else planned if name in planned.__all__ else samplers_module
    assert getattr(samplers_module, name) is getattr(home, name)
    if name in fastsab.__all__:
        assert getattr(fastsab, name) is getattr(home, name)
