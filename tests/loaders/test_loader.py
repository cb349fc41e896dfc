from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import re
import threading
import time
import tracemalloc
import warnings
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fastsab import FastLoader, FastSizeAwareLoader, split_batches
from fastsab.loaders.dataloader_keywords import advice_for, keyword_list
from fastsab.memory import PolynomialRegression
from tests.reference import running_sum_reference

N = 1000
LENGTHS = np.random.default_rng(0).integers(1, 50, N)
BUDGET = 200


class GetItems(Dataset):
    """A map-style dataset with __getitems__ returning a list of samples."""

    def __init__(self, n: int, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.n, self.fail_at, self.delay = n, fail_at, delay
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.tensor(i), "y": torch.tensor(2 * i)}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.fail_at is not None and self.fail_at in indices:
            raise KeyError(f"cannot read {self.fail_at}")
        return [self[i] for i in indices]


class PerItem(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def batch_ids(batch) -> list[int]:
    if isinstance(batch, dict):
        return batch["x"].tolist()
    if isinstance(batch, (tuple, list)):
        return batch_ids(batch[0])
    return batch.tolist()


def loaders(**kwargs):
    """The loaders the shared suite runs: fixed-size and size-aware, over several datasets."""
    data = torch.arange(N)
    return {
        "fast-tensor": FastLoader(data, 64, **kwargs),
        "fast-getitems": FastLoader(GetItems(N), 64, **kwargs),
        "sized-tensor": FastSizeAwareLoader(data, LENGTHS, BUDGET, **kwargs),
        "sized-getitems": FastSizeAwareLoader(GetItems(N), torch.from_numpy(LENGTHS), BUDGET, **kwargs),
        "sized-padded": FastSizeAwareLoader(data, LENGTHS, BUDGET, cost="padded", **kwargs),
    }


LOADER_NAMES = list(loaders())


@pytest.fixture(params=LOADER_NAMES)
def loader_name(request):
    return request.param


@pytest.mark.parametrize("group_size", [7, 64, 2**16])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_once_per_epoch(loader_name, group_size, shuffle):
    # invariant: every index appears exactly once per epoch (none is oversize here)
    loader = loaders(group_size=group_size, shuffle=shuffle)[loader_name]
    for _ in range(2):
        seen = [i for batch in loader for i in batch_ids(batch)]
        assert sorted(seen) == list(range(N))
        assert loader.stats.num_items == N and loader.stats.num_skipped == 0
    if not shuffle:
        assert seen == list(range(N))


def test_no_batch_over_budget_and_greedy_batches():
    # invariant: the loader yields exactly the greedy batches of its epoch order
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, group_size=50, seed=3)
    order = loader.order.permutation.permutation(0)
    expected = [[int(order[p]) for p in b] for b in running_sum_reference(LENGTHS[order].tolist(), BUDGET)]
    assert [b.tolist() for b in loader] == expected
    assert all(LENGTHS[b].sum() <= BUDGET for b in expected)


def test_padded_and_multi_limit_budgets():
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, cost="padded", max_batch_size=16)
    for batch in loader:
        assert len(batch) * LENGTHS[batch.numpy()].max() <= BUDGET and len(batch) <= 16
    two = np.stack([LENGTHS, LENGTHS[::-1]], axis=1)
    loader = FastSizeAwareLoader(torch.arange(N), two, [BUDGET, 150])
    batches = [b.numpy() for b in loader]
    assert sorted(np.concatenate(batches).tolist()) == list(range(N))
    assert all(two[b, 0].sum() <= BUDGET and two[b, 1].sum() <= 150 for b in batches)


def test_same_seed_and_epoch_same_batches(loader_name):
    # invariant: the order depends only on (seed, epoch)
    first, second = loaders(seed=5)[loader_name], loaders(seed=5)[loader_name]
    epoch0 = [batch_ids(b) for b in first]
    assert epoch0 == [batch_ids(b) for b in second]
    epoch1 = [batch_ids(b) for b in first]  # a new iter() starts the next epoch
    assert epoch1 != epoch0
    second.set_epoch(1)
    assert [batch_ids(b) for b in second] == epoch1
    other_seed = loaders(seed=6)[loader_name]
    assert [batch_ids(b) for b in other_seed] != epoch0


def test_len_is_exact_before_iteration(loader_name):
    loader = loaders(group_size=100)[loader_name]
    for epoch in range(3):
        loader.set_epoch(epoch)
        expected = len(loader)
        batches = list(loader)
        assert len(batches) == expected == loader.stats.num_batches


def test_fixed_size_batches_and_drop_last():
    loader = FastLoader(torch.arange(10), 4, shuffle=False, group_size=3)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropping = FastLoader(torch.arange(10), 4, shuffle=False, group_size=3, drop_last=True)
    assert len(dropping) == 2
    assert [b.tolist() for b in dropping] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dropping.stats.num_dropped == 2


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastsab-prefetch"]


