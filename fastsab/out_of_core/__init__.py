"""Datasets larger than RAM: :class:`OutOfCoreDataset` and the parts it is made of.

- :mod:`~fastsab.out_of_core.dataset`: :class:`OutOfCoreDataset` (its budget, constructors
  and ``__getitems__``) and :data:`OVERHEAD_BYTES`.
- :mod:`~fastsab.out_of_core.chunks`: :class:`~fastsab.out_of_core.chunks.ChunkCache`, the
  chunks held (at most two) and the read ahead of the next one.
- :mod:`~fastsab.out_of_core.reads`: samples read by identity into stacked chunks.
- :mod:`~fastsab.out_of_core.samples`: the layout every sample must share, and its checks.
- :mod:`~fastsab.out_of_core.memmap`: rows of a file-backed memmap, read with plain file reads.
"""

from __future__ import annotations

from fastsab.out_of_core.dataset import OVERHEAD_BYTES, OutOfCoreDataset

__all__ = ["OVERHEAD_BYTES", "OutOfCoreDataset"]
