"""``collect_cuda_peak_alloc`` on a GPU: the peaks are the bytes the work allocated, item by item."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastsab.memory.measure import collect_cuda_peak_alloc, collect_peak_alloc

MiB = 2**20


def _allocate(device: torch.device) -> Callable[[int], int]:
    """Work on ``mib``: ``mib`` MiB, then 2 MiB more, the first freed, then ``mib`` MiB again: peak ``mib + 2``."""

    def work(mib: int) -> int:
        first = torch.empty(mib * MiB, dtype=torch.uint8, device=device)
        extra = torch.empty(2 * MiB, dtype=torch.uint8, device=device)
        del first
        again = torch.empty(mib * MiB, dtype=torch.uint8, device=device)
        return int(again.numel() + extra.numel()) // MiB

    return work


def test_peaks_are_the_bytes_allocated_over_what_was_held(device: torch.device) -> None:
    held = torch.ones(8 * MiB, dtype=torch.uint8, device=device)  # weights held through the measurement
    before = torch.cuda.memory_allocated(device)
    work = _allocate(device)
    features, peaks = collect_cuda_peak_alloc([1, 4, 16], work, device, baseline="subtract", progress=False)
    # NOTE: sizes of whole MiB are exact in the caching allocator (it rounds to 512 bytes)
    assert features == [3, 6, 18]
    assert peaks == [3 * MiB, 6 * MiB, 18 * MiB]
    absolute = collect_cuda_peak_alloc([1, 4, 16], work, device, progress=False)
    assert absolute.peaks == [before + peak for peak in peaks]
    assert torch.cuda.memory_allocated(device) == before  # every item's memory was given back
    # collect_peak_alloc hands a CUDA device over to the same collector
    assert collect_peak_alloc([4], work, device, progress=False).peaks == [6 * MiB]
    del held


def test_cleanup_runs_before_the_next_item_is_measured(device: torch.device) -> None:
    kept: list[torch.Tensor] = []
    before = torch.cuda.memory_allocated(device)

    def work(mib: int) -> int:
        kept.append(torch.empty(mib * MiB, dtype=torch.uint8, device=device))  # held past the item
        return mib

    measured = collect_cuda_peak_alloc([2, 2, 2], work, device, cleanup=kept.clear, progress=False)
    # absolute peaks: had the item's memory stayed, each would start from the last one's
    assert measured.peaks == [before + 2 * MiB] * 3


def test_an_item_that_runs_out_of_memory_is_skipped_and_the_others_measured(device: torch.device) -> None:
    total = torch.cuda.get_device_properties(device).total_memory

    def work(nbytes: int) -> int:
        return torch.empty(nbytes, dtype=torch.uint8, device=device).numel()

    items = [MiB, 2 * total, 3 * MiB]  # the second is twice the device's memory: a real out-of-memory error
    measured = collect_cuda_peak_alloc(items, work, device, baseline="subtract", progress=False)
    assert measured.skipped == [1]
    assert measured.features == [MiB, 3 * MiB] and measured.peaks == [MiB, 3 * MiB]
