"""Where an epoch stands: epoch, this rank's share, steps done, ``len()`` and resuming.

An :class:`EpochCursor` is what the loaders and the planned batch sampler share. It turns
``(seed, epoch)`` into this rank's :class:`Stream` of plan chunks and keeps the position in
it, so that :meth:`~EpochCursor.state_dict` is a few numbers and
:meth:`~EpochCursor.load_state_dict` continues with exactly the batches not run yet.

A state records the epoch's *history* as segments: each segment is a stretch of steps run
with one world size (and the dealing options and lowered limits of that stretch). The plan
is never replayed item by item; it is recomputed from the seed and epoch and each segment
is applied in turn:

* a segment with one rank runs its stream of batches (lowered limits re-planned at the
  step they were lowered at) and leaves the batches after its steps;
* a segment with ``w`` ranks deals the batches left to ``w`` ranks
  (:func:`~fastsab.distributed.assign_steps`) and leaves those not dealt to its steps.

A state saved by a job of another world size or other dealing options thus resumes exactly:
the segments keep what decided which batches ran. A state whose seed or plan fingerprint
(dataset length, sizes, configured limits) differs from this object's is refused.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import deque
from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from typing import Any

import numpy as np

from fastsab._checks import check_choice, check_nonnegative_int
from fastsab.distributed import EvenBatches, StepAssignment, assign_steps
from fastsab.epochs import EpochOrder, EpochStats
from fastsab.plans import ExplicitPlan, PlanChunk
from fastsab.plans import Planner as _Planner

__all__ = ["STATE_FORMAT", "EpochCursor", "Segment", "Stream", "plan_fingerprint"]

STATE_FORMAT = "fastsab.epoch-state/2"

#: The largest world size a state may name.
MAX_WORLD_SIZE = 2**24

Planner = _Planner[Any]


def _plain(value: Any) -> Any:
    """Numbers (numpy or Python, also in lists) as plain Python numbers, for states and digests."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def plan_fingerprint(planner: Planner) -> str:
    """A short digest of what determines a planner's batches (besides seed and epoch).

    It covers the number of items, the order options, the configured limits and the sizes:
    all of them for an array of sizes, else the sizes of up to 4096 evenly spread items (a
    callable's sizes are not all computed just to fingerprint them). Numbers are compared by
    value: ``np.int64(100)``, ``100`` and ``100.0`` are the same cap.
    """
    kind, options, sizes = planner.plan_inputs()
    order = planner.order
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr((kind, order.n, order.shuffle, order.group_size, order.rotate)).encode())
    digest.update(json.dumps(_plain(options)).encode())
    digest.update(sizes)
    return digest.hexdigest()


@dataclass
class Segment:
    """A stretch of an epoch run with one world size.

    Attributes:
        world_size: Ranks that ran it.
        steps: Steps run (each rank ran one batch per step).
        even_batches, balance: How the batches were dealt (``None`` for one rank).
        lowered: ``(position, limit)`` for each limit lowered in this stretch: from the
            ``position``-th batch of its stream on, the rest was re-planned under ``limit``
            (one rank only).
    """

    world_size: int
    steps: int = 0
    even_batches: EvenBatches | None = None
    balance: bool | None = None
    lowered: list[tuple[int, Any]] = field(default_factory=list)

    def dealing(self) -> tuple[int, EvenBatches | None, bool | None]:
        """What decides which batches this stretch's steps ran, besides the batches."""
        return self.world_size, self.even_batches, self.balance

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "steps": self.steps,
            "even_batches": self.even_batches,
            "balance": self.balance,
            "lowered": [[position, _plain(limit)] for position, limit in self.lowered],
        }


@dataclass(frozen=True)
class _Run:
    """An epoch as it was started: its number, earlier stretches, this stretch and its stream."""

    epoch: int
    history: list[Segment]
    segment: Segment
    stream: Stream


