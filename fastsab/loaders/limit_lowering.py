"""Lowering the limit mid-epoch: ``LimitLowering``, the loader side of ``fastsab.adaptive.run``.

A lowering (``lower_limit``, or ``retry_last_batch`` for a
batch that ran out of memory) is asked for, maybe from another thread, and kept pending; the
loader's iteration (``fastsab.loaders.iteration``) applies it after the batch last handed out,
and a state saved meanwhile records it (the cursor's hooks ``_pending_lowering``
and ``_step_open``). Here too are what ``fastsab.adaptive.run`` splits a
failed batch with: ``fetch``, ``split_indices`` and
``smaller_limit``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any, Generic, cast

import numpy as np

from fastsab._checks import user_stacklevel
from fastsab.fetch.batch_maker import BatchMaker, IndexArray
from fastsab.fetch.fillers import masked
from fastsab.loaders.options import Limit, LimitLike, T
from fastsab.plan.costs import refuse_above
from fastsab.position.cursor import EpochCursor

__all__ = ["LimitLowering"]


class LimitLowering(EpochCursor, Generic[T]):
    """The limit in force in an epoch, and lowering it for the rest of the epoch.

    Subclasses call ``_init_lowering`` once. Their iteration sets ``limit`` at the start of
    each epoch, records whether the batch it hands out was taken back (``_rewound``) and, after it,
    applies the lowering ``_take_pending`` returns.

    Attributes:
        limit: The batch size or caps in force in the current epoch.
        parts_left: While ``fastsab.adaptive.run`` runs the parts of a split step, how
            many come after the one running (0 otherwise).
    """

    maker: BatchMaker[T]  # (set by the loader) makes the batches of fetch()

    def _init_lowering(self) -> None:
        self.limit: Limit | None = None
        # (limit, retry): asked for by lower_limit() or retry_last_batch() (maybe from another
        # thread), applied by the iteration before it hands out the next batch
        self._pending: tuple[Limit, bool] | None = None
        self._pending_lock = threading.Lock()
        self._rewound = False  # whether that batch was taken back to be planned again
        self.parts_left = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_pending_lock"]  # a lock does not pickle; a new one is made on load
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending_lock = threading.Lock()

    def _take_pending(self, keep: bool = False) -> tuple[Limit, bool] | None:
        """The lowering asked for since the last batch (kept with ``keep``), unless it changes nothing."""
        with self._pending_lock:
            pending = self._pending
            if not keep:
                self._pending = None
        if pending is None or (not pending[1] and _same_limit(pending[0], self.limit)):
            return None
        return pending

    def _pending_lowering(self) -> tuple[int, Limit] | None:
        pending = self._take_pending(keep=True)
        if pending is None or self._progress is None:
            return None
        return self._progress[1] - (1 if pending[1] else 0), pending[0]

    def _step_open(self) -> bool:
        if self.parts_left <= 0:
            return False
        if self.world_size == 1:
            # NOTE: one process splits a step within it only where no lower limit splits its batch
            # (it costs nothing). A state at the step's start would run its parts done again, one
            # after them would lose those of a loop that commits when parts_left is 0: none is exact
            raise RuntimeError(
                f"state_dict() was called between the parts of a split step ({self.parts_left} part(s) still to "
                "run): its batch costs nothing, so no lower limit makes its parts steps of their own, and no state "
                "resumes exactly between them. Save states when loader.parts_left is 0."
            )
        warnings.warn(
            f"state_dict() was called between the parts of a split step ({self.parts_left} part(s) still to run): "
            "the state resumes at the start of that step, so its parts already run will run again. Save states "
            "when loader.parts_left is 0.",
            stacklevel=user_stacklevel(),
        )
        return True

    def fetch(self, indices: IndexArray | Sequence[int]) -> T:
        """The batch for ``indices``, made like the loader's own batches (fetched, collated, moved).

        With shape buckets and ``partial="fill"``, it has their ``sample_mask`` (``False`` on a
        repeated index: a filler row).
        """
        ids = np.asarray(indices, dtype=np.int64)
        batch: T = self.maker(ids)
        if getattr(self.planner, "partial", None) == "fill":
            return masked(batch, ids, self.maker.transfer)  # type: ignore[no-any-return]
        return batch

    def lower_limit(self, limit: LimitLike) -> None:
        """Use a smaller limit (batch size, or cap per column) for the rest of this epoch.

        Applies from the next batch on (batches prefetched under the old limit are planned
        again): the items not yet handed out are planned again, so no sample is lost or
        repeated; items above the new limit get batches of their own. It may be called from
        another thread (a memory monitor) or from the dataset in this process (not from a
        worker process, which holds a copy of the loader): a batch being fetched is
        handed out whole, and the lowering applies after it. A limit equal to the
        one in force changes nothing; one above it is refused (a lowering only lowers). Of two
        lowerings asked before the next batch, the smaller caps hold.
        Recorded in ``stats.limit_changes`` and in the state; the next epoch starts from the
        configured limit again.

        Raises:
            ValueError: If ``limit`` is not a valid batch size or caps, exceeds the
                configured limit or the one in force, or this is one of several ranks.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=False)

    def retry_last_batch(self, limit: LimitLike) -> None:
        """Plan the batch last yielded again, with everything after it, under ``limit``.

        For a batch that failed (ran out of memory): it is no longer counted as done, and
        the next batches are its parts under the smaller limit, then the rest of the epoch.
        A state taken in between resumes exactly. ``fastsab.adaptive.run`` uses it.

        Raises:
            ValueError: As ``lower_limit``.
            RuntimeError: If no batch of an epoch is being iterated.
        """
        self._ask_lowering(self._checked_lowering(limit), retry=True)

    def _ask_lowering(self, limit: Limit, retry: bool) -> None:
        with self._pending_lock:
            pending = self._pending
            if pending is not None:
                # NOTE: a lowering not applied yet (a memory monitor's) is the limit of the next
                # batch; a later one (adaptive.run's, from the limit in force) must not undo it
                limit = _smaller(limit, pending[0])
            # a batch is retried once, however often it is asked; a later lowering keeps the retry
            retry = (retry and not self._rewound) or (pending is not None and pending[1])
            self._pending = (limit, retry)

    def _checked_lowering(self, limit: LimitLike) -> Limit:
        checked: Limit = self.check_lowered_limit(limit)
        if self.world_size > 1:
            raise ValueError(
                f"cannot lower the limit to {limit!r} on rank {self.rank} of {self.world_size}: the ranks would run "
                "different numbers of steps and data-parallel training would hang."
            )
        if self.position is None:
            raise RuntimeError("lowering the limit needs an epoch being iterated (after its first batch).")
        # NOTE: a lowering only lowers: the limit in force may already be below the configured one
        current = self.limit
        refuse_above(_as_caps(checked), _as_caps(current), current, limit, which="current")
        return checked

    def split_indices(self, indices: IndexArray | Sequence[int], limit: LimitLike) -> list[IndexArray]:
        """Split a batch's ``indices`` in order into batches within ``limit`` (greedy)."""
        planner: Any = self.planner  # NOTE: each planner takes its own kind of limit, checked first
        parts: list[IndexArray] = planner.split(np.asarray(indices, dtype=np.int64), planner.check_limit(limit))
        return parts

    def smaller_limit(self, indices: IndexArray | Sequence[int], factor: float) -> Limit:
        """The limit under which the batch ``indices`` splits into about ``factor`` parts."""
        planner: Any = self.planner  # NOTE: self.limit is of the planner's kind
        limit: Limit = planner.smaller_limit(np.asarray(indices, dtype=np.int64), self.limit, factor)
        return limit


def _smaller(limit: Limit, other: Limit) -> Limit:
    """The smaller of two limits of one kind, cap by cap."""
    if isinstance(limit, list) and isinstance(other, list):
        return [min(a, b) for a, b in zip(limit, other)]
    return min(cast(int, limit), cast(int, other))


def _as_caps(limit: Limit | None) -> list[int | float]:
    """A batch size or caps as a list of caps."""
    return [] if limit is None else list(limit) if isinstance(limit, list) else [limit]


def _same_limit(a: Limit | None, b: Limit | None) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))