def test_early_break_leaves_no_thread():
    loader = FastLoader(GetItems(N, delay=0.001), 8, prefetch=3)
    for i, _ in enumerate(loader):
        assert prefetch_threads()
        if i == 2:
            break
    assert not prefetch_threads()
    iterator = iter(loader)
    next(iterator)
    iterator.close()
    assert not prefetch_threads()


def test_error_in_the_loop_body_stops_the_thread():
    loader = FastLoader(GetItems(N, delay=0.001), 8, prefetch=3)
    with pytest.raises(RuntimeError, match="the step failed"):
        for i, _ in enumerate(loader):
            if i == 2:
                raise RuntimeError("the step failed")
    assert not prefetch_threads()


def test_error_in_fetch_propagates_and_stops_thread():
    loader = FastLoader(GetItems(100, fail_at=50), 10, shuffle=False, prefetch=2)
    with pytest.raises(KeyError, match="cannot read 50"):
        list(loader)
    assert not prefetch_threads()


def test_prefetch_gives_same_batches():
    plain = [batch_ids(b) for b in FastLoader(GetItems(N), 32, prefetch=0)]
    assert [batch_ids(b) for b in FastLoader(GetItems(N), 32, prefetch=4)] == plain


class InMemoryGetItems(GetItems):
    """GetItems declaring its ``__getitems__`` an in-memory gather; records the thread of each call."""

    getitems_in_memory = True

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.threads: set[int] = set()

    def __getitems__(self, indices: list[int]) -> list[dict]:
        self.threads.add(threading.get_ident())
        return super().__getitems__(indices)


class FetchingGetItems(InMemoryGetItems):
    getitems_in_memory = False


@pytest.mark.parametrize(
    ("dataset_class", "prefetch", "in_loop_thread"),
    [
        (InMemoryGetItems, None, True),  # prefetch=None chooses 0
        (FetchingGetItems, None, False),  # prefetch=None chooses 2
        (InMemoryGetItems, 2, False),  # an explicit prefetch wins
        (FetchingGetItems, 0, True),
    ],
)
def test_datasets_declaring_an_in_memory_getitems_are_not_prefetched_in_a_thread_by_default(
    dataset_class, prefetch, in_loop_thread
):
    for make in (
        lambda data: FastLoader(data, 32, prefetch=prefetch, seed=1),
        lambda data: FastSizeAwareLoader(data, LENGTHS, BUDGET, prefetch=prefetch, seed=1),
    ):
        dataset = dataset_class(N)
        got = [batch_ids(b) for b in make(dataset)]
        assert (dataset.threads == {threading.get_ident()}) is in_loop_thread
        assert got == [batch_ids(b) for b in make(GetItems(N))]


def test_an_in_memory_getitems_still_runs_in_worker_processes_when_asked():
    loader = FastLoader(InMemoryGetItems(64), 8, seed=1, num_workers=1)
    assert loader.num_workers == 1 and loader.fetcher.in_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a multi-threaded process
        got = [batch_ids(b) for b in loader]
    assert not loader.dataset.threads  # every batch was fetched in a worker process
    assert got == [batch_ids(b) for b in FastLoader(GetItems(64), 8, seed=1)]


def test_device_cpu_with_and_without_pinning():
    data = {"x": torch.arange(20), "f": torch.ones(20, 3)}
    plain = FastLoader(data, 5, device="cpu", seed=1)
    batches = list(plain)
    assert all(b["x"].device.type == "cpu" and b["f"].shape == (5, 3) for b in batches)
    with pytest.warns(UserWarning, match="pin_memory=True has no effect: no accelerator is available"):
        pinned = FastLoader(data, 5, device="cpu", seed=1, pin_memory=True)
    assert [b["x"].tolist() for b in pinned] == [b["x"].tolist() for b in batches]


Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    y: np.ndarray
    name: str = "s"


@pytest.mark.parametrize(
    "dataset",
    [
        torch.arange(N),
        np.arange(N),
        {"x": torch.arange(N), "y": {"z": torch.arange(N) * 2}},
        (torch.arange(N), torch.arange(N) * 2),
        Pair(torch.arange(N), torch.arange(N) * 2),
        TensorDataset(torch.arange(N), torch.arange(N) * 2),
    ],
    ids=["tensor", "ndarray", "dict", "tuple", "namedtuple", "TensorDataset"],
)
def test_pytree_datasets_are_gathered(dataset):
    loader = FastLoader(dataset, 100, seed=2)
    assert loader.fetcher.kind == "gather"
    seen = []
    for batch in loader:
        ids = batch_ids(batch)
        seen += ids
        if isinstance(batch, dict):
            assert batch["y"]["z"].tolist() == [2 * i for i in ids]
        elif isinstance(batch, (tuple, list)):
            assert batch[1].tolist() == [2 * i for i in ids]
            if isinstance(dataset, Pair):
                assert isinstance(batch, Pair)
    assert sorted(seen) == list(range(N))


