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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from fastsab.batching import split_batches
from fastsab.shuffle import GroupedPermutation

__all__ = ["Row", "kernel_rows", "lognormal_lengths", "machine_info", "permutation_rows", "time_best", "to_markdown"]


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
    """

    suite: str
    workload: str
    method: str
    seconds: float
    baseline: str
    ratio: float
    note: str = ""

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


def kernel_rows(sizes: Iterable[int], repeat: int = 3) -> list[Row]:
    """Split kernel vs one ``np.cumsum`` over the same costs (int and float, sum and padded).

    Budget is 300 x the mean length, as in the size-aware loader workload.
    """
    rows = []
    for n in sizes:
        lengths = lognormal_lengths(n)
        budget = 300 * int(lengths.mean())
        floats = lengths * 1.0009765625  # non-integer float costs, exact in binary
        base = "np.cumsum (floor)"
        floor = time_best(partial(np.cumsum, lengths), repeat)
        rows.append(Row("split kernel", f"n={n:,}", base, floor, base, 1.0))
        cases = [
            ("split_batches int", partial(split_batches, lengths, budget)),
            ("split_batches float", partial(split_batches, floats, float(budget))),
            ("split_batches padded", partial(split_batches, lengths, budget, cost="padded")),
        ]
        for name, fn in cases:
            seconds = time_best(fn, repeat)
            note = f"{fn().num_batches:,} batches"
            rows.append(Row("split kernel", f"n={n:,}", name, seconds, base, seconds / floor, note))
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
        cases = [
            ("torch.randperm", partial(torch.randperm, n)),
            ("GroupedPermutation epoch", partial(perm.permutation, 1)),
            ("GroupedPermutation first group", partial(_first_group, perm)),
        ]
        for name, fn in cases:
            seconds = time_best(fn, repeat)
            rows.append(Row("permutation", work, name, seconds, base, seconds / floor))
    return rows


def _first_group(perm: GroupedPermutation) -> np.ndarray:
    return next(perm.groups(1))


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
        **s**
        <BLANKLINE>
        | workload | method | ms | x baseline | note |
        |---|---|---:|---:|---|
        | n=1 | a | 2.00 | 1.00 | |
    """
    out: list[str] = []
    for suite in dict.fromkeys(row.suite for row in rows):
        if out:
            out.append("")
        out += [f"**{suite}**", "", "| workload | method | ms | x baseline | note |", "|---|---|---:|---:|---|"]
        for row in rows:
            if row.suite == suite:
                note = f" {row.note} " if row.note else " "
                out.append(f"| {row.workload} | {row.method} | {row.seconds * 1e3:.2f} | {row.ratio:.2f} |{note}|")
    return "\n".join(out)
