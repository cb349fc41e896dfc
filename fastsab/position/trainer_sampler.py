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

``lightning_read`` tells a loader that Lightning's fit reads its ``len()`` as the length of a
training loader, what for and how often that trainer loads the loader again: a loader whose
epochs differ in length gives no length to a trainer that would keep it for later epochs (as
``FastDataModule`` does), and each epoch's own to the fetcher that starts its iteration.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from types import FrameType
from typing import NamedTuple

__all__ = ["CountedLength", "LightningRead", "TrainerSampler", "lightning_read", "loaded_at_epoch_end"]

#: The modules whose frames are Lightning's: the ``lightning`` package and the standalone ones.
_LIGHTNING = ("lightning.", "lightning_fabric.", "pytorch_lightning.")
#: How many frames from ``len()``'s caller Lightning's loop is looked for (it is 2 to 9 up).
_DEPTH = 16

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


class LightningRead(NamedTuple):
    """A ``len()`` that Lightning's fit reads of a training loader."""

    #: The trainer's ``reload_dataloaders_every_n_epochs``: how often it loads the loader again (0: never).
    reload: int
    #: Read to count the steps of the epochs to come (kept until the next reload); else read by the
    #: data fetcher as an epoch's iteration is made, to know its last batch.
    counts_epochs: bool
    #: Where the fit loop reads as it loads the loader: the epoch it sets next (``None`` elsewhere).
    epoch: int | None
    #: A trainer option that takes a fraction of the epoch's length (``"limit_train_batches=0.5"``), or ``None``.
    fraction: str | None = None


def lightning_read(loader: object, caller: FrameType | None) -> LightningRead | None:
    """What Lightning's fit reads ``len(loader)`` for, where ``loader`` is one of its training loaders.

    Lightning's fit loop reads the training loader's ``len()`` when it loads the loader (also before it
    sets the epoch to run), and keeps it as every epoch's number of steps until it loads the loader
    again (every ``reload_dataloaders_every_n_epochs`` epochs; never with 0). Its data fetcher reads it
    each time it makes an epoch's iteration, to know the epoch's last batch.

    Args:
        loader: The loader whose ``len()`` is read.
        caller: The frame that called ``len()``.

    Returns:
        The read, where ``caller`` is Lightning's and a Lightning loop up the stack fits with
        ``loader`` as (one of) its training loaders; ``None`` where anything else reads the length
        (the user's code, another trainer, an evaluation loop).
    """
    # NOTE: the trainer is found on the stack because it gives a bare loader no other sign: it
    # reads len() before it calls anything else of it. Only Lightning's own objects are read
    if caller is None or not caller.f_globals.get("__name__", "").startswith(_LIGHTNING):
        return None
    frame: FrameType | None = caller
    below: FrameType | None = None  # the frame the one looked at called
    for _ in range(_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if type(owner).__module__.startswith(_LIGHTNING):
            trainer = getattr(owner, "trainer", None)
            reload = getattr(trainer, "reload_dataloaders_every_n_epochs", None)
            if isinstance(reload, int) and type(trainer).__module__.startswith(_LIGHTNING):
                if not _holds(getattr(trainer, "train_dataloader", None), loader):
                    return None
                # NOTE: the epoch Lightning passes to set_epoch once the loader is loaded
                progress = getattr(getattr(owner, "epoch_progress", None), "current", None)
                epoch = getattr(progress, "processed", None)
                return LightningRead(
                    reload,
                    fraction=_fraction(trainer),
                    # (the loop's own reads go through Lightning's functions; its fetcher's through its methods)
                    counts_epochs=below is None or "self" not in below.f_locals,
                    epoch=epoch if isinstance(epoch, int) and frame.f_code.co_name == "setup_data" else None,
                )
        frame, below = frame.f_back, frame
    return None


def _fraction(trainer: object) -> str | None:
    """The option of ``trainer`` that takes a fraction of the training loader's length, as ``name=value``."""
    for name in ("limit_train_batches", "val_check_interval"):
        value = getattr(trainer, name, None)
        # NOTE: 1.0 is the whole epoch, which Lightning takes without a length; an int counts batches
        if isinstance(value, float) and value != 1.0:
            return f"{name}={value}"
    return None


def _holds(loaders: object, loader: object) -> bool:
    """Whether ``loaders`` (a loader, or a list, tuple or mapping of them, nested) is or holds ``loader``."""
    if loaders is loader:
        return True
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    return isinstance(loaders, (list, tuple)) and any(_holds(each, loader) for each in loaders)


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
        self.withheld = False  # the trainer was told the loader has no length: it counts no steps

    def withhold(self, withheld: bool) -> bool:
        """Whether the trainer is told that the loader has no length; return whether it was told so before.

        A trainer told so runs each epoch to its end: it counts nothing, and the ``len()`` that other
        code reads is not its count.
        """
        before, self.withheld = self.withheld, withheld
        if withheld:
            self.counted = None
        return before

    def set_by_trainer(self) -> None:
        """The trainer set the coming epoch (through the loader's ``sampler``)."""
        # NOTE: a trainer that reads len() again after setting the epoch (Lightning, to know its
        # last batch) still stops at the length it read first: later reads do not count
        self._open, self._set_by_trainer = False, True

    def read(self, length: int, *, counted: bool = False) -> int:
        """Note ``length``, a ``len()`` the loader answered (``counted``: the one the trainer counts); return it."""
        if counted or (self._open and not self.withheld):
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
                    "Its epochs differ in length (size-aware batches, or a mixture's epochs): give the trainer a "
                    "loader for each epoch (Trainer(reload_dataloaders_every_n_epochs=1), and in train_dataloader() "
                    "call loader.set_epoch(self.trainer.current_epoch) before returning it), or use "
                    "fastsab.integrations.lightning.FastDataModule."
                )
        # NOTE: opened at the start, not at the end: a trainer that knows the epoch's length
        # takes no batch past the last, so the iteration is never seen to end
        self._open, self._set_by_trainer = True, False
