"""What both loaders share: ``LoaderBase``.

The base of ``FastLoader`` and ``FastSizeAwareLoader``: what a loader
is made of (dataset, epoch order, batch maker, options), the epoch, rank and state of an
``EpochCursor``, and what trainers read of it (``len()``,
``sampler``, a ``DataLoader`` with its plan). Iterating an epoch is
``LoaderIteration``'s, lowering the limit mid-epoch (the loader
side of ``fastsab.adaptive.run``) ``LimitLowering``'s.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any

import numpy as np
import torch

from fastsab._checks import user_stacklevel
from fastsab.fetch.batch_maker import BatchMaker
from fastsab.fetch.fetcher import Fetcher
from fastsab.fetch.mixture import Mixture
from fastsab.fetch.transfer import Transfer
from fastsab.loaders.bucketed import bucket_collators
from fastsab.loaders.dataloader_keywords import TakesDataLoaderKeywords
from fastsab.loaders.iteration import LoaderIteration
from fastsab.loaders.options import LoaderOptions, T
from fastsab.loaders.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.plan.bucket_planner import BucketPlanner
from fastsab.plan.epochs import EpochOrder
from fastsab.plan.fixed_size import FixedSizePlanner
from fastsab.plan.mixed_order import MixedOrder
from fastsab.plan.planners import SizeAwarePlanner
from fastsab.plan.shuffle import DEFAULT_GROUP_SIZE
from fastsab.position.distributed import resolve_rank
from fastsab.position.trainer_sampler import CountedLength, TrainerSampler, lightning_read, loaded_at_epoch_end

__all__ = ["LoaderBase"]


# NOTE: one chain of bases, a concept each (LoaderBase -> LoaderIteration -> LimitLowering ->
# EpochCursor), rather than side-by-side mixins: each layer uses the one below it (the iteration
# applies lowerings, a lowering overrides the cursor's hooks), so each is typed by its base
class LoaderBase(LoaderIteration[T], metaclass=TakesDataLoaderKeywords):
    """What both loaders share: epochs, ranks, making batches, prefetch, workers, stats and state.

    The metaclass drops DataLoader's keywords at their default values (``timeout=0``) and
    refuses the others with what to use instead, so that the constructors keep explicit signatures.

    Attributes:
        options: The ``LoaderOptions`` as given.
        dataset: The dataset.
        order: The epoch order (``EpochOrder``).
        maker: Makes the batches (``BatchMaker``).
        stats: What the last epoch yielded (``EpochStats``), ``None`` before.
        limit: The batch size or caps in force in the current epoch.
        parts_left: While ``fastsab.adaptive.run`` runs the parts of a split step, how
            many come after the one running (0 otherwise).
    """

    def __init__(self, dataset: object, options: LoaderOptions) -> None:
        self.options = options
        self.rank, self.world_size = resolve_rank(options.rank, options.world_size)
        fetcher = Fetcher(dataset, options.collate_fn)
        self.dataset = dataset
        chunk_size = getattr(dataset, "chunk_size", None)
        self._chunked = isinstance(chunk_size, int) and callable(getattr(dataset, "set_chunk_order", None))
        group_size = options.group_size
        if group_size is None:
            # NOTE: a chunked dataset (OutOfCoreDataset) is shuffled with its chunks as the
            # groups, unrotated, so every chunk is read once per epoch
            group_size = chunk_size if isinstance(chunk_size, int) and self._chunked else DEFAULT_GROUP_SIZE
        if isinstance(dataset, Mixture):
            self.order: EpochOrder = dataset.order(
                shuffle=options.shuffle, seed=options.seed, group_size=options.group_size
            )
        else:
            self.order = EpochOrder(
                fetcher.length,
                shuffle=options.shuffle,
                seed=options.seed,
                group_size=group_size,
                rotate=not self._chunked,
            )
        transfer = Transfer.create(options.device, options.pin_memory, options.non_blocking)
        self.maker = BatchMaker(fetcher, transfer, options.chunk_bytes)
        self.stats = None
        self.planner: FixedSizePlanner | SizeAwarePlanner | BucketPlanner
        self._init_lowering()
        self._workers = None
        self._counted = CountedLength()

    @property
    def fetcher(self) -> Fetcher:
        """How batches are read from the dataset (``Fetcher``)."""
        return self.maker.fetcher

    @property
    def device(self) -> torch.device | None:
        """Where batches are moved (``None``: left where they are)."""
        return self.maker.transfer.device

    @property
    def pin_memory(self) -> bool:
        """Whether host memory is pinned before copies (``False`` where no accelerator is available)."""
        return self.maker.transfer.pin_memory

    @property
    def non_blocking(self) -> bool:
        """Whether host-to-device copies are asynchronous."""
        return self.maker.transfer.non_blocking

    @property
    def chunk_bytes(self) -> int:
        """Largest in-memory gather of one plan chunk."""
        return self.maker.chunk_bytes

    # -- epochs, state and what trainers read ------------------------------------------

    def _use_planner(self, planner: FixedSizePlanner | SizeAwarePlanner | BucketPlanner) -> None:
        if isinstance(self.order, MixedOrder) and not isinstance(planner, FixedSizePlanner):
            self.order.use_costs(functools.partial(_item_costs, planner))
        self._init_cursor(planner, self.rank, self.world_size, self.options.even_batches, self.options.balance)

    def batch_sampler(self) -> PlannedBatchSampler:
        """This loader's batch plan as a ``Sampler[list[int]]`` for ``DataLoader(batch_sampler=...)``.

        The sampler starts at the loader's next epoch and counts epochs on its own.
        """
        sampler = PlannedBatchSampler(
            self.planner, self.rank, self.world_size, self.even_batches, self.balance, epoch=self.epoch
        )
        self._copy_position(sampler)
        return sampler

    def data_loader(self, **options: Any) -> PlannedDataLoader:
        """A ``DataLoader`` with this loader's batch plan, e.g. for worker processes.

        ``options`` go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...). Its
        ``state_dict`` counts the batches the training loop received, not those the
        workers fetched ahead. This loader's device transfer and ``collate_fn`` are not
        used (the default ``collate_fn`` is ``collate_batch``): pass what
        ``DataLoader`` needs.

        Raises:
            ValueError: If ``collate_fn`` pads lengths further than a padded budget charges them
                (its ``pad_to_multiple_of``: see ``check_collators``).
        """
        if isinstance(self.planner, SizeAwarePlanner):
            self.planner.rule.check_collators({"data_loader's collate_fn": options.get("collate_fn")})
        if isinstance(self.planner, BucketPlanner):
            if self.planner.partial == "fill":
                raise ValueError(
                    "a DataLoader cannot add the sample_mask of the filler rows that partial='fill' makes: iterate the "
                    "loader itself (num_workers= runs worker processes), or pass partial='keep'."
                )
            if "collate_fn" in options:  # (else PlannedDataLoader's default, collate_batch)
                options["collate_fn"] = bucket_collators(
                    {"data_loader's collate_fn": options["collate_fn"]}, self.planner
                )["data_loader's collate_fn"]
        return PlannedDataLoader(self.dataset, self.batch_sampler(), **options)

    def __len__(self) -> int:
        """Exact number of steps of the next epoch (see ``__len__``).

        A size-aware loader's epochs differ in length, and so do a ``Mixture``'s (unless they end at a
        number of items: ``equal_epochs``). Lightning keeps the length it read when it
        loaded the training loader for every epoch until it loads it again, so where it does not
        load it every epoch (``reload_dataloaders_every_n_epochs=1``) the loader reports no length to
        it (with a warning, once): Lightning then runs every epoch to its end, and its data fetcher,
        which reads the length again as each epoch starts, gets that epoch's.

        Raises:
            TypeError: Where Lightning reads it to count the steps of epochs to come, as above.
            ValueError: There, where the trainer takes a fraction of it (``limit_train_batches=0.5``,
                ``val_check_interval=0.5``), which it refuses without a length.
        """
        read = None if self.equal_epochs else lightning_read(self, sys._getframe(1))
        if read is not None and read.reload != 1:
            if not self._counted.withhold(True):
                warnings.warn(
                    f"{type(self).__name__} reports no length to this Lightning trainer: its epochs differ in "
                    f"their number of batches, and with reload_dataloaders_every_n_epochs={read.reload} the "
                    "trainer would stop a longer epoch after the length it read first, so it runs every epoch to "
                    "its end instead. For a length (a progress bar's total, val_check_interval as a fraction, "
                    "estimated_stepping_batches), pass Trainer(reload_dataloaders_every_n_epochs=1) and call "
                    "loader.set_epoch(self.trainer.current_epoch) in train_dataloader().",
                    stacklevel=user_stacklevel(),
                )
            if read.counts_epochs and read.fraction is not None:
                raise ValueError(
                    f"Trainer({read.fraction}) takes a fraction of the training loader's length, but "
                    f"{type(self).__name__} reports none to a trainer that loads it every "
                    f"reload_dataloaders_every_n_epochs={read.reload} epochs: its epochs differ in length. "
                    "Pass Trainer(reload_dataloaders_every_n_epochs=1) and call "
                    "loader.set_epoch(self.trainer.current_epoch) in train_dataloader(), or give a number of batches."
                )
            if read.counts_epochs:
                raise TypeError(
                    f"{type(self).__name__} has no length for a Lightning trainer that loads it every "
                    f"reload_dataloaders_every_n_epochs={read.reload} epochs: its epochs differ in length."
                )
            if read.epoch is not None and not (self._resuming or self.finished_steps):
                # NOTE: the fit loop makes the epoch's iteration before it sets the epoch, and reads no
                # length again: resumed from a checkpoint saved at an epoch's end, it loads no state
                # into the loader, and sets the next epoch, not the one train_dataloader() saw
                self.set_epoch(read.epoch)
            # NOTE: resumed from a state saved after an epoch's last step, Lightning counts that epoch's
            # steps into the next one when it does not know the epoch's length (as FastDataModule's loader)
            return self._counted.read(super().__len__() + self.finished_steps, counted=True)
        if read is not None:
            self._counted.withhold(False)
        return self._counted.read(super().__len__())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see ``load_state_dict``)."""
        super().load_state_dict(state)
        if self.finished_steps:  # saved after its epoch's last step: a trainer may count them on
            loaded_at_epoch_end(self.fingerprint(), self.epoch, self.finished_steps, self)

    @property
    def equal_epochs(self) -> bool:
        """Whether every epoch has as many steps: fixed-size batches of epochs of as many items.

        Size-aware epochs differ in their number of batches; so do a ``Mixture``'s epochs, in items,
        unless they end at a number of items (``stop={"items": n}``).
        """
        return isinstance(self.planner, FixedSizePlanner) and self.order.equal_epochs

    @property
    def sampler(self) -> TrainerSampler:
        """Where a trainer written for ``DataLoader`` sets the epoch (see ``TrainerSampler``)."""
        return TrainerSampler(self.set_epoch, self._counted)


def _item_costs(planner: SizeAwarePlanner | BucketPlanner, ids: np.ndarray) -> np.ndarray:
    """What a mixture's weights count of each item: its cost under ``planner`` (the first column), or its length."""
    if isinstance(planner, BucketPlanner):
        costs = planner.lengths(ids)
    else:
        costs = planner.costs(ids)
        if planner.rule.feature_cost is not None:
            costs = planner.rule.feature_cost(costs)
    return np.asarray(costs, dtype=np.float64).reshape(len(ids), -1)[:, 0]
