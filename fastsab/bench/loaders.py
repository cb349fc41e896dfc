"""The loader workloads of ``fastsab bench``: the seed loop and its size-aware version per epoch, the per-batch
overhead over a sweep of batch sizes, and the time to the first batch, against DataLoader and the numpy floor; at
scale, one rank's first batch and its memory."""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from fastsab.bench.epochs import Case, Progress, epoch_times, floor_rows
from fastsab.bench.report import Row, time_best
from fastsab.bench.workloads import lognormal_lengths
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader

__all__ = [
    "PER_BATCH_SAMPLES",
    "BatchedDataset",
    "PerItemDataset",
    "first_batch_rows",
    "loader_rows",
    "per_batch_rows",
    "scale_rows",
]

#: Items per epoch of the per-batch sweep.
PER_BATCH_SAMPLES = 240_000
#: Batch sizes of the per-batch sweep.
PER_BATCH_SIZES = (64, 256, 1024)
NUMPY_FLOOR = "numpy permutation+reshape (floor)"
TENSOR_FLOOR = "torch permutation + gather + unbind (tensor floor)"
#: What a rank of a huge epoch may take to its first batch (the ``scale`` suite's targets).
SCALE_SECONDS = 0.5
SCALE_MIB = 512
#: What a rank of a huge epoch may take from ``load_state_dict`` of a mid-epoch state to its first batch.
RESUME_SECONDS = 1.0


class PerItemDataset(Dataset[torch.Tensor]):
    """The map-style dataset of the seed loop: one ``__getitem__`` per sample."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


class BatchedDataset(PerItemDataset):
    """The same dataset with ``__getitems__``: one call per batch."""

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.data[indices]


def _identity(batch: Any) -> Any:
    return batch


def loader_rows(
    samples: int = 300_000,
    batch_size: int = 300,
    epochs: int = 3,
    progress: Progress | None = None,
) -> list[Row]:
    """The seed loop and its size-aware version, per epoch, against the numpy floor.

    Fixed-size rows use ``torch.arange(samples)`` batched by ``batch_size`` and shuffled;
    size-aware rows use log-normal lengths (mean ~150) with a budget of ``batch_size`` x
    mean length. Ratios are to the numpy permutation+reshape loop measured in this run.
    """
    data = torch.arange(samples)
    lengths = lognormal_lengths(samples)
    budget = batch_size * int(lengths.mean())
    length_list = lengths.tolist()
    rng = np.random.default_rng(0)
    numbers = np.arange(samples)

    def numpy_floor() -> Iterable[Any]:
        class Epochs:
            def __iter__(self) -> Iterator[Any]:
                usable = samples // batch_size * batch_size
                return iter(rng.permutation(numbers)[:usable].reshape(-1, batch_size))

        return Epochs()

    def size_aware_dataloader() -> Iterable[Any]:
        sampler = SizeAwareBatchSampler(RandomSampler(data), length_list.__getitem__, budget, warn_logger=None)
        return DataLoader(BatchedDataset(data), batch_sampler=sampler, collate_fn=_identity)

    cases: list[Case] = [
        (NUMPY_FLOOR, numpy_floor),
        ("DataLoader, __getitem__ per item", lambda: DataLoader(PerItemDataset(data), batch_size, shuffle=True)),
        (
            "DataLoader + __getitems__",
            lambda: DataLoader(BatchedDataset(data), batch_size, shuffle=True, collate_fn=_identity),
        ),
        ("FastLoader", lambda: FastLoader(data, batch_size)),
        ("SizeAwareBatchSampler(callable) + DataLoader", size_aware_dataloader),
        ("FastSizeAwareLoader", lambda: FastSizeAwareLoader(data, lengths, budget)),
    ]
    rows = floor_rows("loaders", _loader_workload, cases, epochs, progress)
    per_item = next(row.seconds for row in rows if "per item" in row.method)
    size_aware_baseline = next(row.seconds for row in rows if "SizeAwareBatchSampler" in row.method)
    for row in rows:
        row.speedup = (size_aware_baseline if row.workload == "size-aware" else per_item) / row.seconds
    return rows


def per_batch_rows(
    samples: int = PER_BATCH_SAMPLES,
    batch_sizes: Iterable[int] = PER_BATCH_SIZES,
    epochs: int = 5,
    progress: Progress | None = None,
) -> list[Row]:
    """The loaders' cost per batch over ``batch_sizes``, against the numpy floor and the tensor floor.

    Per batch size: the numpy floor (permutation + reshape, batches of indices), the tensor
    floor (the least work that yields tensor batches: ``torch.randperm``, one gather, one
    view per batch), ``FastLoader`` on ``torch.arange(samples)`` and ``FastSizeAwareLoader``
    on log-normal lengths with a budget of the batch size x mean length. Ratios are to the
    numpy floor; the note gives each row's overhead per batch over both floors in microseconds,
    ``(time - floor time) / batches``.
    """
    data = torch.arange(samples)
    lengths = lognormal_lengths(samples)
    rows: list[Row] = []
    for batch_size in batch_sizes:
        cases: list[Case] = [
            (NUMPY_FLOOR, partial(_NumpyFloor, samples, batch_size)),
            (TENSOR_FLOOR, partial(_TensorFloor, data, batch_size)),
            ("FastLoader", partial(FastLoader, data, batch_size)),
            ("FastSizeAwareLoader", partial(FastSizeAwareLoader, data, lengths, batch_size * int(lengths.mean()))),
        ]
        measured = epoch_times(cases, epochs, progress)
        floors = [measured[NUMPY_FLOOR][0], measured[TENSOR_FLOOR][0]]
        for name, (seconds, batches) in measured.items():
            over = [(seconds - floor) / max(batches, 1) * 1e6 for floor in floors]
            note = f"{batches:,} batches; {over[0]:+.2f} us/batch over the numpy floor, "
            note += f"{over[1]:+.2f} over the tensor floor"
            workload = f"batch size {batch_size}"
            rows.append(Row("per-batch", workload, name, seconds, NUMPY_FLOOR, seconds / floors[0], note))
    return rows


class _NumpyFloor:
    """Epochs of the numpy floor: a permutation of an ``int64`` arange, reshaped into rows of indices."""

    def __init__(self, samples: int, batch_size: int) -> None:
        self.rng = np.random.default_rng(0)
        self.numbers = np.arange(samples)
        self.usable = samples // batch_size * batch_size
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rng.permutation(self.numbers)[: self.usable].reshape(-1, self.batch_size))


class _TensorFloor:
    """Epochs of the tensor floor: ``torch.randperm``, one gather of the data, a view per batch."""

    def __init__(self, data: torch.Tensor, batch_size: int) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.data = data
        self.usable = len(data) // batch_size * batch_size
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = torch.randperm(len(self.data), generator=self.generator)[: self.usable]
        return iter(torch.index_select(self.data, 0, order).view(-1, self.batch_size).unbind(0))


def _loader_workload(name: str) -> str:
    return "seed loop" if "Size" not in name else "size-aware"


def first_batch_rows(n: int = 10**8, repeat: int = 3) -> list[Row]:
    """Time to the first batch of a FastLoader over ``n`` items vs one numpy permutation of ``n``."""
    data = torch.arange(n)
    loader = FastLoader(data, 300)
    base = "numpy permutation"
    floor = time_best(partial(np.random.default_rng(0).permutation, n), repeat)
    seconds = time_best(partial(_first_batch, loader), repeat)
    return [
        Row("first batch", f"n={n:,}", base, floor, base, 1.0),
        Row("first batch", f"n={n:,}", "FastLoader first batch", seconds, base, seconds / floor),
    ]


def _first_batch(loader: FastLoader) -> Any:
    return next(iter(loader))


class IndexDataset:
    """``n`` items that are their own indices, made on demand: a dataset of any length without its data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(indices, dtype=np.int64))


