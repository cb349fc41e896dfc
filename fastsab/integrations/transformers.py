"""Training with a fast loader in Hugging Face ``transformers.Trainer``.

``FastTrainer`` is a ``Trainer`` that takes its training batches from a
``FastLoader`` or ``FastSizeAwareLoader`` (``train_loader=``)
instead of building a ``DataLoader`` from ``train_dataset``. The loader plans each rank's share
itself, so it is not handed to ``accelerate`` (which would shard it a second time), and its
batches reach the model as its ``collate_fn`` makes them (``data_collator`` and the
``dataloader_*`` arguments are not used for training).

Trainer counts its epochs, its ``max_steps`` and the position of a resumed run from one
``len()`` of the loader, as if every epoch had as many batches. ``FastTrainer`` counts
each epoch's own batches from the loader's plan (size-aware epochs differ), saves the loader's
position in every checkpoint and resumes it there without fetching the batches already trained
on; gradient accumulation ends with each epoch, as Trainer's does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from fastsab.loaders.loader_base import LoaderBase

__all__ = ["LOADER_STATE_NAME", "FastTrainer"]

# NOTE: FastTrainer overrides these steps of Trainer's training loop (transformers 5); a Trainer
# without them would silently run its own counts, so the import fails instead
_OVERRIDDEN = ("set_initial_training_values", "_init_training_state", "_run_epoch", "_save_checkpoint")
_missing = [name for name in _OVERRIDDEN if not hasattr(Trainer, name)]
if _missing:
    raise ImportError(
        f"fastsab.integrations.transformers needs a transformers.Trainer with {_missing!r} (transformers 5); "
        "upgrade transformers."
    )

#: The file, in each checkpoint folder, that holds the training loader's position.
LOADER_STATE_NAME = "fastsab_train_loader.json"


class FastTrainer(Trainer):
    """A ``transformers.Trainer`` that trains on the batches of a fast loader.

    The batches are the loader's, passed on as they are: with shape buckets (``buckets=``, and
    ``partial="fill"``, the default) every batch holds a ``sample_mask`` (``False`` on filler
    rows), which Trainer's ``compute_loss`` would pass to ``model(**batch)``. Override
    ``compute_loss`` to take it out and leave the filler rows out of the loss (an example is
    on the transformers page of the docs).

    Args:
        *args: What ``Trainer`` takes (``model``, ``args``, ...).
        **kwargs: What ``Trainer`` takes (``eval_dataset``, ...); ``train_dataset`` is not needed.
        train_loader: The training loader. Make it after ``TrainingArguments`` (which starts
            ``torch.distributed`` under ``torchrun``), so that it plans for this process's rank.

    Raises:
        TypeError: If ``train_loader`` is not a fastsab loader.
        ValueError: If the loader's rank or world size is not this process's, ``train_dataset``
            is given too, or ``auto_find_batch_size`` is set (the loader plans the batches).
        RuntimeError: In ``train()``, at the first batch after the loader's limit was lowered
            (``lower_limit``, ``retry_last_batch``, ``fastsab.adaptive.run``): Trainer counted
            the epoch's steps from the plan before the epoch ran.

    Examples:
        >>> import tempfile
        >>> import numpy as np
        >>> import torch
        >>> from transformers import TrainingArguments
        >>> from fastsab import FastSizeAwareLoader
        >>> args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], num_train_epochs=3)
        >>> sizes = np.random.default_rng(0).integers(1, 9, 48)
        >>> loader = FastSizeAwareLoader(torch.arange(48), sizes, max_total_size=11, seed=0)
        >>> trainer = FastTrainer(model=torch.nn.Linear(1, 1), args=args, train_loader=loader)
        >>> [trainer.steps_in_epoch(epoch) for epoch in range(3)]  # size-aware epochs differ
        [24, 27, 25]
        >>> trainer.set_initial_training_values(args, loader)[-1]  # max_steps: their sum
        76
    """

    def __init__(self, *args: Any, train_loader: LoaderBase[Any], **kwargs: Any) -> None:
        if not isinstance(train_loader, LoaderBase):
            raise TypeError(
                f"train_loader must be a FastLoader or FastSizeAwareLoader, got {type(train_loader).__name__}."
            )
        if kwargs.get("train_dataset") is not None:
            raise ValueError("pass FastTrainer train_loader= or train_dataset=, not both: the loader is trained on.")
        super().__init__(*args, **kwargs)
        if self.args.auto_find_batch_size:
            raise ValueError(
                "FastTrainer does not take auto_find_batch_size=True: the loader plans its batches; give it a limit "
                "that fits, or split a batch within the training step with fastsab.adaptive.batch."
            )
        ranks = (self.args.process_index, self.args.world_size)
        if (train_loader.rank, train_loader.world_size) != ranks:
            raise ValueError(
                f"train_loader plans for rank {train_loader.rank} of {train_loader.world_size}, but this process is "
                f"rank {ranks[0]} of {ranks[1]}: make the loader after TrainingArguments (which starts "
                "torch.distributed), or pass it rank= and world_size=."
            )
        self.train_loader = train_loader
        self._epoch_steps: dict[int, int] = {}
        self._epochs = _Epochs(self)
        self.add_callback(_EpochFraction(self))

    def get_train_dataloader(self) -> Any:
        """The training loader's epochs, not wrapped by ``accelerate`` (which would shard them again)."""
        return self._epochs

    def num_examples(self, dataloader: Any) -> int:
        """The items of the training loader's next epoch (Trainer's own count for its other loaders)."""
        if dataloader is self._epochs:  # (a mixture's epochs may hold more or fewer than its sources' items)
            return int(self.train_loader.order.epoch_length(self.train_loader.epoch))
        return int(super().num_examples(dataloader))

    def steps_in_epoch(self, epoch: int) -> int:
        """The batches ``epoch`` gives this rank (every rank runs as many), from the loader's plan.

        Raises:
            ValueError: If the epoch has no batch (Trainer would stop there).
        """
        if epoch not in self._epoch_steps:
            steps = self.train_loader.epoch_steps(epoch)
            if steps == 0:
                raise ValueError(f"the training loader has no batch in epoch {epoch}; give it more data.")
            self._epoch_steps[epoch] = steps
        return self._epoch_steps[epoch]

    def _updates(self, batches: int) -> int:
        """Optimizer steps over ``batches`` of an epoch: the last accumulates the batches left, as Trainer's does."""
        return math.ceil(batches / self.args.gradient_accumulation_steps)

    def _updates_in_epoch(self, epoch: int) -> int:
        return self._updates(self.steps_in_epoch(epoch))

    def set_initial_training_values(self, args: Any, dataloader: Any) -> tuple[Any, ...]:
        """Trainer's training numbers, with ``max_steps`` and the epochs counted epoch by epoch."""
        values = list(super().set_initial_training_values(args, dataloader))
        # (num_train_epochs, num_update_steps_per_epoch, num_examples, num_train_samples,
        #  total_train_batch_size, steps_in_epoch, max_steps): the first, second, sixth and last
        # assume equal epochs; _run_epoch is given each epoch's own numbers
        if args.max_steps > 0:
            max_steps, epochs, done = args.max_steps, 0, 0
            while done < max_steps:
                done += self._updates_in_epoch(epochs)
                epochs += 1
        else:
            whole = math.floor(args.num_train_epochs)
            epochs = math.ceil(args.num_train_epochs)
            max_steps = sum(self._updates_in_epoch(epoch) for epoch in range(whole))
            if epochs > whole:  # a fraction of the last epoch, rounded up as Trainer does
                max_steps += math.ceil((args.num_train_epochs - whole) * self._updates_in_epoch(whole))
        values[0], values[1], values[5], values[6] = (
            epochs,
            self._updates_in_epoch(0),
            self.steps_in_epoch(0),
            max_steps,
        )
        return tuple(values)

    def _position(self, global_step: int) -> tuple[int, int]:
        """``(epoch, batches trained in it)`` after ``global_step`` optimizer steps from the start."""
        epoch = 0
        while global_step >= self._updates_in_epoch(epoch):
            global_step -= self._updates_in_epoch(epoch)
            epoch += 1
        return epoch, global_step * self.args.gradient_accumulation_steps

    def _init_training_state(
        self,
        max_steps: int,
        num_update_steps_per_epoch: int,
        num_train_epochs: int,
        resume_from_checkpoint: Any,
        trial: Any,
    ) -> tuple[int, int]:
        super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if resume_from_checkpoint is None:
            return 0, 0
        epoch, steps = self._position(self.state.global_step)
        if self.args.ignore_data_skip:  # Trainer's option: the resumed epoch starts again
            return epoch, 0
        path = os.path.join(resume_from_checkpoint, LOADER_STATE_NAME)
        if not os.path.isfile(path):
            raise ValueError(
                f"the checkpoint {resume_from_checkpoint!r} has no {LOADER_STATE_NAME}: it was not saved by "
                "FastTrainer. Resume from a FastTrainer checkpoint, or pass ignore_data_skip=True to start its "
                "epoch again."
            )
        with open(path) as file:
            self.train_loader.load_state_dict(json.load(file))  # checks the seed and the plan's inputs
        saved = (self.train_loader.epoch, self.train_loader.resumed_steps)
        if saved != (epoch, steps):
            raise ValueError(
                f"the loader state in {resume_from_checkpoint!r} is at epoch {saved[0]}, step {saved[1]}, but the "
                f"checkpoint's global step {self.state.global_step} is at epoch {epoch}, step {steps} of this "
                "loader: resume with the training arguments and world size of the run that saved it."
            )
        return epoch, steps

    def _run_epoch(
        self,
        model: Any,
        epoch: int,
        train_dataloader: Any,
        steps_in_epoch: int,
        num_update_steps_per_epoch: int,
        trial: Any,
        ignore_keys_for_eval: Any,
        start_time: float,
        resume_from_checkpoint: Any,
        epochs_trained: int,
        steps_trained_in_current_epoch: int,
    ) -> None:
        # NOTE: the loader starts a resumed epoch at its saved position itself (nothing fetched to
        # skip), so Trainer is handed the rest of the epoch as an epoch of its own; the trained
        # part is a whole number of accumulations, so the rest's accumulations end where the
        # whole epoch's do. _EpochFraction sets state.epoch from the loader's position.
        resumed = epoch == epochs_trained and resume_from_checkpoint is not None
        rest = self.steps_in_epoch(epoch) - (steps_trained_in_current_epoch if resumed else 0)
        super()._run_epoch(  # type: ignore[no-untyped-call]
            model=model,
            epoch=epoch,
            train_dataloader=train_dataloader,
            steps_in_epoch=rest,
            num_update_steps_per_epoch=self._updates(rest),
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            start_time=start_time,
            resume_from_checkpoint=resume_from_checkpoint,
            epochs_trained=epochs_trained,
            steps_trained_in_current_epoch=0,
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:  # the state is the same on every rank
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"  # as Trainer names it
            folder = os.path.join(self._get_output_dir(trial=trial), folder)
            with open(os.path.join(folder, LOADER_STATE_NAME), "w") as file:
                # NOTE: Trainer fetches no batch ahead of its step, so what the loader handed
                # out is what was trained on
                json.dump(self.train_loader.state_dict(), file)


class _Epochs:
    """The training loader as Trainer iterates it: each epoch ends with the batch that ends its plan.

    Trainer takes exactly the batches it counted for the epoch and never asks for one more, so
    the loader's iteration would stay open after its last batch; here it is run to its end
    right after that batch, so that the loader ends its epoch (and warns of the items it skipped).
    """

    def __init__(self, trainer: FastTrainer) -> None:
        self.trainer = trainer
        self.loader = trainer.train_loader

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        rest = self.trainer.steps_in_epoch(self.loader.epoch) - self.loader.resumed_steps
        batches = iter(self.loader)
        for count in range(1, rest + 1):
            batch = next(batches)
            stats = self.loader.stats
            if stats is not None and stats.limit_changes:
                # NOTE: Trainer fixed the epoch's optimizer steps (and max_steps, the schedule) from
                # the plan; run to the end counted, a lowered plan would leave its last items untrained
                raise RuntimeError(
                    f"the training loader's limit was lowered in epoch {stats.epoch} after "
                    f"{stats.limit_changes[0][0]} batches, which plans the rest of the epoch again, but FastTrainer "
                    "counted the epoch's steps from its plan; give the loader a limit that fits instead (or split "
                    "a batch within the training step, as fastsab.adaptive.batch does)."
                )
            if count == rest and next(batches, None) is not None:
                raise RuntimeError(f"the training loader yielded more than the {rest} batches its plan has left.")
            yield batch


class _EpochFraction(TrainerCallback):
    """Sets ``state.epoch`` (epochs done, with a fraction) from the loader's position after each step."""

    def __init__(self, trainer: FastTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        position = self.trainer.train_loader.position
        if position is not None:
            epoch, steps = position
            state.epoch = epoch + steps / self.trainer.steps_in_epoch(epoch)
