"""Real CUDA out-of-memory errors: recognized, retried smaller by ``adaptive.batch``, and survived by
``adaptive.run``, whose epoch still yields every sample exactly once, in the order of an epoch without them.

A step asks for a share of the device's free memory per sample, so that batches above a size ask for
more than the device has: the allocator's own error, not a raised stand-in.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader, adaptive
from fastsab.adaptive import AdaptiveOOMError
from fastsab.adaptive.oom import is_out_of_memory


def _free_bytes(device: torch.device) -> int:
    """The device's free memory now, its cache given back first."""
    gc.collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(device)[0])


def _use(nbytes: int, device: torch.device) -> torch.Tensor:
    """Allocate ``nbytes`` on the device and touch them; the 0-d sum of a few of them (an int8 1)."""
    block = torch.ones(nbytes, dtype=torch.uint8, device=device)
    return block[:4].sum()


def test_a_real_cuda_out_of_memory_error_is_recognized(device: torch.device) -> None:
    total = torch.cuda.get_device_properties(device).total_memory
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(2 * total, dtype=torch.uint8, device=device)
    assert is_out_of_memory(caught.value)
    assert str(caught.value).startswith("CUDA out of memory")


def test_adaptive_batch_halves_a_size_that_runs_out_of_device_memory(device: torch.device) -> None:
    per_sample = _free_bytes(device) // 12  # 8 samples take 2/3 of the free memory, 16 take 4/3
    before = torch.cuda.memory_allocated(device)
    tried: list[int] = []

    @adaptive.batch(initial_batch_size=64, cache=None)
    def work(batch_size: int) -> int:
        tried.append(batch_size)
        return int(_use(batch_size * per_sample, device))

    assert work() == 4  # sum of 4 ones
    assert tried == [64, 32, 16, 8]
    assert torch.cuda.memory_allocated(device) == before  # the failed attempts' memory was given back


def test_adaptive_run_survives_real_oom_and_yields_every_sample_once_in_order(device: torch.device) -> None:
    n = 96
    uninterrupted = [i for batch in FastLoader(torch.arange(n), 16, seed=0) for i in batch.tolist()]
    loader = FastLoader(torch.arange(n), 16, seed=0, device=device)
    per_sample = _free_bytes(device) // 12  # batches of 16 ask for 4/3 of the free memory, of 8 for 2/3
    seen: list[int] = []

    def step(batch: torch.Tensor) -> int:
        assert batch.device == device
        touched = int(_use(len(batch) * per_sample, device))
        seen.extend(batch.tolist())
        return touched

    results = list(adaptive.run(loader, step))
    assert seen == uninterrupted  # invariant: every sample once, in the order of the epoch without errors
    assert results == [4] * (n // 8)
    assert loader.stats is not None and [change[1:] for change in loader.stats.limit_changes] == [(16, 8)]


def test_a_size_aware_epoch_survives_real_oom_without_loss_or_repeat(device: torch.device) -> None:
    n = 300
    sizes = np.random.default_rng(0).integers(1, 17, n)
    uninterrupted = [i for batch in FastSizeAwareLoader(torch.arange(n), sizes, 64, seed=0) for i in batch.tolist()]
    loader = FastSizeAwareLoader(torch.arange(n), sizes, 64, seed=0, device=device)
    unit = _free_bytes(device) // 48  # a batch costing 64 asks for 4/3 of the free memory, one costing 32 for 2/3
    seen: list[int] = []

    def step(batch: torch.Tensor) -> None:
        _use(int(sizes[batch.cpu().numpy()].sum()) * unit, device)
        seen.extend(batch.tolist())

    list(adaptive.run(loader, step))
    assert seen == uninterrupted  # invariant: every sample once, in the epoch's order
    assert loader.stats is not None and loader.stats.limit_changes and loader.stats.num_splits >= 1


def test_a_single_sample_beyond_the_device_is_an_error_naming_it(device: torch.device) -> None:
    total = torch.cuda.get_device_properties(device).total_memory

    def step(batch: torch.Tensor) -> None:
        _use(2 * total, device)

    with pytest.raises(AdaptiveOOMError, match=r"step on the sample \d+ ran out of memory"):
        list(adaptive.run(FastLoader(torch.arange(4), 2, device=device), step))
