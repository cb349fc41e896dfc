"""Epoch timings of the loader suites: every case's best epoch, as rows against the first case (the floor)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastsab.bench.report import Row

__all__ = ["Case", "Progress", "epoch_times", "floor_rows", "one_thread"]

#: A named case: what makes its iterable of batches (one epoch per iteration).
Case = tuple[str, Callable[[], Iterable[Any]]]
#: Called with a case's name before it is set up.
Progress = Callable[[str], None]


@contextmanager
def one_thread() -> Iterator[None]:
    """torch computes in one thread inside the block (its thread count restored after).

    A step then takes a steady time on a shared machine: idle threads of torch's pool spin on
    busy cores, and a case's time would follow the machine's load more than its own work.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def epoch_times(cases: list[Case], epochs: int, progress: Progress | None = None) -> dict[str, tuple[float, int]]:
    """Best seconds per epoch of each case, and its batches, torch computing in one thread (``one_thread``).

    After one warm-up epoch each, the cases run one epoch in turn, ``epochs`` rounds, so
    that a slow spell of a shared machine hits all of them alike.
    """
    # NOTE: one thread for every case, as the numpy floor and the DataLoader loops run anyway: with
    # torch's pool, a loader's time on a busy 2-core machine was 3x its time alone (its idle threads spin)
    with one_thread():
        iterables = {}
        batches = {}
        for name, make in cases:
            if progress is not None:
                progress(name)
            iterables[name] = make()
            batches[name] = sum(1 for _ in iterables[name])
        best = dict.fromkeys(iterables, float("inf"))
        for _ in range(epochs):
            for name, iterable in iterables.items():
                gc.collect()
                start = time.perf_counter()
                for _ in iterable:
                    pass
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], batches[name]) for name in iterables}


def floor_rows(
    suite: str, workload: Callable[[str], str], cases: list[Case], epochs: int, progress: Progress | None = None
) -> list[Row]:
    """A row per case of ``epoch_times``, its ratio to the first case's time, its batches as the note.

    Args:
        suite: The rows' table.
        workload: The workload of a case, by its name.
        cases: The cases, the floor first.
        epochs: Timed epochs of each case.
        progress: Told each case's name before it is set up.
    """
    measured = epoch_times(cases, epochs, progress)
    floor_name = cases[0][0]
    floor = measured[floor_name][0]
    return [
        Row(suite, workload(name), name, seconds, floor_name, seconds / floor, f"{n_batches:,} batches")
        for name, (seconds, n_batches) in measured.items()
    ]