def test_dataclass_pytree_and_gather_per_batch():
    dataset = Sample(torch.arange(N), np.arange(N) * 3)
    for chunk_bytes in (0, 2**20):  # per-batch gathers, then whole-chunk gathers
        batches = list(FastLoader(dataset, 100, seed=4, chunk_bytes=chunk_bytes))
        assert all(isinstance(b, Sample) and b.name == "s" for b in batches)
        assert all((b.y == b.x.numpy() * 3).all() for b in batches)
        assert sorted(torch.cat([b.x for b in batches]).tolist()) == list(range(N))


def test_getitems_datasets():
    batches = list(FastLoader(GetItems(10), 4, shuffle=False))
    assert [b["y"].tolist() for b in batches] == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]

    class Batched(Dataset):
        def __len__(self):
            return 10

        def __getitems__(self, indices):
            return torch.tensor(indices) * 10

    assert [b.tolist() for b in FastLoader(Batched(), 5, shuffle=False)] == [[0, 10, 20, 30, 40], [50, 60, 70, 80, 90]]


def test_getitems_wrong_count_is_an_error():
    class Short(GetItems):
        def __getitems__(self, indices):
            return super().__getitems__(indices)[:-1]

    class ShortBatch(GetItems):
        def __getitems__(self, indices):
            return torch.zeros(len(indices) + 1)

    with pytest.raises(ValueError, match=r"Short.__getitems__ returned 3 samples for 4 indices"):
        list(FastLoader(Short(8), 4, prefetch=0))
    with pytest.raises(ValueError, match=r"ShortBatch.__getitems__ returned a batch of 5 rows for 4 indices"):
        list(FastLoader(ShortBatch(8), 4, prefetch=0))


def test_per_item_dataset_works_with_a_warning():
    with pytest.warns(UserWarning, match="dataset PerItem is read item by item"):
        loader = FastLoader(PerItem(20), 6, shuffle=False)
    assert next(b.tolist() for b in loader) == [0, 1, 2, 3, 4, 5]
    with pytest.warns(UserWarning, match="dataset list is read item by item"):
        lists = FastLoader([torch.tensor([i, i]) for i in range(4)], 2, shuffle=False, collate_fn=torch.stack)
    assert [b.tolist() for b in lists] == [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]


def test_dataloader_batch_sampler_path():
    loader = FastSizeAwareLoader(GetItems(N), LENGTHS, BUDGET, seed=9)
    sampler = loader.batch_sampler()
    assert len(sampler) == len(loader)
    planned = list(sampler)
    assert planned == [batch_ids(b) for b in loader]
    assert sorted(i for b in planned for i in b) == list(range(N))
    sampler.set_epoch(0)
    dataloader = DataLoader(GetItems(N), batch_sampler=sampler, num_workers=2)
    assert [b["x"].tolist() for b in dataloader] == planned


def test_sizeof_forms_agree():
    data = torch.arange(N)
    lengths_t = torch.from_numpy(LENGTHS)

    class Doubler(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    reference = [b.tolist() for b in FastSizeAwareLoader(data, LENGTHS, BUDGET, seed=1)]
    forms = [
        lengths_t,
        LENGTHS.tolist(),
        lambda ids: LENGTHS[ids],
    ]
    for sizeof in forms:
        assert [b.tolist() for b in FastSizeAwareLoader(data, sizeof, BUDGET, seed=1)] == reference
    with pytest.warns(UserWarning, match="sizeof is called once per item, which is slow"):
        per_item = FastSizeAwareLoader(data, lambda i: int(LENGTHS.tolist()[i]), BUDGET, seed=1)
    assert [b.tolist() for b in per_item] == reference
    model = FastSizeAwareLoader(data, Doubler(), 2 * BUDGET, features=lengths_t.double(), seed=1)
    assert [b.tolist() for b in model] == reference


def test_skipped_items_are_counted_and_warned():
    lengths = LENGTHS.copy()
    lengths[[3, 500]] = BUDGET + 1
    loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET)
    with pytest.warns(UserWarning, match="2 items were larger than max_total_size and were skipped in epoch 0"):
        seen = [i for b in loader for i in b.tolist()]
    assert sorted(loader.stats.skipped) == [3, 500] and loader.stats.num_skipped == 2
    assert sorted(seen + loader.stats.skipped) == list(range(N))
    own = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, oversize="own_batch", shuffle=False)
    assert [3] in [b.tolist() for b in own]
    with pytest.raises(ValueError, match=r"item 3 has cost 201 above max_total_size 200"):
        list(FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, oversize="error", shuffle=False))


