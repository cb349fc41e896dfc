"""A mixture's epoch order: its sources' orders merged by the mixing rule (``fastsab.plan.mixing``).

``MixedOrder`` gives what ``EpochOrder`` gives (an epoch's ids chunk by chunk, taken up at any
position) for a mixture, so that every planner batches a mixture as it batches one dataset.

Ids: the sources are laid end to end (source ``s``'s item ``i`` is ``offsets[s] + i`` of ``n``
items in all), and the id a mixture's order yields also names the source epoch it comes from:
``offsets[s] + i + n * source_epoch``. An upsampled source yields an item once per source epoch,
so that every id of a mixture epoch is distinct; ``id % n`` is the item (``fetch_ids``,
``MixedCosts``), ``locate`` names its source.

Each source walks its own seeded grouped permutation (``EpochOrder``, its seed drawn from the
mixture's seed and the source's name), epoch after epoch: a source's epochs run on across the
mixture's epochs, and the mixture's epoch ``e`` starts where epoch ``e - 1`` ended (``starts``).
Where the rule stands is kept every chunk (``MixState``), so that an epoch is taken up at any
position by walking at most a chunk.
"""

from __future__ import annotations

import bisect
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastsab._checks import check_choice, short_repr, user_stacklevel
from fastsab.plan.epochs import FIRST_CHUNK, EpochOrder
from fastsab.plan.mix_weights import StopRule, WeightSchedule
from fastsab.plan.mixing import MixState, SourceHeads, mix_walk

__all__ = ["MixedCosts", "MixedOrder", "SourceFigures", "source_numbers"]

#: Items walked at a time while looking an id up past the least its source's position says: a
#: walk reads a block of every source first (``SourceHeads``), so steps shorter than one waste it.
_LOOK_STEP = 2**12

#: Epochs whose chunk states are kept (the current one, the next one planned ahead, one before).
_KEPT_EPOCHS = 3


