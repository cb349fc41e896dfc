"""The workers suite's sweep (``--workers``) and its I/O-bound proxy (``--workers-dataset io``, ``RemoteReads``)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from fastsab.bench.workers import RemoteReads, pad_tokens, workers_rows
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader


def test_workers_rows_checks_its_counts_and_dataset_before_measuring():
    with pytest.raises(
        TypeError, match=r"worker_counts must be a sequence of worker counts such as \(1, 2, 4\), got 2"
    ):
        workers_rows(worker_counts=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"worker_counts names a worker count more than once, got \(1, 1\)"):
        workers_rows(worker_counts=(1, 1))
    with pytest.raises(ValueError, match=r"worker_counts must be worker counts of at least 1 .* got \(0, 2\)"):
        workers_rows(worker_counts=(0, 2))
    with pytest.raises(ValueError, match=r"dataset must be 'cpu' \(texts tokenized\) or 'io' .* got 'gpu'"):
        workers_rows(dataset="gpu")  # type: ignore[arg-type]


# -- the sweep's rows ------------------------------------------------------------------


def _speedups(note: str) -> tuple[float, float]:
    found = re.search(r"; (\d+\.\d+)x one process, (\d+\.\d+)x per worker", note)
    assert found is not None, note
    return float(found.group(1)), float(found.group(2))


@pytest.mark.parametrize("dataset", ["cpu", "io"])
def test_the_sweep_gives_each_count_its_rows_and_notes(dataset):
    rows = workers_rows(samples=120, batch_size=16, epochs=2, worker_counts=(1, 2), rounds=1, dataset=dataset)
    assert len(rows) == 2 * 2 * 7  # (two loaders, two phases, one process + 3 cases per count)
    described = "120 texts" if dataset == "cpu" else "120 reads waiting 8 ms a batch"
    assert [row.workload for row in rows[::7]] == [
        f"{kind}, {described}, {phase}"
        for kind in ("fixed size", "size-aware")
        for phase in ("first epoch", "later epochs")
    ]
    for start, name in zip(range(0, len(rows), 7), ["FastLoader"] * 2 + ["FastSizeAwareLoader"] * 2):
        group = rows[start : start + 7]
        assert [row.method for row in group] == [
            f"{name}(prefetch=2), one process",
            *(
                method
                for count in (1, 2)
                for method in (
                    f"{name}(num_workers={count})",
                    f"{name}(num_workers={count}, persistent_workers=True)",
                    f"DataLoader(num_workers={count}, persistent_workers=True, batch_sampler={name}.batch_sampler())",
                )
            ),
        ]
        one = group[0]
        assert one.ratio == 1.0 and all(row.baseline == one.method for row in group)
        assert "one process," not in one.note and "per worker" not in one.note
        assert len({row.note.split(";")[0] for row in group}) == 1  # the same batches
        # the one-process row's speed-up is to the first count's DataLoader; each other row's to its count's
        assert one.speedup == pytest.approx(group[3].seconds / one.seconds)
        for position, row in enumerate(group[1:]):
            count = 1 + position // 3
            dataloader = group[3 * count]
            assert row.speedup == pytest.approx(dataloader.seconds / row.seconds)
            speedup, per_worker = _speedups(row.note)
            assert speedup == pytest.approx(one.seconds / row.seconds, abs=0.006)
            assert per_worker == pytest.approx(one.seconds / row.seconds / count, abs=0.006)
            assert ("cores)" in row.note) == (count > (os.cpu_count() or 1))


def test_a_count_above_the_cores_runs_and_says_so(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    rows = workers_rows(samples=40, batch_size=16, epochs=2, worker_counts=(2,), rounds=1, dataset="io")
    assert [row.note.endswith("x per worker (2 workers > 1 cores)") for row in rows] == [False, True, True, True] * 4


# -- the I/O-bound dataset -------------------------------------------------------------


@pytest.mark.parametrize("sized", [False, True])
def test_remote_reads_in_workers_give_the_plan_s_batches_of_the_items_read_one_by_one(sized):
    # invariant: with workers, batches come in plan order, each once, equal to the items read alone and padded
    reads = RemoteReads(150, seed=3, wait_s=0.001)
    assert reads.lengths.tolist() == RemoteReads(150, seed=3).lengths.tolist()  # (the wait aside, one dataset)

    def loader(**options: object) -> FastLoader[torch.Tensor] | FastSizeAwareLoader[torch.Tensor]:
        if sized:
            return FastSizeAwareLoader(reads, reads.lengths, 16 * 150, collate_fn=pad_tokens, seed=5, **options)
        return FastLoader(reads, 16, collate_fn=pad_tokens, seed=5, **options)

    plain = loader(prefetch=0)
    with_workers = loader(num_workers=2, persistent_workers=True)
    try:
        for epoch in range(2):
            plain.set_epoch(epoch)
            with_workers.set_epoch(epoch)
            expected = [ids.tolist() for ids, _ in plain.iter_with_indices()]
            got = list(with_workers.iter_with_indices())
            assert with_workers._workers is not None and len(with_workers._workers.pids) == 2  # (read there)
            assert [ids.tolist() for ids, _ in got] == expected
            assert sorted(i for ids in expected for i in ids) == list(range(150))
            for ids, batch in got:
                assert torch.equal(batch, pad_tokens([reads[i] for i in ids.tolist()]))
    finally:
        with_workers.close()


def test_remote_reads_are_distinct_token_runs_and_refuse_a_negative_wait():
    reads = RemoteReads(20, wait_s=0.0)
    tokens = torch.cat([reads[i] for i in range(len(reads))])
    assert torch.equal(tokens, torch.arange(int(reads.lengths.sum())))
    assert np.all(reads.lengths >= 5)
    with pytest.raises(ValueError, match=r"wait_s must be seconds \(0 or more\) to wait per batch, got -0.5."):
        RemoteReads(3, wait_s=-0.5)


@pytest.mark.parametrize("wait_s", [float("inf"), float("nan")])
def test_remote_reads_refuse_a_wait_that_never_ends(wait_s):
    with pytest.raises(ValueError, match=rf"wait_s must be seconds \(0 or more\) to wait per batch, got {wait_s!r}."):
        RemoteReads(3, wait_s=wait_s)


@pytest.mark.parametrize("wait_s", ["0.1", True, None])
def test_remote_reads_refuse_a_wait_that_is_no_number(wait_s):
    with pytest.raises(TypeError, match=rf"wait_s must be a real number, got {wait_s!r}"):
        RemoteReads(3, wait_s=wait_s)
