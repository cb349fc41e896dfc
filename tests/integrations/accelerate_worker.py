"""Training runs under Hugging Face Accelerate, by ``tests/integrations/test_accelerate.py``.

``python tests/integrations/accelerate_worker.py MODE KIND DIR [STOP]``, under ``torchrun`` for several
processes. MODE: ``train`` runs 3 epochs (with STOP: saves the state after that many steps
and exits), ``resume`` loads that state in new processes and runs to the end, ``naive``
iterates ``accelerator.prepare(loader.data_loader())``. KIND: ``fixed`` (a FastLoader),
``sized`` (a FastSizeAwareLoader) or ``dispatch`` (a FastLoader, and accelerate's ``dispatch_batches``). Each process writes ``DIR/MODE_RANK.json``: per step its
epoch, sample indices and whether gradients were synced, and the trained weights.
``FASTSAB_WORKER_N`` (240 by default) sets the number of samples, the batch size and budget
growing with it (the same number of steps).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.integrations.accelerate import prepare_loader

N, EPOCHS, ACCUMULATE = int(os.environ.get("FASTSAB_WORKER_N", 240)), 3, 4
SCALE = N // 240
DATA = {"index": torch.arange(N), "x": torch.randn(N, 8, generator=torch.Generator().manual_seed(0))}


def make_loader(kind: str) -> Any:
    """After Accelerator(): the loaders read rank and world size from torch.distributed."""
    if kind in ("fixed", "dispatch"):
        return FastLoader(DATA, 7 * SCALE, seed=5)  # 35 batches; 18 steps per rank under 2 processes
    lengths = np.random.default_rng(1).integers(1, 40, N)
    return FastSizeAwareLoader(DATA, lengths, 150 * SCALE, seed=5)


def main(mode: str, kind: str, out: Path, stop: int | None) -> Accelerator:
    dispatch = DataLoaderConfiguration(dispatch_batches=kind == "dispatch")
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATE, dataloader_config=dispatch)
    record: dict[str, Any] = {"steps": []}
    if mode == "naive":
        planned = accelerator.prepare(make_loader(kind).data_loader())
        record["len"] = len(planned)
        if kind == "dispatch":  # only the main process reads the plan; the others wait for its batches
            print(sum(1 for _ in planned))
            return accelerator
        try:
            record["steps"] = [[0, batch["index"].tolist(), None] for batch in planned]
        except RuntimeError as error:
            record["error"] = str(error)
        write(out, mode, accelerator, record)
        return accelerator
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = prepare_loader(accelerator, make_loader(kind))
    model, optimizer = accelerator.prepare(model, optimizer)
    if mode == "resume":
        accelerator.load_state(str(out / "checkpoint"))
    record["len"] = len(loader)
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch["x"].device.type == accelerator.device.type
            with accelerator.accumulate(model):
                accelerator.backward(model(batch["x"]).pow(2).mean())
                optimizer.step()
                optimizer.zero_grad()
            record["steps"].append([epoch, batch["index"].tolist(), accelerator.sync_gradients])
            if stop is not None and len(record["steps"]) == stop:
                accelerator.save_state(str(out / "checkpoint"))
                write(out, mode, accelerator, record)
                return accelerator  # the run is interrupted here
    record["weight"] = accelerator.unwrap_model(model).weight.detach().flatten().tolist()
    write(out, mode, accelerator, record)
    return accelerator


def write(out: Path, mode: str, accelerator: Accelerator, record: dict[str, Any]) -> None:
    (out / f"{mode}_{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    ended = main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
    # NOTE: the DDP model's reducer holds gloo work: with main's frame gone, accelerate's own
    # references are dropped before the process group ends (else gloo may abort at exit)
    ended.free_memory()
    gc.collect()
    ended.end_training()