class MixedOrder(EpochOrder):
    """The order of a mixture's epochs: the sources' orders merged by the mixing rule.

    Args:
        names: The sources' names, in order.
        orders: Each source's ``EpochOrder`` (its own seed and groups).
        schedule: The weights (``WeightSchedule``).
        stop: When an epoch ends (``StopRule``).
        shuffle, seed, group_size: As an ``EpochOrder``'s (``group_size``: items per chunk of the merged order).
        by_items: Weights count items (each costs 1), not the items' costs.
    """

    def __init__(
        self,
        names: Sequence[str],
        orders: Sequence[EpochOrder],
        schedule: WeightSchedule,
        stop: StopRule,
        *,
        shuffle: bool,
        seed: int,
        group_size: int,
        by_items: bool,
    ) -> None:
        self.names = list(names)
        self.orders = list(orders)
        self.lengths = [order.n for order in self.orders]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self.schedule, self.stop = schedule, stop
        self.shuffle, self.seed, self.group_size, self.by_items = shuffle, seed, group_size, by_items
        self.rotate = True  # (no group spans a rank's share: see EpochShares)
        self._item_costs: Callable[[np.ndarray], np.ndarray] | None = None
        self._starts: dict[int, MixState] = {0: MixState.start(len(self.names))}
        self._marks: dict[int, dict[int, MixState]] = {}  # epoch -> chunk start position -> state
        self._lengths: dict[int, int] = {}  # epoch -> items, once walked to its end
        self._schedules: dict[int, WeightSchedule] = {}  # an epoch resumed with the weights it was saved with
        self._groups: list[tuple[int, int, np.ndarray]] = [(-1, 0, np.empty(0, np.int64))] * len(self.names)

    @property
    def identity(self) -> dict[str, Any]:
        """What decides this order besides the seed, the weights and the costs (the plan's fingerprint reads it)."""
        sources = dict(zip(self.names, self.lengths))
        return {"mixture": sources, "stop": self.stop.as_dict(), "by_items": self.by_items}

    each_item_once = False

    @property
    def equal_epochs(self) -> bool:
        """Whether every epoch has as many items: where it ends at a number of items (``stop={"items": n}``)."""
        return self.stop.kind == "items"

    @property
    def id_bound(self) -> int:
        """Ids the order yields are below this (they name a source epoch too)."""
        return 2**62

    def read_by_ids(self, costs: Any) -> MixedCosts:
        """``costs`` read with this order's ids (each id's item is ``id % n``)."""
        return MixedCosts(costs, self.n)

    @staticmethod
    def source_seed(seed: int, name: str) -> int:
        """The seed of source ``name``'s permutations: drawn from the mixture's seed and the name."""
        return int(np.random.default_rng([seed, zlib.crc32(name.encode())]).integers(2**62))

    def use_costs(self, item_costs: Callable[[np.ndarray], np.ndarray]) -> None:
        """Weigh items by ``item_costs(ids)`` (1-D float64 per item id in ``[0, n)``); unset: 1 each."""
        self._item_costs = None if self.by_items else item_costs
        self.forget()

    def forget(self) -> None:
        """Forget every epoch walked (after the costs changed)."""
        self._starts = {0: MixState.start(len(self.names))}
        self._marks.clear()
        self._lengths.clear()

    # -- reading the sources ------------------------------------------------------------

    def _read(self, s: int, source_epoch: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Source ``s``'s items ``[start, start + count)`` of ``source_epoch``: mixture ids and costs."""
        epoch, first, group = self._groups[s]
        if epoch != source_epoch or not first <= start < first + len(group):
            group = next(self.orders[s].chunks_from(source_epoch, start))
            self._groups[s] = (source_epoch, start, group)
            first = start
        local = group[start - first : start - first + count]
        ids = local + self.offsets[s]
        costs = np.ones(len(ids)) if self._item_costs is None else self._item_costs(ids)
        return ids + self.n * source_epoch, costs

    def _walk(self, epoch: int, state: MixState, count: int) -> tuple[np.ndarray, bool]:
        heads = SourceHeads(self.lengths, self._read, self.names)
        ids, ended = mix_walk(state, heads, self._schedules.get(epoch, self.schedule), self.stop, count)
        return np.asarray(ids, dtype=np.int64), ended

    # -- epochs -------------------------------------------------------------------------

    def start_state(self, epoch: int) -> MixState:
        """Where the rule stands at ``epoch``'s start (earlier epochs walked if not known)."""
        known = max(e for e in self._starts if e <= epoch)
        while known < epoch:
            for _ in self.chunks(known):
                pass
            known += 1
        return self._starts[epoch].copy()

    def state_at(self, epoch: int, position: int) -> MixState:
        """Where the rule stands after ``position`` items of ``epoch``.

        Raises:
            ValueError: If ``epoch`` has fewer than ``position`` items.
        """
        marks = self._marks.get(epoch, {})
        # NOTE: a snapshot (one C call): a prefetch thread may add states while this one reads them
        before = [p for p in list(marks) if p <= position]
        at = max(before) if before else 0
        state = marks[at].copy() if before else self.start_state(epoch)
        if position > at:
            ids, ended = self._walk(epoch, state, position - at)
            if ended:  # (at the epoch's end: what comes after it is the next epoch's)
                self._lengths[epoch] = at + len(ids)
                self._starts.setdefault(epoch + 1, state.next_epoch())
            if at + len(ids) < position:
                raise ValueError(f"mixture epoch {epoch} has {at + len(ids)} items, not {position}.")
        return state

    def _chunk_states(self, epoch: int, position: int, sizes: Iterator[int]) -> Iterator[np.ndarray]:
        state = self.state_at(epoch, position)
        if position >= self._lengths.get(epoch, position + 1):
            return
        marks = self._marks.setdefault(epoch, {})
        for old in sorted(self._marks)[:-_KEPT_EPOCHS]:
            self._marks.pop(old, None)
        for size in sizes:
            marks.setdefault(position, state.copy())
            ids, ended = self._walk(epoch, state, size)
            position += len(ids)
            if len(ids):
                yield ids
            if ended:
                self._lengths[epoch] = position
                self._starts.setdefault(epoch + 1, state.next_epoch())
                return

    def chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks of ``epoch``, ``group_size`` items each, from chunk number ``start`` on."""
        return self._chunk_states(epoch, start * self.group_size, iter(lambda: self.group_size, None))

    def window_chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks of ``epoch`` (from chunk ``start``), each one's items gathered by source, in order.

        ``sort_window`` sorts runs of the chunk by size: gathered so, a window holds one source (but
        where a source's items end), and pads as that source's batches would alone; the chunk's
        share of each source is the rule's, and its batches come in a seeded random order.
        """
        for chunk in self.chunks(epoch, start):
            yield chunk[np.argsort(source_numbers(self.offsets, chunk % self.n), kind="stable")]

    def chunks_from(self, epoch: int, position: int) -> Iterator[np.ndarray]:
        """The chunks of ``epoch`` from its ``position``-th item on (the first one of ``FIRST_CHUNK`` items at most)."""
        # NOTE: a first chunk of at most FIRST_CHUNK items: a resume's first batch waits for no more
        first = min(self.group_size - position % self.group_size, FIRST_CHUNK)
        return self._chunk_states(epoch, position, _sizes(first, self.group_size))

    def chunks_first_small(self, epoch: int) -> Iterator[np.ndarray]:
        """The chunks of ``epoch``, the first of ``FIRST_CHUNK`` items (see ``EpochOrder.chunks_first_small``)."""
        first = min(FIRST_CHUNK, self.group_size)
        return self._chunk_states(epoch, 0, _sizes(first, self.group_size))

    def plan_chunks(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The chunks planners plan ``epoch`` from: from item ``start`` on, or whole with a small first chunk."""
        return self.chunks_from(epoch, start) if start else self.chunks_first_small(epoch)

    def epoch_length(self, epoch: int) -> int:
        """Items of ``epoch`` (walked to its end once)."""
        if epoch not in self._lengths:
            for _ in self.chunks(epoch):
                pass
        return self._lengths[epoch]

    def position_of(self, epoch: int, index: int) -> int:
        """Where the id ``index`` comes in ``epoch``: found from the chunk state before it, a chunk walked at most.

        Raises:
            ValueError: If ``epoch`` does not yield ``index``.
        """
        s, local, source_epoch = (int(v[0]) for v in self.locate(np.array([index])))
        progress = source_epoch * self.lengths[s] + self.orders[s].position_of(source_epoch, local)
        marks = self._marks.get(epoch) or {0: self.start_state(epoch)}
        positions = sorted(marks)
        done = [marks[p].source_epochs[s] * self.lengths[s] + marks[p].positions[s] for p in positions]
        at = positions[max(bisect.bisect_right(done, progress) - 1, 0)]
        state = marks[at].copy()
        if state.source_epochs[s] * self.lengths[s] + state.positions[s] > progress:
            raise ValueError(f"mixture epoch {epoch} does not yield id {index}: it comes before the epoch.")
        # NOTE: the id is source s's (progress - done + 1)-th item from the state on: as many items
        # at least are walked at once, then a block at a time (a resume looks up its point's first item)
        step = progress - (state.source_epochs[s] * self.lengths[s] + state.positions[s]) + 1
        while True:
            ids, ended = self._walk(epoch, state, step)
            step = _LOOK_STEP
            hit = np.flatnonzero(ids == index)
            if len(hit):
                return at + int(hit[0])
            at += len(ids)
            if ended or not len(ids):
                raise ValueError(f"mixture epoch {epoch} does not yield id {index}: it comes after the epoch.")

    def source_figures(self, epoch: int) -> dict[str, SourceFigures]:
        """What ``epoch``'s plan took of each source (all ranks together), from the rule's states at its ends."""
        start, end = self.start_state(epoch), self.start_state(epoch + 1)
        total = end.cost - start.cost
        figures = {}
        for s, name in enumerate(self.names):
            n = self.lengths[s]
            items = (end.source_epochs[s] - start.source_epochs[s]) * n + end.positions[s] - start.positions[s]
            cost = end.costs[s] - start.costs[s]
            target = cost - (end.deviations[s] - start.deviations[s])
            figures[name] = SourceFigures(
                items=items,
                cost=cost,
                source_epochs=end.source_epochs[s],
                share=cost / total if total else 0.0,
                target=target / total if total else 0.0,
            )
        return figures

    # -- ids, state ---------------------------------------------------------------------

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each id's source (its number), index in that source and source epoch."""
        ids = np.asarray(ids, dtype=np.int64)
        items, source_epochs = ids % self.n, ids // self.n
        sources = source_numbers(self.offsets, items)
        return sources, items - self.offsets[sources], source_epochs

    def state_entry(self, epoch: int, item: int | None) -> dict[str, Any]:
        """A state's ``"mixture"``: ``epoch``'s start, the weights, the rule's state where ``item`` comes."""
        entry: dict[str, Any] = {
            "start": self.start_state(epoch).as_dict(),
            "weights": self.schedule.as_list(),
            "over": self.schedule.over,
        }
        if item is not None:
            position = self.position_of(epoch, item)
            entry["at"] = [position, self.state_at(epoch, position).as_dict()]
        return {"mixture": entry}

    def load_entry(self, epoch: int, entry: object, planner: object) -> None:
        """Take up ``entry`` (from ``state_entry``) of a state of ``epoch``; ``planner`` forgets the plans it kept.

        Raises:
            ValueError: If ``entry`` is malformed.
        """
        if entry is None:  # (a state without one: each epoch's start is walked to)
            return
        if not isinstance(entry, dict) or not {"start", "weights", "over"} <= set(entry):
            raise ValueError(f"state['mixture'] must be the mixture's entry of a state, got {short_repr(entry)}.")
        start = MixState.from_dict(entry["start"], self.lengths, "state['mixture']['start']")
        over = check_choice("state['mixture']['over']", entry["over"], ("cost", "items"))
        try:
            saved = WeightSchedule(self.names, entry["weights"], over)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"state['mixture']['weights'] is not a schedule of the mixture's weights ({error})"
            ) from None
        at = entry.get("at")
        if at is not None:
            if not (isinstance(at, list) and len(at) == 2 and isinstance(at[0], int) and at[0] >= 0):
                raise ValueError(
                    f"state['mixture']['at'] must be [position, mixture state] with a position >= 0, "
                    f"got {short_repr(at)}."
                )
            at = (at[0], MixState.from_dict(at[1], self.lengths, "state['mixture']['at']"))
        # NOTE: the saved epoch runs on with the weights it was saved with (its steps run are
        # theirs, and so is every replay of it); weights given anew apply from the next epoch on
        self._schedules = {} if saved.same_as(self.schedule) else {epoch: saved}
        if self._schedules:  # (said: a user who gave new weights sees when they take effect)
            warnings.warn(
                f"the state was saved with other weights ({saved.as_list()}, over {saved.over}) than this "
                f"mixture's ({self.schedule.as_list()}, over {self.schedule.over}): epoch {epoch}, which it "
                "resumes, keeps the weights it was planned with, so that no step already run is planned otherwise, "
                f"and this mixture's weights apply from epoch {epoch + 1} on.",
                stacklevel=user_stacklevel(),
            )
        self._starts = {0: MixState.start(len(self.names)), epoch: start}
        self._marks = {epoch: {0: start.copy()}}
        self._lengths.clear()
        if at is not None:
            self._marks[epoch][at[0]] = at[1]
        forget = getattr(planner, "forget_plans", None)
        if forget is not None:
            forget()


@dataclass(frozen=True)
class SourceFigures:
    """What a mixture's epoch took of one source (``stats.sources``), counted in the plan of all ranks.

    Attributes:
        items: Items the rule took (a source upsampled within the epoch counts each source epoch's;
            oversize items the loader skipped count too: they are in ``stats.skipped``).
        cost: Their cost (as the weights count it: the loader's cost, or 1 per item).
        source_epochs: The source's epochs completed since the mixture's start, at the epoch's end.
        share: ``cost`` over the epoch's cost.
        target: The share the weights gave the source over the epoch (each item's cost
            shared by the weights in force).
    """

    items: int
    cost: float
    source_epochs: int
    share: float
    target: float


def source_numbers(offsets: np.ndarray, items: Any) -> np.ndarray:
    """The source (its number) of each item of sources laid end to end from ``offsets`` (``[0, ..., n]``).

    Examples:
        >>> source_numbers(np.array([0, 4, 6]), np.array([0, 3, 4, 5])).tolist()
        [0, 0, 1, 1]
    """
    numbers: np.ndarray = np.searchsorted(offsets, items, side="right") - 1
    return numbers


def _sizes(first: int, size: int) -> Iterator[int]:
    yield first
    while True:
        yield size


class MixedCosts:
    """A cost source read with a mixture's ids: each id's item is ``id % n``."""

    def __init__(self, source: Any, n: int) -> None:
        self.source, self.n = source, n

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        # NOTE: ids of sources' first epochs (and those the mixing rule reads) are items already:
        # their maximum is several times cheaper than the modulo (an integer division an id)
        items = ids % self.n if len(ids) and int(ids.max()) >= self.n else ids
        return self.source(items)  # type: ignore[no-any-return]

    def fingerprint(self, n: int) -> bytes | memoryview:
        return self.source.fingerprint(n)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        # NOTE: what else a cost source offers (FeatureRows' item_costs) reads rows, not ids; but
        # not ``source`` itself, which unpickling asks for before it is set (else it recurses)
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)