def test_empty_dataset_gives_no_batches():
    assert list(FastLoader(torch.arange(0), 4)) == [] and len(FastLoader(torch.arange(0), 4)) == 0
    sized = FastSizeAwareLoader(torch.arange(0), np.zeros(0), 4)
    assert len(sized) == 0 and list(sized) == []


def test_loaders_pickle_and_keep_their_plan():
    for name, loader in loaders(seed=3).items():
        clone = pickle.loads(pickle.dumps(loader))
        assert [batch_ids(b) for b in clone] == [batch_ids(b) for b in loader], name


def test_a_copy_taken_mid_epoch_after_a_lowering_resumes_as_the_original():
    loader = FastLoader(torch.arange(12), 4, shuffle=False)
    batches = iter(loader)
    next(batches)
    loader.lower_limit(2)
    next(batches)
    clone = copy.deepcopy(loader)
    assert clone.state_dict() == loader.state_dict()
    resumed = FastLoader(torch.arange(12), 4, shuffle=False)
    resumed.load_state_dict(pickle.loads(pickle.dumps(clone)).state_dict())
    assert [b.tolist() for b in resumed] == [[6, 7], [8, 9], [10, 11]]


def test_first_batch_of_a_huge_epoch_is_fast_and_small():
    # 10**8 items: the first batch needs one shuffle group, not the whole order
    class Synthetic(Dataset):
        def __len__(self):
            return 10**8

        def __getitems__(self, indices):
            return torch.tensor(indices)

    loader = FastSizeAwareLoader(Synthetic(), lambda ids: ids % 97 + 1, 5000, prefetch=0)
    tracemalloc.start()
    first = next(iter(loader))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(first) > 0
    # one shuffle group planned, not the epoch: a full 10**8 int64 order alone is 800 MB
    # (the time to the first batch is measured by `fastsab bench --suite first-batch`)
    assert peak < 40 * 2**20, peak


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FastLoader(torch.arange(4), 0), ValueError, r"batch_size must be a positive integer, got 0"),
        (lambda: FastLoader(torch.arange(4), 2.0), TypeError, r"batch_size must be an integer, got 2.0"),
        (
            lambda: FastSizeAwareLoader(torch.arange(4), [1] * 4, -1),
            ValueError,
            r"max_total_size must be a finite number >= 0, got -1",
        ),
        (
            lambda: FastSizeAwareLoader(torch.arange(4), [1] * 3, 5),
            ValueError,
            r"sizeof has 3 sizes but the dataset has 4",
        ),
        (
            lambda: FastSizeAwareLoader(torch.arange(2), [1.0, float("nan")], 5),
            ValueError,
            r"sizeof must be finite, got nan at position 1",
        ),
        (lambda: FastSizeAwareLoader(torch.arange(2), [1, -1], 5), ValueError, r"sizeof must be non-negative"),
        (
            lambda: FastSizeAwareLoader(torch.arange(2), [1.0, float("inf")], 5),
            ValueError,
            r"sizeof must be finite, got inf",
        ),
        (lambda: FastLoader(torch.arange(4), 2, device="gpu"), ValueError, r"device 'gpu' is not a torch device"),
        (
            lambda: FastLoader(torch.arange(4), 2, device=3),
            TypeError,
            r"device must be None, a string or a torch.device",
        ),
        (lambda: FastLoader(torch.arange(4), 2, prefetch=-1), ValueError, r"prefetch must be a non-negative integer"),
        (lambda: FastLoader(torch.arange(4), 2, shuffle="yes"), TypeError, r"shuffle must be a bool, got 'yes'"),
        (lambda: FastLoader(torch.arange(4), 2, collate_fn=3), TypeError, r"collate_fn must be callable or None"),
        (lambda: FastLoader(object(), 2), TypeError, r"dataset must define __getitems__ or __getitem__"),
        (
            lambda: FastLoader({"a": torch.zeros(3), "b": torch.zeros(4)}, 2),
            ValueError,
            r"dataset leaves must share their first dimension, got shapes \[\(3,\), \(4,\)\]",
        ),
        (lambda: FastSizeAwareLoader(torch.arange(4), 5, 5), TypeError, r"sizeof must be an array, tensor or sequence"),
        (
            lambda: FastSizeAwareLoader(torch.arange(4), len, 5, features=torch.ones(3)),
            ValueError,
            r"features has 3 rows but the dataset has 4 items",
        ),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_unavailable_accelerator_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    with pytest.raises(ValueError, match=r"device 'cuda' was requested but torch.cuda is not available here"):
        FastLoader(torch.arange(4), 2, device="cuda")


