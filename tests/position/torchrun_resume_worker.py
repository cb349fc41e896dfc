"""A loop under torchrun (or one plain process) that saves its loader's state or resumes from it.

``python tests/position/torchrun_resume_worker.py DIR STOP`` runs epoch 0 of a size-aware
loader over ``N`` samples, saving the state after ``STOP`` steps (``STOP`` 0: the whole epoch,
no state). ``... DIR resume`` loads ``DIR/state.rank0.json`` and runs the rest of the epoch.
Each rank writes its steps' sample indices to ``DIR/<STOP or resume>.rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fastsab import FastSizeAwareLoader

N = 20_000  # an epoch's first plan chunk is its first 4096 samples


def main(out: Path, mode: str) -> None:
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    sizes = np.arange(N) * 7919 % 97 + 1
    sizes[::53] = 4000  # oversize: skipped
    loader = FastSizeAwareLoader(torch.arange(N), sizes, 3000, seed=3, balance=True, even_batches="pad")
    if mode == "resume":
        loader.load_state_dict(json.loads((out / "state.rank0.json").read_text()))
    stop = 0 if mode == "resume" else int(mode)
    steps = []
    for batch in loader:
        steps.append(batch.tolist())
        if len(steps) == stop:
            (out / f"state.rank{loader.rank}.json").write_text(json.dumps(loader.state_dict()))
            break
    (out / f"{mode}.rank{loader.rank}.json").write_text(json.dumps(steps))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
