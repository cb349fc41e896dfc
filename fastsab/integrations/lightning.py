"""A Lightning data module that serves the fast loaders.

``FastDataModule`` builds a ``FastLoader`` (``batch_size``) or a
``FastSizeAwareLoader`` (``sizeof`` and ``max_total_size``) per split, with
ranks taken from the trainer. It handles ranks itself, so pass
``Trainer(use_distributed_sampler=False)`` (the loaders are not ``DataLoader`` objects, so
Lightning would not add a sampler anyway; the flag makes that explicit). The trainer sets
the epoch of the training loader every epoch, and the module's ``state_dict`` goes into
checkpoints, so a run resumed from a mid-epoch checkpoint continues the epoch with exactly
the batches not yet trained on.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl

from fastsab._checks import user_stacklevel
from fastsab.integrations._splits import SPLITS
from fastsab.loaders.dataloader_keywords import without_dataloader_defaults
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader
from fastsab.plan.cost_sources import size_array
from fastsab.plan.costs import BatchCost
from fastsab.plan.shape_buckets import ShapeBuckets
from fastsab.position.consumed import ConsumedCount
from fastsab.position.distributed import resolve_rank

__all__ = ["SPLITS", "FastDataModule"]


class _TrainLoader:
    """The training loader as Lightning sees it: counts the batches the loop consumed.

    Lightning fetches one batch ahead of the training step, so the loader's own position
    runs ahead of what was trained on; the data module counts consumed batches in
    ``on_before_batch_transfer`` and saves that position instead. This wrapper has no
    ``state_dict`` of its own, so Lightning does not save the loader's position too.
    """

    def __init__(self, loader: FastLoader | FastSizeAwareLoader) -> None:
        self.loader = loader
        self.consumed = ConsumedCount(loader)

    @property
    def sampler(self) -> _TrainLoader:
        """What Lightning calls ``set_epoch`` on at the start of every epoch."""
        return self

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration, unless the loader is already iterating it.

        Without a length, Lightning fetches the first batch of the first epoch before it sets
        that epoch: setting it again would make the loader run it once more after its end.
        """
        position = self.loader.position
        if position is None or position[0] != epoch:
            self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for count, batch in enumerate(self.loader):
            if count == 0:  # the epoch (and a resumed start) is known once the first batch is out
                self.consumed.started()
            yield batch
        self.consumed.ended()


class _SizedTrainLoader(_TrainLoader):
    """A training loader whose length Lightning may read: exact for the coming epoch.

    Lightning counts a resumed epoch's batches from the step it saved, so the length is
    the whole epoch's, as the loader's ``len()`` counts it after a resume.
    """

    def __len__(self) -> int:
        # NOTE: resumed from a checkpoint taken at an epoch's last step, Lightning goes on counting
        # from that epoch's steps into the next one (it compares them with this length to decide
        # whether the epoch had ended), so the next epoch's steps come after them
        return len(self.loader) + self.loader.finished_steps


