"""A mixture's weights over training (``WeightSchedule``) and when its epoch ends (``StopRule``).

Both are plain numbers, saved in a state as JSON; the rule that reads them is in
``fastsab.plan.mixing``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fastsab._checks import as_real_number, check_choice, short_repr

__all__ = ["StopRule", "WeightSchedule", "parse_stop"]

#: How a mixture's epoch ends: at the first source's end, at the last one's, or after a total.
StopKind = Literal["first", "last", "cost", "items"]


@dataclass(frozen=True)
class StopRule:
    """When a mixture's epoch ends.

    A source's epochs run on across the mixture's: a source epoch that a mixture epoch does not
    finish is finished by the next one. ``"first"``: when a source ends a source epoch that began
    within the mixture epoch. ``"last"``: when every source with a positive weight has ended a
    source epoch that began within it (a source that ends one before starts its next: it is
    upsampled). So every mixture epoch holds a whole source epoch of one source (``"first"``) or of
    every source (``"last"``), besides what it finishes of the epochs carried over. ``"cost"`` /
    ``"items"``: with the item that brings the epoch's cost (or items) to ``amount`` or past it.
    """

    kind: StopKind
    amount: float = 0

    def as_dict(self) -> dict[str, Any]:
        """The rule as JSON."""
        return {"kind": self.kind, "amount": self.amount}


def parse_stop(stop: object) -> StopRule:
    """``stop`` as a ``StopRule``: ``"first"``, ``"last"``, ``{"cost": x}`` or ``{"items": n}``.

    Raises:
        TypeError, ValueError: If ``stop`` is none of these, or the amount is not positive.

    Examples:
        >>> parse_stop("last"), parse_stop({"items": 10}).amount
        (StopRule(kind='last', amount=0), 10)
    """
    if isinstance(stop, StopRule):
        return stop
    if isinstance(stop, str):
        return StopRule(check_choice("stop", stop, ("first", "last")))  # type: ignore[arg-type]
    if isinstance(stop, Mapping) and len(stop) == 1:
        ((kind, amount),) = stop.items()
        check_choice("stop's key", kind, ("cost", "items"))
        number = amount.item() if isinstance(amount, np.generic) else amount
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise TypeError(f"stop={{{kind!r}: ...}} needs a number, got {short_repr(amount)}.")
        finite = isinstance(number, int) or math.isfinite(number)  # (an int past the floats is finite)
        if kind == "cost" and not (finite and number > 0):
            raise ValueError(f"stop={{{kind!r}: {number!r}}} needs a positive finite number.")
        if kind == "items" and not (finite and number > 0 and int(number) == number):
            raise ValueError(f"stop={{{kind!r}: {number!r}}} needs a positive integer.")
        return StopRule(kind, number)
    raise TypeError(f"stop must be 'first', 'last', {{'cost': total}} or {{'items': count}}, got {short_repr(stop)}.")


class WeightSchedule:
    """Each source's weight over a mixture's cost (or items) since its start.

    Args:
        names: The sources, in order.
        weights: One mapping ``{source: weight}`` (constant weights), or points
            ``[(at, {source: weight}), ...]`` whose ``at`` increase: from each point on, its
            weights hold until the next point, or move linearly to the next point's weights
            where that point is ``(at, weights, "linear")``. Before the first point its weights
            hold. A source a mapping leaves out has weight 0.
        over: What ``at`` counts: ``"cost"`` (the mixture's cost since its start) or ``"items"``.

    Raises:
        TypeError, ValueError: For a weight that is negative, not finite or not a number, for a
            mapping naming an unknown source or giving every source 0, and for points whose
            ``at`` do not increase.

    Examples:
        >>> schedule = WeightSchedule(["a", "b"], [(0, {"a": 1, "b": 0}), (10, {"a": 0, "b": 1}, "linear")])
        >>> schedule.at(5).tolist(), schedule.at(20).tolist()
        ([0.5, 0.5], [0.0, 1.0])
    """

    def __init__(self, names: Sequence[str], weights: object, over: str = "cost") -> None:
        self.names = list(names)
        self.over = check_choice("over", over, ("cost", "items"))
        self.at_points: list[float] = []
        self.values: list[np.ndarray] = []
        self.linear: list[bool] = []
        if isinstance(weights, Mapping):  # (constant weights: named as given, not as a point)
            self.at_points, self.values, self.linear = [0.0], [self.checked(weights)], [False]
            return
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
            raise TypeError(
                "weights must be a mapping {source: weight} or a list of points [(at, {source: weight}), ...], "
                f"got {short_repr(weights)}."
            )
        for number, point in enumerate(weights):
            at, values, shape = self._point(number, point)
            if self.at_points and not at > self.at_points[-1]:
                raise ValueError(
                    f"weights' points must increase in their 'at': point {number} is at {at!r}, after "
                    f"{self.at_points[-1]!r}."
                )
            self.at_points.append(at)
            self.values.append(values)
            self.linear.append(shape == "linear")
        if self.linear[0]:
            raise ValueError(
                "weights' first point cannot be 'linear': a linear segment moves from the point before it."
            )

    def _point(self, number: int, point: object) -> tuple[float, np.ndarray, str]:
        if not isinstance(point, (tuple, list)) or len(point) not in (2, 3):
            raise TypeError(
                f"weights[{number}] must be (at, {{source: weight}}) or (at, weights, 'linear'), "
                f"got {short_repr(point)}."
            )
        at, values = point[0], point[1]
        shape = point[2] if len(point) == 3 else "step"
        check_choice(f"weights[{number}]'s shape", shape, ("step", "linear"))
        return _finite_nonnegative(f"weights[{number}]'s 'at'", at), self.checked(values, f"weights[{number}]"), shape

    def checked(self, values: object, where: str = "weights") -> np.ndarray:
        """``{source: weight}`` as an array in the sources' order, checked."""
        if not isinstance(values, Mapping):
            raise TypeError(f"{where} must map source names to weights, got {short_repr(values)}.")
        array = np.zeros(len(self.names))
        for name, weight in values.items():
            if name not in self.names:
                raise ValueError(
                    f"{where} names source {name!r}, which the mixture does not have: it has {self.names}."
                )
            array[self.names.index(name)] = _finite_nonnegative(f"{where}[{name!r}]", weight)
        total = sum(array.tolist())  # (a Python sum: past the floats it is inf, without numpy's warning)
        if not total > 0:
            raise ValueError(f"{where} gives every source weight 0: give at least one source a positive weight.")
        if not math.isfinite(total):
            raise ValueError(
                f"{where} sum past the largest float: give weights of a smaller scale, got {short_repr(values)}."
            )
        return array

    def at(self, position: float) -> np.ndarray:
        """The weights at ``position`` (cost or items since the mixture's start)."""
        k = int(np.searchsorted(self.at_points, position, side="right")) - 1
        if k + 1 < len(self.at_points) and self.linear[k + 1]:
            start, end = self.at_points[k], self.at_points[k + 1]
            t = (position - start) / (end - start) if k >= 0 else 0.0
            moved: np.ndarray = self.values[max(k, 0)] + (self.values[k + 1] - self.values[max(k, 0)]) * max(t, 0.0)
            return moved
        return self.values[max(k, 0)]

    def next_change(self, position: float) -> float:
        """Where the weights next differ from those at ``position`` (``inf``: never; in a linear segment: at once)."""
        k = int(np.searchsorted(self.at_points, position, side="right")) - 1
        if k + 1 >= len(self.at_points):
            return math.inf
        return position if self.linear[k + 1] else self.at_points[k + 1]

    def as_list(self) -> list[list[Any]]:
        """The schedule as JSON: ``[at, {source: weight}, shape]`` per point."""
        return [
            [at, {n: float(w) for n, w in zip(self.names, values) if w}, "linear" if linear else "step"]
            for at, values, linear in zip(self.at_points, self.values, self.linear)
        ]

    def same_as(self, other: WeightSchedule) -> bool:
        """Whether ``other`` gives the same weights everywhere (as saved: ``as_list`` and ``over``)."""
        return self.over == other.over and self.as_list() == other.as_list()


def _finite_nonnegative(name: str, value: object) -> float:
    """``value`` as a float, if it is a finite real number >= 0 (a weight, a point's ``at``).

    Raises:
        TypeError: If ``value`` is no real number.
        ValueError: If it is negative, NaN or infinite.
    """
    number = as_real_number(name, value)
    try:
        finite = float(number)
    except OverflowError:  # (an int past the floats)
        finite = math.inf
    if not (math.isfinite(finite) and finite >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {short_repr(number)}.")
    return finite
