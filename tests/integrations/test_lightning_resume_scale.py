"""A Lightning fit resumed mid-epoch from a large size-aware epoch: no planning pass, the uninterrupted batches."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest

from fastsab.bench.workloads import IndexDataset, index_sizes
from fastsab.integrations.lightning import FastDataModule
from tests.integrations.test_lightning import Recorder, crash_after_checkpoint, trainer

N = 10**7
STEP = 40  # the checkpoint's step: mid-epoch (the epoch has about 120,000 steps)


class CountedIndexSizes:
    """``index_sizes``, counting the items whose size the planner read."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        self.asked += len(indices)
        return index_sizes(indices)


class SizesRead(pl.Callback):
    """The sizes read before each training step."""

    def __init__(self, sizes: CountedIndexSizes) -> None:
        self.sizes, self.read = sizes, []

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, index: int) -> None:
        self.read.append(self.sizes.asked)


@pytest.mark.slow
def test_a_fit_resumed_mid_epoch_at_scale_does_not_plan_the_epoch_again(tmp_path):
    sizes = CountedIndexSizes()

    def data() -> FastDataModule:
        return FastDataModule(train=IndexDataset(N), sizeof={"train": sizes}, max_total_size=4096, seed=3)

    # (reloaded every epoch, the training loader has a length, which Lightning reads)
    options = {"max_steps": STEP + 3, "limit_val_batches": 0, "reload_dataloaders_every_n_epochs": 1}
    whole = Recorder()
    trainer(tmp_path / "whole", **options).fit(whole, datamodule=data())
    assert len(whole.train_batches) == STEP + 3
    crashing, saved = crash_after_checkpoint(tmp_path, STEP, data, options)
    sizes.asked = 0
    resumed, read = Recorder(), SizesRead(sizes)
    trainer(tmp_path / "resumed", callbacks=[read], **options).fit(resumed, datamodule=data(), ckpt_path=saved)
    # invariant: step by step, the resumed fit trains the uninterrupted run's batches
    assert crashing.train_batches[:STEP] + resumed.train_batches == whole.train_batches
    # invariant: up to its last step, the resumed fit read the sizes of a plan chunk or two (where the
    # epoch is taken up), not the epoch's: len() came from the checkpoint's count of its batches.
    # (Lightning's teardown then reads len() of the next epoch, which the loader has moved on to.)
    assert len(read.read) == 3 and read.read[-1] < N // 100, read.read
