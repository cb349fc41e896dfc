"""Measuring the peak memory that a piece of work allocates, per data item.

:func:`collect_cuda_peak_alloc` is the bionemo API: it reads the CUDA caching allocator's
peak (``allocated_bytes.all.peak``) around ``work(data)`` for each item.
:func:`collect_peak_alloc` offers the same contract on the CPU, where torch keeps no
allocator statistics: it records the allocator's signed allocation events with the torch
profiler, in time order, and takes the maximum of their running sum. For a CUDA device it
hands over to :func:`collect_cuda_peak_alloc`.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal

import torch
from torch.profiler import ProfilerActivity, profile

from fastsab._checks import check_choice
from fastsab.oom import is_out_of_memory

__all__ = ["Measurements", "collect_cuda_peak_alloc", "collect_peak_alloc", "profile_peak_bytes"]

Baseline = Literal["absolute", "subtract"]


class Measurements(tuple):
    """``(features, peaks)`` as the bionemo API returns them, plus what was skipped.

    Unpacks as a pair: ``features, peaks = collect_cuda_peak_alloc(...)``.

    Attributes:
        features: What ``work`` returned for each measured item.
        peaks: Peak allocated bytes of each measured item.
        skipped: Positions (in iteration order) of the items that ran out of memory.
    """

    skipped: list[int]

    def __new__(cls, features: list[Any], peaks: list[int], skipped: list[int]) -> Measurements:
        result = super().__new__(cls, (features, peaks))
        result.skipped = skipped
        return result

    @property
    def features(self) -> list[Any]:
        return self[0]

    @property
    def peaks(self) -> list[int]:
        return self[1]


def _collect(
    dataset: Iterable[Any],
    measure: Callable[[Any], tuple[Any, int]],
    cleanup: Callable[[], None] | None,
    release: Callable[[], None],
) -> Measurements:
    """The loop both collectors share: measure each item, skip out-of-memory ones, clean up."""
    features: list[Any] = []
    peaks: list[int] = []
    skipped: list[int] = []
    # NOTE: no enumerate(): it keeps its last (position, item) tuple alive, which would hold
    # the item's memory through cleanup and into the next measurement.
    position = -1
    for data in dataset:
        position += 1
        try:
            feature, peak = measure(data)
            features.append(feature)
            peaks.append(peak)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            skipped.append(position)
            print(f"Out of memory at item {position}, skipping it: {error}", file=sys.stderr, flush=True)
        finally:
            # drop this frame's references first, so that cleanup, gc and the device's cache
            # give the item's memory back before the next one
            data = feature = None
            if cleanup is not None:
                cleanup()
            gc.collect()
            release()
    return Measurements(features, peaks, skipped)


def collect_cuda_peak_alloc(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    device: torch.device | str,
    cleanup: Callable[[], None] | None = None,
    *,
    baseline: Baseline = "absolute",
) -> Measurements:
    """Peak CUDA memory allocated while ``work`` runs on each item of ``dataset``.

    For each item: the peak statistics are reset, ``work(data)`` runs, and the allocator's
    ``allocated_bytes.all.peak`` is read. Then, even if ``work`` failed, the references to
    the item and its feature are dropped, ``cleanup()`` runs, garbage is collected and the
    cache is emptied, so the next item starts from the same state. Items whose ``work``
    runs out of memory are skipped and reported (on stderr and in ``.skipped``); other
    errors propagate. The first items may show smaller peaks while torch initializes
    internal buffers: consider discarding them.

    Args:
        dataset: The items.
        work: Runs the workload on an item and returns its feature (e.g. its length).
        device: The CUDA device to measure.
        cleanup: Called after each item, before garbage collection and measuring.
        baseline: ``"absolute"`` reports the peak as the allocator sees it (including
            weights and optimizer state held before the item); ``"subtract"`` reports the
            increment over the memory allocated just before the item, which is what a
            per-item memory model needs.

    Returns:
        :class:`Measurements`: ``(features, peaks)`` with ``.skipped``.

    Raises:
        ValueError: If ``device`` is not a CUDA device, or ``baseline`` is unknown.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {str(device)!r}; use collect_peak_alloc for the CPU.")
    check_choice("baseline", baseline, ("absolute", "subtract"))

    def measure(data: Any) -> tuple[Any, int]:
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device) if baseline == "subtract" else 0
        feature = work(data)
        return feature, int(torch.cuda.memory_stats(device)["allocated_bytes.all.peak"]) - held

    def release() -> None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    return _collect(dataset, measure, cleanup, release)


def profile_peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()`` under the torch profiler; return its result and the CPU peak in bytes.

    The peak is the maximum running sum of the CPU allocator's signed allocation events
    (in time order), i.e. the most memory ``fn`` held at once above what was allocated
    before it started (never below 0).

    Examples:
        >>> def work():
        ...     a = torch.empty(4 * 2**20, dtype=torch.uint8)
        ...     b = torch.empty(4 * 2**20, dtype=torch.uint8)
        ...     del a
        ...     return torch.empty(8 * 2**20, dtype=torch.uint8).numel()
        >>> profile_peak_bytes(work)[1] == 12 * 2**20
        True
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:  # pragma: no cover - depends on the torch build
        raise RuntimeError("this torch build's profiler does not expose memory events (kineto_results).")
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    )
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return result, peak


def collect_peak_alloc(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    device: torch.device | str = "cpu",
    cleanup: Callable[[], None] | None = None,
    *,
    baseline: Baseline = "subtract",
) -> Measurements:
    """Peak memory allocated while ``work`` runs on each item, on the CPU or a CUDA device.

    The same contract as :func:`collect_cuda_peak_alloc`. On the CPU the peak is measured
    with :func:`profile_peak_bytes`: it is the increment over the memory held before the
    item (``baseline="subtract"``); torch keeps no absolute CPU allocator statistics, so
    ``baseline="absolute"`` is refused there. CUDA devices are measured by
    :func:`collect_cuda_peak_alloc`.

    Examples:
        >>> features, peaks = collect_peak_alloc([1, 2], lambda n: torch.zeros(n, 2**18).numel())
        >>> features, [p // 2**20 for p in peaks]
        ([262144, 524288], [1, 2])

    Raises:
        ValueError: For a device that is neither the CPU nor CUDA, or
            ``baseline="absolute"`` on the CPU.
    """
    device = torch.device(device)
    check_choice("baseline", baseline, ("absolute", "subtract"))
    if device.type == "cuda":
        return collect_cuda_peak_alloc(dataset, work, device, cleanup, baseline=baseline)
    if device.type != "cpu":
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {str(device)!r}.")
    if baseline != "subtract":
        raise ValueError(
            "baseline='absolute' cannot be measured on the CPU (torch keeps no CPU allocator statistics); "
            "use baseline='subtract'."
        )
    return _collect(dataset, lambda data: profile_peak_bytes(partial(work, data)), cleanup, lambda: None)
