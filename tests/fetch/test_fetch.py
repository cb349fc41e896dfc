from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections import OrderedDict, namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, TensorDataset, default_collate

from fastsab.fetch.fetcher import Fetcher

Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Columns:
    x: torch.Tensor
    y: np.ndarray
    name: str = "columns"


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A dataclass pytree that transforms its input once, when it is made."""

    x: torch.Tensor

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", self.x * 2)


class PlainTensorDataset(TensorDataset):
    """Overrides nothing about indexing: gathered like a TensorDataset."""

    label = "plain"


class Augmented(TensorDataset):
    def __getitem__(self, index):
        return tuple(t[index] + 100 for t in self.tensors)


class FirstThree(TensorDataset):
    def __len__(self):
        return 3


@dataclasses.dataclass
class Doubled:
    """A dataclass that is a dataset: it defines __getitem__ and __len__."""

    x: torch.Tensor

    def __getitem__(self, index):
        return self.x[index] * 2

    def __len__(self):
        return len(self.x)


class Rows(Dataset):
    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return {"x": self.data[index], "i": index}

    def __getitems__(self, indices: list[int]) -> Any:
        return [self[i] for i in indices]


def fetcher(dataset: Any) -> Fetcher:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Fetcher(dataset, None)


def canonical(batch: Any) -> Any:
    """A batch with numpy arrays as tensors and plain tuples as lists (what default_collate makes of them)."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(batch))
    if isinstance(batch, np.generic):
        return torch.as_tensor(batch)
    if type(batch) in (tuple, list):
        return [canonical(b) for b in batch]
    if isinstance(batch, tuple):  # a namedtuple
        return type(batch)(*[canonical(b) for b in batch])
    if isinstance(batch, dict):
        return type(batch)((k, canonical(v)) for k, v in batch.items())
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return type(batch), {f.name: canonical(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
    return batch


def assert_same(actual: Any, expected: Any) -> None:
    """Same structure, container types, dtypes, shapes and values."""
    actual, expected = canonical(actual), canonical(expected)
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
        assert torch.equal(actual, expected), (actual, expected)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same(actual[key], expected[key])
    else:
        assert actual == expected


def pytree_rows(tree: Any, indices: list[int]) -> Any:
    """Rows ``indices`` of every array of a pytree dataset, stacked: what a batch of it is."""
    if isinstance(tree, torch.Tensor):
        return torch.stack([tree[i] for i in indices])
    if isinstance(tree, np.ndarray):
        return np.stack([tree[i] for i in indices])
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*[pytree_rows(t, indices) for t in tree])
    if isinstance(tree, tuple):
        return tuple(pytree_rows(t, indices) for t in tree)
    if isinstance(tree, dict):
        return type(tree)((k, pytree_rows(v, indices)) for k, v in tree.items())
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: pytree_rows(getattr(tree, f.name), indices) for f in dataclasses.fields(tree)}
        out = object.__new__(type(tree))
        for name, value in fields.items():
            object.__setattr__(out, name, value)
        return out
    return tree  # names and flags are kept


def expected_batch(dataset: Any, indices: list[int]) -> Any:
    if isinstance(dataset, (dict, tuple, Columns, Scaled)):
        return pytree_rows(dataset, indices)
    return default_collate([dataset[i] for i in indices])


DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]
GATHERED = ["tensor", "ndarray", "TensorDataset", "PlainTensorDataset", "dict", "tuple", "namedtuple", "dataclass"]
ITEMWISE = ["Augmented", "FirstThree", "Doubled", "Rows"]


def column(rows: int, dtype: torch.dtype, width: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 200, (rows, width) if width else (rows,), generator=generator)
    return values.to(dtype)


def make_dataset(kind: str, rows: int, dtype: torch.dtype, width: int) -> Any:
    x = column(rows, dtype, width, 1)
    y = column(rows, torch.int64, 0, 2)
    datasets = {
        "tensor": lambda: x,
        "ndarray": lambda: x.numpy(),
        "TensorDataset": lambda: TensorDataset(x, y),
        "PlainTensorDataset": lambda: PlainTensorDataset(x, y),
        "dict": lambda: OrderedDict(x=x, nested={"y": y.numpy(), "flag": True}),
        "tuple": lambda: (x, (y,), "name"),
        "namedtuple": lambda: Pair(x, y.numpy()),
        "dataclass": lambda: Scaled(x) if width % 2 else Columns(x, y.numpy()),
        "Augmented": lambda: Augmented(x, y),
        "FirstThree": lambda: FirstThree(x, y),
        "Doubled": lambda: Doubled(x),
        "Rows": lambda: Rows(x),
    }
    return datasets[kind]()


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(GATHERED + ITEMWISE),
    rows=st.integers(3, 12),
    dtype=st.sampled_from(DTYPES),
    width=st.integers(0, 3),
    data=st.data(),
)
def test_every_dataset_kind_fetches_what_indexing_gives(kind, rows, dtype, width, data):
    dataset = make_dataset(kind, rows, dtype, width)
    fetch = fetcher(dataset)
    length = 3 if kind == "FirstThree" else rows
    assert fetch.length == length
    assert (fetch.kind == "gather") == (kind in GATHERED)
    indices = data.draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=2 * rows))
    assert_same(fetch(np.array(indices, dtype=np.int64)), expected_batch(dataset, indices))


