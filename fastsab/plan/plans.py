"""The plan type: batches of indices in CSR form, the planners' protocol, and a plan given up front.

A ``PlanChunk`` holds consecutive batches as ids plus offsets (batch ``b`` is
``ids[offsets[b]:offsets[b + 1]]``), with the indices the chunk skipped, dropped or
repeated, and the open batch of a split that more chunks follow (``Carry``).
``split_batches`` returns one; a ``Planner`` produces them chunk by
chunk; ``ExplicitPlan`` replays batches computed before (a rank's share, the rest of a
resumed epoch) as such a stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, overload, runtime_checkable

import numpy as np

from fastsab.plan.epochs import EpochOrder

__all__ = ["Carry", "ExplicitPlan", "PlanChunk", "PlanInputs", "PlanStream", "Planner", "Restarts"]

_EMPTY_IDS = np.empty(0, dtype=np.int64)

LimitT = TypeVar("LimitT")
LimitT_contra = TypeVar("LimitT_contra", contravariant=True)


@dataclass(frozen=True)
class Carry:
    """The open batch at the end of a non-final ``split_batches`` call.

    Pass it as ``carry=`` to the next call (with the next chunk of costs) to continue the
    split exactly as if the chunks had been one array.

    Attributes:
        ids: Ids of the items of the open batch, in order.
        costs: Their costs, shape ``(len(ids), k)`` (their features ``(len(ids), d)`` when the
            split pads features: ``feature_cost``).
        next_position: Global position of the next chunk's first item (used for default ids).
    """

    ids: np.ndarray
    costs: np.ndarray
    next_position: int

    def __len__(self) -> int:
        return len(self.ids)


class _Ids:
    """The ``ids`` field of ``PlanChunk``: given as an array, or as a ``range`` made into one on first access."""

    # NOTE: split_batches without ids= numbers the items by position; most callers only read
    # the offsets, so the positions become an array only when asked for.

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    @overload
    def __get__(self, chunk: None, owner: type | None = None) -> _Ids: ...

    @overload
    def __get__(self, chunk: PlanChunk, owner: type | None = None) -> np.ndarray: ...

    def __get__(self, chunk: PlanChunk | None, owner: type | None = None) -> np.ndarray | _Ids:
        if chunk is None:
            raise AttributeError(self.slot)  # NOTE: tells dataclass that the field has no default
        ids = chunk.__dict__[self.slot]
        if isinstance(ids, range):
            ids = np.arange(ids.start, ids.stop, dtype=np.int64)
            chunk.__dict__[self.slot] = ids
        return ids  # type: ignore[no-any-return]

    def __set__(self, chunk: PlanChunk, ids: np.ndarray | range) -> None:
        chunk.__dict__[self.slot] = ids


@dataclass(frozen=True)
class PlanChunk:
    """Consecutive batches in CSR form: batch b is ``ids[offsets[b]:offsets[b+1]]``.

    Attributes:
        ids: The batched indices, batch after batch (a ``range`` given here becomes an
            ``int64`` array on first access).
        offsets: ``num_batches + 1`` int64 offsets into ``ids``.
        skipped: Oversize indices skipped in this chunk.
        dropped: Indices left out (``drop_last``, or surplus batches under ranks).
        padded: Indices of the batches in ``ids`` that repeat batches of the epoch
            (``even_batches="pad"`` under ranks).
        spans: Optional ``(num_batches, 2)`` places (in the epoch's order of groups) of the
            groups of each batch's first and last item, for a whole epoch's plan read group
            by group.
        carry: The open batch to pass to the next split, or ``None`` after a final split
            (and in a planner's chunks).
        figures: Optional ``(4, num_batches)`` figures of the batches, as a size-aware planner
            reports them (``BatchFigures``); kept by ``select``,
            ``head`` and ``tail``.

    Examples:
        >>> chunk = PlanChunk.from_batches([np.array([4, 2]), np.array([7]), np.array([1, 0, 3])])
        >>> [b.tolist() for b in chunk.batches()], chunk.select(np.array([2, 0])).ids.tolist()
        ([[4, 2], [7], [1, 0, 3]], [1, 0, 3, 4, 2])
        >>> chunk.head(1).ids.tolist(), chunk.tail(1).offsets.tolist()
        ([4, 2], [0, 1, 4])
    """

    # NOTE: ids has no default (_Ids says so at run time); type checkers take the descriptor for one
    ids: np.ndarray = _Ids()  # type: ignore[assignment]
    offsets: np.ndarray  # type: ignore[misc]
    skipped: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    dropped: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    padded: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    spans: np.ndarray | None = None
    carry: Carry | None = None
    figures: np.ndarray | None = None

    @property
    def num_batches(self) -> int:
        """Number of complete batches."""
        return len(self.offsets) - 1

    def batches(self) -> list[np.ndarray]:
        """The batches as id arrays (views into ``ids``)."""
        return self.batches_of(self.ids)

    def batches_of(self, values: np.ndarray) -> list[np.ndarray]:
        """``values`` (one per batched item, in the order of ``ids``) cut into the batches."""
        offsets = self.offsets.tolist()
        return [values[offsets[b] : offsets[b + 1]] for b in range(len(offsets) - 1)]

    def first_places(self) -> np.ndarray:
        """Per id, whether it is its batch's first place of that id (a shape bucket's filler rows repeat items).

        Examples:
            >>> PlanChunk.from_batches([np.array([4, 2, 4]), np.array([4, 1])]).first_places().tolist()
            [True, True, False, True, True]
        """
        ids = self.ids
        first = np.ones(len(ids), dtype=bool)
        if len(ids) < 2:
            return first
        batch = np.repeat(np.arange(self.num_batches), np.diff(self.offsets))
        order = np.lexsort((ids, batch))
        repeat = (ids[order][1:] == ids[order][:-1]) & (batch[order][1:] == batch[order][:-1])
        first[order[1:][repeat]] = False
        return first

    def distinct_ids(self) -> np.ndarray:
        """The ids without the repeats within a batch (``first_places``)."""
        first = self.first_places()
        return self.ids if first.all() else self.ids[first]

    def __repr__(self) -> str:
        return (
            f"PlanChunk(num_batches={self.num_batches}, num_items={int(self.offsets[-1])}, "
            f"num_skipped={len(self.skipped)}, num_dropped={len(self.dropped)}, num_padded={len(self.padded)}, "
            f"carry={None if self.carry is None else len(self.carry)})"
        )

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
        # starts[batch of j] + (j - offsets[batch of j]), a running sum of steps of 1 that jump
        # at each batch's first item (one array, summed in place: np.repeat of the starts plus
        # an arange fills three fresh arrays, about 5x slower for a chunk of 65,536 items)
        positions = np.ones(offsets[-1], dtype=np.int64)
        filled = sizes > 0
        firsts, lows, counts = offsets[:-1][filled], starts[filled], sizes[filled]
        if len(firsts):
            positions[firsts[0]] = lows[0]
            positions[firsts[1:]] = lows[1:] - (lows[:-1] + counts[:-1] - 1)
        np.cumsum(positions, out=positions)
        spans = None if self.spans is None else self.spans[which]
        figures = None if self.figures is None else self.figures[:, which]
        return PlanChunk(
            self.ids.take(positions), offsets, self.skipped, self.dropped, self.padded, spans, figures=figures
        )

    def head(self, num_batches: int) -> PlanChunk:
        """The first ``num_batches`` batches; other fields kept."""
        offsets = self.offsets[: num_batches + 1]
        spans = None if self.spans is None else self.spans[:num_batches]
        figures = None if self.figures is None else self.figures[:, :num_batches]
        ids = self.ids[: offsets[-1]]
        return PlanChunk(ids, offsets, self.skipped, self.dropped, self.padded, spans, figures=figures)

    def tail(self, start: int) -> PlanChunk:
        """The batches from batch ``start`` on; other fields kept."""
        first = self.offsets[start]
        spans = None if self.spans is None else self.spans[start:]
        figures = None if self.figures is None else self.figures[:, start:]
        offsets = self.offsets[start:] - first
        return PlanChunk(self.ids[first:], offsets, self.skipped, self.dropped, self.padded, spans, figures=figures)


class PlanStream(Protocol[LimitT_contra]):
    """The plan chunks of one epoch, whose limit can be lowered mid-epoch."""

    def __iter__(self) -> Iterator[PlanChunk]: ...

    def __next__(self) -> PlanChunk: ...

    def lower(self, pending: np.ndarray, limit: LimitT_contra) -> None:
        """Batch ``pending`` (the items not yet yielded of the current chunk) and all that follows under ``limit``."""
        ...


class PlanInputs(NamedTuple):
    """What determines a planner's batches besides the order, seed and epoch (see ``plan_fingerprint``).

    Attributes:
        kind: The planner's name.
        options: Its options and configured limits (plain JSON once numbers are made plain).
        sizes: Bytes of the per-item sizes (all of an array of sizes, a sample of computed ones).
        older: The options of the same batches as an older fastsab named them: a state saved
            with one of them resumes.
    """

    kind: str
    options: dict[str, Any]
    sizes: bytes | memoryview
    older: tuple[dict[str, Any], ...] = ()


class Planner(Protocol[LimitT]):
    """What the cursor and the loaders need of a planner; ``LimitT`` is its limit (a batch size or caps)."""

    @property
    def order(self) -> EpochOrder:
        """The epoch order the planner batches."""
        ...

    @property
    def limit(self) -> LimitT:
        """The configured limit."""
        ...

    def num_batches(self, epoch: int) -> int:
        """The exact number of batches of ``epoch``."""
        ...

    def chunks(self, epoch: int) -> PlanStream[LimitT]:
        """The plan chunks of ``epoch``."""
        ...

    def batch_costs(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Cost of each batch ``ids[offsets[b]:offsets[b + 1]]``, for balancing ranks."""
        ...

    def check_limit(self, limit: object) -> LimitT:
        """``limit`` checked as a limit of this planner."""
        ...

    def check_lowered_limit(self, limit: object) -> LimitT:
        """``limit`` checked as a limit of this planner, not above the configured one."""
        ...

    def smaller_limit(self, ids: np.ndarray, current: LimitT, factor: float) -> LimitT:
        """A limit about ``factor`` times below the cost of the failed batch ``ids``."""
        ...

    def split(self, ids: np.ndarray, limit: LimitT) -> list[np.ndarray]:
        """``ids`` in order split into batches within ``limit``."""
        ...

    def plan_inputs(self) -> PlanInputs:
        """What determines the batches besides the order, seed and epoch."""
        ...


@runtime_checkable
class Restarts(Protocol):
    """A planner that plans an epoch from one of its batches on, without the batches before it."""

    @property
    def restarts(self) -> bool:
        """Whether ``chunks_from`` gives the epoch's batches (a planner may restart with some options only)."""
        ...

    def chunks_from(self, epoch: int, item: int) -> PlanStream[Any]:
        """The plan chunks of ``epoch`` from the batch whose first item is ``item`` on."""
        ...

    def skipped_before(self, epoch: int, item: int) -> np.ndarray:
        """The items ``epoch`` skips (oversize) before the batch whose first item is ``item``, in order."""
        ...


class ExplicitPlan:
    """Batches given up front, as a stream of plan chunks whose limit can be lowered.

    Args:
        chunk: The batches (and the skipped, dropped and padded indices to report).
        planner: Splits the items left when the limit is lowered (its ``split(ids, limit)``).
    """

    def __init__(self, chunk: PlanChunk, planner: Planner[Any]) -> None:
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
