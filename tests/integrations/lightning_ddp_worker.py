"""Two CPU processes of Lightning DDP: ``python tests/integrations/lightning_ddp_worker.py DIR [bare]``.

Without ``bare``: one epoch over a FastDataModule. With ``bare``: a bare FastSizeAwareLoader
from ``train_dataloader()``, over epochs of different lengths, crashed and resumed from its
last mid-epoch checkpoint; each rank's per-step batches are compared with the uninterrupted
epochs of that rank's loader.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist

from fastsab import FastSizeAwareLoader
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


class Crash(Exception):
    pass


class BareLoaderModel(pl.LightningModule):
    """Builds a bare loader for the trainer's epoch; each rank writes the batches of its steps to ``DIR/RUN``."""

    def __init__(self, out: Path, crash_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out, self.crash_at_step = out, crash_at_step

    def train_dataloader(self):
        loader = bare_loader(self.global_rank)
        loader.set_epoch(self.trainer.current_epoch)
        return loader

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_at_step:
            raise Crash("a crash in the middle of an epoch")
        with open(self.out / f"rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps([self.current_epoch, batch.tolist()]) + "\n")
        return self.layer(batch.float()[:, None]).pow(2).mean()

    teardown = Model.teardown

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def bare_loader(rank: int) -> FastSizeAwareLoader:
    # seed 8: epochs of 14, 13 and 13 steps on 2 ranks
    return FastSizeAwareLoader(torch.arange(N), np.arange(N) % 5 + 1, 12, seed=8, rank=rank, world_size=2)


def uninterrupted(rank: int) -> list[list]:
    loader = bare_loader(rank)
    return [[epoch, batch.tolist()] for epoch in range(3) for batch in loader]


def bare(root: Path) -> None:
    """Crashed at step 22 and resumed from step 20 (in epoch 1): the steps of the uninterrupted epochs."""
    options = {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp_spawn",
        "max_epochs": 3,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": root,
    }
    runs = {name: root / name for name in ("crash", "resumed")}
    for path in runs.values():
        path.mkdir()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=4, save_top_k=-1)
    try:
        pl.Trainer(callbacks=[checkpoints], **options).fit(BareLoaderModel(runs["crash"], crash_at_step=22))
    except Exception as error:  # the spawned processes' Crash, as the launcher re-raises it
        assert "a crash in the middle of an epoch" in str(error), error
    saved = root / "ckpt" / "epoch=1-step=20.ckpt"
    pl.Trainer(enable_checkpointing=False, **options).fit(BareLoaderModel(runs["resumed"]), ckpt_path=saved)

    def steps(run: str, rank: int) -> list[list]:
        return [json.loads(line) for line in (runs[run] / f"rank{rank}.jsonl").read_text().splitlines()]

    for rank in range(2):
        whole, crashed, resumed = uninterrupted(rank), steps("crash", rank), steps("resumed", rank)
        lengths = [sum(1 for epoch, _ in whole if epoch == e) for e in range(3)]
        assert lengths == [14, 13, 13], lengths  # epochs of different lengths
        assert len(crashed) == 22 and crashed[:20] + resumed == whole, f"rank {rank}: {crashed[:20] + resumed}"
    print("BARE DDP OK")


class ModuleModel(BareLoaderModel):
    """The model of :func:`resized`: its data comes from a FastDataModule."""

    train_dataloader = None  # type: ignore[assignment]


def resized(root: Path) -> None:
    """A FastDataModule run on 2 processes crashed at step 10, resumed from step 8 on 1: each sample once."""
    options = {
        "accelerator": "cpu",
        "max_epochs": 2,
        "reload_dataloaders_every_n_epochs": 1,
        "use_distributed_sampler": False,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": root,
    }

    def data() -> FastDataModule:
        return FastDataModule(train=torch.arange(N), sizeof={"train": np.arange(N) % 5 + 1}, max_total_size=12, seed=8)

    (root / "crash").mkdir()
    (root / "resumed").mkdir()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=4, save_top_k=-1)
    trainer = pl.Trainer(devices=2, strategy="ddp_spawn", callbacks=[checkpoints], **options)
    try:
        trainer.fit(ModuleModel(root / "crash", crash_at_step=10), datamodule=data())
    except Exception as error:
        assert "a crash in the middle of an epoch" in str(error), error
    saved = root / "ckpt" / "epoch=0-step=8.ckpt"
    one = pl.Trainer(devices=1, enable_checkpointing=False, **options)
    one.fit(ModuleModel(root / "resumed"), datamodule=data(), ckpt_path=saved)

    def steps(run: str, rank: int) -> list[list]:
        return [json.loads(line) for line in (root / run / f"rank{rank}.jsonl").read_text().splitlines()]

    before = [i for rank in range(2) for _, batch in steps("crash", rank)[:8] for i in batch]
    resumed = steps("resumed", 0)
    after = [i for epoch, batch in resumed if epoch == 0 for i in batch]
    seen = Counter(before + after)
    assert seen == Counter(range(N)), f"lost {set(range(N)) - set(seen)}, repeated {seen - Counter(range(N))}"
    alone = FastSizeAwareLoader(torch.arange(N), np.arange(N) % 5 + 1, 12, seed=8)
    alone.set_epoch(1)
    assert [batch for epoch, batch in resumed if epoch == 1] == [b.tolist() for b in alone]
    print("RESIZED OK")


if __name__ == "__main__":
    if sys.argv[2:] == ["bare"]:
        bare(Path(sys.argv[1]))
        sys.exit()
    if sys.argv[2:] == ["resized"]:
        resized(Path(sys.argv[1]))
        sys.exit()
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