def test_bad_sizes_from_a_callable_name_the_index():
    loader = FastSizeAwareLoader(torch.arange(10), lambda ids: np.where(ids == 7, -1.0, 1.0), 5, shuffle=False)
    with pytest.raises(
        ValueError, match=r"sizeof gave -1.0 for dataset index 7; sizes must be finite and non-negative"
    ):
        list(loader)


def test_set_epoch_validation():
    loader = FastLoader(torch.arange(4), 2)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer, got -1"):
        loader.set_epoch(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(3)
    assert loader.epoch == 3


def test_split_kernel_agrees_with_loader_plan():
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, shuffle=False)
    expected = [b.tolist() for b in split_batches(LENGTHS, BUDGET).batches()]
    assert [b.tolist() for b in loader] == expected


def test_a_batch_spanning_many_groups_is_planned_in_memory_proportional_to_it():
    # invariant: len() and the plan of a batch that spans 780 groups hold O(batch) memory
    # (one copy of the open batch per group would be ~1 GB here)
    n = 200_000
    loader = FastSizeAwareLoader(torch.arange(n), np.ones(n, dtype=np.int64), 10**9, group_size=256, shuffle=False)
    tracemalloc.start()
    try:
        assert len(loader) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert [len(batch) for batch in loader] == [n]


def _fitted_model(num_features: int, degree: int, seed: int) -> PolynomialRegression:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, (3 * (degree + 1) ** num_features, num_features)).astype(np.float64)
    y = 50 + (x * rng.uniform(1, 5, num_features)).sum(axis=1) + 0.1 * (x**degree).sum(axis=1)
    model = PolynomialRegression(degree, num_features)
    model.fit(x[:, 0] if num_features == 1 else x, y, upper_quantile=1.0)
    return model


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 300),
    num_features=st.integers(1, 2),
    degree=st.integers(1, 2),
    seed=st.integers(0, 2**16),
    budget=st.integers(100, 5000),
    shuffle=st.booleans(),
)
def test_features_as_int_tensor_float_tensor_array_or_list_give_the_same_batches(
    n, num_features, degree, seed, budget, shuffle
):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 100, (n,) if num_features == 1 else (n, num_features))
    model = _fitted_model(num_features, degree, seed)
    forms = {
        "int64 tensor": torch.from_numpy(lengths),
        "int32 tensor": torch.from_numpy(lengths).to(torch.int32),
        "float64 tensor": torch.from_numpy(lengths).double(),
        "float32 tensor": torch.from_numpy(lengths).float(),
        "int numpy array": lengths,
        "float numpy array": lengths.astype(np.float32),
        "list": lengths.tolist(),
        "tuple": tuple(lengths.tolist()),
    }
    data = torch.arange(n)
    batches = {}
    for name, features in forms.items():
        loader = FastSizeAwareLoader(
            data,
            sizeof=model,
            features=features,
            max_total_size=budget,
            shuffle=shuffle,
            seed=seed,
            oversize="own_batch",
        )
        batches[name] = [b.tolist() for b in loader]
        assert sorted(i for b in batches[name] for i in b) == list(range(n))
    reference = batches["float64 tensor"]
    assert all(b == reference for b in batches.values())


def test_features_reach_a_callable_sizeof_converted_once_in_their_own_kind():
    seen = []

    def sizeof(rows):
        seen.append((type(rows).__name__, rows.dtype))
        return rows * 2

    lengths = [3, 1, 2, 4]
    for features in (lengths, np.array(lengths, dtype=np.int16), torch.tensor(lengths, dtype=torch.int32)):
        loader = FastSizeAwareLoader(torch.arange(4), sizeof, 8, features=features, shuffle=False)
        assert [b.tolist() for b in loader] == [[0, 1], [2], [3]]  # costs 6, 2, 4, 8
    # (each loader calls sizeof on its first item at construction, then on the epoch)
    assert list(dict.fromkeys(seen)) == [("ndarray", np.int64), ("Tensor", torch.int64)]
    assert len(seen) == 6


@pytest.mark.parametrize(
    ("features", "error", "message"),
    [
        (torch.tensor([True, False, True]), TypeError, r"features must hold integers or floats, got dtype torch.bool"),
        (
            np.array([1, 2, 3], dtype=np.complex64),
            TypeError,
            r"features must hold integers or floats, got dtype complex",
        ),
        (["a", "b", "c"], TypeError, r"features must hold integers or floats, got dtype <U1: \['a', 'b', 'c'\]"),
        ([1, None, 3], TypeError, r"features must hold integers or floats, got dtype object"),
        (
            [[1, 2], [3], [4]],
            ValueError,
            r"features must be a 1-D or 2-D array of numbers, but features\[1\] is \[3\] of shape \(1,\) where features\[0\] has shape \(2,\)",
        ),
        (torch.tensor([1.0, float("nan"), 2.0]), ValueError, r"features must be finite, got nan at position 1"),
        (np.array([1.0, 2.0, np.inf]), ValueError, r"features must be finite, got inf at position 2"),
        (
            torch.ones(3, 2),
            ValueError,
            r"features must be 1-D or of shape \(n, 1\) for a model with num_features=1, got shape \(3, 2\)",
        ),
        (torch.ones(3, 1, 1), ValueError, r"features must be 1-D or 2-D, got shape \(3, 1, 1\)"),
        (7, ValueError, r"features must be 1-D or 2-D, got shape \(\): 7"),
        ([1, 2], ValueError, r"features has 2 rows but the dataset has 3 items"),
    ],
)
def test_bad_features_are_named(features, error, message):
    model = _fitted_model(1, 1, 0)
    with pytest.raises(error, match=message):
        FastSizeAwareLoader(torch.arange(3), model, 1000, features=features)


