"""fastsab: fast, size-aware batching for PyTorch."""

from fastsab.bionemo.buckets import BucketBatchSampler, Buckets, create_buckets
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from fastsab.bionemo.streaming import size_aware_batching
from fastsab.fetch.fetcher import collate_batch
from fastsab.fetch.mixture import Mixture, MixtureSamplesError
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader
from fastsab.loaders.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.out_of_core import OutOfCoreDataset
from fastsab.plan.batching import BatchSplit, Carry, split_batches
from fastsab.plan.shape_buckets import ShapeBuckets
from fastsab.plan.shuffle import GroupedPermutation, grouped_permutation
from fastsab.position.stats import EpochStats
from fastsab.varlen.collate import PackCollator, PadCollator
from fastsab.varlen.ragged import RaggedDataset

__all__ = [
    "BatchSplit",
    "BucketBatchSampler",
    "Buckets",
    "Carry",
    "EpochStats",
    "FastLoader",
    "FastSizeAwareLoader",
    "GroupedPermutation",
    "Mixture",
    "MixtureSamplesError",
    "OutOfCoreDataset",
    "PackCollator",
    "PadCollator",
    "PlannedBatchSampler",
    "PlannedDataLoader",
    "RaggedDataset",
    "ShapeBuckets",
    "SizeAwareBatchSampler",
    "collate_batch",
    "create_buckets",
    "grouped_permutation",
    "size_aware_batching",
    "split_batches",
]

__version__ = "0.1.0"
