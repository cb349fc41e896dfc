"""Loaders that survive out-of-memory errors: ``run`` over a ``LowersLimit``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import numpy as np
import torch  # noqa: F401  # NOTE: used by the examples of the docstrings (their namespace is this module's)

from fastsab._checks import short_repr
from fastsab.adaptive.oom import is_out_of_memory
from fastsab.adaptive.retry import AdaptiveOOMError, _check_factor, free_memory
from fastsab.loaders.options import Limit
from fastsab.plan.plans import PlanChunk
from fastsab.position.stats import EpochStats

__all__ = ["LowersLimit", "run"]

B = TypeVar("B")
B_co = TypeVar("B_co", covariant=True)
R = TypeVar("R")


class LowersLimit(Protocol[B_co]):
    """What ``run`` needs of a loader: batches with their indices, and a limit it can lower.

    ``FastLoader`` and ``FastSizeAwareLoader`` implement it; the
    limit is a batch size or the caps of the cost columns (``fastsab.loaders.options.Limit``).
    """

    @property
    def world_size(self) -> int:
        """The number of ranks that share each epoch."""
        ...

    @property
    def stats(self) -> EpochStats | None:
        """The epoch being iterated (``num_splits`` counts the batches split)."""
        ...

    def iter_with_indices(self) -> Iterator[tuple[np.ndarray, B_co]]:
        """The next epoch as ``(indices, batch)`` pairs."""
        ...

    def fetch(self, indices: np.ndarray) -> B_co:
        """The batch of ``indices``, made like the loader's own batches."""
        ...

    def smaller_limit(self, indices: np.ndarray, factor: float) -> Limit:
        """The limit under which the batch ``indices`` splits into about ``factor`` parts."""
        ...

    def split_indices(self, indices: np.ndarray, limit: Limit) -> Sequence[np.ndarray]:
        """``indices`` split in order into batches within ``limit``."""
        ...

    def retry_last_batch(self, limit: Limit) -> None:
        """Plan the batch last yielded again, with the rest of the epoch, under ``limit``."""
        ...

    parts_left: int
    """Parts of the loader's current step still to run after the one being run (0: none)."""


