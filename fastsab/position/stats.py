"""What an epoch yielded: :class:`EpochStats`, a loader's ``stats``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastsab.plan.plans import PlanChunk

__all__ = ["EpochStats"]


@dataclass
class EpochStats:
    """What the last epoch yielded.

    Attributes:
        epoch: The epoch number.
        num_batches: Batches yielded so far.
        num_items: Items in those batches.
        num_skipped: Oversize items skipped (size-aware loaders).
        skipped: Their dataset indices.
        num_dropped: Items left out: the last partial batch with ``drop_last=True``, or the
            surplus batches with ``even_batches="drop"`` under ``torch.distributed``.
        dropped: Their dataset indices.
        limit_changes: ``(batches yielded before, old limit, new limit)`` for every time
            the batch size or cap was lowered during the epoch (out-of-memory adaptation).
        num_splits: Batches split because their step ran out of memory
            (:func:`fastsab.adaptive.run`).
        num_padded: Steps filled by repeating batches so that every rank runs the same
            number of steps (``even_batches="pad"`` under ``torch.distributed``), over all ranks.
        padded: The indices this rank yields a second time in the epoch: its share of those
            repeated batches. A resumed epoch reports, like ``skipped`` and ``dropped``, the
            whole epoch's: all repeats of the ranks it runs on, also those run before the save.
        spread_before, spread_after: Mean per-step cost spread ``(max - min) / max`` across
            ranks with batches dealt in plan order, and with the balanced assignment.
    """

    epoch: int
    num_batches: int = 0
    num_items: int = 0
    num_skipped: int = 0
    skipped: list[int] = field(default_factory=list)
    num_dropped: int = 0
    dropped: list[int] = field(default_factory=list)
    limit_changes: list[tuple[int, Any, Any]] = field(default_factory=list)
    num_splits: int = 0
    num_padded: int = 0
    padded: list[int] = field(default_factory=list)
    spread_before: float = 0.0
    spread_after: float = 0.0

    def clear_reports(self) -> None:
        """Forget the skipped, dropped and padded items (a new plan of the epoch reports them again)."""
        self.num_skipped = self.num_dropped = 0
        self.skipped, self.dropped, self.padded = [], [], []

    def add(self, chunk: PlanChunk) -> None:
        self.num_skipped += len(chunk.skipped)
        self.skipped += chunk.skipped.tolist()
        self.num_dropped += len(chunk.dropped)
        self.dropped += chunk.dropped.tolist()
        self.padded += chunk.padded.tolist()
