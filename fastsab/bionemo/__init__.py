"""The bionemo-compatible API, on fastsab's greedy rule and plans.

``size_aware_batching`` (:mod:`~fastsab.bionemo.streaming`, item by item for plain iterables),
``SizeAwareBatchSampler`` (:mod:`~fastsab.bionemo.samplers`), ``BucketBatchSampler`` and
``create_buckets`` (:mod:`~fastsab.bionemo.buckets`). All are importable from :mod:`fastsab`.

Imports :mod:`fastsab.loaders` (a sampler's plan handed to a ``DataLoader``) and the stages below it.
"""
