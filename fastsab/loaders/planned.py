"""A loader's batch plan handed to a ``torch.utils.data.DataLoader``.

``PlannedBatchSampler`` is a loader's ``EpochCursor`` as a batch
sampler (``loader.batch_sampler()``); ``PlannedDataLoader`` is the ``DataLoader`` over it
(``loader.data_loader()``) whose state counts the batches the training loop received.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader, Sampler

from fastsab.fetch.fetcher import collate_batch, indexable
from fastsab.position.consumed import ConsumedCount
from fastsab.position.cursor import EpochCursor
from fastsab.position.distributed import EvenBatches
from fastsab.position.shares import Planner
from fastsab.position.stats import EpochStats

__all__ = ["PlannedBatchSampler", "PlannedDataLoader"]


class PlannedBatchSampler(EpochCursor, Sampler[list[int]]):
    """A loader's batch plan as a ``torch.utils.data.Sampler[list[int]]``.

    Made by ``FastLoader.batch_sampler() <fastsab.FastLoader.batch_sampler>``. Like the
    loaders, each ``iter()`` starts the next epoch unless ``set_epoch`` was called
    (under ranks, once the last one ran to its end: see ``_start_epoch``),
    ``len()`` is exact, it yields this rank's share under ``torch.distributed``, and it
    resumes from ``state_dict``. ``stats`` reports the epoch as the loaders' does
    (skipped, dropped and padded items, with the same warning about skipped items), its
    batches counted as handed out.

    Its position counts the batches it handed out. A ``DataLoader`` with worker processes
    takes batches ahead of the training loop (``prefetch_factor * num_workers``), so the
    sampler's position is ahead of what was trained on: use
    ``PlannedDataLoader`` (``loader.data_loader(num_workers=...)``), whose
    ``state_dict`` counts the batches the loop received. ``state_dict`` refuses to
    answer when it sees this sampler iterated by a ``DataLoader`` with workers.
    """

    def __init__(
        self, planner: Planner, rank: int, world_size: int, even_batches: EvenBatches, balance: bool, *, epoch: int = 0
    ) -> None:
        self._init_cursor(planner, rank, world_size, even_batches, balance, epoch)
        self._ahead = False  # iterated by a DataLoader whose workers fetch ahead
        self._counted_by: ConsumedCount | None = None  # a PlannedDataLoader's count of the batches received
        self.stats: EpochStats | None = None

    def __iter__(self) -> Iterator[list[int]]:
        caller = sys._getframe(1)
        shards = _accelerate_shards(caller)
        if shards > 1 and self.world_size > 1:
            raise RuntimeError(
                f"accelerator.prepare() deals the batches of this PlannedBatchSampler to its {shards} processes, but "
                f"the plan already is the share of rank {self.rank} of {self.world_size}: dealt again, {shards - 1} "
                f"of every {shards} samples of the epoch would never be seen. Prepare the loader with "
                f"fastsab.integrations.accelerate.prepare_loader(accelerator, loader) instead (it also takes "
                f"loader.data_loader(...))."
            )
        self._ahead = self._counted_by is None and _called_by_worker_loader(caller)
        stats = EpochStats(self.epoch)
        _, stream = self._start_epoch(stats)
        if self._counted_by is not None:
            # NOTE: counted from here, not from the first batch received: worker processes start
            # the epoch (and take batches ahead) when the loop calls iter(), before any batch arrives
            self._counted_by.started()
        self.stats = stats
        progress = self._progress
        try:
            for chunk in stream:
                for batch in chunk.batches():
                    stats.num_batches += 1
                    stats.num_items += len(batch)
                    self._step_done()  # counted as handed out
                    yield batch.tolist()
        except GeneratorExit:
            if self._progress is progress:  # (not an iteration a newer one left behind)
                self._iteration_left()
            raise
        self._epoch_done(stats)

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands, counted in batches handed out (see the class docstring).

        Raises:
            RuntimeError: If a ``DataLoader`` with worker processes iterates this sampler:
                the count would include batches never trained on.
        """
        if self._ahead and self._progress is not None:
            raise RuntimeError(
                "this PlannedBatchSampler is iterated by a DataLoader with worker processes, which takes batches "
                "ahead of the training loop, so its position would skip batches never trained on; use "
                "loader.data_loader(num_workers=...) (a PlannedDataLoader) and its state_dict() instead."
            )
        return super().state_dict()


class PlannedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over a ``PlannedBatchSampler`` whose state counts received batches.

    Worker processes fetch whole batches (``dataset.__getitems__`` when it exists) ahead of
    the loop; ``state_dict`` counts only the batches this loader's iterator returned, so
    a resume yields exactly the batches not trained on. ``len()``, ``set_epoch`` and
    ``load_state_dict`` act on the sampler. Made by ``loader.data_loader(...)``.

    Args:
        dataset: The dataset to fetch from. A tensor, a numpy array, a ``TensorDataset`` or a
            pytree of tensors (a dict, tuple, namedtuple or dataclass of them) is gathered row
            by row as the loaders gather it (``GatheredRows``).
        batch_sampler: The plan, from ``loader.batch_sampler()``.
        **options: Further ``DataLoader`` options (``num_workers``, ``collate_fn``,
            ``pin_memory``, ``prefetch_factor``, ``persistent_workers``, ...). The default
            ``collate_fn`` is ``collate_batch``, which also takes the whole
            batches ``OutOfCoreDataset`` returns.
    """

    def __init__(self, dataset: Any, batch_sampler: PlannedBatchSampler, **options: Any) -> None:
        if not isinstance(batch_sampler, PlannedBatchSampler):
            raise TypeError(f"batch_sampler must be a PlannedBatchSampler, got {type(batch_sampler).__name__}.")
        for name in ("batch_size", "shuffle", "sampler", "drop_last"):
            if name in options:
                raise ValueError(f"{name} is decided by the batch plan; do not pass it to PlannedDataLoader.")
        if options.get("in_order", True) is not True:
            # NOTE: the state counts the batches received; out of order they are not the plan's first ones
            raise ValueError(
                f"PlannedDataLoader yields batches in the order of the plan, so that a saved state resumes "
                f"exactly; got in_order={options['in_order']!r}."
            )
        options.setdefault("collate_fn", collate_batch)
        # NOTE: a pytree dataset (a dict or tuple of tensors) is read by the loader's Fetcher:
        # indexing the container itself would give its keys or fields, not rows
        super().__init__(indexable(dataset), batch_sampler=batch_sampler, **options)
        self.plan = batch_sampler
        self._received = ConsumedCount(batch_sampler)  # counted in batches this loader returned
        batch_sampler._counted_by = self._received

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._counted(super().__iter__())

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        try:
            for batch in batches:  # (the sampler starts the count when it starts its epoch)
                self._received.received()
                yield batch
        except GeneratorExit:
            self._received.left()
            raise
        self._received.ended()

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration."""
        self.plan.set_epoch(epoch)

    @property
    def stats(self) -> EpochStats | None:
        """The plan's report of the epoch (see ``PlannedBatchSampler``)."""
        return self.plan.stats

    def state_dict(self) -> dict[str, Any]:
        """The plan's state, counted in batches this loader returned to the loop."""
        return self._received.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see ``PlannedBatchSampler.load_state_dict``)."""
        self._received.ended()
        self.plan.load_state_dict(state)


def _accelerate_shards(frame: FrameType | None) -> int:
    """The processes among which accelerate deals the batches ``frame`` (the caller of ``iter()``) takes.

    ``accelerator.prepare(data_loader)`` wraps the batch sampler in a ``BatchSamplerShard``
    that keeps every ``num_processes``-th batch (its generator is the caller), or, with
    ``dispatch_batches=True``, has a ``DataLoaderDispatcher`` split the main process's
    batches among the processes (its ``_fetch_batches`` is a few calls up, past the
    ``DataLoader`` iterator's). 0 where neither takes the batches.
    """
    # NOTE: looked up, not imported: the core does not depend on accelerate, and neither
    # exists where accelerate was not imported
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return 0
    for _ in range(_DISPATCH_DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, module.BatchSamplerShard):
            return int(owner.num_processes)
        if isinstance(owner, module.DataLoaderDispatcher):
            return int(owner.state.num_processes)
        frame = frame.f_back
    return 0


#: Calls from ``DataLoaderDispatcher._fetch_batches`` down to the batch sampler: ``__next__``,
#: ``_next_data``, ``_next_index`` of the ``DataLoader`` iterator, with room for a wrapper.
_DISPATCH_DEPTH = 6


def _called_by_worker_loader(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the caller of ``iter()``) belongs to a DataLoader iterator with workers."""
    from torch.utils.data import dataloader

    owner = frame.f_locals.get("self") if frame is not None else None
    return isinstance(owner, getattr(dataloader, "_MultiProcessingDataLoaderIter", ()))