class FastDataModule(pl.LightningDataModule):
    """Fast loaders for the train, val, test and predict splits of a Lightning run.

    Args:
        train: The training dataset (any dataset the loaders accept), or ``None`` if not used.
        val: The validation dataset, or ``None``.
        test: The test dataset, or ``None``.
        predict: The prediction dataset, or ``None``.
        batch_size: Items per batch, for fixed-size batches.
        sizeof: Per-split sizes for size-aware batches: a mapping from split name to what
            ``FastSizeAwareLoader`` accepts as ``sizeof``.
        max_total_size: The budget of a size-aware batch (not needed with ``buckets=`` a
            ``ShapeBuckets`` table with batch sizes).
        seed: Seed of the training order (evaluation splits are not shuffled).
        **loader_options: Further options for the loaders (``cost``, ``group_size``,
            ``collate_fn``, ``even_batches``, ...); ``device`` is left to Lightning.

    Raises:
        TypeError: If ``loader_options`` holds a ``DataLoader`` keyword the loaders do not
            take (the error says what to use instead).
        ValueError: If neither ``batch_size`` nor ``sizeof`` and ``max_total_size`` are
            given, or ``sizeof`` names an unknown split.

    Examples:
        >>> import torch
        >>> module = FastDataModule(train=torch.arange(10), val=torch.arange(4), batch_size=4)
        >>> [batch.tolist() for batch in module.val_dataloader()]
        [[0, 1, 2, 3]]
    """

    def __init__(
        self,
        *,
        train: Any = None,
        val: Any = None,
        test: Any = None,
        predict: Any = None,
        batch_size: int | None = None,
        sizeof: Mapping[str, Any] | None = None,
        max_total_size: Any = None,
        seed: int = 0,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        self.datasets = {"train": train, "val": val, "test": test, "predict": predict}
        if sizeof is not None:
            if not isinstance(sizeof, Mapping):
                raise TypeError(f"sizeof must map split names to sizes, got {type(sizeof).__name__}.")
            unknown = sorted(set(sizeof) - set(SPLITS))
            if unknown:
                raise ValueError(f"sizeof names unknown splits {unknown!r}; splits are {SPLITS!r}.")
            table = loader_options.get("buckets")
            if max_total_size is not None:
                _check_caps(max_total_size, sizeof)
            elif not (isinstance(table, ShapeBuckets) and table.batch_sizes is not None):
                raise ValueError(
                    "max_total_size is needed with sizeof, unless buckets= is a ShapeBuckets table with "
                    "batch sizes (which then bound every split's batches)."
                )
        elif batch_size is None:
            raise ValueError("give batch_size, or sizeof and max_total_size.")
        if "device" in loader_options:
            raise ValueError("device is chosen by the Lightning trainer; do not pass it to FastDataModule.")
        # NOTE: checked now rather than when the trainer first asks for a loader, mid-setup
        if sizeof:
            without_dataloader_defaults(FastSizeAwareLoader, loader_options)
        if batch_size is not None:
            without_dataloader_defaults(FastLoader, loader_options)
        self.batch_size = batch_size
        self.sizeof = dict(sizeof or {})
        self.max_total_size = max_total_size
        self.seed = seed
        self.loader_options = loader_options
        self._loaders: dict[str, Any] = {}
        self._pending_state: dict[str, Any] | None = None

    def _loader(self, split: str) -> Any:
        if split in self._loaders:  # the same loader on every reload: it keeps the epoch and position
            return self._loaders[split]
        dataset = self.datasets[split]
        if dataset is None:
            raise ValueError(f"FastDataModule has no {split} dataset; pass {split}= to use this split.")
        options = {"shuffle": split == "train", "seed": self.seed, **self.loader_options}
        ranks = resolve_rank(options.get("rank"), options.get("world_size"), trainer=getattr(self, "trainer", None))
        options["rank"], options["world_size"] = ranks
        loader: Any
        if split in self.sizeof:
            loader = FastSizeAwareLoader(dataset, self.sizeof[split], self.max_total_size, **options)
        elif self.batch_size is None:
            raise ValueError(f"sizeof has no sizes for the {split} split.")
        else:
            loader = FastLoader(dataset, self.batch_size, **options)
        if split == "train":
            if self._pending_state is not None:
                loader.load_state_dict(self._pending_state)
                self._pending_state = None
            loader = self._wrap_train(loader)
        self._loaders[split] = loader
        return loader

    def _wrap_train(self, loader: FastLoader | FastSizeAwareLoader) -> _TrainLoader:
        # NOTE: Lightning reads len() once per reload of the training loader and stops the
        # epoch after that many batches. Size-aware epochs differ in length, and so do a
        # mixture's, so without a reload every epoch the length is left out (Lightning then runs
        # each epoch to its end) rather than cutting off batches.
        trainer = getattr(self, "trainer", None)
        reloads = trainer is not None and trainer.reload_dataloaders_every_n_epochs == 1
        if loader.equal_epochs or reloads:
            return _SizedTrainLoader(loader)
        warnings.warn(
            "the training loader's epochs differ in their number of batches (size-aware batches, or a mixture's "
            "epochs): pass "
            "Trainer(reload_dataloaders_every_n_epochs=1) so that Lightning reads each epoch's exact length; "
            "until then the training loader reports none and every epoch runs to its end.",
            stacklevel=user_stacklevel(),
        )
        return _TrainLoader(loader)

    def train_dataloader(self) -> Any:
        return self._loader("train")

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        return self._loader("test")

    def predict_dataloader(self) -> Any:
        return self._loader("predict")

    def teardown(self, stage: str) -> None:
        """Shut down the worker processes the loaders keep (``persistent_workers=True``).

        Lightning calls it when ``fit``, ``validate``, ``test`` or ``predict`` ends; the
        loaders keep their epoch and position, and start new workers if iterated again.
        """
        for loader in self._loaders.values():
            (loader.loader if isinstance(loader, _TrainLoader) else loader).close()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = getattr(self, "trainer", None)
        train = self._loaders.get("train")
        if trainer is not None and trainer.training and train is not None:
            train.consumed.received()
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position, counted in batches the training loop consumed."""
        train = self._loaders.get("train")
        if train is None:
            return {} if self._pending_state is None else {"train": self._pending_state}
        return {"train": train.consumed.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training loader from ``state_dict`` (applied when it is built)."""
        state = state_dict.get("train")
        if state is None:
            return
        train = self._loaders.get("train")
        if train is None:
            self._pending_state = state
        else:
            train.consumed.ended()  # counts from the loaded position when the epoch starts
            train.loader.load_state_dict(state)


def _check_caps(max_total_size: Any, sizeof: Mapping[str, Any]) -> None:
    """Check the caps, and their number against the cost columns of every split's array of sizes.

    A callable ``sizeof`` is checked when its loader is made (it needs the dataset).
    """
    rule = BatchCost(max_total_size)
    for sizes in sizeof.values():
        array = size_array(sizes, ndim=(1, 2))
        if array is not None:
            rule.check_columns(array)
