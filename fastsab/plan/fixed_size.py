"""The fixed-size planner: batches of ``batch_size`` consecutive items of the epoch order."""

from __future__ import annotations

import numpy as np

from fastsab._checks import check_positive_int
from fastsab.plan.costs import refuse_above
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.plans import _EMPTY_IDS, PlanChunk, PlanInputs

__all__ = ["FixedSizeEpoch", "FixedSizePlanner"]


class FixedSizePlanner:
    """Batches of ``batch_size`` consecutive items of the epoch order (across chunk borders)."""

    def __init__(self, order: EpochOrder, batch_size: int, drop_last: bool) -> None:
        self.order = order
        self.batch_size = check_positive_int("batch_size", batch_size)
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}.")
        self.drop_last = drop_last

    def num_batches(self, epoch: int) -> int:
        n, size = self.order.epoch_length(epoch), self.batch_size
        return n // size if self.drop_last else -(-n // size)

    def plan_inputs(self) -> PlanInputs:
        """What besides the order decides the batches: the batch size and ``drop_last``."""
        return PlanInputs("FixedSizePlanner", {"batch_size": self.batch_size, "drop_last": self.drop_last}, b"")

    def chunks(self, epoch: int) -> FixedSizeEpoch:
        return FixedSizeEpoch(self, epoch)

    @property
    def restarts(self) -> bool:
        """Whether ``chunks_from`` gives the epoch's batches: always."""
        return True

    def chunks_from(self, epoch: int, item: int) -> FixedSizeEpoch:
        """The plan chunks of ``epoch`` from the batch whose first item is ``item`` on."""
        return FixedSizeEpoch(self, epoch, start=self.order.position_of(epoch, item))

    def skipped_before(self, epoch: int, item: int) -> np.ndarray:
        """The items skipped before a batch: none (a fixed-size plan skips none)."""
        return _EMPTY_IDS

    def batch_costs(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Cost of each batch ``ids[offsets[b]:offsets[b + 1]]`` for balancing: its size."""
        return np.diff(offsets).astype(np.float64)

    @property
    def limit(self) -> int:
        """The configured limit: the batch size."""
        return self.batch_size

    def check_limit(self, limit: object) -> int:
        """``limit`` checked as a batch size."""
        return check_positive_int("limit", limit)

    def check_lowered_limit(self, limit: object) -> int:
        """``limit`` checked as a batch size, not above the configured one."""
        checked = self.check_limit(limit)
        refuse_above([checked], [self.batch_size], self.batch_size, limit)
        return checked

    def smaller_limit(self, ids: np.ndarray, current: int, factor: float) -> int:
        """A batch size about ``factor`` times below the failed batch's size."""
        return min(current, max(1, int(len(ids) / factor)))

    def split(self, ids: np.ndarray, limit: int) -> list[np.ndarray]:
        """Cut ``ids`` into batches of at most ``limit`` items."""
        return [ids[start : start + limit] for start in range(0, len(ids), limit)]


class FixedSizeEpoch:
    """One epoch of a ``FixedSizePlanner``, whose batch size can be lowered mid-epoch.

    With ``drop_last`` the last ``n % batch_size`` items of the order are dropped, as
    planned at the start of the epoch: lowering the batch size never changes which items
    the epoch covers (a last partial batch after a lowering is kept).
    """

    def __init__(self, planner: FixedSizePlanner, epoch: int, *, start: int = 0) -> None:
        self.planner = planner
        self.batch_size = planner.batch_size
        n = planner.order.epoch_length(epoch)
        self._keep = n - n % planner.batch_size if planner.drop_last else n  # items batched at all
        self._seen = start  # items of the order before the next chunk
        self._chunks = planner.order.plan_chunks(epoch, start)
        self._rest = _EMPTY_IDS

    def __iter__(self) -> FixedSizeEpoch:
        return self

    def __next__(self) -> PlanChunk:
        size = self.batch_size
        for chunk in self._chunks:
            kept = max(0, min(len(chunk), self._keep - self._seen))
            self._seen += len(chunk)
            dropped = chunk[kept:]
            ids = np.concatenate([self._rest, chunk[:kept]]) if len(self._rest) else chunk[:kept]
            full = len(ids) // size * size
            self._rest = ids[full:]
            if full or len(dropped):
                return PlanChunk(ids[:full], np.arange(0, full + 1, size, dtype=np.int64), dropped=dropped)
        if not len(self._rest):
            raise StopIteration
        # NOTE: the rest is handed out once; a lowering in it gives the items after its cut back
        rest, self._rest = self._rest, _EMPTY_IDS
        return PlanChunk(rest, np.append(np.arange(0, len(rest), size, dtype=np.int64), len(rest)))

    def lower(self, pending: np.ndarray, limit: int) -> None:
        """Batch ``pending`` (the rest of the current chunk) and all that follows with ``limit`` items."""
        self._rest = np.concatenate([pending, self._rest])
        self.batch_size = int(limit)
