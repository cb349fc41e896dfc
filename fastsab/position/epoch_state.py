"""The resume state format: an epoch's stretches (``Segment``) and how a state is read back.

A state is plain JSON: the format, seed, epoch and plan fingerprint, the plan's settings
(``"plan"``, to name what differs when the fingerprint does), the stretch being run (its world
size, steps, dealing options and lowered limits) at the top level, and the earlier stretches
of the epoch under ``"history"``. ``parse_state`` checks every value and names the key of
the first bad one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, TypeAlias

from fastsab._checks import check_choice
from fastsab.plan.costs import Limit
from fastsab.position.distributed import EvenBatches
from fastsab.position.fingerprint import plan_differences

__all__ = [
    "MAX_WORLD_SIZE",
    "RESUME_KEYS",
    "SEGMENT_KEYS",
    "STATE_FORMAT",
    "STATE_KEYS",
    "Limit",
    "Lowered",
    "ResumePoint",
    "ResumePoints",
    "Segment",
    "check_steps",
    "lowered_at",
    "parse_resume_point",
    "parse_state",
]

STATE_FORMAT = "fastsab.epoch-state/2"

#: The largest world size a state may name.
MAX_WORLD_SIZE = 2**24

#: The entries of a stretch (a ``Segment``), at the top level of a state and in its history.
SEGMENT_KEYS = ("world_size", "steps", "even_batches", "balance", "lowered")
#: The entries of a state besides those of its current stretch.
STATE_KEYS = ("format", "seed", "epoch", "history", "fingerprint")
#: The entries a state may lack: the plan's settings (states saved before they were kept have none),
#: where planning resumes (``ResumePoint``: states saved before it was kept, or where none applies)
#: and the epoch's global batches (where the saving run knew them: ``fastsab.position.batch_count``).
OPTIONAL_KEYS = ("plan", "resume", "batches", "mixture")
#: The entries of a state's ``"resume"``.
RESUME_KEYS = ("batch", "item", "rng")
#: The resume points an iteration keeps for the steps behind the last one handed out (a consumer's lag).
KEPT_POINTS = 2**12


#: ``(position, limit)`` records: from the ``position``-th batch of a stream on, ``limit`` applied.
#: Positions never decrease; entries of one position are lowerings applied there one after the
#: other (a batch retried, then a part of it retried again), each re-planning what the previous left.
Lowered: TypeAlias = list[tuple[int, Limit]]


@dataclass
class Segment:
    """A stretch of an epoch run with one world size.

    Attributes:
        world_size: Ranks that ran it.
        steps: Steps run (each rank ran one batch per step).
        even_batches, balance: How the batches were dealt (``None`` for one rank).
        lowered: ``(position, limit)`` for each limit lowered in this stretch, in the order
            applied: from the ``position``-th batch of its stream on, the rest was re-planned
            under ``limit`` (one rank only). Several entries may share a position.
    """

    world_size: int
    steps: int = 0
    even_batches: EvenBatches | None = None
    balance: bool | None = None
    lowered: Lowered = field(default_factory=list)

    def dealing(self) -> tuple[int, EvenBatches | None, bool | None]:
        """What decides which batches this stretch's steps ran, besides the batches."""
        return self.world_size, self.even_batches, self.balance

    def as_dict(self) -> dict[str, Any]:
        """The stretch as the entries of a state (limits as given: numbers may be numpy's)."""
        return {
            "world_size": self.world_size,
            "steps": self.steps,
            "even_batches": self.even_batches,
            "balance": self.balance,
            "lowered": [[position, limit] for position, limit in self.lowered],
        }


