"""Loaders that survive out-of-memory errors: :func:`run`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch  # noqa: F401  # NOTE: used by the examples of the docstrings (their namespace is this module's)

from fastsab.adaptive.retry import AdaptiveOOMError, _check_factor, free_memory
from fastsab.oom import is_out_of_memory


def run(loader: Any, step: Callable[[Any], Any], *, factor: float = 2) -> Iterator[Any]:
    """Call ``step(batch)`` on every batch of the loader's next epoch, surviving OOM.

    When ``step`` runs out of memory on a batch, memory is freed and the loader plans that
    batch again, with the rest of the epoch, under a limit ``factor`` times below the
    batch's cost (its size for :class:`~fastsab.FastLoader`): the batch's parts come next
    (split again if they fail too) and the lower limit holds for the rest of the epoch
    (``loader.stats.limit_changes``, :meth:`~fastsab.FastLoader.retry_last_batch`). Every
    sample is processed exactly once, and a state saved between results resumes exactly; a
    single sample that does not fit raises :class:`AdaptiveOOMError`.

    Under data parallelism (``world_size > 1``) the limit is kept, so that every rank still
    runs the same number of loader steps: a failing batch is split and its parts run within
    the step (accumulate the parts' gradients; save states between steps). So is a batch
    that costs nothing, which no smaller limit splits: it is halved by count, and a state
    saved between its parts' results resumes after the whole batch.

    Args:
        loader: A :class:`~fastsab.FastLoader` or :class:`~fastsab.FastSizeAwareLoader`.
        step: The work on one batch, e.g. a training step; its results are yielded.
        factor: How much smaller the limit gets after each out-of-memory error (> 1).

    Yields:
        What ``step`` returns, batch after batch (split batches give one result per part).

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
    factor = _check_factor(factor)
    for indices, first in loader.iter_with_indices():
        pending: list[tuple[Any, Any]] = [(indices, first)]
        del first
        while pending:
            ids, batch = pending.pop()
            if batch is None:
                batch = loader.fetch(ids)
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
                parts = loader.split_indices(ids, limit)
                loader.stats.num_splits += 1
                if loader.world_size == 1 and len(parts) > 1 and ids is indices:
                    # NOTE: the loader plans the batch again under the smaller limit, so its
                    # parts come next as the loader's own batches and a state taken between
                    # them resumes exactly
                    loader.retry_last_batch(limit)
                    break
                # NOTE: under data parallelism the limit stays (a rank that planned more steps
                # than the others would hang the job), and a batch the limit cannot split
                # (it costs nothing) is halved by count: its parts run within the loader's step
                if len(parts) == 1:
                    parts = [ids[: len(ids) // 2], ids[len(ids) // 2 :]]
                pending.extend((part, None) for part in reversed(parts))
                continue
            del batch
            yield result