def test_an_error_of_sizeof_on_features_names_features():
    two = _fitted_model(2, 1, 0)
    with pytest.raises(ValueError, match=r"features must be of shape \(n, 2\) for a model with num_features=2"):
        FastSizeAwareLoader(torch.arange(3), two, 1000, features=[1, 2, 3])
    columns = _fitted_model(1, 1, 0)
    # (sizeof is called on the first item at construction, where its error shows)
    with pytest.raises(ValueError, match=r"sizeof failed on features\[indices\] \(shape \(1,\), dtype int64\): x must"):
        FastSizeAwareLoader(torch.arange(3), lambda rows: columns(rows[:, None]), 1000, features=[1, 2, 3])


# a value of each DataLoader keyword a loader takes with DataLoader's meaning
ACCEPTED_VALUES = {
    "batch_size": 2,
    "shuffle": False,
    "drop_last": True,
    "collate_fn": None,
    "pin_memory": False,
    "num_workers": 2,
    "worker_init_fn": print,
    "multiprocessing_context": "fork",
    "persistent_workers": True,
}
# what an accepted keyword needs besides itself
ACCEPTED_WITH = {"multiprocessing_context": {"num_workers": 1}, "persistent_workers": {"num_workers": 1}}


def _make_loader(loader_class, **keywords):
    data = torch.arange(5)
    if loader_class is FastLoader:
        positional = (data,) if "batch_size" in keywords else (data, 2)
        return FastLoader(*positional, **keywords)
    return FastSizeAwareLoader(data, [1, 1, 1, 1, 1], 2, **keywords)


# a value of each DataLoader keyword other than its default (a new keyword of torch needs one here)
OTHER_VALUES = {
    "batch_size": 3,
    "drop_last": True,
    "sampler": [0, 1],
    "batch_sampler": [[0]],
    "num_workers": 2,
    "timeout": 5.0,
    "worker_init_fn": print,
    "multiprocessing_context": "spawn",
    "generator": torch.Generator(),
    "prefetch_factor": 2,
    "pin_memory_device": "cuda",
    "in_order": False,
}


@pytest.mark.parametrize("loader_class", [FastLoader, FastSizeAwareLoader])
@pytest.mark.parametrize("name", [name for name in inspect.signature(DataLoader).parameters if name != "dataset"])
def test_every_dataloader_keyword_is_taken_or_named_with_advice(loader_class, name):
    if name in inspect.signature(loader_class).parameters:
        loader = _make_loader(loader_class, **{name: ACCEPTED_VALUES[name]}, **ACCEPTED_WITH.get(name, {}))
        seen = [i for b in loader for i in b.tolist()]
        assert len(set(seen)) == len(seen) >= 4 and set(seen) <= set(range(5))  # drop_last drops one
        return
    assert advice_for(loader_class.__name__, name), f"no advice for DataLoader's keyword {name}"
    default = inspect.signature(DataLoader).parameters[name].default
    if name != "batch_size":  # DataLoader's default asks for nothing the loader does not do: accepted
        plain = [b.tolist() for b in _make_loader(loader_class, shuffle=False)]
        assert [b.tolist() for b in _make_loader(loader_class, shuffle=False, **{name: default})] == plain
    value = default if name == "batch_size" else OTHER_VALUES[name]
    message = (
        rf"{loader_class.__name__} does not take DataLoader's keyword {name} \(got {name}={re.escape(repr(value))}\): "
    )
    with pytest.raises(TypeError, match=message + re.escape(advice_for(loader_class.__name__, name))):
        _make_loader(loader_class, **{name: value})


def test_a_default_of_another_type_is_not_a_default():
    with pytest.raises(TypeError, match=r"keyword timeout \(got timeout=False\)"):
        FastLoader(torch.arange(4), 2, timeout=False)
    with pytest.raises(TypeError, match=r"keyword in_order \(got in_order=1\)"):
        FastLoader(torch.arange(4), 2, in_order=1)


