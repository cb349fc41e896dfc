"""The loader workloads of ``fastsab bench``: the seed loop and its size-aware version per epoch, the per-batch
overhead over a sweep of batch sizes, and the time to the first batch, against DataLoader and the numpy
floor (the scale suite is in ``scale``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from fastsab.bench.epochs import Case, Progress, epoch_times, floor_rows, one_thread
from fastsab.bench.report import Row, time_best
from fastsab.bench.workloads import index_sizes, lognormal_lengths
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader
from fastsab.plan._sum_kernel import _sum_split
from fastsab.plan.compiled import compiled_sum_walk, use_compiled
from fastsab.plan.cost_sources import make_cost_source
from fastsab.plan.epochs import EpochOrder

__all__ = [
    "PER_BATCH_SAMPLES",
    "SIZE_AWARE_COMPILED",
    "SIZE_AWARE_FLOOR",
    "BatchedDataset",
    "PerItemDataset",
    "first_batch_rows",
    "loader_rows",
    "per_batch_rows",
]

#: Items per epoch of the per-batch sweep.
PER_BATCH_SAMPLES = 240_000
#: Batch sizes of the per-batch sweep.
PER_BATCH_SIZES = (64, 256, 1024)
NUMPY_FLOOR = "numpy permutation+reshape (floor)"
TENSOR_FLOOR = "torch permutation + gather + unbind (tensor floor)"


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
        *_size_aware_cases(partial(FastSizeAwareLoader, data, lengths, budget)),
    ]
    try:
        rows = floor_rows("loaders", _loader_workload, cases, epochs, progress)
    finally:
        use_compiled(False)
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
    on log-normal lengths with a budget of the batch size x mean length (where numba is
    installed, also with its split compiled: ``use_compiled``), and the least such a loader can
    take (``_SizeAwareFloor``: FastLoader's epoch plus the split's own work). Ratios are to the
    numpy floor; the note gives each row's overhead per batch over both floors in microseconds,
    ``(time - floor time) / batches``.
    """
    data = torch.arange(samples)
    lengths = lognormal_lengths(samples)
    rows: list[Row] = []
    for batch_size in batch_sizes:
        size_aware = partial(FastSizeAwareLoader, data, lengths, batch_size * int(lengths.mean()))
        floor = partial(
            _SizeAwareFloor, partial(FastLoader, data, batch_size), lengths, batch_size * int(lengths.mean())
        )
        cases: list[Case] = [
            (NUMPY_FLOOR, partial(_NumpyFloor, samples, batch_size)),
            (TENSOR_FLOOR, partial(_TensorFloor, data, batch_size)),
            ("FastLoader", partial(FastLoader, data, batch_size)),
            *_size_aware_cases(size_aware),
            *_size_aware_cases(floor, SIZE_AWARE_FLOOR),
        ]
        try:
            measured = epoch_times(cases, epochs, progress)
        finally:
            use_compiled(False)
        floors = [measured[NUMPY_FLOOR][0], measured[TENSOR_FLOOR][0]]
        for name, (seconds, batches) in measured.items():
            over = [(seconds - floor) / max(batches, 1) * 1e6 for floor in floors]
            note = f"{batches:,} batches; {over[0]:+.2f} us/batch over the numpy floor, "
            note += f"{over[1]:+.2f} over the tensor floor"
            workload = f"batch size {batch_size}"
            rows.append(Row("per-batch", workload, name, seconds, NUMPY_FLOOR, seconds / floors[0], note))
    return rows


#: The size-aware loader's row with its split compiled (``use_compiled``), where numba is installed.
SIZE_AWARE_COMPILED = "FastSizeAwareLoader (use_compiled)"
#: The per-batch sweep's row of the least a size-aware loader can take (``_SizeAwareFloor``).
SIZE_AWARE_FLOOR = "FastLoader + the split's own work (size-aware floor)"


def _size_aware_cases(make: Callable[[], Iterable[Any]], name: str = "FastSizeAwareLoader") -> list[Case]:
    """``name``'s epochs of ``make()`` with the numpy walks, and (where numba is installed) the compiled ones."""
    cases: list[Case] = [(name, lambda: _Walked(make(), compiled=False))]
    if use_compiled(wait=True):
        cases.append((f"{name} (use_compiled)", lambda: _Walked(make(), compiled=True)))
    use_compiled(False)
    return cases


class _Walked:
    """A loader's epochs, its splits walked by the compiled walks or by the numpy ones (``use_compiled``)."""

    def __init__(self, loader: Iterable[Any], compiled: bool) -> None:
        self.loader, self.compiled = loader, compiled

    def __iter__(self) -> Iterator[Any]:
        # NOTE: the choice is global and the cases of epoch_times take turns: each epoch sets it again
        use_compiled(self.compiled)
        return iter(self.loader)


