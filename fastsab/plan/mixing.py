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
    """The next items of every source, read ahead a block at a time.

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
        self._ids: list[list[int]] = [[] for _ in self.lengths]
        self._costs: list[list[float]] = [[] for _ in self.lengths]
        self._at: list[tuple[int, int]] = [(-1, -1)] * len(
            self.lengths
        )  # (source epoch, position) of the block's start

    def block(self, s: int, source_epoch: int, position: int) -> tuple[list[int], list[float], int]:
        """The block of source ``s`` holding ``position`` of ``source_epoch``: ids, costs, ``position``'s offset."""
        epoch, start = self._at[s]
        if epoch != source_epoch or not start <= position < start + len(self._ids[s]):
            count = min(_BLOCK, self.lengths[s] - position)
            ids, costs = self.read(s, source_epoch, position, count)
            self._ids[s], self._costs[s] = ids.tolist(), costs.tolist()
            self._at[s] = (source_epoch, position)
            start = position
        return self._ids[s], self._costs[s], position - start


#: Items of a source read ahead at once.
_BLOCK = 2**12


def mix_walk(
    state: MixState, heads: SourceHeads, schedule: WeightSchedule, stop: StopRule, count: int
) -> tuple[list[int], bool]:
    """Run the rule for up to ``count`` items from ``state`` (updated in place).

    Returns:
        The ids chosen, and whether the mixture epoch ended with the last of them.
    """
    lengths = heads.lengths
    sources = range(len(lengths))
    d = state.deviations
    out: list[int] = []
    ids_of: list[list[int]] = []
    costs_of: list[list[float]] = []
    offset: list[int] = []
    for s in sources:
        ids, costs, at = heads.block(s, state.source_epochs[s], state.positions[s])
        ids_of.append(ids)
        costs_of.append(costs)
        offset.append(at)
    by_items = schedule.over == "items"
    change = -1.0  # (weights read at the first item)
    weights: list[float] = []
    shares: list[float] = []
    positive: list[int] = []
    while len(out) < count:
        where = state.items if by_items else state.cost
        if where >= change:
            array = schedule.at(where)
            weights = array.tolist()
            total = float(array.sum())
            shares = [w / total for w in weights]
            positive = [s for s in sources if weights[s] > 0]
            change = schedule.next_change(where)
        best, best_key = -1, math.inf
        for s in positive:
            if d[s] <= 0:
                key = (d[s] + costs_of[s][offset[s]]) / weights[s]
                if key < best_key or best < 0:
                    best, best_key = s, key
        if best < 0:  # (no source with a positive weight is behind: weights that changed)
            for s in positive:
                key = (d[s] + costs_of[s][offset[s]]) / weights[s]
                if key < best_key or best < 0:
                    best, best_key = s, key
        s = best
        c = costs_of[s][offset[s]]
        out.append(ids_of[s][offset[s]])
        for r in positive:
            d[r] -= shares[r] * c
        d[s] += c
        state.costs[s] += c
        state.cost += c
        state.epoch_cost += c
        state.items += 1
        state.epoch_items += 1
        state.positions[s] += 1
        offset[s] += 1
        ended = False
        if state.positions[s] == lengths[s]:  # the source's epoch ends: its next one starts
            state.source_epochs[s] += 1
            state.positions[s] = 0
            # NOTE: a source epoch carried over from the mixture's epoch before does not end this one
            ended = state.began[s]
            state.ended[s] = state.ended[s] or ended
            state.began[s] = True
            if state.costs[s] == state.source_starts[s] and stop.kind in ("last", "cost"):
                raise _costs_nothing(heads, s, stop)
            state.source_starts[s] = state.costs[s]
        if _stops(state, stop, weights, ended):
            return out, True
        if offset[s] == len(ids_of[s]):
            ids_of[s], costs_of[s], offset[s] = heads.block(s, state.source_epochs[s], state.positions[s])
    return out, False


def _stops(state: MixState, stop: StopRule, weights: list[float], ended: bool) -> bool:
    """Whether the mixture epoch ends after the item just taken."""
    if stop.kind == "first":
        return ended
    if stop.kind == "last":
        return ended and all(done or not w for done, w in zip(state.ended, weights))
    if stop.kind == "cost":
        return state.epoch_cost >= stop.amount
    return state.epoch_items >= stop.amount


def _costs_nothing(heads: SourceHeads, s: int, stop: StopRule) -> ValueError:
    """The error for source ``s``, whose items all cost 0: the rule would take it at every turn."""
    name = heads.names[s] if heads.names else s
    return ValueError(
        f"source {name!r} costs nothing: each of its {heads.lengths[s]} items has cost 0, so under weights that "
        f"count cost it is always behind its share and would be taken at every turn, and stop={stop.kind!r} "
        "would never come. Give it weight 0, leave it out, or pass by='items'."
    )