def test_the_loaders_show_their_own_signatures():
    assert "timeout" not in inspect.signature(FastLoader).parameters
    assert list(inspect.signature(FastSizeAwareLoader).parameters)[:3] == ["dataset", "sizeof", "max_total_size"]


def test_dataloader_keywords_with_fastsab_meanings():
    assert [len(b) for b in FastLoader(torch.arange(5), batch_size=2, shuffle=False, drop_last=True)] == [2, 2]
    with pytest.raises(TypeError, match=r"keyword prefetch_factor \(got prefetch_factor=4\): prefetch=k is the number"):
        FastLoader(torch.arange(5), 2, shuffle=False, prefetch_factor=4)
    with pytest.raises(TypeError, match=r"keyword batch_size \(got batch_size=8\): .*max_total_size=.*max_batch_size="):
        FastSizeAwareLoader(torch.arange(5), [1] * 5, 4, batch_size=8)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'num_worker'"):
        FastLoader(torch.arange(5), 2, num_worker=4)  # not DataLoader's: Python's own error
    loader = FastLoader(torch.arange(6), 2, shuffle=False)
    with pytest.raises(ValueError, match=r"PlannedDataLoader yields batches in the order of the plan.*in_order=False"):
        loader.data_loader(in_order=False)
    assert [b.tolist() for b in loader.data_loader(in_order=True)] == [[0, 1], [2, 3], [4, 5]]
    assert len(pickle.loads(pickle.dumps(loader))) == 3


def test_the_docs_list_every_dataloader_keyword_from_the_table():
    page = (Path(__file__).parents[2] / "docs" / "coming-from" / "dataloader.md").read_text()
    assert keyword_list((FastLoader, FastSizeAwareLoader)) in page


@pytest.mark.parametrize("balance", [True, False])
def test_zero_budget_batches_the_zero_cost_items_on_every_rank(balance):
    lengths = torch.tensor([0, 0, 3, 0, 0, 0, 0, 0])
    dealt = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no cost divided by a zero cap
        warnings.simplefilter("ignore", UserWarning)  # the skipped item is reported
        for rank in (0, 1):
            loader = FastSizeAwareLoader(
                torch.arange(8), lengths, 0, shuffle=False, rank=rank, world_size=2, max_batch_size=2, balance=balance
            )
            dealt += [b.tolist() for b in loader]
            assert loader.stats.num_skipped == 1
    assert sorted(i for batch in dealt for i in batch) == [0, 1, 3, 4, 5, 6, 7]
    assert all(len(batch) <= 2 for batch in dealt)


def test_float_features_reach_a_callable_sizeof_of_their_own_dtype():
    # a float32 module as sizeof needs float32 features
    net = torch.nn.Linear(1, 1)
    with torch.no_grad():
        net.weight.fill_(2.0)
        net.bias.zero_()

    def sizeof(rows):
        return net(torch.as_tensor(rows)[:, None]).squeeze(1)

    for features in (torch.tensor([3.0, 1.0, 2.0, 4.0]), np.array([3.0, 1.0, 2.0, 4.0], dtype=np.float32)):
        loader = FastSizeAwareLoader(torch.arange(4), sizeof, 8, features=features, shuffle=False)
        assert [b.tolist() for b in loader] == [[0, 1], [2], [3]]  # costs 6, 2, 4, 8
    seen = []
    half = FastSizeAwareLoader(
        torch.arange(2), lambda rows: seen.append(rows.dtype) or rows, 8, features=torch.ones(2).half()
    )
    assert len(half) == 1 and set(seen) == {torch.float16}  # (at construction, on the first item, and per chunk)


def test_the_configured_limit_cannot_be_reassigned():
    # a new value would not reach the epoch's plan, so it is refused rather than ignored
    loader = FastLoader(torch.arange(10), 4, shuffle=False)
    with pytest.raises(AttributeError, match="batch_size"):
        loader.batch_size = 2  # type: ignore[misc]
    assert loader.batch_size == 4 and [len(b) for b in loader] == [4, 4, 2]
    sized = FastSizeAwareLoader(torch.arange(4), [3] * 4, 12, shuffle=False)
    with pytest.raises(AttributeError, match="max_total_size"):
        sized.max_total_size = 3  # type: ignore[misc]
    assert sized.max_total_size == 12 and [len(b) for b in sized] == [4]


Pair = namedtuple("Pair", ["x", "y"])


def _pytree_dataset(kind: str) -> object:
    x = torch.arange(10)
    if kind == "dict":
        return {"x": x, "y": x * 2, "name": "pairs"}
    if kind == "tuple":
        return (x, x * 2)
    return Pair(x, x * 2)