def run(loader: LowersLimit[B], step: Callable[[B], R], *, factor: float = 2) -> Iterator[R]:
    """Call ``step(batch)`` on every batch of the loader's next epoch, surviving OOM.

    When ``step`` runs out of memory on a batch, memory is freed and the loader plans that
    batch again, with the rest of the epoch, under a limit ``factor`` times below the
    batch's cost (its rows for ``FastLoader`` and shape buckets, so that a short last batch
    splits too): the batch's parts come next
    (split again if they fail too) and the lower limit holds for the rest of the epoch
    (``loader.stats.limit_changes``, ``retry_last_batch``). Every
    sample is processed exactly once, and a state saved between results resumes exactly; a
    single sample that does not fit raises ``AdaptiveOOMError``.

    Under data parallelism (``world_size > 1``) the limit is kept, so that every rank still
    runs the same number of loader steps: a failing batch is split and its parts run within
    the step. So is a batch that costs nothing, which no smaller limit splits: it is halved
    by count. While ``step`` runs a part, ``loader.parts_left`` says how many parts of the
    step come after it (0 for the last part, and for every batch that is not split): a step
    accumulates the parts' gradients and updates the model when it is 0 (under
    ``DistributedDataParallel``, ``backward`` within ``model.no_sync()`` while it is not).
    Under ranks a state saved between the parts of a step resumes at the start of that step,
    as the model saved with it has not been updated by the step's first parts (a warning says
    so). On one process only a batch that costs nothing is split within its step, and a state
    between its parts is refused (``RuntimeError``): none resumes exactly there. The loader's
    ``stats.num_batches`` counts its steps: each part of a batch planned again, a step split
    within it once.

    Args:
        loader: A ``FastLoader`` or ``FastSizeAwareLoader``
            (any ``LowersLimit``).
        step: The work on one batch, e.g. a training step; its results are yielded.
        factor: How much smaller the limit gets after each out-of-memory error (> 1).

    Returns:
        An iterator of what ``step`` returns, batch after batch (split batches give one result
        per part).

    Raises:
        TypeError: If ``loader`` is not a fastsab loader (a list, a ``DataLoader``) or ``step``
            is not callable (raised at the call, before any batch).
        ValueError: If ``factor`` is not above 1.

    Examples:
        >>> from fastsab import FastLoader
        >>> def step(batch):
        ...     if len(batch) > 3:
        ...         raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        ...     return batch.tolist()
        >>> loader = FastLoader(torch.arange(10), batch_size=8, shuffle=False)
        >>> list(run(loader, step))  # 8 fails, then 4: the rest of the epoch uses batches of 2
        [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        >>> loader.stats.limit_changes, loader.stats.num_splits
        ([(0, 8, 4), (0, 4, 2)], 2)
    """
    # NOTE: checked now, not at the first batch: run() returns the generator below
    missing = [name for name in ("iter_with_indices", "fetch", "smaller_limit") if not hasattr(loader, name)]
    if missing:
        raise TypeError(
            f"loader must be a fastsab.FastLoader or fastsab.FastSizeAwareLoader (it lowers its own batch limit "
            f"when a step runs out of memory), got {short_repr(loader)} of type {type(loader).__name__}, which has "
            f"no {missing[0]}(). Wrap the data in a loader first, e.g. run(FastLoader(data, batch_size=64), step)."
        )
    if not callable(step):
        raise TypeError(
            f"step must be a callable taking a batch, got {short_repr(step)} of type {type(step).__name__}."
        )
    return _run(loader, step, _check_factor(factor))


def _run(loader: LowersLimit[B], step: Callable[[B], R], factor: float) -> Iterator[R]:
    """The generator ``run`` returns (its arguments checked)."""
    for indices, first in loader.iter_with_indices():
        # NOTE: the parts of a split batch are fetched when their turn comes (None until then)
        pending: list[tuple[np.ndarray, B | None]] = [(indices, first)]
        del first
        while pending:
            ids, fetched = pending.pop()
            batch = loader.fetch(ids) if fetched is None else fetched
            del fetched
            loader.parts_left = len(pending)
            try:
                result = step(batch)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                del batch
                free_memory(error)
                if len(ids) == 1:
                    raise AdaptiveOOMError(f"step on the sample {int(ids[0])}", [1], 1, error) from None
                limit = loader.smaller_limit(ids, factor)
                parts = list(loader.split_indices(ids, limit))
                _count_split(loader.stats)
                # NOTE: a batch is made smaller by more parts, or by a smaller one (a shape bucket's
                # last batch, filled to a smaller batch size)
                smaller = len(parts) > 1 or len(parts[0]) < len(ids)
                if loader.world_size == 1 and smaller and ids is indices:
                    # NOTE: the loader plans the batch again under the smaller limit, so its
                    # parts come next as the loader's own batches and a state taken between
                    # them resumes exactly
                    loader.retry_last_batch(limit)
                    break
                # NOTE: under data parallelism the limit stays (a rank that planned more steps
                # than the others would hang the job), and a batch the limit cannot split
                # (it costs nothing) is halved by count: its parts run within the loader's step.
                # Halves of its items, each once: a filler row (a repeat) would count as real in a half
                if not smaller:
                    items = PlanChunk(ids, np.array([0, len(ids)], dtype=np.int64)).distinct_ids()
                    parts = [items[: len(items) // 2], items[len(items) // 2 :]] if len(items) > 1 else [items]
                pending.extend((part, None) for part in reversed(parts))
                continue
            del batch
            yield result


def _count_split(stats: EpochStats | None) -> None:
    if stats is not None:  # (set by the loader's iteration, which is running)
        stats.num_splits += 1