def index_sizes(indices: np.ndarray) -> np.ndarray:
    """Sizes 1..97 computed from the indices, vectorized: a ``sizeof`` for any number of items."""
    return np.asarray(indices, dtype=np.int64) % 97 + 1


def scale_rows(n: int = 10**9, rank: int = 7, world_size: int = 8, repeat: int = 3) -> list[Row]:
    """Time to the first batch and peak RSS growth of rank ``rank`` of ``world_size`` over ``n`` items.

    Each loader runs in a fresh process (its peak RSS is its own): the memory is the growth
    of the peak to the first batch of the first loader; the time is the best of ``repeat``
    loaders made and started one after the other. The ratio is to the targets, 0.5 s and
    512 MiB: below 1 meets them. The resume rows time ``load_state_dict`` of a state saved
    about half-way through the epoch, to the first batch (``resume_rows``).
    """
    rows = []
    target = f"target {SCALE_SECONDS} s, {SCALE_MIB} MiB"
    for name in ("FastLoader", "FastSizeAwareLoader"):
        seconds, mib = _in_process(f"_first_batch_here({name!r}, {n}, {rank}, {world_size}, {repeat})")
        rows.append(
            Row(
                "scale",
                f"n={n:,}, rank {rank} of {world_size}",
                f"{name} first batch",
                seconds,
                target,
                seconds / SCALE_SECONDS,
                note=f"peak RSS +{mib:.0f} MiB ({mib / SCALE_MIB:.2f} of the target)",
            )
        )
    return rows + resume_rows(n, rank, world_size, repeat)


