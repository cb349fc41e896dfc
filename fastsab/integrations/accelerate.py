"""Hugging Face Accelerate over the fast loaders: ``prepare_loader``.

``accelerator.prepare`` knows only ``DataLoader`` objects: it returns a
``FastLoader`` untouched (no position in ``save_state``, no end of epoch for
gradient accumulation), and it shards a ``PlannedDataLoader`` across its
processes a second time, although the loaders already plan this rank's share from
``torch.distributed`` (``PlannedBatchSampler`` refuses that with an error naming this
module). ``prepare_loader`` is the loaders' ``prepare``: it keeps the per-rank plan,
registers the loader for ``save_state`` / ``load_state``, tells accelerate's gradient
accumulation where each epoch ends, and moves batches to ``accelerator.device``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState
from accelerate.utils import send_to_device

from fastsab.loaders.loader_base import LoaderBase
from fastsab.loaders.planned import PlannedDataLoader
from fastsab.position.consumed import ConsumedCount
from fastsab.position.cursor import EpochCursor

__all__ = ["AcceleratedLoader", "prepare_loader"]

#: What ``prepare_loader`` takes: a fast loader, or its plan in a ``DataLoader`` (worker processes).
Loader = LoaderBase[Any] | PlannedDataLoader

_NONE = object()  # what an epoch without batches gives first


class AcceleratedLoader(DataLoaderStateMixin):  # type: ignore[misc]  # accelerate is untyped
    """A fast loader as accelerate's prepared ``DataLoader`` objects behave; made by ``prepare_loader``.

    Iterating it runs the loader's next epoch (this rank's share of the plan), one batch
    ahead, as accelerate's ``DataLoaderShard`` does: ``accelerator.gradient_state`` sees
    ``end_of_dataloader`` on the epoch's last batch, so ``accelerator.accumulate(model)``
    syncs there. Its ``state_dict`` counts the batches the training loop received, not
    the one fetched ahead.

    Attributes:
        loader: The loader it iterates.
        move_to: Where this object moves batches (``None``: left where the loader puts them).
    """

    def __init__(self, loader: Loader, move_to: torch.device | None, non_blocking: bool) -> None:
        self.loader = loader
        self.cursor: EpochCursor = loader.plan if isinstance(loader, PlannedDataLoader) else loader
        self.move_to = move_to
        self.non_blocking = non_blocking
        self.consumed = ConsumedCount(self.cursor)
        self.gradient_state = GradientState()
        # NOTE: DataLoaderStateMixin.begin() computes a padding remainder from a fixed batch
        # size for gather_for_metrics; the plan has none, so it stays -1 ("unknown"), as for a
        # DataLoader without a length
        self._drop_last = True

    @property
    def device(self) -> torch.device | None:
        """Where the batches are: ``move_to``, or the loader's own ``device`` (``None``: not moved)."""
        own: torch.device | None = getattr(self.loader, "device", None)
        return self.move_to if self.move_to is not None else own

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (after ``load_state``: the one it resumes)."""
        return self.cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (a resumed position is kept for its own epoch)."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        """This rank's steps in the coming epoch: the whole epoch's, also when it resumes mid-epoch.

        The same on every rank (the loaders deal equal steps); what an LR schedule over
        ``len(loader)`` steps per epoch expects.
        """
        return len(self.cursor)

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        try:
            batches = iter(self.loader)
            current = next(batches, _NONE)
            if current is _NONE:
                return
            self.consumed.started()
            # NOTE: one batch ahead, as DataLoaderShard: the epoch's last batch is known as the
            # last before the training step runs on it
            for upcoming in batches:
                self.consumed.received()
                yield self._placed(current)
                current = upcoming
            self.end_of_dataloader = True
            self.consumed.received()
            yield self._placed(current)
        except GeneratorExit:
            self.consumed.left()
            raise
        finally:
            self.end()
        self.consumed.ended()

    def _placed(self, batch: Any) -> Any:
        if self.move_to is None:
            return batch
        return send_to_device(batch, self.move_to, non_blocking=self.non_blocking)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state counted in batches the training loop received (``save_state`` saves it)."""
        return self.consumed.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (``load_state`` calls it): the next iteration runs the batches not received."""
        self.consumed.ended()
        self.loader.load_state_dict(state)


def prepare_loader(
    accelerator: Accelerator, loader: Loader, *, device_placement: bool | None = None
) -> AcceleratedLoader:
    """Prepare a fast loader for ``accelerator``, as ``accelerator.prepare`` prepares a ``DataLoader``.

    The loader keeps its own plan of this rank's batches (build it after ``Accelerator()``,
    which starts ``torch.distributed``); the result is registered with
    ``accelerator.register_for_checkpointing``, so ``save_state`` / ``load_state`` save and
    restore its position (call ``prepare_loader`` in the same order relative to other
    registered objects in the run that resumes).

    Args:
        accelerator: The ``Accelerator`` of the run.
        loader: A ``FastLoader`` or ``FastSizeAwareLoader``, or
            its ``loader.data_loader(num_workers=...)`` for worker processes.
        device_placement: Whether batches go to ``accelerator.device`` (default: the
            accelerator's ``device_placement``). A loader made with ``device=`` moves its
            batches itself and is left as it is.

    Returns:
        An ``AcceleratedLoader`` to iterate in the training loop.

    Raises:
        TypeError: If ``accelerator`` is not an ``Accelerator`` or ``loader`` not a fast loader.
        ValueError: If the loader plans for another rank or world size than the accelerator's.

    Examples:
        >>> import torch
        >>> from fastsab import FastLoader
        >>> accelerator = Accelerator(cpu=True)
        >>> loader = prepare_loader(accelerator, FastLoader(torch.arange(10), 4, shuffle=False))
        >>> [(batch.tolist(), accelerator.gradient_state.end_of_dataloader) for batch in loader]
        [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]
    """
    if not isinstance(accelerator, Accelerator):
        raise TypeError(f"accelerator must be an accelerate.Accelerator, got {type(accelerator).__name__}.")
    if not isinstance(loader, (LoaderBase, PlannedDataLoader)):
        raise TypeError(
            f"loader must be a FastLoader, a FastSizeAwareLoader or a PlannedDataLoader, got "
            f"{type(loader).__name__}; prepare other DataLoader objects with accelerator.prepare."
        )
    cursor = loader.plan if isinstance(loader, PlannedDataLoader) else loader
    planned = (cursor.rank, cursor.world_size)
    if planned != (accelerator.process_index, accelerator.num_processes):
        raise ValueError(
            f"loader plans for rank {planned[0]} of {planned[1]}, but the accelerator runs process "
            f"{accelerator.process_index} of {accelerator.num_processes}; build the loader after Accelerator() "
            f"(it reads torch.distributed), or pass rank=accelerator.process_index and "
            f"world_size=accelerator.num_processes."
        )
    if device_placement is None:
        device_placement = bool(accelerator.device_placement)
    moves = device_placement and getattr(loader, "device", None) is None
    prepared = AcceleratedLoader(loader, accelerator.device if moves else None, bool(accelerator.non_blocking))
    accelerator.register_for_checkpointing(prepared)
    return prepared
