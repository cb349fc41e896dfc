"""Benchmark workloads of ``fastsab bench``: ratios measured in one run.

Every table row carries the measured time and its ratio to a floor measured in the same
run (``np.cumsum`` for the split kernel, ``numpy.random.Generator.permutation`` for
shuffles, the numpy permutation+reshape loop for loaders), so results stay comparable on
noisy shared machines.

- ``report``: ``Row``, timing, the machine line and the markdown tables.
- ``workloads``: the split kernel, permutations and the adaptive overhead.
- ``epochs``: epoch timings of cases, as rows against a floor.
- ``loaders``: the loaders per epoch, the time to the first batch, and a rank's
  first batch of a huge epoch (time and memory, ``scale_rows``).
- ``varlen``: variable-length batches: padded and packing efficiency, steps and time.
- ``end_to_end``: the loaders feeding a small model's training step.
- ``device``: batches moved to a device against a pinned ``copy_``, and a training step there.
- ``fidelity``: memory budgets measured on small models (on the CPU or a CUDA device).
"""

from __future__ import annotations

# NOTE: the datasets of the loader workloads stay reachable here, as before the split, outside __all__
from fastsab.bench.end_to_end import end_to_end_rows
from fastsab.bench.loaders import BatchedDataset, PerItemDataset, first_batch_rows, loader_rows  # noqa: F401
from fastsab.bench.report import Row, machine_info, time_best, to_markdown
from fastsab.bench.varlen import plot_varlen, varlen_rows
from fastsab.bench.workloads import adaptive_rows, kernel_rows, lognormal_lengths, permutation_rows

__all__ = [
    "Row",
    "adaptive_rows",
    "end_to_end_rows",
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