def test_tensor_dataset_subclasses_that_change_indexing_are_fetched_per_item():
    x = torch.arange(6)
    with pytest.warns(UserWarning, match="dataset Augmented is read item by item"):
        augmented = Fetcher(Augmented(x), None)
    assert augmented.kind == "per_item" and [t.tolist() for t in augmented(np.array([0, 5]))] == [[100, 105]]
    with pytest.warns(UserWarning, match="dataset FirstThree is read item by item"):
        first_three = Fetcher(FirstThree(x), None)
    assert first_three.length == 3
    with pytest.raises(IndexError, match="index 3 is out of range for a dataset of 3 items"):
        first_three(np.array([0, 3]))
    with pytest.warns(UserWarning, match="dataset Doubled is read item by item"):
        doubled = Fetcher(Doubled(x), None)
    assert doubled(np.array([1, 2])).tolist() == [2, 4]


def test_dataclass_pytrees_are_gathered_field_by_field():
    scaled = Scaled(torch.arange(5))  # x is [0, 2, 4, 6, 8]; gathering must not scale again
    batch = Fetcher(scaled, None)(np.array([4, 1]))
    assert isinstance(batch, Scaled) and batch.x.tolist() == [8, 2]
    columns = Columns(torch.arange(4), np.arange(4) * 3, name="c")
    batch = Fetcher(columns, None).take(np.array([3, 3]))
    assert batch.name == "c" and batch.x.tolist() == [3, 3] and batch.y.tolist() == [9, 9]


@pytest.mark.parametrize(
    ("dataset", "where", "what"),
    [
        ({"x": torch.arange(4), "y": [torch.arange(4), torch.arange(4)]}, r"dataset\['y'\]", "list"),
        ((torch.arange(4), {"d": TensorDataset(torch.arange(4))}), r"dataset\[1\]\['d'\]", "TensorDataset"),
        (Pair(torch.arange(4), np.ma.masked_array(np.arange(4))), r"dataset\.y", "MaskedArray"),
    ],
)
def test_pytrees_with_lists_or_other_objects_inside_are_refused(dataset, where, what):
    with pytest.raises(TypeError, match=rf"{where} is a {what}, which is not a tensor, an array or a pytree container"):
        Fetcher(dataset, None)


def test_indices_are_checked():
    for dataset in (torch.arange(5), Rows(torch.arange(5))):
        fetch = fetcher(dataset)
        with pytest.raises(IndexError, match="index -1 is out of range for a dataset of 5 items"):
            fetch(np.array([0, -1]))
        with pytest.raises(IndexError, match="index 5 is out of range for a dataset of 5 items"):
            fetch(np.array([5, 1]))
        with pytest.raises(TypeError, match=r"indices must be an array of integers, got dtype float64"):
            fetch(np.array([0.0, 1.5]))
        with pytest.raises(ValueError, match=r"indices must be one-dimensional, got shape \(1, 2\)"):
            fetch(np.array([[0, 1]]))
    with pytest.raises(IndexError, match="index -2 is out of range for a dataset of 5 items"):
        Fetcher(torch.arange(5), None).take(np.array([-2]))
    assert Fetcher(torch.arange(5), None)([4, 0]).tolist() == [4, 0]  # a list of ints is fine


def test_empty_datasets():
    empty = Fetcher({"x": torch.zeros(0, 3), "y": np.zeros(0)}, None)
    assert empty.length == 0
    batch = empty(np.zeros(0, dtype=np.int64))
    assert batch["x"].shape == (0, 3) and batch["y"].shape == (0,)
    with pytest.raises(IndexError, match="index 0 is out of range for a dataset of 0 items"):
        empty(np.array([0]))
    with pytest.raises(
        ValueError, match=r"dataset must have a first dimension to index its items, got shapes \[\(\)\]"
    ):
        Fetcher(torch.tensor(3.0), None)


