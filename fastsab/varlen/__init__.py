"""Variable-length data: collators that pad or pack, and ragged datasets gathered without per-item Python.

``PadCollator`` and ``PackCollator``
(``collate``) over their base (``collator``, samples read by
``sample_columns``); ``RaggedDataset``
(``ragged``) and where its values come from (``ragged_sources``).

Imports ``fastsab.plan`` (the padded length the budget charges) and the checks only.
"""
