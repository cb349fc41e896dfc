"""Measuring the peak memory that a piece of work allocates, per data item.

``collect_cuda_peak_alloc`` is the bionemo API: it reads the CUDA caching allocator's
peak (``allocated_bytes.all.peak``) around ``work(data)`` for each item.
``collect_peak_alloc`` offers the same contract on the CPU, where torch keeps no
allocator statistics: it records the allocator's signed allocation events with torch's CPU
profiler, in time order, and takes the maximum of their running sum. For a CUDA device it
hands over to ``collect_cuda_peak_alloc``.

Both collectors show a progress bar over the items on a terminal (``progress=False`` turns
it off; where stderr is not a terminal, e.g. a log file or CI, nothing is drawn) and print
nothing else, except a line for each item skipped for running out of memory.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from functools import partial
from typing import Any, Literal

import torch
from torch.profiler import DeviceType, ProfilerActivity, profile
from tqdm import tqdm

from fastsab._checks import check_choice
from fastsab.adaptive.oom import is_out_of_memory

__all__ = ["Measurements", "collect_cuda_peak_alloc", "collect_peak_alloc", "profile_peak_bytes"]

Baseline = Literal["absolute", "subtract"]


class Measurements(tuple[list[Any], list[int]]):
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
    progress: bool,
) -> Measurements:
    """The loop both collectors share: measure each item, skip out-of-memory ones, clean up."""
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {progress!r}.")
    features: list[Any] = []
    peaks: list[int] = []
    skipped: list[int] = []
    # NOTE: the bar is updated by hand rather than wrapping the dataset: tqdm's iterator keeps
    # the last item alive in its frame, which would count it in the next item's baseline.
    # disable=None draws it only where stderr is a terminal: a log gets no carriage returns.
    total = len(dataset) if isinstance(dataset, Sized) else None
    with (
        _frozen_heap(),
        tqdm(total=total, desc="measuring peaks", unit="item", disable=None if progress else True) as bar,
    ):
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
                bar.write(f"Out of memory at item {position}, skipping it: {error}", file=sys.stderr)
            finally:
                # drop this frame's references first, so that cleanup, gc and the device's cache
                # give the item's memory back before the next one
                data = feature = None
                if cleanup is not None:
                    cleanup()
                gc.collect()
                release()
                bar.update(1)
    return Measurements(features, peaks, skipped)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Leave the objects alive now out of garbage collections until the block ends.

    The collectors run a full collection after every item, so that reference cycles
    holding the item's memory are freed before the next one. With the objects that existed
    before (modules, the datasets, everything imported) frozen, such a collection only
    visits what was created since, which keeps it to milliseconds in a large process; and
    no collection during an item frees memory held from before it, which would count as a
    negative allocation in that item's window.
    """
    gc.collect()
    # NOTE: a process that froze objects itself (gc.freeze before forking) is left as it is:
    # unfreezing at the end would unfreeze its objects too.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


def collect_cuda_peak_alloc(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    device: torch.device | str,
    cleanup: Callable[[], None] | None = None,
    *,
    baseline: Baseline = "absolute",
    progress: bool = True,
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
        progress: Show a progress bar over the items (drawn only where stderr is a
            terminal).

    Returns:
        ``Measurements``: ``(features, peaks)`` with ``.skipped``.

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

    return _collect(dataset, measure, cleanup, release, progress)


def profile_peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()`` recording the CPU allocator's events; return its result and the peak in bytes.

    Every allocation and free of torch's CPU allocator during ``fn`` in the calling thread
    is recorded with its signed size; the peak is the maximum running sum of these events
    in time order, i.e. the most memory ``fn`` held at once above what was allocated before
    it started (never below 0). Memory that is not allocated through torch (Python objects,
    numpy arrays) or that other threads allocate is not counted; nor is a free of memory
    allocated before ``fn`` started, so the peak then errs on the high side.

    The events come from torch's lightweight (legacy) CPU profiler, which costs about
    nothing per operator and prints nothing; where a torch build lacks it, from
    ``torch.profiler`` (the same events, slower, and its backend may log to stderr).

    Examples:
        >>> def work():
        ...     a = torch.empty(4 * 2**20, dtype=torch.uint8)
        ...     b = torch.empty(4 * 2**20, dtype=torch.uint8)
        ...     del a
        ...     return torch.empty(8 * 2**20, dtype=torch.uint8).numel()
        >>> profile_peak_bytes(work)[1] == 12 * 2**20
        True
    """
    if _LEGACY_PROFILER:
        result, events = _legacy_memory_events(fn)
    else:  # pragma: no cover - depends on the torch build
        result, events = _kineto_memory_events(fn)
    running = peak = 0
    for nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return result, peak


_autograd: Any = torch._C._autograd
_LEGACY_PROFILER = hasattr(_autograd, "_enable_profiler_legacy") and hasattr(_autograd, "_disable_profiler_legacy")


def _legacy_memory_events(fn: Callable[[], Any]) -> tuple[Any, list[int]]:
    """``fn()`` and the signed CPU allocation sizes it caused, in time order (legacy profiler)."""
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

    # NOTE: ProfilerState.CPU is the profiler behind torch.autograd.profiler_legacy: memory
    # events are reported by the allocator as with torch.profiler, but nothing is started in
    # kineto, which costs a large constant per session and logs two lines to stderr.
    config = ProfilerConfig(ProfilerState.CPU, False, True, False, False, False, _ExperimentalConfig())
    _autograd._enable_profiler_legacy(config)
    try:
        result = fn()
    finally:
        threads = _autograd._disable_profiler_legacy()
    # NOTE: each thread's events are kept in their recorded order; threads are merged by start time
    per_thread = [
        [(event.start_us(), event.cpu_memory_usage()) for event in events if event.kind() == "memory_alloc"]
        for events in threads
    ]
    return result, [nbytes for _, nbytes in heapq.merge(*per_thread, key=lambda event: event[0])]


def _kineto_memory_events(fn: Callable[[], Any]) -> tuple[Any, list[int]]:  # pragma: no cover - fallback
    """``fn()`` and the signed CPU allocation sizes it caused, in time order (``torch.profiler``)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("this torch build's profiler does not expose memory events (kineto_results).")
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in results.events()
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
    )
    return result, [nbytes for _, nbytes in events]


def collect_peak_alloc(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    device: torch.device | str = "cpu",
    cleanup: Callable[[], None] | None = None,
    *,
    baseline: Baseline = "subtract",
    progress: bool = True,
) -> Measurements:
    """Peak memory allocated while ``work`` runs on each item, on the CPU or a CUDA device.

    The same contract as ``collect_cuda_peak_alloc``. On the CPU the peak is measured
    with ``profile_peak_bytes``: it is the increment over the memory held before the
    item (``baseline="subtract"``); torch keeps no absolute CPU allocator statistics, so
    ``baseline="absolute"`` is refused there. CUDA devices are measured by
    ``collect_cuda_peak_alloc``. Nothing is printed but the progress bar (on a terminal,
    unless ``progress=False``) and a line per item skipped for running out of memory.

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
        return collect_cuda_peak_alloc(dataset, work, device, cleanup, baseline=baseline, progress=progress)
    if device.type != "cpu":
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {str(device)!r}.")
    if baseline != "subtract":
        raise ValueError(
            "baseline='absolute' cannot be measured on the CPU (torch keeps no CPU allocator statistics); "
            "use baseline='subtract'."
        )
    return _collect(dataset, lambda data: profile_peak_bytes(partial(work, data)), cleanup, lambda: None, progress)
