"""Datasets larger than RAM: ``OutOfCoreDataset`` and the parts it is made of.

- ``dataset``: ``OutOfCoreDataset`` (its budget, constructors
  and ``__getitems__``) and ``OVERHEAD_BYTES``.
- ``chunks``: ``ChunkCache``, the
  chunks held (at most two) and the read ahead of the next one.
- ``reads``: samples read by identity into stacked chunks.
- ``samples``: the layout every sample must share, and its checks.
- ``memmap``: rows of a file-backed memmap, read with plain file reads.
"""

from __future__ import annotations

from fastsab.out_of_core.dataset import OVERHEAD_BYTES, OutOfCoreDataset

__all__ = ["OVERHEAD_BYTES", "OutOfCoreDataset"]
