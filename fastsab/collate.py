"""The former home of the collators, kept so that ``fastsab.collate`` imports keep working.

The collators now live in ``fastsab.varlen.collate``.
"""

from __future__ import annotations

from fastsab.varlen.collate import Collator, Flat, PackCollator, PadCollator, pack_positions

__all__ = ["Collator", "Flat", "PackCollator", "PadCollator", "pack_positions"]
