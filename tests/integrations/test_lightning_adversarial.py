"""Lightning runs stopped past an epoch's first plan chunk and resumed: the uninterrupted steps."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.integrations.lightning import FastDataModule
from tests.integrations.test_lightning import Crash, Recorder, trainer

# NOTE: 10,000 items: an epoch's first chunk is cut after 4096 items (EpochOrder.chunks_first_small),
# so the checkpoints below fall inside that small chunk, right after it and well past it
N = 10_000
SIZES = np.arange(N) * 7919 % 97 + 1


class BareRecorder(Recorder):
    """A recorder that makes its own size-aware loader in ``train_dataloader``."""

    def val_dataloader(self):
        return FastSizeAwareLoader(torch.arange(8), np.ones(8), 4)

    def train_dataloader(self):
        return FastSizeAwareLoader(torch.arange(N), SIZES, 3000, seed=4)


def data_module():
    return FastDataModule(
        train=torch.arange(N),
        val=torch.arange(8),
        sizeof={"train": SIZES, "val": np.ones(8)},
        max_total_size=3000,
        seed=4,
    )


@pytest.mark.parametrize("bare", [False, True])
@pytest.mark.parametrize("checkpoint_step", [40, 70, 80])
def test_a_checkpoint_past_the_first_chunk_resumes_the_uninterrupted_steps(tmp_path, bare, checkpoint_step):

    new = BareRecorder if bare else Recorder
    whole = new()
    trainer(tmp_path / "a", max_epochs=1).fit(whole, **({} if bare else {"datamodule": data_module()}))
    steps = [batch for _, batch in whole.train_batches]
    assert len(steps) > checkpoint_step + 10
    crashing = new(crash_at_step=checkpoint_step + 7)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=checkpoint_step, save_top_k=-1
    )
    run = trainer(tmp_path / "b", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoints])
    with pytest.raises(Crash):
        run.fit(crashing, **({} if bare else {"datamodule": data_module()}))
    (saved,) = sorted((tmp_path / "ckpt").glob(f"*step={checkpoint_step}.ckpt"))
    resumed = new()
    trainer(tmp_path / "c", max_epochs=1).fit(
        resumed, **({} if bare else {"datamodule": data_module()}), ckpt_path=saved
    )
    # invariant: step by step, the uninterrupted run's samples after the checkpoint's step
    assert [batch for _, batch in resumed.train_batches] == steps[checkpoint_step:]