class TensorRows(Rows):
    """Batches of a dict of tensors only, one row short."""

    def __getitems__(self, indices):
        return {"x": self.data[indices[1:]], "y": self.data[indices[1:]] * 2}


def test_getitems_results_of_the_wrong_size_are_errors():
    class Dropping(Rows):
        def __getitems__(self, indices):
            return [self[i] for i in indices[1:]]

    class Batched(Rows):
        def __getitems__(self, indices):
            return {"x": self.data[indices], "i": torch.tensor(indices[:1])}

    with pytest.raises(ValueError, match=r"Dropping.__getitems__ returned 2 samples for 3 indices"):
        Fetcher(Dropping(torch.arange(5)), None)(np.array([0, 1, 2]))
    with pytest.raises(
        ValueError,
        match=r"Batched.__getitems__ result leaves must share their first dimension, got shapes \[\(1,\), \(3,\)\]",
    ):
        Fetcher(Batched(torch.arange(5)), None)(np.array([0, 1, 2]))

    class Short(Rows):
        def __getitems__(self, indices):
            return {"x": self.data[indices[1:]], "i": torch.tensor(indices[1:]), "n": None}

    for dataset in (Short(torch.arange(5)), TensorRows(torch.arange(5))):
        with pytest.raises(ValueError, match=r"__getitems__ returned a batch of 2 rows for 3 indices"):
            Fetcher(dataset, None)(np.array([0, 1, 2]))


def test_fetchers_pickle_with_their_dataset():
    for dataset in (Columns(torch.arange(5), np.arange(5)), Rows(torch.arange(5)), TensorDataset(torch.arange(5))):
        fetch = fetcher(dataset)
        clone = pickle.loads(pickle.dumps(fetch))
        assert clone.kind == fetch.kind
        assert_same(clone(np.array([4, 2])), fetch(np.array([4, 2])))


class PackedSequences(Dataset[Any]):
    """Sequences ``arange(length)`` whose ``__getitems__`` packs a batch into one row."""

    def __init__(self, lengths: list[int], extra: int = 0) -> None:
        self.lengths = lengths
        self.extra = extra  # sequences added to each batch, to test the count check

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        from fastsab.varlen.collate import PackCollator

        samples = [{"input_ids": torch.arange(self.lengths[i])} for i in indices + [0] * self.extra]
        return PackCollator()(samples)


def test_a_packed_batch_counts_its_sequences_by_cu_seqlens():
    fetch = Fetcher(PackedSequences([3, 1, 2]), None)
    batch = fetch(np.array([2, 0]))
    assert batch["input_ids"].tolist() == [0, 1, 0, 1, 2] and batch["cu_seqlens"].tolist() == [0, 2, 5]
    with pytest.raises(
        ValueError, match=r"returned a packed batch of 3 sequences \(len\(cu_seqlens\) - 1\) for 2 indices"
    ):
        Fetcher(PackedSequences([3, 1, 2], extra=1), None)(np.array([2, 0]))


@pytest.mark.parametrize(
    "leaf",
    [
        torch.arange(12) * 3,
        torch.arange(24, dtype=torch.float64).reshape(12, 2),
        torch.arange(36).reshape(3, 12).T,  # not contiguous
        torch.arange(12) % 3 == 0,
        torch.arange(12, dtype=torch.float32).requires_grad_(),
    ],
    ids=["int64", "float64 rows", "transposed", "bool", "requires_grad"],
)
def test_gathered_rows_are_those_of_indexing_whatever_the_tensor(leaf):
    index = np.array([5, 0, 11, 5, 2])
    rows = Fetcher(leaf, None)(index)
    expected = leaf[torch.from_numpy(index)]
    assert rows.dtype == expected.dtype and rows.requires_grad == expected.requires_grad
    assert torch.equal(rows.detach(), expected.detach())


class DeclaredRows(Rows):
    getitems_in_memory = True


class MisdeclaredRows(DeclaredRows):
    getitems_in_memory = "yes"


def test_in_memory_fetches_are_gathers_and_getitems_declared_in_memory():
    assert Fetcher(torch.arange(4), None).in_memory
    assert Fetcher(DeclaredRows(torch.arange(4)), None).in_memory
    assert not Fetcher(Rows(torch.arange(4)), None).in_memory
    assert not Fetcher(PackedSequences([1, 2]), None).in_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not Fetcher(Doubled(torch.arange(4)), None).in_memory  # per item
    with pytest.raises(TypeError, match=r"MisdeclaredRows.getitems_in_memory must be True or False, got 'yes'"):
        Fetcher(MisdeclaredRows(torch.arange(4)), None)
