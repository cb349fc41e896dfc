"""The bionemo-compatible API, on fastsab's greedy rule and plans.

``size_aware_batching`` (``streaming``, item by item for plain iterables),
``SizeAwareBatchSampler`` (``samplers``), ``BucketBatchSampler`` and
``create_buckets`` (``buckets``). All are importable from ``fastsab``.

Imports ``fastsab.loaders`` (a sampler's plan handed to a ``DataLoader``) and the stages below it.
"""