@dataclass(frozen=True)
class ResumePoint:
    """Where an epoch's plan is taken up again on resume, so that no step before it is planned again.

    It is the first global batch of the dealing window (on one rank: of the plan chunk) that
    holds the last step run: a resume plans the epoch from that batch's first item on, deals
    from there with the dealer's random state there, and skips that window's steps already run.

    Attributes:
        batch: The epoch's global batch number (the window's first step times the world size).
        item: The index of that batch's first item.
        rng: The dealer's random state before it dealt the window (PCG64's ``state``, ``inc``,
            ``has_uint32`` and ``uinteger``); ``None`` where it draws none (one rank, no balancing).
    """

    batch: int
    item: int
    rng: tuple[int, int, int, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The point as a state's ``"resume"`` entry (the random state in hexadecimal strings, for JSON)."""
        rng = None if self.rng is None else [format(value, "x") for value in self.rng]
        return {"batch": self.batch, "item": self.item, "rng": rng}


class ResumePoints:
    """The resume points of an epoch's windows as they are dealt, each with the steps it holds."""

    def __init__(self) -> None:
        # NOTE: bounded: a consumer further behind than the kept windows saves a state without a
        # point, which resumes by planning the epoch again (as a state of an older fastsab does)
        self._points: deque[tuple[int, int, ResumePoint]] = deque(maxlen=KEPT_POINTS)

    def add(self, first_step: int, end_step: int, point: ResumePoint) -> None:
        """Note ``point``, which holds the steps ``[first_step, end_step)``."""
        if end_step > first_step:
            self._points.append((first_step, end_step, point))

    def clear(self) -> None:
        """Forget every point (a lowered limit plans the rest otherwise)."""
        self._points.clear()

    def copy(self) -> ResumePoints:
        """The points kept, in an object of their own."""
        copied = ResumePoints()
        copied._points.extend(self._points)
        return copied

    def holding(self, steps: int) -> ResumePoint | None:
        """The point of the window holding the last of ``steps`` steps run (``None``: not kept, or no step run)."""
        # NOTE: a snapshot (one C call): a prefetch thread may add points while a state is saved
        for first, end, point in reversed(tuple(self._points)):
            if first < steps <= end:
                return point
            if end < steps:
                return None
        return None


def lowered_at(lowered: Lowered, position: int, limit: Limit) -> Lowered:
    """The record ``lowered`` with ``limit`` lowered at ``position`` after its entries (later ones replaced).

    An entry of the same position is kept: the rest was planned under it before ``limit``
    re-planned it again, and a resume must plan it the same way twice.

    Examples:
        >>> lowered_at([(2, 50), (6, 40)], 4, 30)
        [(2, 50), (4, 30)]
        >>> lowered_at([(2, 50), (4, 30)], 4, 20)
        [(2, 50), (4, 30), (4, 20)]
    """
    # NOTE: a lowering is applied at the position reached, after every recorded one, so no
    # entry lies after it; those that would are dropped to keep the positions non-decreasing
    return [(at, old) for at, old in lowered if at <= position] + [(position, limit)]


def check_steps(segment: Segment, steps: int, epoch: int) -> None:
    """Refuse ``segment`` if it ran more than the ``steps`` its epoch has on its ranks."""
    if segment.steps > steps:
        ranks = f"{segment.world_size} rank" + ("s" if segment.world_size > 1 else "")
        raise ValueError(f"state has steps={segment.steps!r}, past the {steps} steps of epoch {epoch} on {ranks}.")


def parse_state(
    state: object,
    *,
    seed: int,
    fingerprint: str,
    check_limit: Callable[[Any], Limit],
    plan: dict[str, Any] | None = None,
    older: Callable[[], Sequence[str]] = tuple,
) -> tuple[int, list[Segment]]:
    """The epoch of ``state`` and its stretches (the last one is where the state was taken).

    Args:
        state: What ``state_dict()`` returned (maybe through JSON).
        seed, fingerprint: The reader's; a state of another seed or plan is refused.
        check_limit: Checks a lowered limit and returns it as the planner uses it.
        plan: The reader's plan settings (``plan_identity``): a refusal names what differs
            from the state's. The fingerprint alone decides whether a state is refused.
        older: The fingerprints an older fastsab gave the reader's batches (``older_fingerprints``),
            asked for only where the state's is not the reader's: a state of one of them resumes.

    Raises:
        TypeError: If ``state`` or one of its values has the wrong type.
        ValueError: If it is not a state of this format, of this seed and plan, or a value
            is out of range.

    Examples:
        >>> parse_state([], seed=0, fingerprint="", check_limit=int)
        Traceback (most recent call last):
        ...
        TypeError: state must be a dict from state_dict(), got list.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}.")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"state is not a fastsab epoch state of this version (format {state.get('format')!r}, "
            f"expected {STATE_FORMAT!r})."
        )
    _check_keys("state", state, STATE_KEYS + SEGMENT_KEYS, OPTIONAL_KEYS)
    if _state_int("seed", state["seed"]) != seed:
        raise ValueError(f"state was saved with seed {state['seed']!r}, but this object has seed {seed!r}.")
    saved_plan = state.get("plan")
    if saved_plan is not None and not isinstance(saved_plan, dict):
        raise TypeError(f"state['plan'] must be a dict from state_dict(), got {saved_plan!r}.")
    if state["fingerprint"] != fingerprint and state["fingerprint"] not in older():
        raise ValueError(_refusal(state["fingerprint"], fingerprint, saved_plan, plan))
    epoch = _state_int("epoch", state["epoch"])
    if epoch >= 2**63:
        raise ValueError(f"state['epoch'] must be below 2**63, got {epoch!r}.")
    if not isinstance(state["history"], list):
        raise TypeError(f"state['history'] must be a list, got {state['history']!r}.")
    for raw in state["history"]:
        if not isinstance(raw, dict):
            raise TypeError(f"each of state['history'] must be a dict, got {raw!r}.")
        _check_keys("state['history']", raw, SEGMENT_KEYS)
    return epoch, [_parse_segment(raw, check_limit) for raw in [*state["history"], state]]


def parse_resume_point(state: dict[str, Any]) -> ResumePoint | None:
    """The ``"resume"`` entry of a state read by ``parse_state`` (``None`` where it has none).

    Raises:
        TypeError: If the entry or one of its values has the wrong type.
        ValueError: If it lacks an entry, has an unknown one, or a value is out of range.
    """
    raw = state.get("resume")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"state['resume'] must be a dict from state_dict(), got {raw!r}.")
    _check_keys("state['resume']", raw, RESUME_KEYS)
    batch, item = _state_int("resume batch", raw["batch"]), _state_int("resume item", raw["item"])
    rng = raw["rng"]
    if rng is None:
        return ResumePoint(batch, item)
    if not isinstance(rng, list) or len(rng) != 4 or not all(isinstance(value, str) for value in rng):
        raise TypeError(f"state['resume']['rng'] must be None or a list of 4 hexadecimal strings, got {rng!r}.")
    try:
        values = [int(value, 16) for value in rng]
    except ValueError:
        raise ValueError(f"state['resume']['rng'] must hold hexadecimal strings, got {rng!r}.") from None
    bounds = (2**128, 2**128, 2, 2**32)
    if any(not 0 <= value < bound for value, bound in zip(values, bounds)):
        raise ValueError(f"state['resume']['rng'] is not a random state of the dealer, got {rng!r}.")
    return ResumePoint(batch, item, (values[0], values[1], values[2], values[3]))


def _refusal(saved: object, fingerprint: str, saved_plan: dict[str, Any] | None, plan: dict[str, Any] | None) -> str:
    """Why a state of fingerprint ``saved`` is refused: what differs, where both name their settings."""
    hashes = f"(fingerprint {saved!r}, this object's is {fingerprint!r})"
    if saved_plan is None or plan is None:
        return (
            f"state was saved for another dataset, sizes or batching configuration {hashes} "
            "(a state saved by an older fastsab names no setting)."
        )
    return (
        f"state was saved for another dataset, sizes or batching configuration: "
        f"{'; '.join(plan_differences(saved_plan, plan))} {hashes}. Load it into a loader made with the "
        "settings it was saved with, or start the epoch afresh without load_state_dict()."
    )


def _check_keys(name: str, raw: dict[Any, Any], keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """Refuse ``raw`` (``name`` in the state) unless it has the entries ``keys`` and no others but ``optional``."""
    for key in keys:
        if key not in raw:
            raise ValueError(f"state has no {key!r} entry; pass a dict made by state_dict().")
    # NOTE: an entry this version does not know may change where a resume starts: refused, not ignored
    unknown = [key for key in raw if key not in keys + optional]
    if unknown:
        raise ValueError(
            f"{name} has an unknown entry {unknown[0]!r} (entries are {', '.join(keys)}); "
            "pass a dict made by state_dict()."
        )


def _parse_segment(raw: dict[str, Any], check_limit: Callable[[Any], Limit]) -> Segment:
    world = _state_int("world_size", raw["world_size"])
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise ValueError(f"state has world_size={world!r}; it must be from 1 to {MAX_WORLD_SIZE}.")
    steps = _state_int("steps", raw["steps"])
    even: EvenBatches | None = None
    balance: bool | None = None
    if world > 1:
        even = check_choice("state['even_batches']", raw["even_batches"], ("pad", "drop"))  # type: ignore[assignment]
        balance = raw["balance"]
        if not isinstance(balance, bool):
            raise TypeError(f"state['balance'] must be a bool, got {balance!r}.")
    return Segment(world, steps, even, balance, _parse_lowered(raw["lowered"], world, check_limit))


def _parse_lowered(lowered: object, world: int, check_limit: Callable[[Any], Limit]) -> Lowered:
    if not isinstance(lowered, list) or (lowered and world != 1):
        raise ValueError(f"state['lowered'] must be a list (empty for several ranks), got {lowered!r}.")
    entries: Lowered = []
    for entry in lowered:
        if not isinstance(entry, list) or len(entry) != 2:
            raise ValueError(f"each of state['lowered'] must be [position, limit], got {entry!r}.")
        position = _state_int("lowered position", entry[0])
        if entries and position < entries[-1][0]:
            raise ValueError(f"state['lowered'] positions must not decrease, got {lowered!r}.")
        try:
            limit = check_limit(entry[1])
        except (TypeError, ValueError) as error:
            raise type(error)(f"state['lowered'] has a bad limit {entry[1]!r}: {error}") from None
        entries.append((position, limit))
    return entries


def _state_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        kind = "a number that is not an integer" if isinstance(value, Real) else type(value).__name__
        raise TypeError(f"state[{name!r}] must be an integer, got {value!r} ({kind}).")
    if value < 0:
        raise ValueError(f"state[{name!r}] must be a non-negative integer, got {value!r}.")
    return int(value)
