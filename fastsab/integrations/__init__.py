"""Integrations with other engines; each imports its engine only when imported itself.

- ``fastsab.integrations.accelerate``: ``prepare_loader``, the fast loaders prepared for a
  Hugging Face ``Accelerator`` (``pip install fastsab[accelerate]``).
- ``fastsab.integrations.lightning``: a ``LightningDataModule`` over the fast loaders
  (``pip install fastsab[lightning]``).
- ``fastsab.integrations.transformers``: a ``transformers.Trainer`` that trains on a fast
  loader (``pip install fastsab[transformers]``).
- ``fastsab.integrations.webdataset``: size-aware batching for WebDataset pipelines
  (``pip install fastsab[webdataset]``) and data modules over tar shards (which need
  ``fastsab[lightning]`` too).

``tools/check_extras.py`` checks each module in an environment with only its extra installed;
a new module needs a row in its table.
"""
