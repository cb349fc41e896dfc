"""A loader's ``sampler``: where a trainer sets the epoch, and the length it counts.

Trainers written for ``torch.utils.data.DataLoader`` set the epoch through
``loader.sampler.set_epoch(epoch)`` (Lightning's ``_set_sampler_epoch`` does, at every epoch
start), and count the epoch's steps with the ``len()`` they read when they got the loader.
Lightning reads it once per loading of the training loader (when it asks for the loader, and
before it loads a checkpoint's state into it), and stops every epoch after that many steps,
also an epoch with more.

``TrainerSampler`` is the ``sampler`` of ``FastLoader`` and
``FastSizeAwareLoader``: it sets the loader's epoch. ``CountedLength`` keeps
the length a trainer counts: the first ``len()`` read after the loader was made or after its last epoch
started, before the trainer set the next epoch. When the trainer set an epoch that has more
steps than that (size-aware epochs differ in length), the iteration refuses to start rather
than be cut short: a shorter epoch ends early, which trainers handle exactly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

__all__ = ["CountedLength", "TrainerSampler", "loaded_at_epoch_end"]

#: The last state loaded at its epoch's very end in this process: the plan's fingerprint, the
#: next epoch, the steps a trainer counted of the ended one, and the loader that loaded it.
_ENDED: list[tuple[str, int, int, weakref.ref[object]]] = []


def loaded_at_epoch_end(fingerprint: str, epoch: int, steps: int, loader: object) -> None:
    """Note that ``loader`` loaded a state saved after the last of an epoch's ``steps``; ``epoch`` is the next.

    Lightning, resumed from such a state with a training loader it reloads every epoch, takes
    the ended epoch's steps as run steps of the next one when that one has more: a loader it
    builds anew for the next epoch would be stopped after the difference. That loader checks
    the note when its epoch starts (``CountedLength.start``).
    """
    _ENDED[:] = [(fingerprint, epoch, steps, weakref.ref(loader))]


class TrainerSampler:
    """What a trainer finds as ``loader.sampler``: ``set_epoch``.

    It is not a ``torch.utils.data.Sampler`` (it yields nothing), so code that looks for
    ``RandomSampler`` or ``DistributedSampler`` leaves it alone. The loader makes one each
    time its ``sampler`` is read: it holds the loader, which holds no sampler back.

    Args:
        set_epoch: The loader's ``set_epoch``.
        counted: The loader's ``CountedLength``.
    """

    def __init__(self, set_epoch: Callable[[int], None], counted: CountedLength) -> None:
        self._set_epoch = set_epoch
        self._counted = counted

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration, set by a trainer that counts the length it read."""
        self._set_epoch(epoch)
        self._counted.set_by_trainer()


class CountedLength:
    """The length a trainer counts for a loader's coming epoch, and whether the trainer set that epoch."""

    def __init__(self) -> None:
        self._open = True  # the next len() read is the length a trainer keeps
        self._set_by_trainer = False  # the trainer set the coming epoch through the loader's sampler
        self.counted: int | None = None  # that length, once read

    def set_by_trainer(self) -> None:
        """The trainer set the coming epoch (through the loader's ``sampler``)."""
        # NOTE: a trainer that reads len() again after setting the epoch (Lightning, to know its
        # last batch) still stops at the length it read first: later reads do not count
        self._open, self._set_by_trainer = False, True

    def read(self, length: int) -> int:
        """Note ``length``, a ``len()`` the loader answered; return it."""
        if self._open:
            self.counted, self._open = length, False
        return length

    def start(self, loader: object, epoch: int, length: Callable[[], int], fingerprint: Callable[[], str]) -> None:
        """Start ``epoch``, unless the trainer that set it counts fewer steps than it has.

        Args:
            loader: The loader.
            epoch: The epoch about to start.
            length: Its number of steps, as ``len()`` counts them (computed only if needed).
            fingerprint: The digest of the loader's plan (computed only if a state was loaded
                at an epoch's end in this process).

        Raises:
            ValueError: If the trainer set ``epoch`` and it has more steps than the length
                the trainer read, or than the trainer goes on to count after a state another
                loader loaded at the end of the epoch before: the trainer would stop the epoch
                before its last batches.
        """
        name = type(loader).__name__
        if self._set_by_trainer and self.counted is not None and _ENDED:
            # NOTE: looked at only where a trainer set the epoch: the digest may call sizeof
            ended_at, ended_epoch, carried, by = _ENDED.pop()
            if ended_epoch == epoch and by() is not loader and self.counted > carried and ended_at == fingerprint():
                raise ValueError(
                    f"{name} epoch {epoch} has {length()} steps, but the trainer resumed from a state saved after the "
                    f"last of epoch {epoch - 1}'s {carried} steps and counts them as steps of this epoch: it would "
                    f"stop it after {self.counted - carried} batches. Lightning does so when it reloads the training "
                    "loader every epoch and the epoch after such a checkpoint is longer. Resume from a checkpoint "
                    "saved at another step or at the epoch's end (ModelCheckpoint(every_n_epochs=1)), or use "
                    "fastsab.integrations.lightning.FastDataModule, which keeps one loader."
                )
        if self._set_by_trainer and self.counted is not None:
            steps = length()
            if steps > self.counted:
                raise ValueError(
                    f"{name} epoch {epoch} has {steps} steps, but the trainer counts {self.counted} (the len() it "
                    f"read when it got the loader) and would stop the epoch {steps - self.counted} batches early. "
                    "Size-aware epochs differ in length: give the trainer a loader for each epoch "
                    "(Trainer(reload_dataloaders_every_n_epochs=1), and in train_dataloader() call "
                    "loader.set_epoch(self.trainer.current_epoch) before returning it), or use "
                    "fastsab.integrations.lightning.FastDataModule."
                )
        # NOTE: opened at the start, not at the end: a trainer that knows the epoch's length
        # takes no batch past the last, so the iteration is never seen to end
        self._open, self._set_by_trainer = True, False
