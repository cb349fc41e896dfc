"""Worker of the peek test: ``python tests/position/ddp_peek_worker.py INIT_FILE OUT_FILE`` (2 ranks, gloo).

Each rank records its sample indices per epoch and step, without ``set_epoch``: an
uninterrupted run, the same with rank 1 peeking (``next(iter(loader))``) before the first epoch
and between two epochs, and a run resumed mid-epoch on which rank 1 peeks before going on.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastsab import FastSizeAwareLoader

N = 400
EPOCHS = 3


def make_loader() -> FastSizeAwareLoader:
    lengths = np.random.default_rng(1).lognormal(np.log(30), 0.9, N).clip(1, 300).astype(np.int64)
    return FastSizeAwareLoader(torch.arange(N), lengths, 900, seed=5)  # rank and world size from the group


def epoch_batches(loader: FastSizeAwareLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def worker(rank: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    plain = make_loader()
    uninterrupted = [epoch_batches(plain) for _ in range(EPOCHS)]

    peeked = make_loader()
    runs = []
    for epoch in range(EPOCHS):
        if rank == 1 and epoch != 1:
            next(iter(peeked))  # a look at a batch, before the epoch and between epochs
        runs.append(epoch_batches(peeked))

    saver = make_loader()
    saver.set_epoch(1)
    iterator = iter(saver)
    for _ in range(3):
        next(iterator)
    resumed = make_loader()
    resumed.load_state_dict(saver.state_dict())
    if rank == 1:
        next(iter(resumed))
    rest = [epoch_batches(resumed), epoch_batches(resumed)]

    results: list[object] = [None, None]
    dist.all_gather_object(results, {"uninterrupted": uninterrupted, "peeked": runs, "resumed": rest})
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    # NOTE: leave without the interpreter's teardown, as tests/position/ddp_worker.py does (gloo threads)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2, join=True)
