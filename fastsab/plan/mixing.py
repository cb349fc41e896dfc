"""The mixing rule: which source the next item of a mixture comes from.

A mixture merges the orders of its sources into one. Each source ``s`` has a weight ``w_s``; its
*target* after a prefix of the merged order is its share ``w_s / sum(w)`` of the prefix's total
cost (the loader's cost of each item: tokens under a token budget, bytes under a memory model;
or 1 per item). Its *deviation* ``d_s`` is its cost so far minus its target. The rule, worst-case
fair weighted fair queueing (WF2Q) on the sources' next items:

1. The sources that may give the next item are those with a positive weight and ``d_s <= 0``
   (not ahead of their target); where none is, every source with a positive weight.
2. Of those, the next item is the head of the source whose deviation after it, per unit of
   weight, is least: ``argmin (d_s + c_s) / w_s``, ``c_s`` the cost of its next item; ties go to
   the source named first.
3. The item's cost ``c`` is added to its source's cost, and ``w_r / sum(w) * c`` to every target.

Under constant weights, after every prefix of the merged order, every source's cost lies within
the cost of the largest item of any source of its target: it is taken only when it is not ahead
(so it ends at most one item ahead), and the item chosen among those not ahead is the one a fluid,
exactly proportional split would finish first (so none falls behind by an item). The plain
weighted fair queueing merge (the finish-time order alone) keeps this bound for two sources only:
with three, a heavy source runs ahead by up to two items before the light ones' first items.

Weights follow a ``WeightSchedule`` over the mixture's cost (or items) since its start: each
item is chosen with the weights at the cost before it, and the targets grow by those weights.

``MixState`` is where the rule stands (per source: its source epoch, its position there, its
deviation), ``mix_walk`` the rule run item by item. Everything here is plain numbers: a state is
saved as JSON and the walk gives the same merge wherever it is taken up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fastsab._checks import short_repr
from fastsab.plan._mix_kernel import take_run
from fastsab.plan.compiled import compiled_take_run
from fastsab.plan.mix_weights import StopRule, WeightSchedule

__all__ = ["MixState", "SourceHeads", "mix_walk"]


@dataclass
class MixState:
    """Where the rule stands: per source its source epoch, position there, deviation and cost; the totals.

    A source's cost and deviation (its cost minus its target), ``cost`` and ``items`` count from
    the mixture's start (what a schedule reads); ``epoch_cost`` and ``epoch_items`` from the
    mixture epoch's start. ``began`` marks the sources whose current source epoch began within the
    mixture epoch (a source that carries a source epoch over from the one before has not), and
    ``ended`` those that ended a source epoch they began within it (what ``stop`` reads).
    """

    source_epochs: list[int]
    positions: list[int]
    deviations: list[float]
    costs: list[float] = field(default_factory=list)
    source_starts: list[float] = field(default_factory=list)  # each source's cost when its source epoch began
    cost: float = 0.0
    items: int = 0
    epoch_cost: float = 0.0
    epoch_items: int = 0
    ended: list[bool] = field(default_factory=list)
    began: list[bool] = field(default_factory=list)

    @classmethod
    def start(cls, sources: int) -> MixState:
        """The state before the first item."""
        zeros = [0.0] * sources
        return cls(
            [0] * sources,
            [0] * sources,
            list(zeros),
            list(zeros),
            list(zeros),
            ended=[False] * sources,
            began=[True] * sources,
        )

    def next_epoch(self) -> MixState:
        """The state at the start of the next mixture epoch (epoch counts reset)."""
        began = [position == 0 for position in self.positions]
        return replace(self, epoch_cost=0.0, epoch_items=0, ended=[False] * len(self.positions), began=began)

    def copy(self) -> MixState:
        """An independent copy."""
        return replace(
            self,
            source_epochs=list(self.source_epochs),
            positions=list(self.positions),
            deviations=list(self.deviations),
            costs=list(self.costs),
            source_starts=list(self.source_starts),
            ended=list(self.ended),
            began=list(self.began),
        )

    def as_dict(self) -> dict[str, Any]:
        """The state as JSON (floats written exactly)."""
        return {
            "source_epochs": list(self.source_epochs),
            "positions": list(self.positions),
            "deviations": list(self.deviations),
            "costs": list(self.costs),
            "source_starts": list(self.source_starts),
            "cost": self.cost,
            "items": self.items,
            "epoch_cost": self.epoch_cost,
            "epoch_items": self.epoch_items,
            "ended": list(self.ended),
            "began": list(self.began),
        }

    @classmethod
    def from_dict(cls, entry: object, lengths: Sequence[int], where: str) -> MixState:
        """A state saved by ``as_dict`` for sources of ``lengths`` items.

        Raises:
            ValueError: If ``entry`` is not such a state.
        """
        sources = len(lengths)
        try:
            if not isinstance(entry, Mapping):
                raise TypeError
            positions = [_count(v) for v in _listed(entry["positions"], sources)]
            ended, began = _listed(entry["ended"], sources), _listed(entry["began"], sources)
            if not all(isinstance(v, bool) for v in ended + began) or any(p >= n for p, n in zip(positions, lengths)):
                raise TypeError
            return cls(
                [_count(v) for v in _listed(entry["source_epochs"], sources)],
                positions,
                [_sum(v) for v in _listed(entry["deviations"], sources)],
                [_sum(v) for v in _listed(entry["costs"], sources)],
                [_sum(v) for v in _listed(entry["source_starts"], sources)],
                _sum(entry["cost"]),
                _count(entry["items"]),
                _sum(entry["epoch_cost"]),
                _count(entry["epoch_items"]),
                ended,
                began,
            )
        except (KeyError, TypeError, OverflowError):  # (OverflowError: an int past the floats)
            raise ValueError(f"{where} is not a mixture state of {sources} sources: {short_repr(entry)}.") from None


# NOTE: a saved state's numbers are checked with TypeError (turned into the ValueError that names
# the entry), not with assert, which python -O leaves out


def _listed(values: object, count: int) -> list[Any]:
    """``values``, a list of ``count`` values (a saved state's), else a ``TypeError``."""
    if not (isinstance(values, (list, tuple)) and len(values) == count):
        raise TypeError
    return list(values)


def _count(value: object) -> int:
    """``value``, an integer >= 0 (a saved state's), else a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError
    return value


def _sum(value: object) -> float:
    """``value``, a finite number (a saved state's), as a float, else a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError
    return float(value)


class SourceHeads:
    """The next items of every source, read ahead a block at a time into one flat buffer.

    Source ``s``'s block lies in ``costs`` and ``ids`` from ``offsets[s]`` (its next item) to
    ``ends[s]``, within ``[s * _BLOCK, (s + 1) * _BLOCK)``; the buffers are lists, or arrays for
    the compiled walk (``open``).

    Args:
        lengths: Items of each source.
        read: ``read(s, source_epoch, start, count)`` -> ``(ids, costs)``: the ``count`` items of
            source ``s``'s ``source_epoch`` from position ``start`` on, as the ids the mixture
            yields and their costs (1-D float64).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        read: Callable[[int, int, int, int], tuple[np.ndarray, np.ndarray]],
        names: Sequence[str] = (),
    ) -> None:
        self.lengths, self.names = list(lengths), list(names)
        self.read = read
        self.arrays = False
        self.costs: Any = []
        self.ids: Any = []
        self.offsets: Any = []
        self.ends: Any = []

    def open(self, state: MixState, arrays: bool) -> None:
        """Read every source's block from where ``state`` stands, into arrays or (without ``arrays``) lists."""
        k = len(self.lengths)
        self.arrays = arrays
        if arrays:
            self.costs, self.ids = np.zeros(k * _BLOCK), np.zeros(k * _BLOCK, dtype=np.int64)
            self.offsets, self.ends = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
        else:
            self.costs, self.ids, self.offsets, self.ends = [0.0] * (k * _BLOCK), [0] * (k * _BLOCK), [0] * k, [0] * k
        for s in range(k):
            self.load(s, state.source_epochs[s], int(state.positions[s]))

    def load(self, s: int, source_epoch: int, position: int) -> None:
        """Read source ``s``'s block from ``position`` of ``source_epoch`` on."""
        ids, costs = self.read(s, source_epoch, position, min(_BLOCK, self.lengths[s] - position))
        first, count = s * _BLOCK, len(ids)  # (a read may give fewer: up to the end of a chunk of the source)
        if self.arrays:
            self.ids[first : first + count], self.costs[first : first + count] = ids, costs
        else:
            self.ids[first : first + count], self.costs[first : first + count] = ids.tolist(), costs.tolist()
        self.offsets[s], self.ends[s] = first, first + count


#: Items of a source read ahead at once.
_BLOCK = 2**12


def mix_walk(
    state: MixState, heads: SourceHeads, schedule: WeightSchedule, stop: StopRule, count: int
) -> tuple[np.ndarray, bool]:
    """Run the rule for up to ``count`` items from ``state`` (updated in place).

    The items are taken by ``take_run`` of ``fastsab.plan._mix_kernel``: compiled where
    ``use_compiled`` asked for it and numba has compiled it, else as plain Python.

    Returns:
        The ids chosen, and whether the mixture epoch ended with the last of them.
    """
    compiled = compiled_take_run()
    run = take_run if compiled is None else compiled
    arrays = compiled is not None
    lengths = heads.lengths
    k = len(lengths)

    def column(values: Sequence[float], dtype: type) -> Any:
        return np.array(values, dtype=dtype) if arrays else [dtype(v) for v in values]

    d, source_costs = column(state.deviations, float), column(state.costs, float)
    totals = column([state.cost, state.epoch_cost], float)
    positions, items, epoch_items = list(state.positions), state.items, state.epoch_items
    out: Any = np.zeros(count, dtype=np.int64) if arrays else [0] * count
    heads.open(state, arrays)
    by_items = schedule.over == "items"
    stop_cost = float(stop.amount) if stop.kind == "cost" else math.inf
    change = -1.0  # (weights read at the first item)
    weights: list[float] = []
    n, ended = 0, False
    while n < count:
        where = items if by_items else float(totals[0])
        if where >= change:
            array = schedule.at(where)
            weights = array.tolist()
            total = float(array.sum())
            shares = column([w / total for w in weights], float)
            positive = column([s for s in range(k) if weights[s] > 0], int)
            in_force = column(weights, float)
            change = schedule.next_change(where)
        # NOTE: counts of items stop a run by its length (the first item is always taken): the
        # weights' next change where they count items, and stop={"items": ...}
        limit = count
        if by_items and change < math.inf:
            limit = min(limit, n + max(1, math.ceil(change) - items))
        if stop.kind == "items":
            limit = min(limit, n + math.ceil(stop.amount) - epoch_items)
        before, start = [int(v) for v in heads.offsets], n
        n, s = run(
            d, shares, in_force, positive, source_costs, heads.offsets, heads.ends, heads.costs, heads.ids, totals,
            math.inf if by_items else change, stop_cost, out, n, limit,
        )  # fmt: skip
        items, epoch_items = items + n - start, epoch_items + n - start
        for r in range(k):
            positions[r] += int(heads.offsets[r]) - before[r]
        finished = positions[s] == lengths[s]
        if finished:  # the source's epoch ends: its next one starts
            state.source_epochs[s] += 1
            positions[s] = 0
            if source_costs[s] == state.source_starts[s] and stop.kind in ("last", "cost"):
                raise _costs_nothing(heads, s, stop)
            state.source_starts[s] = float(source_costs[s])
            # NOTE: a source epoch carried over from the mixture's epoch before does not end this one
            finished = state.began[s]
            state.ended[s] = state.ended[s] or finished
            state.began[s] = True
        ended = _stops(stop, state.ended, weights, finished, float(totals[1]), epoch_items)
        if ended:
            break
        if heads.offsets[s] == heads.ends[s]:
            heads.load(s, state.source_epochs[s], positions[s])
    state.deviations, state.costs, state.positions = [float(v) for v in d], [float(v) for v in source_costs], positions
    state.cost, state.epoch_cost = float(totals[0]), float(totals[1])
    state.items, state.epoch_items = items, epoch_items
    return np.asarray(out[:n], dtype=np.int64), ended


def _stops(stop: StopRule, ended: list[bool], weights: list[float], finished: bool, cost: float, items: int) -> bool:
    """Whether the mixture epoch ends after the item just taken (``finished``: it ended its source epoch)."""
    if stop.kind == "first":
        return finished
    if stop.kind == "last":
        return finished and all(done or not w for done, w in zip(ended, weights))
    if stop.kind == "cost":
        return cost >= stop.amount
    return items >= stop.amount


def _costs_nothing(heads: SourceHeads, s: int, stop: StopRule) -> ValueError:
    """The error for source ``s``, whose items all cost 0: the rule would take it at every turn."""
    name = heads.names[s] if heads.names else s
    return ValueError(
        f"source {name!r} costs nothing: each of its {heads.lengths[s]} items has cost 0, so under weights that "
        f"count cost it is always behind its share and would be taken at every turn, and stop={stop.kind!r} "
        "would never come. Give it weight 0, leave it out, or pass by='items'."
    )
