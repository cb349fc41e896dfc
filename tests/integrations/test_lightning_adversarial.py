"""Lightning runs stopped past an epoch's first plan chunk and resumed: the uninterrupted steps."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from fastsab import FastSizeAwareLoader
from fastsab.integrations.lightning import FastDataModule
from fastsab.plan.shape_buckets import ShapeBuckets
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


def data_module(buckets: bool) -> FastDataModule:
    sized = {"sizeof": {"train": SIZES, "val": np.ones(8)}, "seed": 4}
    if buckets:  # a table with batch sizes bounds the batches: no max_total_size
        sized |= {"buckets": ShapeBuckets([40, 80, 100], batch_sizes=[200, 100, 64]), "partial": "keep"}
    else:
        sized["max_total_size"] = 3000
    return FastDataModule(train=torch.arange(N), val=torch.arange(8), **sized)


@pytest.mark.parametrize("source", ["data module", "bare loader", "data module with buckets"])
@pytest.mark.parametrize("checkpoint_step", [40, 70, 80])
def test_a_checkpoint_past_the_first_chunk_resumes_the_uninterrupted_steps(tmp_path, source, checkpoint_step):
    new = BareRecorder if source == "bare loader" else Recorder

    def fit(model, name, **options):
        data = {} if source == "bare loader" else {"datamodule": data_module(buckets="buckets" in source)}
        ckpt_path = options.pop("ckpt_path", None)
        trainer(tmp_path / name, max_epochs=1, **options).fit(model, **data, ckpt_path=ckpt_path)

    whole = new()
    fit(whole, "a")
    steps = [batch for _, batch in whole.train_batches]
    assert len(steps) > checkpoint_step + 10
    crashing = new(crash_at_step=checkpoint_step + 7)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=checkpoint_step, save_top_k=-1
    )
    with pytest.raises(Crash):
        fit(crashing, "b", enable_checkpointing=True, callbacks=[checkpoints])
    (saved,) = sorted((tmp_path / "ckpt").glob(f"*step={checkpoint_step}.ckpt"))
    resumed = new()
    fit(resumed, "c", ckpt_path=saved)
    # invariant: step by step, the uninterrupted run's samples after the checkpoint's step
    assert [batch for _, batch in resumed.train_batches] == steps[checkpoint_step:]
