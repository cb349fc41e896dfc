"""The APIs of peer libraries on top of fastsab: change the import, keep the code.

- ``fastsab.compat.toma``: toma 1.1's ``toma``, ``explicit`` and ``simple`` forms and its
  cache types, on ``fastsab.adaptive``.

bionemo-size-aware-batching 1.0's API needs no module of its own: ``size_aware_batching``,
``SizeAwareBatchSampler``, ``BucketBatchSampler`` and ``create_buckets`` are importable from
``fastsab`` with the same signatures.
"""
