from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader, OutOfCoreDataset
from fastsab.feeder import OVERHEAD_BYTES

ROW = 64  # float32 values per sample: 256 bytes


def reader(i):
    return {"x": np.full(ROW, i, dtype=np.float32), "y": np.int64(i)}


def test_chunks_from_the_budget_and_batches_across_chunks():
    dataset = OutOfCoreDataset(range(100), reader, cpu_memory_limit=2 * 10 * (ROW * 4 + 8))
    assert dataset.chunk_size == 10 and dataset.num_chunks == 10 and len(dataset) == 100
    batch = dataset.__getitems__([95, 3, 14, 4])
    assert batch["y"].tolist() == [95, 3, 14, 4] and batch["x"][:, 0].tolist() == [95, 3, 14, 4]
    assert dataset[7]["y"].item() == 7
    with pytest.raises(IndexError, match="index 100 is out of range for 100 samples"):
        dataset.__getitems__([100])


def test_one_read_gives_several_samples():
    def augmented(i):
        base = np.full(4, i, dtype=np.float32)
        yield base
        yield base + 0.5

    dataset = OutOfCoreDataset(range(6), augmented, cpu_memory_limit=64, one_read_count=2)
    assert len(dataset) == 12 and dataset.chunk_size % 2 == 0
    assert dataset.__getitems__([5, 4])[:, 0].tolist() == [2.5, 2.0]
    broken = OutOfCoreDataset(
        range(3), lambda i: [np.zeros(2)] * 3, cpu_memory_limit=1024, one_read_count=2, sample_bytes=16
    )
    with pytest.raises(ValueError, match=r"read_input\(0\) gave 3 samples; one_read_count is 2"):
        broken.__getitems__([0])


@pytest.mark.parametrize("shuffle", [True, False])
def test_loader_reads_each_chunk_once_per_epoch(shuffle):
    dataset = OutOfCoreDataset(range(1000), reader, cpu_memory_limit=2 * 64 * (ROW * 4 + 8))
    loader = FastLoader(dataset, 48, shuffle=shuffle, seed=1, prefetch=2)
    assert loader.order.group_size == dataset.chunk_size == 64
    for _ in range(2):  # two epochs
        before = dataset.chunk_reads
        seen = [i for batch in loader for i in batch["y"].tolist()]
        assert sorted(seen) == list(range(1000))  # every sample, the remainder included
        assert dataset.chunk_reads - before == dataset.num_chunks  # each chunk read once
    assert len(dataset._chunks) <= 2
    dataset.close()


def test_size_aware_loader_over_an_out_of_core_dataset():
    dataset = OutOfCoreDataset(range(300), reader, cpu_memory_limit=2 * 50 * (ROW * 4 + 8))
    sizes = np.arange(300) % 13 + 1
    loader = FastSizeAwareLoader(dataset, sizes, 40, seed=2)
    batches = [b["y"].numpy() for b in loader]
    assert sorted(np.concatenate(batches).tolist()) == list(range(300))
    assert all(sizes[b].sum() <= 40 for b in batches)
    assert dataset.chunk_reads == dataset.num_chunks


def test_from_memmap_and_from_files(tmp_path):
    array = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=np.float32, shape=(500, 8))
    array[:] = np.arange(500, dtype=np.float32)[:, None]
    array.flush()
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    dataset = OutOfCoreDataset.from_memmap(mapped, cpu_memory_limit=2 * 100 * 32)
    assert dataset.chunk_size == 100
    rows = torch.cat([b[:, 0] for b in FastLoader(dataset, 32, seed=0)])
    assert sorted(rows.tolist()) == list(range(500))
    paths = []
    for i in range(20):
        np.save(tmp_path / f"s{i:02d}.npy", np.full(3, i))
        paths.append(tmp_path / f"s{i:02d}.npy")
    files = OutOfCoreDataset.from_directory(tmp_path, "s*.npy", cpu_memory_limit=2 * 5 * 24)
    assert files.chunk_size == 5 and files.ids == [str(p) for p in paths]
    assert sorted(torch.cat([b[:, 0] for b in FastLoader(files, 4)]).tolist()) == list(range(20))
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        OutOfCoreDataset.from_files([pickled], cpu_memory_limit=1024, sample_bytes=8).__getitems__([0])


def test_pickles_without_threads_and_bad_arguments():
    dataset = OutOfCoreDataset(range(10), reader, cpu_memory_limit=10_000)
    dataset.__getitems__([0])
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.__getitems__([3])["y"].tolist() == [3]
    with pytest.raises(ValueError, match=r"cpu_memory_limit=100 bytes cannot hold two chunks of one read"):
        OutOfCoreDataset(range(10), reader, cpu_memory_limit=100)
    with pytest.raises(ValueError, match="sample_bytes must be a positive integer, got 0"):
        OutOfCoreDataset(range(10), reader, cpu_memory_limit=10_000, sample_bytes=0)
    with pytest.raises(TypeError, match="sample_bytes must be an integer, got 'x'"):
        OutOfCoreDataset(range(10), reader, cpu_memory_limit=10_000, sample_bytes="x")
    with pytest.raises(TypeError, match="read_input must be callable, got int"):
        OutOfCoreDataset(range(10), 3, cpu_memory_limit=100)
    with pytest.raises(ValueError, match="no files match 'none-\\*' in"):
        OutOfCoreDataset.from_directory(".", "none-*", cpu_memory_limit=100)
    with pytest.raises(TypeError, match=r"array must be a file-backed numpy\.memmap, got ndarray"):
        OutOfCoreDataset.from_memmap(np.zeros((3, 3)), cpu_memory_limit=100)


def test_peak_rss_stays_within_the_budget_for_a_file_larger_than_it(tmp_path):
    # a 256 MiB file-backed dataset, fed within a 32 MiB budget: the resident set grows by at
    # most the budget, the documented overhead and two batches
    script = textwrap.dedent(
        f"""
        import threading, time
        import numpy as np, torch
        from fastsab import FastLoader, OutOfCoreDataset
        rows, width = 65536, 1024  # 4 KiB per row
        path = "{tmp_path}/big.f32"
        with open(path, "wb") as f:
            block = np.arange(width, dtype=np.float32)
            for start in range(0, rows, 4096):
                (np.arange(start, start + 4096, dtype=np.float32)[:, None] + 0 * block).tofile(f)
        mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(rows, width))
        budget = 32 * 2**20
        loader = FastLoader(OutOfCoreDataset.from_memmap(mapped, cpu_memory_limit=budget), 256, seed=0)
        page = 4096
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * page
        peak = [0]
        running = [True]
        def sample():
            while running[0]:
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)
        baseline = rss()
        thread = threading.Thread(target=sample); thread.start()
        total = 0.0
        seen = 0
        for batch in loader:
            total += float(batch[:, 0].double().sum())
            seen += len(batch)
        running[0] = False; thread.join()
        print(seen == rows, total == rows * (rows - 1) / 2, peak[0] - baseline, budget)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    complete, sums, growth, budget = out.stdout.split()
    assert complete == "True" and sums == "True"
    in_flight = (2 + 2) * 256 * 1024 * 4  # the loader's default prefetch of 2, plus two batches
    assert int(growth) <= int(budget) + OVERHEAD_BYTES + in_flight, (int(growth) / 2**20, "MiB")
