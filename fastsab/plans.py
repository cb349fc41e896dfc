"""The plan type: batches of indices in CSR form, and a plan of batches given up front.

A :class:`PlanChunk` holds consecutive batches of an epoch as ids plus offsets (batch ``b``
is ``ids[offsets[b]:offsets[b + 1]]``), with the indices the chunk skipped, dropped or
repeated. Planners produce them chunk by chunk; :class:`ExplicitPlan` replays batches
computed before (a rank's share, the rest of a resumed epoch) as such a stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ExplicitPlan", "PlanChunk"]

_EMPTY_IDS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class PlanChunk:
    """Batches planned from one chunk of the epoch order: batch b is ``ids[offsets[b]:offsets[b+1]]``.

    Attributes:
        ids: The batched indices, batch after batch.
        offsets: ``num_batches + 1`` int64 offsets into ``ids``.
        skipped: Oversize indices skipped in this chunk.
        dropped: Indices left out (``drop_last``, or surplus batches under ranks).
        padded: Indices of the batches in ``ids`` that repeat batches of the epoch
            (``even_batches="pad"`` under ranks).
        spans: Optional ``(num_batches, 2)`` places (in the epoch's order of groups) of the
            groups of each batch's first and last item, for a whole epoch's plan read group
            by group.

    Examples:
        >>> chunk = PlanChunk.from_batches([np.array([4, 2]), np.array([7]), np.array([1, 0, 3])])
        >>> [b.tolist() for b in chunk.batches()], chunk.select(np.array([2, 0])).ids.tolist()
        ([[4, 2], [7], [1, 0, 3]], [1, 0, 3, 4, 2])
        >>> chunk.head(1).ids.tolist(), chunk.tail(1).offsets.tolist()
        ([4, 2], [0, 1, 4])
    """

    ids: np.ndarray
    offsets: np.ndarray
    skipped: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    dropped: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    padded: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    spans: np.ndarray | None = None

    @property
    def num_batches(self) -> int:
        return len(self.offsets) - 1

    def batches(self) -> list[np.ndarray]:
        """The batches as id arrays (views into :attr:`ids`)."""
        ids, offsets = self.ids, self.offsets.tolist()
        return [ids[offsets[b] : offsets[b + 1]] for b in range(len(offsets) - 1)]

    @classmethod
    def from_batches(cls, batches: Sequence[np.ndarray]) -> PlanChunk:
        """A chunk of the given batches (no skipped, dropped or padded indices)."""
        offsets = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in batches], out=offsets[1:])
        ids = np.concatenate(batches).astype(np.int64, copy=False) if batches else _EMPTY_IDS
        return cls(ids, offsets)

    @classmethod
    def concat(cls, chunks: Sequence[PlanChunk]) -> PlanChunk:
        """One chunk holding the batches (and skipped, dropped, padded indices) of ``chunks`` in order."""
        if not chunks:
            return cls(_EMPTY_IDS, np.zeros(1, dtype=np.int64))
        sizes = np.concatenate([np.diff(c.offsets) for c in chunks])
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids, skipped, dropped, padded = (
            np.concatenate([getattr(c, name) for c in chunks]) for name in ("ids", "skipped", "dropped", "padded")
        )
        return cls(ids, offsets, skipped, dropped, padded)

    def select(self, which: np.ndarray) -> PlanChunk:
        """The batches ``which`` (indices of batches, in the order given); other fields kept."""
        which = np.asarray(which, dtype=np.int64)
        starts = self.offsets[which]
        sizes = self.offsets[which + 1] - starts
        offsets = np.zeros(len(which) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # NOTE: one gather for all batches: item j of the result comes from position
        # starts[batch of j] + (j - offsets[batch of j]).
        positions = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        spans = None if self.spans is None else self.spans[which]
        return PlanChunk(self.ids[positions], offsets, self.skipped, self.dropped, self.padded, spans)

    def head(self, num_batches: int) -> PlanChunk:
        """The first ``num_batches`` batches; other fields kept."""
        offsets = self.offsets[: num_batches + 1]
        spans = None if self.spans is None else self.spans[:num_batches]
        return PlanChunk(self.ids[: offsets[-1]], offsets, self.skipped, self.dropped, self.padded, spans)

    def tail(self, start: int) -> PlanChunk:
        """The batches from batch ``start`` on; other fields kept."""
        first = self.offsets[start]
        spans = None if self.spans is None else self.spans[start:]
        return PlanChunk(self.ids[first:], self.offsets[start:] - first, self.skipped, self.dropped, self.padded, spans)


class ExplicitPlan:
    """Batches given up front, as a stream of plan chunks whose limit can be lowered.

    Args:
        chunk: The batches (and the skipped, dropped and padded indices to report).
        planner: Splits the items left when the limit is lowered (its ``split(ids, limit)``).
    """

    def __init__(self, chunk: PlanChunk, planner: Any) -> None:
        self._next: PlanChunk | None = chunk
        self.planner = planner

    def __iter__(self) -> ExplicitPlan:
        return self

    def __next__(self) -> PlanChunk:
        chunk, self._next = self._next, None
        if chunk is None:
            raise StopIteration
        return chunk

    def lower(self, pending: np.ndarray, limit: Any) -> None:
        """Batch ``pending`` (every item not yet yielded, in order) greedily under ``limit``."""
        self._next = PlanChunk.from_batches(self.planner.split(pending, limit))