def resume_rows(n: int = 10**9, rank: int = 7, world_size: int = 8, repeat: int = 3) -> list[Row]:
    """Time and peak RSS growth from ``load_state_dict`` of a mid-epoch state to the first batch.

    The state is the one the loader's own ``batch_sampler()`` reports after about half of the
    epoch's steps on rank ``rank`` (run in a process of its own, not timed); a fresh process
    makes the loader, then times ``load_state_dict`` and ``next(iter(loader))``, best of
    ``repeat``, its peak RSS growth counted from before the first loader was made. The ratio
    is to the targets, 1 s and 512 MiB.
    """
    rows = []
    target = f"target {RESUME_SECONDS} s, {SCALE_MIB} MiB"
    for name in ("FastLoader", "FastSizeAwareLoader"):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "state.json")
            (steps,) = _in_process(f"_save_mid_epoch({name!r}, {n}, {rank}, {world_size}, {path!r})")
            seconds, mib = _in_process(f"_resume_here({name!r}, {n}, {rank}, {world_size}, {path!r}, {repeat})")
        rows.append(
            Row(
                "scale",
                f"n={n:,}, rank {rank} of {world_size}, resumed at step {int(steps):,}",
                f"{name} resumed first batch",
                seconds,
                target,
                seconds / RESUME_SECONDS,
                note=(
                    f"load_state_dict to first batch; peak RSS +{mib:.0f} MiB ({mib / SCALE_MIB:.2f} of the target); "
                    "state from the loader's batch_sampler() after about half the epoch's steps"
                ),
            )
        )
    return rows


def _scale_loader(name: str, n: int, rank: int, world_size: int) -> Any:
    """The loader ``name`` of the scale suite: ``IndexDataset(n)``, 256 items or a budget of 4096."""
    if name == "FastLoader":
        return FastLoader(IndexDataset(n), 256, rank=rank, world_size=world_size)
    return FastSizeAwareLoader(IndexDataset(n), index_sizes, 4096, rank=rank, world_size=world_size)


def _save_mid_epoch(name: str, n: int, rank: int, world_size: int, path: str) -> None:
    """Write to ``path`` the state of ``name``'s batch sampler after about half its epoch; print the steps."""
    loader = _scale_loader(name, n, rank, world_size)
    # NOTE: len() of a size-aware epoch plans it whole; half the steps are estimated from the
    # mean size (49) instead, which puts the state a little before the middle
    total = len(loader) if name == "FastLoader" else n * 49 // 4096 // world_size
    sampler = loader.batch_sampler()
    batches = iter(sampler)
    for _ in itertools.islice(batches, total // 2):
        pass
    with open(path, "w") as file:
        json.dump(sampler.state_dict(), file)
    print(json.dumps([total // 2]))


def _resume_here(name: str, n: int, rank: int, world_size: int, path: str, repeat: int) -> None:
    """Print ``[best seconds, peak RSS growth in MiB]`` from ``load_state_dict`` to the first batch."""
    with open(path) as file:
        state = json.load(file)
    before = _memory_kib("VmRSS")
    best, growth = float("inf"), 0.0
    for run in range(repeat):
        loader = _scale_loader(name, n, rank, world_size)
        start = time.perf_counter()
        loader.load_state_dict(state)
        next(iter(loader))
        best = min(best, time.perf_counter() - start)
        if run == 0:
            growth = (_memory_kib("VmHWM") - before) / 1024
    print(json.dumps([best, growth]))


def _in_process(call: str) -> list[float]:
    """The last line ``call`` (a function of this module) prints, run in a fresh process."""
    script = f"import fastsab.bench.loaders as bench; bench.{call}"
    done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return [float(value) for value in json.loads(done.stdout.strip().splitlines()[-1])]


def _first_batch_here(name: str, n: int, rank: int, world_size: int, repeat: int) -> None:
    """Print ``[best seconds, peak RSS growth in MiB]`` of this process's first batches of ``name``.

    The growth is the peak RSS after the first batch less the RSS in use before the loader was
    made: an upper bound (a peak of the imports counts in it too, where it was higher).
    """
    before = _memory_kib("VmRSS")
    best, growth = float("inf"), 0.0
    for run in range(repeat):
        start = time.perf_counter()
        next(iter(_scale_loader(name, n, rank, world_size)))
        best = min(best, time.perf_counter() - start)
        if run == 0:
            growth = (_memory_kib("VmHWM") - before) / 1024
    print(json.dumps([best, growth]))


def _memory_kib(field: str) -> float:
    """This process's ``VmRSS`` (in use) or ``VmHWM`` (peak) in KiB, from ``/proc/self/status``.

    Where there is no ``/proc``, both are the peak ``ru_maxrss``, which can only understate the growth.
    """
    # NOTE: not ru_maxrss where /proc exists: Linux keeps it across exec, so a process started
    # by a large parent would report the parent's peak as its own; VmHWM is this image's
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return float(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform == "darwin" else float(peak)  # (bytes on macOS, KiB elsewhere)
