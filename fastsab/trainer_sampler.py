"""A loader's ``sampler``: where a trainer sets the epoch, and the length it counts.

Trainers written for ``torch.utils.data.DataLoader`` set the epoch through
``loader.sampler.set_epoch(epoch)`` (Lightning's ``_set_sampler_epoch`` does, at every epoch
start), and count the epoch's steps with the ``len()`` they read when they got the loader.
Lightning reads it once per loading of the training loader (when it asks for the loader, and
before it loads a checkpoint's state into it), and stops every epoch after that many steps,
also an epoch with more.

:class:`TrainerSampler` is the ``sampler`` of :class:`~fastsab.FastLoader` and
:class:`~fastsab.FastSizeAwareLoader`: it sets the loader's epoch. :class:`CountedLength` keeps
the length a trainer counts: the first ``len()`` read after the loader was made or after its last epoch
started, before the trainer set the next epoch. When the trainer set an epoch that has more
steps than that (size-aware epochs differ in length), the iteration refuses to start rather
than be cut short: a shorter epoch ends early, which trainers handle exactly.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CountedLength", "TrainerSampler"]


class TrainerSampler:
    """What a trainer finds as ``loader.sampler``: ``set_epoch``.

    It is not a ``torch.utils.data.Sampler`` (it yields nothing), so code that looks for
    ``RandomSampler`` or ``DistributedSampler`` leaves it alone. The loader makes one each
    time its ``sampler`` is read: it holds the loader, which holds no sampler back.

    Args:
        set_epoch: The loader's ``set_epoch``.
        counted: The loader's :class:`CountedLength`.
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

    def start(self, loader: str, epoch: int, length: Callable[[], int]) -> None:
        """Start ``epoch``, unless the trainer that set it counts fewer steps than it has.

        Args:
            loader: The loader's name, for the message.
            epoch: The epoch about to start.
            length: Its number of steps, as ``len()`` counts them (computed only if needed).

        Raises:
            ValueError: If the trainer set ``epoch`` and it has more steps than the length
                the trainer read: the trainer would stop the epoch before its last batches.
        """
        if self._set_by_trainer and self.counted is not None:
            steps = length()
            if steps > self.counted:
                raise ValueError(
                    f"{loader} epoch {epoch} has {steps} steps, but the trainer counts {self.counted} (the len() it "
                    f"read when it got the loader) and would stop the epoch {steps - self.counted} batches early. "
                    "Size-aware epochs differ in length: give the trainer a loader for each epoch "
                    "(Trainer(reload_dataloaders_every_n_epochs=1), and in train_dataloader() call "
                    "loader.set_epoch(self.trainer.current_epoch) before returning it), or use "
                    "fastsab.integrations.lightning.FastDataModule."
                )
        # NOTE: opened at the start, not at the end: a trainer that knows the epoch's length
        # takes no batch past the last, so the iteration is never seen to end
        self._open, self._set_by_trainer = True, False
