"""The split names of the Lightning data modules, defined once for both."""

from __future__ import annotations

from enum import Enum

__all__ = ["SPLITS", "Split"]


class Split(str, Enum):
    """The splits of a data module (strings, so ``"train"`` works as a key too)."""

    train = "train"
    val = "val"
    test = "test"


#: Every split with a data loader hook of its own in Lightning: the ``Split`` names and ``predict``.
#: (``WebDataModule`` serves ``predict`` from ``test``, as bionemo does.)
SPLITS: tuple[str, ...] = (*(split.value for split in Split), "predict")
