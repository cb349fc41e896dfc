"""Benchmark workloads of ``fastsab bench``: ratios measured in one run.

Every table row carries the measured time and its ratio to a floor measured in the same
run (``np.cumsum`` for the split kernel, ``numpy.random.Generator.permutation`` for
shuffles, the numpy permutation+reshape loop for loaders), so results stay comparable on
noisy shared machines.
"""

from __future__ import annotations

import gc
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from fastsab import adaptive
from fastsab.batching import split_batches
from fastsab.loader import FastLoader, FastSizeAwareLoader
from fastsab.samplers import SizeAwareBatchSampler
from fastsab.shuffle import GroupedPermutation

__all__ = [
    "Row",
    "adaptive_rows",
    "first_batch_rows",
    "kernel_rows",
    "loader_rows",
    "lognormal_lengths",
    "machine_info",
    "permutation_rows",
    "time_best",
    "to_markdown",
]


@dataclass
class Row:
    """One measured line of a benchmark table.

    Attributes:
        suite: Table the row belongs to.
        workload: What was run (e.g. ``split n=10**7``).
        method: Who ran it.
        seconds: Best time over the repeats.
        baseline: Method the ratio refers to.
        ratio: ``seconds / baseline seconds`` (``< 1`` is faster than the baseline).
        note: Extra facts (batches, items).
        speedup: For loader rows, DataLoader-per-item time of the same workload / this time.
    """

    suite: str
    workload: str
    method: str
    seconds: float
    baseline: str
    ratio: float
    note: str = ""
    speedup: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_best(fn: Callable[[], Any], repeat: int = 3, warmup: int = 1) -> float:
    """Best wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs, in seconds.

    Examples:
        >>> time_best(lambda: sum(range(10)), repeat=2) >= 0
        True
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def lognormal_lengths(n: int, seed: int = 0, mean: float = 150.0, sigma: float = 1.0) -> np.ndarray:
    """The size-aware workload: log-normal lengths with the given mean, clipped to [8, 4000].

    Examples:
        >>> lengths = lognormal_lengths(100_000)
        >>> bool(lengths.min() >= 8 and lengths.max() <= 4000), bool(130 < lengths.mean() < 170)
        (True, True)
    """
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, n), 8, 4000).astype(np.int64)


def kernel_rows(sizes: Iterable[int], repeat: int = 5) -> list[Row]:
    """Split kernel vs one ``np.cumsum`` over the same costs (int and float, sum and padded).

    Budget is 300 x the mean length, as in the size-aware loader workload.
    """
    rows = []
    for n in sizes:
        lengths = lognormal_lengths(n)
        budget = 300 * int(lengths.mean())
        floats = lengths * 1.0009765625  # non-integer float costs, exact in binary
        work = f"n={n:,}"
        for kind, costs, cap in (("int", lengths, budget), ("float", floats, float(budget))):
            base = f"np.cumsum {kind} (floor)"
            floor = time_best(partial(np.cumsum, costs), repeat)
            rows.append(Row("split kernel", work, base, floor, base, 1.0))
            modes: tuple[Literal["sum", "padded"], ...] = ("sum", "padded") if kind == "int" else ("sum",)
            for mode in modes:
                fn = partial(split_batches, costs, cap, cost=mode)
                seconds = time_best(fn, repeat)
                note = f"{fn().num_batches:,} batches"
                rows.append(
                    Row("split kernel", work, f"split_batches {kind} {mode}", seconds, base, seconds / floor, note)
                )
    return rows


def permutation_rows(sizes: Iterable[int], repeat: int = 3, group_size: int = 2**16) -> list[Row]:
    """A grouped permutation per epoch and to its first group, vs numpy and torch."""
    rows = []
    for n in sizes:
        rng = np.random.default_rng(0)
        perm = GroupedPermutation(n, group_size, seed=0)
        work = f"n={n:,}"
        base = "numpy permutation"
        floor = time_best(partial(rng.permutation, n), repeat)
        rows.append(Row("permutation", work, base, floor, base, 1.0))
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("torch.randperm", partial(torch.randperm, n)),
            ("GroupedPermutation epoch", partial(perm.permutation, 1)),
            ("GroupedPermutation first group", partial(_first_group, perm)),
        ]
        for name, fn in cases:
            seconds = time_best(fn, repeat)
            rows.append(Row("permutation", work, name, seconds, base, seconds / floor))
    return rows


class PerItemDataset(Dataset):
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


def _epoch_times(
    cases: list[tuple[str, Callable[[], Iterable[Any]]]],
    epochs: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, tuple[float, int]]:
    """Best seconds per epoch of each case, and its batches.

    After one warm-up epoch each, the cases run one epoch in turn, ``epochs`` rounds, so
    that a slow spell of a shared machine hits all of them alike.
    """
    iterables = {}
    batches = {}
    for name, make in cases:
        if progress is not None:
            progress(name)
        iterables[name] = make()
        batches[name] = sum(1 for _ in iterables[name])
    best = dict.fromkeys(iterables, float("inf"))
    for _ in range(epochs):
        for name, iterable in iterables.items():
            gc.collect()
            start = time.perf_counter()
            for _ in iterable:
                pass
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], batches[name]) for name in iterables}


def loader_rows(
    samples: int = 300_000,
    batch_size: int = 300,
    epochs: int = 3,
    progress: Callable[[str], None] | None = None,
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

    cases: list[tuple[str, Callable[[], Iterable[Any]]]] = [
        ("numpy permutation+reshape (floor)", numpy_floor),
        ("DataLoader, __getitem__ per item", lambda: DataLoader(PerItemDataset(data), batch_size, shuffle=True)),
        (
            "DataLoader + __getitems__",
            lambda: DataLoader(BatchedDataset(data), batch_size, shuffle=True, collate_fn=_identity),
        ),
        ("FastLoader", lambda: FastLoader(data, batch_size)),
        ("SizeAwareBatchSampler(callable) + DataLoader", size_aware_dataloader),
        ("FastSizeAwareLoader", lambda: FastSizeAwareLoader(data, lengths, budget)),
    ]
    rows: list[Row] = []
    measured = _epoch_times(cases, epochs, progress)
    floor = measured[cases[0][0]][0]
    for name, (seconds, n_batches) in measured.items():
        workload = "seed loop" if "Size" not in name else "size-aware"
        base = "numpy permutation+reshape (floor)"
        rows.append(Row("loaders", workload, name, seconds, base, seconds / floor, f"{n_batches:,} batches"))
    per_item = next(row.seconds for row in rows if "per item" in row.method)
    size_aware_baseline = next(row.seconds for row in rows if "SizeAwareBatchSampler" in row.method)
    for row in rows:
        row.speedup = (size_aware_baseline if row.workload == "size-aware" else per_item) / row.seconds
    return rows


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


def _first_group(perm: GroupedPermutation) -> np.ndarray:
    return next(perm.groups(1))


def adaptive_rows(calls: int = 200, repeat: int = 9) -> list[Row]:
    """Overhead of the adaptive batch decorator on its cached fast path (no OOM).

    Two workloads: a no-op (the wrapper's own cost per call, in isolation) and matrix
    products repeated to take about 2 ms per call. Each row is the time per call over
    ``calls`` calls, best of ``repeat``, with the methods measured in turn each repeat so
    that drifts of a shared machine hit them alike.
    """
    left, right = torch.randn(300, 300), torch.randn(300, 300)
    reps = 10

    def matmuls(batch_size: int) -> torch.Tensor:
        out = left
        for _ in range(reps):
            out = torch.mm(left, right)
        return out

    reps = max(1, round(2e-3 / (time_best(partial(matmuls, 0), 10) / reps)))  # about 2 ms per call

    def noop(batch_size: int) -> int:
        return batch_size

    rows = []
    for workload, operation in (("no-op", noop), ("~2 ms op", matmuls)):
        methods: list[tuple[str, Callable[[], Any]]] = [
            ("direct call", partial(operation, 64)),
            ("batch, StackMemoryCache (default)", adaptive.batch(operation, initial_batch_size=64)),
            ("batch, GlobalCache", adaptive.batch(operation, initial_batch_size=64, cache=adaptive.GlobalCache)),
            ("batch, NoCache", adaptive.batch(operation, initial_batch_size=64, cache=None)),
        ]
        best = dict.fromkeys((name for name, _ in methods), float("inf"))
        for _ in range(repeat):
            for name, fn in methods:
                gc.collect()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / calls)
        floor = best["direct call"]
        for name, seconds in best.items():
            overhead = f"{(seconds - floor) * 1e6:+.1f} us per call"
            rows.append(Row("adaptive overhead", workload, name, seconds, "direct call", seconds / floor, overhead))
    return rows


def machine_info() -> str:
    """One line naming the machine and versions the numbers were measured on."""
    return (
        f"{platform.machine()}, {torch.get_num_threads()} threads, Python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}"
    )


def to_markdown(rows: list[Row]) -> str:
    """Render rows as one markdown table per suite.

    Examples:
        >>> print(to_markdown([Row("s", "n=1", "a", 0.002, "a", 1.0)]))
        **s** (x baseline = time / time of a on the same workload; lower is faster)
        <BLANKLINE>
        | workload | method | ms | x baseline | speed-up | note |
        |---|---|---:|---:|---:|---|
        | n=1 | a | 2 | 1 |  |  |
    """
    out: list[str] = []
    for suite in dict.fromkeys(row.suite for row in rows):
        if out:
            out.append("")
        suite_rows = [row for row in rows if row.suite == suite]
        baselines = " or ".join(dict.fromkeys(row.baseline for row in suite_rows))
        out += [f"**{suite}** (x baseline = time / time of {baselines} on the same workload; lower is faster)", ""]
        out += ["| workload | method | ms | x baseline | speed-up | note |", "|---|---|---:|---:|---:|---|"]
        for row in suite_rows:
            speedup = f"{row.speedup:.1f}x" if row.speedup is not None else ""
            cells = [row.workload, row.method, f"{row.seconds * 1e3:.4g}", f"{row.ratio:.3g}", speedup, row.note]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
