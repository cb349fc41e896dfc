"""Resuming an epoch where it stopped, from a state of a few numbers.

A loader's (or planned sampler's) state is ``(seed, epoch, steps done, world size, and a
fingerprint of the plan's inputs)``. The plan is recomputed from the seed and epoch, never
replayed item by item, and the first ``steps`` batches are left out; a state saved with
another world size continues the same global plan (see
:class:`~fastsab.distributed.ShardedPlanner`). A state whose seed or fingerprint differs
from this object's is refused.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from fastsab._checks import check_nonnegative_int
from fastsab.distributed import ShardedPlanner
from fastsab.epochs import FixedSizePlanner, SizeAwarePlanner, _ArrayCosts

__all__ = ["Resumable", "plan_fingerprint"]

STATE_FORMAT = "fastsab.epoch-state/1"


def plan_fingerprint(planner: FixedSizePlanner | SizeAwarePlanner) -> str:
    """A short digest of what determines a planner's batches (besides seed and epoch).

    It covers the number of items, the order options and the batching limits, and the
    sizes: all of them for an array of sizes, else the sizes of up to 4096 evenly spread
    items (a callable's sizes are not all computed just to fingerprint them).
    """
    order = planner.order
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr((type(planner).__name__, order.n, order.shuffle, order.group_size)).encode())
    if isinstance(planner, FixedSizePlanner):
        digest.update(repr((planner.batch_size, planner.drop_last)).encode())
    else:
        digest.update(repr((planner.limit, sorted(planner.options.items()), planner.oversize)).encode())
        if isinstance(planner.costs, _ArrayCosts):
            digest.update(np.ascontiguousarray(planner.costs.sizes).tobytes())
        elif order.n:
            sample = np.unique(np.linspace(0, order.n - 1, min(order.n, 4096)).astype(np.int64))
            digest.update(np.ascontiguousarray(planner.costs(sample)).tobytes())
    return digest.hexdigest()


class Resumable:
    """Epoch bookkeeping shared by the loaders and the planned batch sampler.

    Subclasses set ``self.sharded`` (a :class:`ShardedPlanner`) and call
    :meth:`_start_epoch` / :meth:`_step_done` / :meth:`_epoch_done` while iterating.
    """

    sharded: ShardedPlanner
    epoch: int
    _progress: list[int] | None
    _resume: tuple[int, int, int] | None

    def _init_progress(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self._progress = None  # [epoch, steps done] while an epoch is being iterated
        self._resume = None  # (epoch, steps, world size) from load_state_dict
        self._fingerprint: str | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (the order depends only on seed and epoch)."""
        self.epoch = check_nonnegative_int("epoch", epoch)

    def __len__(self) -> int:
        """Exact number of batches (steps) of the next epoch."""
        return self.sharded.num_batches(self.epoch)

    def _start_epoch(self) -> tuple[int, Any]:
        """Begin the next epoch: its number and this rank's plan chunks (resumed if loaded)."""
        epoch = self.epoch
        self.epoch = epoch + 1
        skip, saved_world = 0, None
        if self._resume is not None and self._resume[0] == epoch:
            _, skip, saved_world = self._resume
        self._resume = None
        self._progress = [epoch, skip]
        return epoch, self.sharded.chunks(epoch, skip, saved_world)

    @property
    def position(self) -> tuple[int, int] | None:
        """``(epoch, steps yielded)`` while an epoch is being iterated, else ``None``."""
        return None if self._progress is None else (self._progress[0], self._progress[1])

    def _step_done(self) -> None:
        if self._progress is not None:
            self._progress[1] += 1

    def _epoch_done(self) -> None:
        self._progress = None

    def fingerprint(self) -> str:
        """Digest of the plan's inputs (see :func:`plan_fingerprint`), computed once."""
        if self._fingerprint is None:
            self._fingerprint = plan_fingerprint(self.sharded.planner)
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: O(1) in size; resume with :meth:`load_state_dict`.

        Mid-epoch it names the epoch and the steps already yielded; between epochs, the
        next epoch and 0 steps.
        """
        epoch, steps = self._progress if self._progress is not None else (self.epoch, 0)
        if self._progress is None and self._resume is not None:
            epoch, steps = self._resume[0], self._resume[1]
        return {
            "format": STATE_FORMAT,
            "seed": self.sharded.planner.order.seed,
            "epoch": int(epoch),
            "steps": int(steps),
            "world_size": self.sharded.world_size,
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches not yet run.

        Raises:
            TypeError: If ``state`` is not a dict.
            ValueError: If it is not a fastsab epoch state, or was saved with another seed,
                dataset or batching configuration.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}.")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state is not a fastsab epoch state (format {state.get('format')!r}).")
        seed = self.sharded.planner.order.seed
        if state["seed"] != seed:
            raise ValueError(f"state was saved with seed {state['seed']!r}, but this object has seed {seed!r}.")
        if state["fingerprint"] != self.fingerprint():
            raise ValueError(
                "state was saved for another dataset, sizes or batching configuration "
                f"(fingerprint {state['fingerprint']!r}, this object's is {self.fingerprint()!r})."
            )
        epoch = check_nonnegative_int("epoch", state["epoch"])
        steps, world = int(state["steps"]), int(state["world_size"])
        if steps < 0 or world < 1:
            raise ValueError(f"state has steps={steps!r} and world_size={world!r}; both must be valid counts.")
        self.epoch = epoch
        self._progress = None
        self._resume = (epoch, steps, world) if steps else None
