"""Worker of the multi-process DDP tests: run as ``python tests/position/ddp_worker.py WORLD_SIZE INIT_FILE``."""

from __future__ import annotations

import gc
import os
import sys
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastsab import FastSizeAwareLoader

N = 600


def make_loader() -> FastSizeAwareLoader:
    lengths = np.random.default_rng(0).lognormal(np.log(30), 0.9, N).clip(1, 300).astype(np.int64)
    data = {"index": torch.arange(N), "x": torch.randn(N, 8, generator=torch.Generator().manual_seed(0))}
    return FastSizeAwareLoader(
        data, lengths, 1100, seed=11
    )  # 25 global batches: 2 and 3 ranks pad  # rank and world size from torch.distributed


def gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def covers_once(per_rank: list[tuple[list[list[int]], list[int]]]) -> bool:
    """Every index exactly once over all ranks, besides the repeats each rank reports as padding."""
    seen = Counter(i for batches, _ in per_rank for batch in batches for i in batch)
    padded = Counter(i for _, repeats in per_rank for i in repeats)
    return seen == Counter(range(N)) + padded


def worker(rank: int, world_size: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    loader = make_loader()
    assert (loader.rank, loader.world_size) == (rank, world_size)

    # 1. equal steps, checked with an all_reduce; the ranks' union covers the epoch
    batches = [b["index"].tolist() for b in loader]
    steps = torch.tensor([len(batches)])
    low, high = steps.clone(), steps.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    everything = gather((batches, loader.stats.padded))
    if rank == 0:
        print(f"STEPS {low.item()} {high.item()} COVER {covers_once(everything)}", flush=True)
        print(f"PADDED {loader.stats.num_padded}", flush=True)

    # 2. a short real DDP training loop over variable-size batches
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader.set_epoch(1)
    for batch in loader:
        optimizer.zero_grad()
        model(batch["x"]).pow(2).mean().backward()
        optimizer.step()
    weights = gather(model.module.weight.detach().clone())
    if rank == 0:
        print(f"TRAINED {all(torch.equal(weights[0], w) for w in weights)}", flush=True)

    # 3. save after 3 steps, resume on fresh loaders: every item exactly once (+ padding)
    loader.set_epoch(2)
    iterator = iter(loader)
    before = [next(iterator)["index"].tolist() for _ in range(3)]
    state = loader.state_dict()
    resumed = make_loader()
    resumed.load_state_dict(state)
    after = [b["index"].tolist() for b in resumed]
    everything = gather((before + after, resumed.stats.padded))
    if rank == 0:
        print(f"RESUMED {covers_once(everything) and resumed.stats.num_padded > 0}", flush=True)
    # NOTE: drop the DDP model (its reducer holds gloo work) and line the ranks up before
    # the process group goes: tearing gloo down under live work aborts the process
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    # NOTE: leave without the interpreter's teardown: under load, gloo's C++ threads have been
    # seen to abort the process ("terminate called without an active exception") after every
    # check had passed; the results are printed and the group is gone, nothing is lost.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    world = int(sys.argv[1])
    mp.spawn(worker, args=(world, sys.argv[2]), nprocs=world, join=True)
