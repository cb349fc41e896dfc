"""Benchmark workloads of ``fastsab bench``: ratios measured in one run.

Every table row carries the measured time and its ratio to a floor measured in the same
run (``np.cumsum`` for the split kernel, ``numpy.random.Generator.permutation`` for
shuffles, the numpy permutation+reshape loop for loaders), so results stay comparable on
noisy shared machines.

- :mod:`~fastsab.bench.report`: :class:`Row`, timing, the machine line and the markdown tables.
- :mod:`~fastsab.bench.workloads`: the split kernel, permutations and the adaptive overhead.
- :mod:`~fastsab.bench.epochs`: epoch timings of cases, as rows against a floor.
- :mod:`~fastsab.bench.loaders`: the loaders per epoch and the time to the first batch.
- :mod:`~fastsab.bench.varlen`: variable-length batches: padded and packing efficiency, steps and time.
"""

from __future__ import annotations

# NOTE: the datasets of the loader workloads stay reachable here, as before the split, outside __all__
from fastsab.bench.loaders import BatchedDataset, PerItemDataset, first_batch_rows, loader_rows  # noqa: F401
from fastsab.bench.report import Row, machine_info, time_best, to_markdown
from fastsab.bench.varlen import plot_varlen, varlen_rows
from fastsab.bench.workloads import adaptive_rows, kernel_rows, lognormal_lengths, permutation_rows

__all__ = [
    "Row",
    "adaptive_rows",
    "first_batch_rows",
    "kernel_rows",
    "loader_rows",
    "lognormal_lengths",
    "machine_info",
    "permutation_rows",
    "plot_varlen",
    "time_best",
    "to_markdown",
    "varlen_rows",
]
