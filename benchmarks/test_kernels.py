"""pytest-benchmark suite for the split kernel and grouped permutations.

Run with ``python -m pytest benchmarks -n 0 --benchmark-enable``. Compare within a group: the
floor of each group (``np.cumsum``, ``numpy permutation``) is measured in the same run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsab import GroupedPermutation, split_batches
from fastsab.bench import lognormal_lengths


@pytest.fixture(scope="module", params=[10**6, 10**7], ids=["1e6", "1e7"])
def lengths(request):
    return lognormal_lengths(request.param)


def test_cumsum_floor(benchmark, lengths):
    benchmark.group = f"split n={len(lengths):.0e}"
    benchmark(np.cumsum, lengths)


@pytest.mark.parametrize("kind", ["int", "float", "padded"])
def test_split_kernel(benchmark, lengths, kind):
    benchmark.group = f"split n={len(lengths):.0e}"
    budget = 300 * int(lengths.mean())
    if kind == "float":
        split = benchmark(split_batches, lengths * 1.0009765625, float(budget))
    else:
        split = benchmark(split_batches, lengths, budget, cost="sum" if kind == "int" else "padded")
    assert split.offsets[-1] == len(lengths)


@pytest.mark.parametrize("n", [10**6, 10**8], ids=["1e6", "1e8"])
@pytest.mark.parametrize("method", ["numpy", "torch", "grouped", "grouped-first-group"])
def test_permutation(benchmark, n, method):
    benchmark.group = f"permutation n={n:.0e}"
    rng = np.random.default_rng(0)
    perm = GroupedPermutation(n)
    fn = {
        "numpy": lambda: rng.permutation(n),
        "torch": lambda: torch.randperm(n),
        "grouped": lambda: perm.permutation(1),
        "grouped-first-group": lambda: next(perm.groups(1)),
    }[method]
    benchmark.pedantic(fn, rounds=3, warmup_rounds=1)
