"""Two CPU processes of Lightning DDP over a FastDataModule: ``python tests/lightning_ddp_worker.py DIR``."""

from __future__ import annotations

import sys
from collections import Counter

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist

from fastsab.integrations.lightning import FastDataModule

N = 90


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.tolist())
        return self.layer(batch.float()[:, None]).pow(2).mean()

    def on_train_epoch_end(self):
        everything = [None] * dist.get_world_size()
        dist.all_gather_object(everything, self.seen)
        if self.global_rank == 0:
            steps = {len(batches) for batches in everything}
            dealt = Counter(tuple(b) for batches in everything for b in batches)
            covered = {i for b in dealt for i in b} == set(range(N))
            repeats = sum(count - 1 for count in dealt.values())
            padded = self.trainer.datamodule.train_dataloader().loader.stats.num_padded
            print(f"DDP {'OK' if len(steps) == 1 and covered and repeats == padded else 'FAILED'} {steps} {repeats}")

    def teardown(self, stage):
        # NOTE: each process ends its process group itself, after fitting: a group left to the
        # interpreter's exit can abort the process there (a C++ thread destroyed while running)
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    sizes = np.arange(N) % 5 + 1
    data = FastDataModule(train=torch.arange(N), sizeof={"train": sizes}, max_total_size=12, seed=3)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        default_root_dir=sys.argv[1],
    )
    trainer.fit(Model(), datamodule=data)