class Stream:
    """This rank's plan chunks of one epoch, after ``skip`` batches, with limits lowered.

    ``lowered`` limits are re-applied where they were lowered (also inside the skipped
    batches), so that a resumed stream has the batches the interrupted one had.
    :meth:`lower` plans the batches from a position on again, also those of chunks already
    returned (fetched ahead): the chunks returned are kept until :meth:`release` lets them go.
    """

    def __init__(self, plan: Any, *, skip: int = 0, lowered: list[tuple[int, Any]] | None = None) -> None:
        self.plan = plan
        self.skip = skip
        self.lowered = list(lowered or [])  # the record: replayed and new lowerings
        self._replay = deque(self.lowered)
        self.position = 0  # batches of the stream before the next chunk
        self.stats: EpochStats | None = None
        self._returned: deque[tuple[int, int, PlanChunk]] = deque()  # (first, end position, chunk) not released

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> PlanChunk:
        while True:
            chunk = next(self.plan)
            if self.stats is not None:
                self.stats.add(chunk)
            start = self.position
            end = start + chunk.num_batches
            while self._replay and self._replay[0][0] <= end:
                position, limit = self._replay.popleft()
                cut = position - start
                self.plan.lower(chunk.ids[chunk.offsets[cut] :], limit)
                chunk, end = chunk.head(cut), position
            self.position = end
            if self.skip >= end:  # ran before the state was saved
                continue
            if self.skip > start:
                chunk, start = chunk.tail(self.skip - start), self.skip
            self._returned.append((start, end, chunk))
            return chunk

    def release(self, position: int) -> None:
        """Let go of the chunks whose batches all come before ``position``."""
        returned = self._returned
        while returned and returned[0][1] <= position:
            returned.popleft()

    def lower(self, position: int, limit: Any) -> None:
        """Plan the batches from ``position`` on again under ``limit``.

        ``position`` must not be released; nothing may iterate the stream meanwhile.
        """
        pending = [
            chunk.ids[chunk.offsets[max(position - start, 0)] :]
            for start, end, chunk in self._returned
            if end > position
        ]
        self._returned.clear()
        self.plan.lower(np.concatenate(pending) if pending else np.empty(0, dtype=np.int64), limit)
        self.position = position
        self.lowered = _lowered_at(self.lowered, position, limit)

    @property
    def lowered_past_end(self) -> bool:
        """Whether lowered limits remain that the stream never reached."""
        return bool(self._replay)

    def count(self) -> int:
        """Number of batches left (consumes the stream)."""
        total = 0
        for chunk in self:
            total += chunk.num_batches
        return total