class _SizeAwareFloor:
    """Epochs of a ``FastLoader`` plus the work of a size-aware split itself: the least a size-aware loader takes.

    Per group of an epoch's order (grouped as the loader's): the items' sizes looked up (as the
    loader's cost source does), then summed and walked to the batch ends (the numpy walk, or the compiled one after
    ``use_compiled``). A ``FastSizeAwareLoader`` does this and all a ``FastLoader`` does; its carry
    from group to group, its figures and its bookkeeping are left out.
    """

    def __init__(self, make: Callable[[], FastLoader[Any]], lengths: np.ndarray, budget: int) -> None:
        self.loader = make()
        self.costs = make_cost_source(lengths, len(lengths))
        # NOTE: the groups of an epoch's order, made once: the loader's shuffle is timed in its own epoch
        self.groups = list(EpochOrder(len(lengths), shuffle=True).chunks(0))
        self.budget = budget

    def __iter__(self) -> Iterator[Any]:
        caps = np.array([self.budget])
        for group in self.groups:
            _sum_split(self.costs(group)[:, None], caps, [self.budget], None, 1, None, True)
        return iter(self.loader)


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
    """Time to the first batch of the loaders over ``n`` items vs one numpy permutation of ``n``.

    ``FastLoader`` over ``torch.arange(n)`` (batches of 300) and ``FastSizeAwareLoader`` over the
    same data, sizes 1 to 97 read from the indices (``index_sizes``) under a budget of 4096, with
    ``cost="sum"`` and ``cost="padded"``. Each loader is made beforehand; its time is the best of
    ``5 * repeat`` first batches, in one torch thread. Where numba is installed, two more sets of
    rows: the padded loader once its split is compiled (``use_compiled``), and the three loaders'
    first batches right after ``use_compiled()``, while it compiles in its thread (in ``repeat``
    fresh processes, the best of them). The ratio is the time over the permutation's, measured in
    this run; the note says how many times sooner the first batch comes.
    """
    data = torch.arange(n)
    base = "numpy permutation"
    work = f"n={n:,}"
    floor = time_best(partial(np.random.default_rng(0).permutation, n), repeat)
    rows = [Row("first batch", work, base, floor, base, 1.0)]

    def row(name: str, seconds: float, note: str = "") -> Row:
        sooner = f"{floor / seconds:,.0f}x sooner"
        return Row("first batch", work, f"{name} first batch", seconds, base, seconds / floor, _joined(sooner, note))

    with one_thread():
        loaders = _first_batch_loaders(data)
        for name, loader in loaders.items():
            rows.append(row(name, time_best(partial(_first_batch, loader), 5 * repeat)))
        if use_compiled(wait=True):
            try:
                padded = loaders[PADDED_LOADER]
                rows.append(row(PADDED_LOADER, time_best(partial(_first_batch, padded), 5 * repeat), COMPILED))
            finally:
                use_compiled(False)
            for name, seconds, compiling in _first_batches_while_compiling(n, repeat):
                rows.append(row(name, seconds, f"right after use_compiled(), {compiling}"))
    return rows


#: The size-aware loaders of ``first_batch_rows`` (the padded one is also timed with its split compiled).
SUM_LOADER = 'FastSizeAwareLoader cost="sum"'
PADDED_LOADER = 'FastSizeAwareLoader cost="padded"'
COMPILED = "its split compiled (use_compiled)"


def _first_batch_loaders(data: torch.Tensor) -> dict[str, Any]:
    """The loaders of ``first_batch_rows`` over ``data``."""
    return {
        "FastLoader": FastLoader(data, 300),
        SUM_LOADER: FastSizeAwareLoader(data, index_sizes, 4096),
        PADDED_LOADER: FastSizeAwareLoader(data, index_sizes, 4096, cost="padded"),
    }


def _first_batch(loader: Any) -> Any:
    return next(iter(loader))


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _first_batches_while_compiling(n: int, repeat: int) -> list[tuple[str, float, str]]:
    """Each loader's best first batch over ``repeat`` fresh processes, right after ``use_compiled()``.

    Returns ``(name, seconds, whether the compile was still running at the last first batch)``.
    """
    script = f"from fastsab.bench.loaders import _while_compiling; _while_compiling({n})"
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    names = list(runs[0]["seconds"])
    still = all(run["compiling"] for run in runs)
    compiling = "the compile still running" if still else "the compile over in some runs"
    return [(name, min(run["seconds"][name] for run in runs), compiling) for name in names]


def _while_compiling(n: int) -> None:
    """Print (JSON) the first batch's seconds of each loader, made beforehand, right after ``use_compiled()``."""
    with one_thread():
        loaders = _first_batch_loaders(torch.arange(n))
        for loader in loaders.values():
            _first_batch(loader)  # NOTE: a warm-up, as time_best's: the first calls of a process are not timed
        seconds = {}
        use_compiled()  # from here on numba compiles (or loads its cache) in a thread of its own
        for name, loader in loaders.items():
            start = time.perf_counter()
            _first_batch(loader)
            seconds[name] = time.perf_counter() - start
        compiling = compiled_sum_walk() is None  # (compiled after the padded walk)
    print(json.dumps({"seconds": seconds, "compiling": compiling}))
