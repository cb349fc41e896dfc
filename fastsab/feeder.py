"""The former home of ``OutOfCoreDataset``, kept so that ``fastsab.feeder`` imports keep working.

The dataset now lives in ``fastsab.out_of_core``.
"""

from __future__ import annotations

from fastsab.out_of_core.dataset import OVERHEAD_BYTES, OutOfCoreDataset

__all__ = ["OVERHEAD_BYTES", "OutOfCoreDataset"]
