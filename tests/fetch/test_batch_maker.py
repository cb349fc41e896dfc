from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastLoader
from fastsab.fetch.batch_maker import BatchMaker
from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.transfer import Transfer
from tests.fetch.test_fetch import Columns, Pair, Scaled

N = 20

DATASETS = {
    "tensor": lambda: torch.arange(N * 2).reshape(N, 2),
    "numpy": lambda: np.arange(N) * 3,
    "dict": lambda: {"x": torch.arange(N), "y": {"z": np.arange(N) * 2}, "name": "d"},
    "namedtuple": lambda: Pair(torch.arange(N), torch.arange(N) * 2),
    "dataclass": lambda: Columns(torch.arange(N), np.arange(N) * 5, "c"),
    "post_init dataclass": lambda: Scaled(torch.arange(N)),
}


def first_rows(rows: Any) -> Any:
    """A collate_fn that changes the batch: keeps it, with a count beside it."""
    return {"rows": rows, "count": 7}


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, (torch.Tensor, np.ndarray)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name))
    else:
        assert a == b


def made(dataset: Any, collate_fn: Any, chunk_bytes: int, device: str | None) -> list[tuple[list[int], Any]]:
    maker: BatchMaker = BatchMaker(Fetcher(dataset, collate_fn), Transfer.create(device), chunk_bytes)
    ids = np.random.default_rng(0).permutation(N)
    return [(i.tolist(), batch) for i, batch in maker.batches(ids, [0, 6, 7, 13, 20])]


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("collate_fn", [None, first_rows], ids=["no collate_fn", "collate_fn"])
@pytest.mark.parametrize("kind", list(DATASETS))
def test_a_chunk_gathered_at_once_gives_the_batches_gathered_one_by_one(kind, collate_fn, device):
    dataset = DATASETS[kind]()
    whole = made(dataset, collate_fn, 2**20, device)
    one_by_one = made(dataset, collate_fn, 0, device)
    assert [ids for ids, _ in whole] == [ids for ids, _ in one_by_one]
    for (ids, a), (_, b) in zip(whole, one_by_one):
        assert_same(a, b)
        fetched = Transfer.create(device)(Fetcher(dataset, collate_fn)(np.array(ids)))
        assert_same(a, fetched)


def test_the_loader_gives_the_same_batches_whether_it_gathers_chunks_or_batches():
    dataset = Scaled(torch.arange(N))
    for device in (None, "cpu"):
        chunks = [b.x.tolist() for b in FastLoader(dataset, 6, shuffle=False, device=device)]
        batches = [b.x.tolist() for b in FastLoader(dataset, 6, shuffle=False, device=device, chunk_bytes=0)]
        assert chunks == batches == [[2 * i for i in range(lo, min(lo + 6, N))] for lo in range(0, N, 6)]


def test_a_chunk_too_large_for_chunk_bytes_is_gathered_batch_by_batch():
    calls = []

    class Recording(Fetcher):
        def take(self, indices: Any) -> Any:
            calls.append(len(indices))
            return super().take(indices)

    data = torch.arange(N)  # 8 bytes a row
    maker: BatchMaker = BatchMaker(Recording(data, None), Transfer(), chunk_bytes=8 * N)
    assert [b.tolist() for _, b in maker.batches(np.arange(N), [0, 10, N])] == [list(range(10)), list(range(10, N))]
    assert calls == [N]
    maker.chunk_bytes = 8 * N - 1
    assert [b.tolist() for _, b in maker.batches(np.arange(N), [0, 10, N])] == [list(range(10)), list(range(10, N))]
    assert calls == [N]  # not taken as a chunk: fetched batch by batch


def test_chunk_bytes_is_checked():
    with pytest.raises(TypeError, match=r"chunk_bytes must be an integer, got 1\.5 of type float\."):
        BatchMaker(Fetcher(torch.arange(3), None), Transfer(), 1.5)  # type: ignore[arg-type]


def test_a_gathered_chunk_is_one_run_of_views_and_the_others_a_run_per_batch():
    ids, offsets = np.array([4, 1, 7, 0, 9]), np.array([0, 2, 3, 5])
    data = torch.arange(N) * 10
    make = BatchMaker(Fetcher(data, None), Transfer(), chunk_bytes=2**20)
    expected = [(part.tolist(), batch.tolist()) for part, batch in make.batches(ids, offsets)]
    [run] = make.runs(ids, offsets, with_indices=True, per_batch=False)
    assert run.sizes == [2, 1, 2] and [(p.tolist(), b.tolist()) for p, b in zip(run.ids, run.batches)] == expected
    assert all(batch._base is not None for batch in run.batches)  # views of one gather
    [unindexed] = make.runs(ids, offsets, with_indices=False, per_batch=False)
    assert unindexed.ids is None and [b.tolist() for b in unindexed.batches] == [b for _, b in expected]
    for maker, per_batch in [(make, True), (BatchMaker(Fetcher(data, None), Transfer(), chunk_bytes=0), False)]:
        runs = list(maker.runs(ids, offsets, with_indices=True, per_batch=per_batch))
        assert [run.sizes for run in runs] == [[2], [1], [2]]
        assert [(r.ids[0].tolist(), next(iter(r.batches)).tolist()) for r in runs] == expected
