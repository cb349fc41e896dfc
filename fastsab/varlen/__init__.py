"""Variable-length data: collators that pad or pack, and ragged datasets gathered without per-item Python.

:class:`~fastsab.varlen.collate.PadCollator` and :class:`~fastsab.varlen.collate.PackCollator`
(:mod:`~fastsab.varlen.collate`) over their base (:mod:`~fastsab.varlen.collator`, samples read by
:mod:`~fastsab.varlen.sample_columns`); :class:`~fastsab.varlen.ragged.RaggedDataset`
(:mod:`~fastsab.varlen.ragged`) and where its values come from (:mod:`~fastsab.varlen.ragged_sources`).

Imports :mod:`fastsab.plan` (the padded length the budget charges) and the checks only.
"""
