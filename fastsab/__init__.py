"""fastsab: fast, size-aware batching for PyTorch."""

from fastsab.batching import BatchSplit, Carry, split_batches
from fastsab.buckets import BucketBatchSampler, Buckets, create_buckets
from fastsab.collate import PackCollator, PadCollator
from fastsab.epochs import EpochStats
from fastsab.fetch import collate_batch
from fastsab.loader import FastLoader, FastSizeAwareLoader
from fastsab.out_of_core import OutOfCoreDataset
from fastsab.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.ragged import RaggedDataset
from fastsab.samplers import SizeAwareBatchSampler
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
    "PackCollator",
    "PadCollator",
    "PlannedBatchSampler",
    "PlannedDataLoader",
    "RaggedDataset",
    "SizeAwareBatchSampler",
    "collate_batch",
    "create_buckets",
    "grouped_permutation",
    "size_aware_batching",
    "split_batches",
]

__version__ = "0.1.0"