def _first_rows(batch: object) -> dict:
    """A batch of a pytree dataset as plain lists, whatever its container."""
    if isinstance(batch, dict):
        return {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
    return {str(i): value.tolist() for i, value in enumerate(batch)}


def _swap_pairs(rows: object) -> object:
    """A collate_fn: the gathered columns in reverse order (a module-level function, so workers can pickle it)."""
    columns = list(rows.values()) if isinstance(rows, dict) else list(rows)
    return [column for column in reversed(columns) if isinstance(column, torch.Tensor)]


@pytest.mark.parametrize("kind", ["dict", "tuple", "namedtuple"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("collate_fn", [None, _swap_pairs])
def test_data_loader_over_a_pytree_dataset_yields_the_loader_batches(kind, num_workers, collate_fn):
    def loader() -> FastLoader:
        return FastLoader(_pytree_dataset(kind), 4, seed=5, collate_fn=collate_fn)

    expected = [_first_rows(batch) for batch in loader()]
    options: dict = {"num_workers": num_workers}
    if collate_fn is not None:
        options["collate_fn"] = collate_fn
    if num_workers:
        options["multiprocessing_context"] = "fork" if "fork" in torch.multiprocessing.get_all_start_methods() else None
    data = loader().data_loader(**options)
    assert [_first_rows(batch) for batch in data] == expected
    assert len(data) == len(expected) == 3


def _tagged(rows: object) -> object:
    """A collate_fn that shows what it was given (a module-level function, so workers can pickle it)."""
    return (type(rows).__name__, rows)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(10) * 3,
        lambda: np.arange(20.0).reshape(10, 2),
        lambda: torch.utils.data.TensorDataset(torch.arange(10), torch.arange(10) * 2),
        lambda: torch.arange(10),
    ],
    ids=["ndarray", "2-D ndarray", "TensorDataset", "tensor"],
)
@pytest.mark.parametrize("collate_fn", [None, _tagged])
def test_data_loader_over_arrays_yields_the_loader_batches(make, collate_fn):
    # the same batches, of the same types, whether the loop reads the loader or its DataLoader
    expected = list(FastLoader(make(), 4, seed=5, collate_fn=collate_fn))
    options = {} if collate_fn is None else {"collate_fn": collate_fn}
    got = list(FastLoader(make(), 4, seed=5, collate_fn=collate_fn).data_loader(**options))
    assert [repr(batch) for batch in got] == [repr(batch) for batch in expected]


def test_integer_sizes_whose_sums_pass_int64_are_batched_exactly():
    loader = FastSizeAwareLoader(torch.arange(3), [2**62, 2**62, 1], 2**70, shuffle=False)
    assert len(loader) == 1 and [b.tolist() for b in loader] == [[0, 1, 2]]
    loader = FastSizeAwareLoader(torch.arange(5), [2**61] * 5, 3 * 2**61, shuffle=False)
    assert len(loader) == 2 and [b.tolist() for b in loader] == [[0, 1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("sizeof", "caps", "counts"),
    [
        (np.ones((4, 2), dtype=np.int64), [3, 3, 3], (3, 2)),
        (np.ones((4, 2), dtype=np.int64), [3], (1, 2)),
        (np.ones(4, dtype=np.int64), [3, 3], (2, 1)),
        (lambda ids: np.ones((len(ids), 2), dtype=np.int64), [3, 3, 3], (3, 2)),
    ],
)
def test_caps_of_another_number_than_the_cost_columns_are_refused_at_construction(sizeof, caps, counts):
    with pytest.raises(ValueError, match=rf"max_total_size has {counts[0]} caps but costs has {counts[1]} columns"):
        FastSizeAwareLoader(torch.arange(4), sizeof, caps)


def test_one_cap_applies_to_every_cost_column():
    sizes = np.array([[1, 2], [2, 1], [1, 1]])
    loader = FastSizeAwareLoader(torch.arange(3), sizes, 3, shuffle=False)
    assert [b.tolist() for b in loader] == [[0, 1], [2]]
    assert [b.tolist() for b in FastSizeAwareLoader(torch.arange(3), sizes, [3, 2], shuffle=False)] == [[0], [1, 2]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: FastLoader(torch.arange(12), 3, seed=0),
        lambda: FastSizeAwareLoader(torch.arange(12), torch.ones(12), 3, seed=0),
    ],
)
def test_an_iterator_left_behind_by_a_newer_one_refuses_to_go_on(make):
    loader = make()
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    # its batches would count toward the newer epoch's position, and a resume would skip them
    with pytest.raises(RuntimeError, match="left behind"):
        next(old)
    assert len(list(new)) == 3 and loader.state_dict()["epoch"] == 2 and loader.state_dict()["steps"] == 0


def test_an_iterator_refuses_to_go_on_after_a_state_was_loaded():
    loader = FastLoader(torch.arange(12), 3, seed=0)
    state = loader.state_dict()
    batches = iter(loader)
    next(batches)
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match="left behind"):
        next(batches)
    assert sorted(torch.cat(list(loader)).tolist()) == list(range(12))