class EpochCursor:
    """Epochs, ranks, position and state of a loader or a planned batch sampler.

    Subclasses call :meth:`_init_cursor` once, then :meth:`_start_epoch` at the start of
    each iteration and :meth:`_step_done` after each batch handed out.
    """

    planner: Planner
    epoch: int

    def _init_cursor(
        self, planner: Planner, rank: int, world_size: int, even_batches: Any, balance: Any, epoch: int = 0
    ) -> None:
        if not isinstance(balance, bool):
            raise TypeError(f"balance must be a bool, got {balance!r}.")
        self.planner = planner
        self.rank, self.world_size = rank, world_size
        self.even_batches: EvenBatches = check_choice("even_batches", even_batches, ("pad", "drop"))  # type: ignore[assignment]
        self.balance = balance
        self.epoch = epoch
        self._history: list[Segment] = []  # the resumed epoch's earlier stretches
        self._segment = self._new_segment()  # the stretch this object runs
        self._resuming = False  # load_state_dict set a position in self.epoch
        self._finished: tuple[int, list[Segment], Segment] | None = None  # a loaded state at its epoch's end
        self._progress: list[int] | None = None  # [epoch, steps] while an epoch is iterated
        self._run: _Run | None = None  # the epoch last started: its stretches and stream
        self._fingerprint: str | None = None
        self._cache: tuple[Any, Any] | None = None
        self.assignment: StepAssignment | None = None

    def _new_segment(self) -> Segment:
        if self.world_size == 1:
            return Segment(1)
        return Segment(self.world_size, 0, self.even_batches, self.balance)

    # -- epochs -----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (the order depends only on seed and epoch).

        A position loaded for another epoch is dropped; a loaded state of an epoch whose
        every step ran makes that epoch run empty, if it is chosen again.
        """
        epoch = check_nonnegative_int("epoch", epoch)
        finished, self._finished = self._finished, None
        if finished is not None and epoch == finished[0]:
            self._history, self._segment, self._resuming = finished[1], finished[2], True
        elif self._resuming and epoch != self.epoch:
            self._resuming = False
            self._history, self._segment = [], self._new_segment()
        self.epoch = epoch

    def __len__(self) -> int:
        """Exact number of batches (steps) the next iteration yields (the rest, after a resume)."""
        if not self._resuming:
            if self.world_size == 1:
                return int(self.planner.num_batches(self.epoch))
            return self._dealt(self.epoch, (), None)[1].num_steps
        return self._remaining(self.epoch, self._history, self._segment)

    def _start_epoch(self, stats: EpochStats | None = None) -> tuple[int, Stream]:
        """Begin the next epoch: its number and this rank's stream (resumed if loaded)."""
        epoch = self.epoch
        if not self._resuming:
            self._history, self._segment = [], self._new_segment()
        self._resuming, self._finished = False, None
        self.epoch = epoch + 1
        stream = self._stream_of(epoch, self._history, self._segment)
        stream.stats = stats
        if stats is not None and self.assignment is not None and self.world_size > 1:
            stats.num_padded = self.assignment.num_padded
            stats.spread_before, stats.spread_after = self.assignment.spread_before, self.assignment.spread_after
        self._run = _Run(epoch, list(self._history), self._segment, stream)
        self._progress = [epoch, self._segment.steps]
        return epoch, stream

    def _rewind(self) -> None:
        """Count the batch last handed out as not run (it is planned again)."""
        if self._progress is not None:
            self._progress[1] -= 1

    def _pending_lowering(self) -> tuple[int, Any] | None:
        """``(position, limit)`` of a lowering asked for but not applied yet (none here)."""
        return None

    @property
    def position(self) -> tuple[int, int] | None:
        """``(epoch, steps handed out)`` while an epoch is being iterated, else ``None``.

        The steps count from the start of the stretch this object runs: after a resume from
        a state of the same world size, from the start of the epoch.
        """
        return None if self._progress is None else (self._progress[0], self._progress[1])

    @property
    def resumed_steps(self) -> int:
        """Steps of the next epoch that ran before the state it resumes from was saved."""
        return self._segment.steps if self._resuming else 0

    @property
    def start_position(self) -> tuple[int, int] | None:
        """``(epoch, steps)`` at which the epoch started last started (after a resume)."""
        return None if self._run is None else (self._run.epoch, self._run.segment.steps)

    def _copy_position(self, other: EpochCursor) -> None:
        """Give ``other`` this object's next epoch and loaded position."""
        other.epoch = self.epoch
        if self._resuming:
            other._history, other._segment, other._resuming = list(self._history), replace(self._segment), True

    def _step_done(self) -> None:
        if self._progress is not None:
            self._progress[1] += 1

    def _epoch_done(self, stats: EpochStats | None = None) -> None:
        """End the epoch; warn about the items ``stats`` reports skipped (oversize)."""
        self._progress = None
        self._history, self._segment = [], self._new_segment()
        if stats is not None and stats.num_skipped:
            warnings.warn(
                f"{stats.num_skipped} items were larger than max_total_size and were skipped in epoch "
                f"{stats.epoch}; their indices are in stats.skipped.",
                stacklevel=3,
            )

    # -- plans --------------------------------------------------------------------------------

    def _stream_of(self, epoch: int, history: list[Segment], segment: Segment) -> Stream:
        """This rank's stream of ``epoch`` after ``history``, ``segment.steps`` batches in."""
        if segment.world_size == 1:
            rest = self._left_after(epoch, history)
            plan = self.planner.chunks(epoch) if rest is None else ExplicitPlan(rest, self.planner)
            return Stream(plan, skip=segment.steps, lowered=segment.lowered)
        whole, assignment = self._dealt(epoch, history, segment)
        self.assignment = assignment
        _check_steps(segment, assignment.num_steps, epoch)
        mine = assignment.batches[segment.steps :, self.rank]
        padding = assignment.padding[segment.steps :, self.rank]
        chunk = whole.select(mine)
        padded = whole.select(mine[padding]).ids
        dropped = np.concatenate([whole.dropped, whole.select(assignment.dropped).ids])
        return Stream(ExplicitPlan(PlanChunk(chunk.ids, chunk.offsets, whole.skipped, dropped, padded), self.planner))

    def _dealt(self, epoch: int, history: Any, segment: Segment | None) -> tuple[PlanChunk, StepAssignment]:
        """The batches left after ``history``, dealt to ``segment``'s ranks (cached)."""
        segment = segment or self._new_segment()
        key = (epoch, json.dumps([s.as_dict() for s in history]), segment.dealing())
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]  # type: ignore[no-any-return]
        whole = self._left_after(epoch, list(history))
        if whole is None:
            whole = _with_spans(list(self.planner.chunks(epoch)), self.planner.order, epoch)
        assignment = self._assign(whole, segment, epoch)
        self._cache = (key, (whole, assignment))
        return whole, assignment

    def _assign(self, whole: PlanChunk, segment: Segment, epoch: int) -> StepAssignment:
        costs = self.planner.batch_costs(whole.ids, whole.offsets)
        order = self.planner.order
        return assign_steps(
            costs,
            segment.world_size,
            even_batches=segment.even_batches or "pad",
            balance=bool(segment.balance),
            seed=order.seed,
            epoch=epoch,
            # NOTE: groups that are a dataset's chunks (not rotated) are dealt in order, so each
            # rank reads each chunk about once per epoch
            spans=whole.spans,
        )

    def _left_after(self, epoch: int, history: list[Segment]) -> PlanChunk | None:
        """The global batches not run by the stretches of ``history`` (``None``: no history)."""
        left: PlanChunk | None = None
        for segment in history:
            plan = self.planner.chunks(epoch) if left is None else ExplicitPlan(left, self.planner)
            if segment.world_size == 1:
                whole = PlanChunk.concat(list(Stream(plan, lowered=segment.lowered)))
                total = whole.num_batches
                if segment.steps > total:
                    raise ValueError(
                        f"state has steps={segment.steps!r} on one rank, past the {total} batches of epoch {epoch}."
                    )
                left = whole.tail(segment.steps)
                continue
            whole = left if left is not None else _with_spans(list(plan), self.planner.order, epoch)
            assignment = self._assign(whole, segment, epoch)
            _check_steps(segment, assignment.num_steps, epoch)
            done = np.unique(assignment.batches[: segment.steps])
            left = whole.select(np.setdiff1d(np.arange(whole.num_batches, dtype=np.int64), done))
        return left

    def _remaining(self, epoch: int, history: list[Segment], segment: Segment) -> int:
        if segment.world_size > 1:
            steps = self._dealt(epoch, history, segment)[1].num_steps
        elif not history and not segment.lowered:
            steps = int(self.planner.num_batches(epoch))
        else:
            rest = self._left_after(epoch, history)
            plan = self.planner.chunks(epoch) if rest is None else ExplicitPlan(rest, self.planner)
            stream = Stream(plan, lowered=segment.lowered)
            steps = stream.count()
            if stream.lowered_past_end:
                raise ValueError(
                    f"state['lowered'] names positions past the {steps} batches of epoch {epoch}: {segment.lowered!r}."
                )
        _check_steps(segment, steps, epoch)
        return steps - segment.steps

    # -- state ----------------------------------------------------------------------------------

    def check_lowered_limit(self, limit: Any) -> Any:
        """``limit`` checked as a batch size or caps, none above the configured ones."""
        checked = self.planner.check_limit(limit)
        configured = self.planner.limit
        new_caps = checked if isinstance(checked, list) else [checked]
        old_caps = configured if isinstance(configured, list) else [configured]
        if any(new > old for new, old in zip(new_caps, old_caps)):
            raise ValueError(f"a lowered limit must not exceed the configured {configured!r}, got {limit!r}.")
        return checked

    def fingerprint(self) -> str:
        """Digest of the plan's inputs (see :func:`plan_fingerprint`), computed once."""
        if self._fingerprint is None:
            self._fingerprint = plan_fingerprint(self.planner)
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: a few numbers; resume with :meth:`load_state_dict`.

        Mid-epoch it names the epoch, the steps handed out and the stretches of the epoch
        run before with other world sizes; between epochs, the next epoch and 0 steps. The
        state is the same on every rank and plain JSON.
        """
        if self._progress is not None:
            return self._state(self._progress[0], self._progress[1])
        if self._resuming:
            return self._state(self.epoch, self._segment.steps)
        return self._state(self.epoch, 0)

    def _state(self, epoch: int, steps: int) -> dict[str, Any]:
        """The state of ``epoch`` after ``steps`` steps of its current stretch."""
        run = self._run
        if run is not None and run.epoch == epoch and not self._resuming:
            lowered = list(run.stream.lowered)
            pending = self._pending_lowering()
            if pending is not None:  # applied before the next batch: where a resume replays it
                steps = pending[0]
                lowered = _lowered_at(lowered, *pending)
            history, segment = run.history, replace(run.segment, lowered=lowered)
        elif self._resuming and epoch == self.epoch:
            history, segment = self._history, self._segment
        else:
            history, segment = [], self._new_segment()
        current = replace(segment, steps=steps)
        return {
            "format": STATE_FORMAT,
            "seed": self.planner.order.seed,
            "epoch": int(epoch),
            **current.as_dict(),
            "history": [s.as_dict() for s in history],
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches not yet run.

        The state may come from a job with another world size or other dealing options: the
        rest of the epoch is dealt to this job's ranks.

        Raises:
            TypeError: If ``state`` or one of its values has the wrong type.
            ValueError: If it is not a fastsab epoch state, was saved with another seed,
                dataset or batching configuration, or names steps past the end of its epoch.
        """
        epoch, segments = self._parse(state)
        history, current = segments[:-1], segments[-1]
        resuming = bool(history) or current.steps > 0 or bool(current.lowered)
        remaining = self._remaining(epoch, history, current) if resuming else None  # raises past the end
        self._finished = None
        if remaining == 0 and current.steps > 0:
            # NOTE: an epoch whose every step ran (saved before the loop saw its end) is the
            # start of the next one, as a trainer that goes on to set_epoch(epoch + 1) expects;
            # a trainer that sets the saved epoch again gets it empty, not run a second time
            self._finished = (epoch, history, current)
            epoch, history, current, resuming = epoch + 1, [], self._new_segment(), False
        elif current.dealing() != self._new_segment().dealing():  # other ranks: deal the rest anew
            # (the rest may give these ranks no step: the epoch then runs empty and reports
            # what it drops)
            if current.steps or current.lowered:
                history = [*history, current]
            current = self._new_segment()
        self.epoch = epoch
        self._progress = None
        self._history, self._segment = history, current
        self._resuming = resuming

    def _parse(self, state: Any) -> tuple[int, list[Segment]]:
        """The epoch and its stretches (the last one is where the state was taken)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}.")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"state is not a fastsab epoch state of this version (format {state.get('format')!r}, "
                f"expected {STATE_FORMAT!r})."
            )
        for key in ("seed", "epoch", "history", "fingerprint"):
            if key not in state:
                raise ValueError(f"state has no {key!r} entry; pass a dict made by state_dict().")
        seed = self.planner.order.seed
        if _state_int("seed", state["seed"]) != seed:
            raise ValueError(f"state was saved with seed {state['seed']!r}, but this object has seed {seed!r}.")
        if state["fingerprint"] != self.fingerprint():
            raise ValueError(
                "state was saved for another dataset, sizes or batching configuration "
                f"(fingerprint {state['fingerprint']!r}, this object's is {self.fingerprint()!r})."
            )
        epoch = _state_int("epoch", state["epoch"])
        if epoch >= 2**63:
            raise ValueError(f"state['epoch'] must be below 2**63, got {epoch!r}.")
        if not isinstance(state["history"], list):
            raise TypeError(f"state['history'] must be a list, got {state['history']!r}.")
        return epoch, [self._parse_segment(s) for s in [*state["history"], state]]

    def _parse_segment(self, raw: Any) -> Segment:
        if not isinstance(raw, dict):
            raise TypeError(f"each of state['history'] must be a dict, got {raw!r}.")
        for key in ("world_size", "steps", "even_batches", "balance", "lowered"):
            if key not in raw:
                raise ValueError(f"state has no {key!r} entry; pass a dict made by state_dict().")
        world = _state_int("world_size", raw["world_size"])
        if not 1 <= world <= MAX_WORLD_SIZE:
            raise ValueError(f"state has world_size={world!r}; it must be from 1 to {MAX_WORLD_SIZE}.")
        steps = _state_int("steps", raw["steps"])
        if world == 1:
            even, balance = None, None
        else:
            even = check_choice("state['even_batches']", raw["even_batches"], ("pad", "drop"))
            balance = raw["balance"]
            if not isinstance(balance, bool):
                raise TypeError(f"state['balance'] must be a bool, got {balance!r}.")
        lowered = raw["lowered"]
        if not isinstance(lowered, list) or (lowered and world != 1):
            raise ValueError(f"state['lowered'] must be a list (empty for several ranks), got {lowered!r}.")
        entries: list[tuple[int, Any]] = []
        for entry in lowered:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError(f"each of state['lowered'] must be [position, limit], got {entry!r}.")
            position = _state_int("lowered position", entry[0])
            if entries and position <= entries[-1][0]:
                raise ValueError(f"state['lowered'] positions must increase, got {lowered!r}.")
            try:
                limit = self.check_lowered_limit(entry[1])
            except (TypeError, ValueError) as error:
                raise type(error)(f"state['lowered'] has a bad limit {entry[1]!r}: {error}") from None
            entries.append((position, limit))
        return Segment(world, steps, even, balance, entries)  # type: ignore[arg-type]


def _lowered_at(lowered: list[tuple[int, Any]], position: int, limit: Any) -> list[tuple[int, Any]]:
    """The record ``lowered`` with ``limit`` from ``position`` on (replacing later entries)."""
    return [(at, old) for at, old in lowered if at < position] + [(position, limit)]


def _check_steps(segment: Segment, steps: int, epoch: int) -> None:
    if segment.steps > steps:
        ranks = f"{segment.world_size} rank" + ("s" if segment.world_size > 1 else "")
        raise ValueError(f"state has steps={segment.steps!r}, past the {steps} steps of epoch {epoch} on {ranks}.")


def _state_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        kind = "a number that is not an integer" if isinstance(value, Real) else type(value).__name__
        raise TypeError(f"state[{name!r}] must be an integer, got {value!r} ({kind}).")
    if value < 0:
        raise ValueError(f"state[{name!r}] must be a non-negative integer, got {value!r}.")
    return int(value)


def _with_spans(chunks: list[PlanChunk], order: EpochOrder, epoch: int) -> PlanChunk:
    """The chunks as one; with unrotated groups, each batch labelled with the groups it spans.

    A label is a group's place in the epoch's order of groups: for each batch, the places of
    its first and of its last item's group.
    """
    whole = PlanChunk.concat(chunks)
    if order.rotate or not whole.num_batches:
        return whole
    place = np.empty(order.permutation.num_groups, dtype=np.int64)
    place[order.group_order(epoch)] = np.arange(len(place))
    ends = np.stack([whole.ids[whole.offsets[:-1]], whole.ids[whole.offsets[1:] - 1]], axis=1)
    return replace(whole, spans=place[ends // order.group_size])
