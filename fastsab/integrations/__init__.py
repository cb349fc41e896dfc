"""Integrations with other engines; each imports its engine only when imported itself.

- :mod:`fastsab.integrations.accelerate`: ``prepare_loader``, the fast loaders prepared for a
  Hugging Face ``Accelerator`` (``pip install fastsab[accelerate]``).
- :mod:`fastsab.integrations.lightning`: a ``LightningDataModule`` over the fast loaders
  (``pip install fastsab[lightning]``).
- :mod:`fastsab.integrations.webdataset`: size-aware batching for WebDataset pipelines and a
  data module over tar shards (``pip install fastsab[webdataset]``).
"""
