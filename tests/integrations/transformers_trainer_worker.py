"""Trains a tiny model with FastTrainer and records the samples of every step.

``python tests/integrations/transformers_trainer_worker.py DIR KIND PHASE [STOP]`` (or under ``torchrun``):

- ``KIND``: ``fixed`` (FastLoader, batch size 4), ``sized`` (FastSizeAwareLoader, whose
  epochs differ in their number of batches) or ``mixed`` (a FastSizeAwareLoader over a ``Mixture``
  of ``web``, whose sample ``i`` has index ``i``, and ``code``, a quarter as many, index
  ``CODE + i``, upsampled: ``stop="last"``), with gradient accumulation over 2 batches.
- ``PHASE``: ``first`` runs the whole training into ``DIR/full``, then the same training into
  ``DIR/stopped``, where the process ends right after the checkpoint of step ``STOPS[...]``;
  ``resume`` resumes ``DIR/stopped`` from that checkpoint in this new process. ``STOP`` gives
  another step to stop after.

Each rank writes one line per batch the model ran, ``{"epoch", "step", "indices"}``, to
``DIR/<run>.rank<R>.jsonl`` (the resumed run appends to the stopped one's); ``DIR/plan.rank<R>.json``
holds the batches the loader alone gives the rank in each epoch, and ``DIR/meta.json`` the steps
of each epoch, the step the interrupted run stopped after, the indices every epoch holds once
(``once``) and those it holds at least once (``also``: an upsampled source's). With
``FASTSAB_PLAIN_TRAINER=1`` the loader is handed to a plain ``Trainer`` (its
``get_train_dataloader`` returns it), which the tests show loses exactness. ``FASTSAB_WORKER_N``
(48 by default) sets the number of samples, the batch size and budget growing with it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments

from fastsab import FastLoader, FastSizeAwareLoader, Mixture
from fastsab.integrations.transformers import FastTrainer

N = int(os.environ.get("FASTSAB_WORKER_N", 48))
SCALE = N // 48
EPOCHS = 3
ACCUMULATE = 2
# the optimizer step whose checkpoint the interrupted run stops after, by kind and world size: in
# epoch 1 (fixed) or 2 (sized), where Trainer's count from the first epoch's length is wrong
STOPS = {("fixed", 1): 8, ("fixed", 2): 4, ("sized", 1): 30, ("sized", 2): 16, ("mixed", 1): 30, ("mixed", 2): 16}
CODE = 10**6  # the index of the mixture's code sample i is CODE + i


class Recorder(torch.nn.Module):
    """A model of one weight that writes down the sample indices of each batch it runs."""

    def __init__(self, record: Path) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.record = record
        self.trainer: Trainer | None = None

    def forward(self, index: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
        assert self.trainer is not None
        loader = self.trainer.train_loader if isinstance(self.trainer, FastTrainer) else self.trainer.plain_loader
        line = {"epoch": loader.stats.epoch, "step": self.trainer.state.global_step, "indices": index.tolist()}
        with self.record.open("a") as file:
            file.write(json.dumps(line) + "\n")
        return {"loss": (self.weight * x).pow(2).mean()}


class StopAfterSave(TrainerCallback):
    """Ends the process right after the checkpoint of step ``stop`` is written, as a crash would."""

    def __init__(self, stop: int) -> None:
        self.stop = stop

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.stop:
            if dist.is_available() and dist.is_initialized():
                dist.barrier()  # every rank has written its part of the checkpoint
            os._exit(0)


class PlainTrainer(Trainer):
    """The loader handed to Trainer as it is: what FastTrainer replaces."""

    def __init__(self, *args, train_loader, **kwargs):
        super().__init__(*args, **kwargs)
        self.plain_loader = train_loader

    def get_train_dataloader(self):
        return self.plain_loader


def make_loader(kind: str, **ranks: int) -> FastLoader | FastSizeAwareLoader:
    """The loader of ``kind`` (``ranks``: ``rank=`` and ``world_size=``, else torch.distributed's)."""
    data = {"index": torch.arange(N), "x": torch.linspace(0, 1, N)}
    if kind == "fixed":
        return FastLoader(data, 4 * SCALE, seed=1, **ranks)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 9, N)
    if kind == "mixed":  # epochs of 42, 42 and 43 batches on one rank (code: 21 or 22 samples of 12 each)
        code = {"index": CODE + torch.arange(N // 4), "x": torch.linspace(0, 1, N // 4)}
        mixture = Mixture({"web": data, "code": code}, weights={"web": 0.6, "code": 0.4}, stop="last")
        costs = {"web": sizes, "code": rng.integers(3, 9, N // 4)}
        return FastSizeAwareLoader(mixture, costs, max_total_size=11 * SCALE, seed=0, **ranks)
    return FastSizeAwareLoader(data, sizes, max_total_size=11 * SCALE, seed=0, **ranks)


def train(root: Path, kind: str, run: str, resume: bool, stopping: bool, stop: int | None) -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    stop = stop or STOPS[kind, world_size]
    args = TrainingArguments(
        output_dir=str(root / run),
        use_cpu=True,
        report_to=[],
        save_strategy="steps",
        save_steps=stop,
        num_train_epochs=EPOCHS,
        gradient_accumulation_steps=ACCUMULATE,
        learning_rate=0.01,
        logging_steps=1,  # every step logs its epoch (with the fraction), compared between the runs
        disable_tqdm=True,
        seed=0,
        ddp_backend="gloo" if world_size > 1 else None,
        ddp_find_unused_parameters=False,
    )
    loader = make_loader(kind)  # after TrainingArguments, which starts torch.distributed
    rank = loader.rank
    model = Recorder(root / f"{run}.rank{rank}.jsonl")
    plain = os.environ.get("FASTSAB_PLAIN_TRAINER") == "1"
    trainer = (PlainTrainer if plain else FastTrainer)(
        model=model, args=args, train_loader=loader, callbacks=[StopAfterSave(stop)] if stopping else []
    )
    model.trainer = trainer
    if run == "full":  # what the loader alone gives this rank, epoch by epoch, from a copy of it
        plan = make_loader(kind)
        epochs = []
        for epoch in range(EPOCHS):
            plan.set_epoch(epoch)
            epochs.append([batch["index"].tolist() for batch in plan])
        (root / f"plan.rank{rank}.json").write_text(json.dumps(epochs))
        steps = [loader.epoch_steps(e) for e in range(EPOCHS)]
        also = list(range(CODE, CODE + N // 4)) if kind == "mixed" else []
        meta = {"epoch_steps": steps, "stop": stop, "once": list(range(N)), "also": also}
        (root / "meta.json").write_text(json.dumps(meta))
    trainer.train(resume_from_checkpoint=str(root / run / f"checkpoint-{stop}") if resume else None)


if __name__ == "__main__":
    root, kind, phase = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    stop = int(sys.argv[4]) if len(sys.argv) > 4 else None
    if phase == "first":
        train(root, kind, "full", resume=False, stopping=False, stop=stop)
        train(root, kind, "stopped", resume=False, stopping=True, stop=stop)
    else:
        train(root, kind, "stopped", resume=True, stopping=False, stop=stop)
    if dist.is_available() and dist.is_initialized():
        # NOTE: the trainers and their DDP models (whose reducers hold gloo work) sit in
        # reference cycles: collected before the group ends, or gloo may abort at exit
        gc.collect()
        dist.destroy_process_group()
