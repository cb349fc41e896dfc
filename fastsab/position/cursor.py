"""Where an epoch stands: epoch, this rank's share, steps done, ``len()`` and resuming.

An ``EpochCursor`` is what the loaders and the planned batch sampler share. It turns
``(seed, epoch)`` into this rank's ``Stream`` of plan chunks and keeps the position in it, so
that ``state_dict`` is a few numbers and ``load_state_dict`` continues with exactly the
batches not run yet.

A state records the epoch's *history* as segments (``fastsab.position.epoch_state``): each is a
stretch of steps run with one world size (and the dealing options and lowered limits of that
stretch), and where the plan is taken up again (``ResumePoint``). A resume on the same ranks
plans the epoch from that point on (``fastsab.position.resumed``); otherwise ``EpochShares``
plans it again from the seed and applies each segment in turn, so a state saved by a job of
another world size or other dealing options resumes exactly. A state whose seed or plan
fingerprint (``fastsab.position.fingerprint``: dataset length, sizes, configured limits)
differs from this object's is refused.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from fastsab._checks import check_choice, check_nonnegative_int, user_stacklevel
from fastsab.plan.bucket_planner import BucketPlanner
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.position.batch_count import KnownBatches, counted
from fastsab.position.distributed import EvenBatches
from fastsab.position.epoch_state import STATE_FORMAT, Limit, ResumePoint, Segment, lowered_at, parse_state
from fastsab.position.fingerprint import _plain, older_fingerprints, plan_identity
from fastsab.position.resumed import epoch_stream, loaded_point, saved_point, steps_left
from fastsab.position.shares import EpochShares, Planner
from fastsab.position.stats import EpochStats
from fastsab.position.stream import Stream

__all__ = ["STATE_FORMAT", "EpochCursor", "Segment", "Stream"]


@dataclass(frozen=True)
class _Run:
    """An epoch as it was started: its number, earlier stretches, this stretch and its stream."""

    epoch: int
    history: list[Segment]
    segment: Segment
    stream: Stream

    def __getstate__(self) -> dict[str, Any]:
        """The run with its stream's record (skipped batches, lowerings) but not its plan.

        A copy (``pickle``, ``copy.deepcopy``) of a cursor keeps where the epoch stands, not
        the iteration itself: the plan is a generator, which does not pickle. The copy's next
        iteration starts an epoch of its own, as the original's does.
        """
        state = self.__dict__.copy()
        state["stream"] = self.stream.copied()
        return state


class EpochCursor:
    """Epochs, ranks, position and state of a loader or a planned batch sampler.

    Subclasses call ``_init_cursor`` once, then ``_start_epoch`` at the start of
    each iteration and ``_step_done`` after each batch handed out.
    """

    planner: Planner
    epoch: int
    """The epoch the next iteration runs (with ``shuffle``, its order). ``set_epoch`` and ``load_state_dict``
    set it; ``state_dict()`` saves the epoch being iterated. In one process an iteration moves it on as it
    starts, so a loop left early goes on with the next epoch. Under ranks only an epoch's end moves it on: an
    iteration left early (a peek) is started again, at the same epoch and position."""

    def _init_cursor(
        self, planner: Planner, rank: int, world_size: int, even_batches: Any, balance: Any, epoch: int = 0
    ) -> None:
        if not isinstance(balance, bool):
            raise TypeError(f"balance must be a bool, got {balance!r}.")
        self.planner = planner
        self.rank, self.world_size = rank, world_size
        self.even_batches: EvenBatches = check_choice("even_batches", even_batches, ("pad", "drop"))  # type: ignore[assignment]
        self.balance: bool = balance
        self.epoch = epoch
        self._history: list[Segment] = []  # the resumed epoch's earlier stretches
        self._segment = self._new_segment()  # the stretch this object runs
        self._resuming = False  # load_state_dict set a position in self.epoch
        self._point: ResumePoint | None = None  # where the loaded position's plan is taken up (else replayed)
        self._finished: tuple[int, list[Segment], Segment] | None = None  # a loaded state at its epoch's end
        self._progress: list[int] | None = None  # [epoch, steps] while an epoch is iterated
        self._run: _Run | None = None  # the epoch last started: its stretches and stream
        self._advance = False  # under ranks: the end of the epoch last started sets the next one
        self._left = False  # the iteration last started was left before its end (a peek, a break)
        self._identity: tuple[str, dict[str, Any]] | None = None  # the plan's fingerprint and settings
        self._batches = KnownBatches(planner)  # an epoch's global batches, once counted or loaded
        self._shares = EpochShares(planner, rank)

    def _new_segment(self) -> Segment:
        if self.world_size == 1:
            return Segment(1)
        return Segment(self.world_size, 0, self.even_batches, self.balance)

    # -- epochs -----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (the order depends only on seed and epoch).

        A position loaded for another epoch is dropped, and so is that of an iteration left
        before its end (a peek, a loop left mid-epoch): ``state_dict`` then names the
        chosen epoch, where the next iteration starts. A loaded state of an epoch whose every
        step ran makes that epoch run empty, if it is chosen again. Without it, the
        next iteration runs the epoch after the last one started (one process) or after the
        last one run to its end (several ranks: see ``_start_epoch``).
        """
        epoch = check_nonnegative_int("epoch", epoch)
        self._advance = False
        if self._left:
            # NOTE: the left iteration's position is not where the next one starts: the state,
            # as len(), names the epoch chosen (at its loaded position, if it is the loaded one)
            self._left, self._progress, self._run = False, None, None
        finished, self._finished = self._finished, None
        if finished is not None and epoch == finished[0]:
            self._history, self._segment, self._resuming = finished[1], finished[2], True
        elif self._resuming and epoch != self.epoch:
            self._resuming = False
            self._history, self._segment = [], self._new_segment()
        self.epoch = epoch

    def __len__(self) -> int:
        """Exact number of steps of the next epoch, as a trainer counts them.

        After ``load_state_dict`` it is the whole epoch's: the steps run before the state
        was saved (over every earlier stretch, whatever its world size) plus the steps left,
        while the iteration yields only the steps left. Trainers (Lightning, torch's
        ``StatefulDataLoader``) restore their step counter and stop the epoch at ``len()``.
        An epoch's batches are counted once; a state that carries them (``"batches"``) spares
        the count where the steps left follow from them (``fastsab.position.batch_count``).
        """
        if self._resuming:
            batches = self._batches.get(self.epoch, count=not (self._history or self._segment.lowered))
            return self.resumed_steps + self._shares.remaining(self.epoch, self._history, self._segment, batches)
        return self.epoch_steps(self.epoch)

    def epoch_steps(self, epoch: int) -> int:
        """Steps of the whole of ``epoch`` run by this object's ranks, wherever the iteration stands.

        Every rank runs as many. Size-aware epochs may differ in their number of steps; a trainer
        that counts its epochs from the global step reads each epoch's here.

        Raises:
            ValueError: If ``epoch`` is negative.
        """
        epoch = check_nonnegative_int("epoch", epoch)
        return self._shares.remaining(epoch, [], self._new_segment(), self._batches.get(epoch, count=True))

    def _start_epoch(self, stats: EpochStats | None = None) -> tuple[int, Stream]:
        """Begin the next epoch: its number and this rank's stream (resumed if loaded).

        In one process the epoch after it is the next one. Under ranks (``world_size > 1``)
        an epoch is the next one until it runs to its end: an iteration left before (a peek,
        ``next(iter(loader))``) is started again, at the same epoch and loaded position, by
        the next iteration unless ``set_epoch`` chose another.
        """
        epoch = self.epoch
        point = self._point if self._resuming else None
        if not self._resuming:
            self._history, self._segment = [], self._new_segment()
        if self.world_size == 1:
            self._resuming, self._finished = False, None
            self.epoch = epoch + 1
        else:
            # NOTE: counting iterations would let a rank that iterates once more than the others
            # (a peek) run another epoch's share from then on, silently losing and repeating
            # samples; the end of an epoch is reached by every rank alike (equal steps)
            self._advance = True
        self._left = False
        count = counted(epoch, self._batches.get(epoch), self._history, self._segment)
        stream, dealt = epoch_stream(self._shares, epoch, self._history, self._segment, point, count)
        stream.stats = stats
        if stats is not None:
            # NOTE: the chunks a rank is dealt, and those planned again from a list of batches, come
            # without the planner's figures: measured from their ids (costs read once more)
            figures = getattr(self.planner, "figures", None)
            stats.measure = None if figures is None else figures.of
        if dealt is not None:  # reports its padding and spreads as it deals
            dealt.stats = stats
        self._run = _Run(epoch, list(self._history), self._segment, stream)
        self._progress = [epoch, self._segment.steps]
        return epoch, stream

    def start_limit(self) -> Limit:
        """The limit in force where the epoch last started: the configured one, or the last lowered before."""
        limit: Limit = self.planner.limit
        run = self._run
        if run is None:
            return limit
        for segment in run.history:  # lowered in earlier stretches, then before the resumed position
            if segment.lowered:
                limit = segment.lowered[-1][1]
        for position, lowered in run.stream.lowered:
            if position <= run.stream.skip:
                limit = lowered
        return limit

    def _rewind(self) -> None:
        """Count the batch last handed out as not run (it is planned again)."""
        if self._progress is not None:
            self._progress[1] -= 1

    def _pending_lowering(self) -> tuple[int, Limit] | None:
        """``(position, limit)`` of a lowering asked for but not applied yet (none here)."""
        return None

    def _step_open(self) -> bool:
        """Whether the step last handed out still has parts to run (none here)."""
        return False

    @property
    def position(self) -> tuple[int, int] | None:
        """``(epoch, steps handed out)`` while an epoch is being iterated, else ``None``.

        The steps count from the start of the stretch this object runs: after a resume from
        a state of the same world size, from the start of the epoch.
        """
        return None if self._progress is None else (self._progress[0], self._progress[1])

    @property
    def resumed_steps(self) -> int:
        """Steps of the next epoch that ran before the state it resumes from was saved (else 0).

        Counted over every stretch of the epoch, whatever its world size: each stretch's steps
        are steps of every rank, so they add up as a trainer's step counter does.
        """
        if not self._resuming:
            return 0
        return sum(segment.steps for segment in self._history) + self._segment.steps

    @property
    def finished_steps(self) -> int:
        """Steps of an epoch whose state was loaded at its end, until the next epoch starts (else 0)."""
        if self._finished is None:
            return 0
        _, history, current = self._finished
        return sum(segment.steps for segment in history) + current.steps

    @property
    def start_position(self) -> tuple[int, int] | None:
        """``(epoch, steps)`` at which the epoch started last started (after a resume)."""
        return None if self._run is None else (self._run.epoch, self._run.segment.steps)

    def _copy_position(self, other: EpochCursor) -> None:
        """Give ``other`` this object's next epoch and loaded position."""
        other.epoch, other._batches.known = self.epoch, self._batches.known
        if self._resuming:
            other._history, other._segment, other._resuming = list(self._history), replace(self._segment), True
            other._point = self._point

    def _iteration_left(self) -> None:
        """The iteration last started was left before its end (a peek, a break, a consumer that stopped)."""
        self._left = True

    def _step_done(self) -> None:
        if self._progress is not None:
            self._progress[1] += 1

    def _epoch_done(self, stats: EpochStats | None = None) -> None:
        """End the epoch; warn about the items ``stats`` reports skipped (oversize)."""
        self._progress = None
        if self._advance and self._run is not None:  # under ranks: no epoch chosen since it started
            self._advance, self._resuming, self._finished = False, False, None
            self.epoch = self._run.epoch + 1
        if not self._resuming:
            self._history, self._segment = [], self._new_segment()
        # (only a size-aware plan skips items)
        if stats is not None and stats.num_skipped and isinstance(self.planner, (SizeAwarePlanner, BucketPlanner)):
            warnings.warn(self.planner.skipped_warning(stats.skipped, stats.epoch), stacklevel=user_stacklevel())

    # -- state ----------------------------------------------------------------------------------

    def check_lowered_limit(self, limit: Any) -> Limit:
        """``limit`` checked as a batch size or caps, none above the configured ones."""
        checked: Limit = self.planner.check_lowered_limit(limit)
        return checked

    def fingerprint(self) -> str:
        """Digest of the plan's inputs (see ``plan_fingerprint``), computed once."""
        return self._plan_identity()[0]

    def _plan_identity(self) -> tuple[str, dict[str, Any]]:
        """The plan's fingerprint and settings (see ``plan_identity``), computed once."""
        if self._identity is None:
            self._identity = plan_identity(self.planner)
        return self._identity

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: a few numbers; resume with ``load_state_dict``.

        Mid-epoch it names the epoch, the steps handed out and the stretches of the epoch
        run before with other world sizes; between epochs, the next epoch and 0 steps. The
        state is the same on every rank and plain JSON.
        """
        if self._progress is not None:
            return self._state(self._progress[0], self._progress[1])
        if self._resuming:
            return self._state(self.epoch, self._segment.steps)
        return self._state(self.epoch, 0)

    def consumed_state(self, consumed: tuple[int, int] | None) -> dict[str, Any]:
        """The state counted where the batches are consumed rather than handed out.

        Args:
            consumed: ``(epoch, steps)`` a consumer (a training loop behind worker processes or
                a trainer that fetches ahead) received of the epoch it iterates, or ``None``
                when it iterates none: then the state is ``state_dict``.
        """
        # (after set_epoch dropped a left iteration, what it consumed is no longer the position)
        return self.state_dict() if consumed is None or self._run is None else self._state(*consumed)

    def _state(self, epoch: int, steps: int) -> dict[str, Any]:
        """The state of ``epoch`` after ``steps`` steps of its current stretch."""
        run = self._run
        point: ResumePoint | None = None
        # NOTE: under ranks the epoch being run keeps its loaded position (_resuming) until its end
        if run is not None and run.epoch == epoch and (self._advance or not self._resuming):
            lowered = list(run.stream.lowered)
            if self._step_open() and self._progress is not None:
                # NOTE: the parts of a split step run within it: the state resumes at its start
                steps = min(steps, self._progress[1] - 1)
            pending = self._pending_lowering()
            if pending is not None:  # applied before the next batch: where a resume replays it
                # NOTE: a retried batch is not done, whoever counted it
                steps = min(steps, pending[0])
                lowered = lowered_at(lowered, *pending)
            history, segment = run.history, replace(run.segment, lowered=lowered)
            point = None if history or lowered else saved_point(run.stream, self.planner, steps)
        elif self._resuming and epoch == self.epoch:
            history, segment, point = self._history, self._segment, self._point
        else:
            history, segment = [], self._new_segment()
        current = replace(segment, steps=steps)
        state = {
            "format": STATE_FORMAT,
            "seed": self.planner.order.seed,
            "epoch": int(epoch),
            **current.as_dict(),
            "history": [s.as_dict() for s in history],
            "fingerprint": self.fingerprint(),
            "plan": self._plan_identity()[1],
        }
        if point is not None:
            state["resume"] = point.as_dict()
        state |= self.planner.order.state_entry(epoch, None if point is None else point.item)  # (a mixture's)
        state |= self._batches.entry(epoch, [*history, current])  # (a lowered limit: another count)
        return _plain(state)  # type: ignore[no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches not yet run.

        The state may come from a job with another world size or other dealing options: the
        rest of the epoch is dealt to this job's ranks. On the ranks and dealing it was saved
        with, the epoch is planned from the state's resume point, through the next step here.

        Raises:
            TypeError: If ``state`` or one of its values has the wrong type.
            ValueError: If it is not a fastsab epoch state, was saved with another seed,
                dataset or batching configuration, or names steps past the end of its epoch.
        """
        fingerprint, plan = self._plan_identity()
        epoch, segments = parse_state(
            state,
            seed=self.planner.order.seed,
            fingerprint=fingerprint,
            check_limit=self.check_lowered_limit,
            plan=plan,
            older=lambda: older_fingerprints(self.planner),
        )
        self.planner.order.load_entry(epoch, state.get("mixture"), self.planner)  # (a mixture's rule takes it up)
        history, current = segments[:-1], segments[-1]
        resuming = bool(history) or current.steps > 0 or bool(current.lowered)
        point = loaded_point(self._shares, state, history, current, self._new_segment())
        batches = self._batches.load(epoch, state)  # (steps past the end are refused by steps_left)
        remaining = steps_left(self._shares, epoch, history, current, point, batches) if resuming else None
        self._finished = None
        if remaining == 0 and current.steps > 0:
            # NOTE: an epoch whose every step ran (saved before the loop saw its end) is the
            # start of the next one, as a trainer that goes on to set_epoch(epoch + 1) expects;
            # a trainer that sets the saved epoch again gets it empty, not run a second time
            self._finished = (epoch, history, current)
            epoch, history, current, resuming, point = epoch + 1, [], self._new_segment(), False, None
        elif current.dealing() != self._new_segment().dealing():  # other ranks: deal the rest anew
            # (the rest may give these ranks no step: the epoch then runs empty and reports
            # what it drops)
            if current.steps or current.lowered:
                history = [*history, current]
            current = self._new_segment()
        self.epoch = epoch
        self._progress = None
        self._advance = False
        self._history, self._segment = history, current
        self._resuming, self._point = resuming, point
