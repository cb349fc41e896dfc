"""fastsab: fast, size-aware batching for PyTorch."""

from fastsab.batching import BatchSplit, Carry, split_batches
from fastsab.epochs import EpochStats
from fastsab.feeder import OutOfCoreDataset
from fastsab.fetch import collate_batch
from fastsab.loader import FastLoader, FastSizeAwareLoader
from fastsab.samplers import (
    BucketBatchSampler,
    Buckets,
    PlannedBatchSampler,
    PlannedDataLoader,
    SizeAwareBatchSampler,
    create_buckets,
)
from fastsab.shuffle import GroupedPermutation, grouped_permutation
from fastsab.streaming import size_aware_batching

__all__ = [
    "BatchSplit",
    "BucketBatchSampler",
    "Buckets",
    "Carry",
    "EpochStats",
    "FastLoader",
    "FastSizeAwareLoader",
    "GroupedPermutation",
    "OutOfCoreDataset",
    "PlannedBatchSampler",
    "PlannedDataLoader",
    "SizeAwareBatchSampler",
    "collate_batch",
    "create_buckets",
    "grouped_permutation",
    "size_aware_batching",
    "split_batches",
]

__version__ = "0.1.0"
