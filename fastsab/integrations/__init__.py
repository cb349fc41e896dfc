"""Integrations with other engines; each imports its engine only when imported itself.

- :mod:`fastsab.integrations.lightning`: a ``LightningDataModule`` over the fast loaders
  (``pip install fastsab[lightning]``).
- :mod:`fastsab.integrations.transformers`: a ``transformers.Trainer`` that trains on a fast
  loader (``pip install fastsab[transformers]``).
- :mod:`fastsab.integrations.webdataset`: size-aware batching for WebDataset pipelines and a
  data module over tar shards (``pip install fastsab[webdataset]``).
"""
