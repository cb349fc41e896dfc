"""The scale suite of ``fastsab bench``: one rank's first batch of a huge epoch and its memory, fresh and
resumed from a mid-epoch state, each loader in a process of its own."""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from fastsab.bench.report import Row
from fastsab.bench.workloads import IndexDataset, index_sizes
from fastsab.fetch.mixture import Mixture
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader

__all__ = ["MIXTURE_WEIGHTS", "mixture_sources", "resume_figures", "resume_rows", "scale_rows"]

#: What a rank of a huge epoch may take to its first batch (the ``scale`` suite's targets).
SCALE_SECONDS = 0.5
SCALE_MIB = 512
#: What a rank of a huge epoch may take from ``load_state_dict`` of a mid-epoch state to its first batch.
RESUME_SECONDS = 1.0


def scale_rows(n: int = 10**9, rank: int = 7, world_size: int = 8, repeat: int = 3) -> list[Row]:
    """Time to the first batch and peak RSS growth of rank ``rank`` of ``world_size`` over ``n`` items.

    Each loader runs in a fresh process (its peak RSS is its own): the memory is the growth
    of the peak to the first batch of the first loader; the time is the best of ``repeat``
    loaders made and started one after the other. The ratio is to the targets, 0.5 s and
    512 MiB: below 1 meets them. The resume rows time ``load_state_dict`` of a state saved
    about half-way through the epoch, to the first batch (``resume_rows``).
    """
    rows = []
    target = f"target {SCALE_SECONDS} s, {SCALE_MIB} MiB"
    for name in ("FastLoader", "FastSizeAwareLoader"):
        seconds, mib = _in_process(f"_first_batch_here({name!r}, {n}, {rank}, {world_size}, {repeat})")
        rows.append(
            Row(
                "scale",
                f"n={n:,}, rank {rank} of {world_size}",
                f"{name} first batch",
                seconds,
                target,
                seconds / SCALE_SECONDS,
                note=f"peak RSS +{mib:.0f} MiB ({mib / SCALE_MIB:.2f} of the target)",
            )
        )
    return rows + resume_rows(n, rank, world_size, repeat)


def resume_rows(n: int = 10**9, rank: int = 7, world_size: int = 8, repeat: int = 3) -> list[Row]:
    """Time and peak RSS growth from ``load_state_dict`` of a mid-epoch state to the first batch.

    The state is the one the loader's own ``batch_sampler()`` reports after about half of the
    epoch's steps on rank ``rank`` (run in a process of its own, not timed); a fresh process
    makes the loader, then times ``load_state_dict`` and ``next(iter(loader))``, best of
    ``repeat``, its peak RSS growth counted from before the first loader was made. The ratio
    is to the targets, 1 s and 512 MiB.
    """
    rows = []
    target = f"target {RESUME_SECONDS} s, {SCALE_MIB} MiB"
    for name in ("FastLoader", "FastSizeAwareLoader"):
        steps, seconds, mib = resume_figures(name, n, rank, world_size, repeat)
        rows.append(
            Row(
                "scale",
                f"n={n:,}, rank {rank} of {world_size}, resumed at step {steps:,}",
                f"{name} resumed first batch",
                seconds,
                target,
                seconds / RESUME_SECONDS,
                note=(
                    f"load_state_dict to first batch; peak RSS +{mib:.0f} MiB ({mib / SCALE_MIB:.2f} of the target); "
                    "state from the loader's batch_sampler() after about half the epoch's steps"
                ),
            )
        )
    return rows


def resume_figures(name: str, n: int, rank: int, world_size: int, repeat: int) -> tuple[int, float, float]:
    """The step resumed at, the best seconds and the peak RSS growth (MiB) of ``resume_rows``'s run of ``name``.

    ``name``: ``"FastLoader"``, ``"FastSizeAwareLoader"`` or ``"Mixture"`` (a size-aware loader
    over ``mixture_sources(n)``), each in processes of its own.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "state.json")
        (steps,) = _in_process(f"_save_mid_epoch({name!r}, {n}, {rank}, {world_size}, {path!r})")
        seconds, mib = _in_process(f"_resume_here({name!r}, {n}, {rank}, {world_size}, {path!r}, {repeat})")
    return int(steps), seconds, mib


#: The weights of the three sources of the mixture the scale suite resumes (by cost).
MIXTURE_WEIGHTS = {"web": 0.5, "code": 0.3, "books": 0.2}


def mixture_sources(n: int) -> Mixture:
    """``n`` items in three ``IndexDataset`` sources in proportion to ``MIXTURE_WEIGHTS``, mixed by those weights.

    Their sizes are ``index_sizes`` of the ids (computed: no array of ``n`` sizes is held).

    Examples:
        >>> mixture_sources(1000).lengths
        [500, 300, 200]
    """
    counts = [int(n * weight) for weight in MIXTURE_WEIGHTS.values()]
    counts[0] += n - sum(counts)
    return Mixture({name: IndexDataset(count) for name, count in zip(MIXTURE_WEIGHTS, counts)}, MIXTURE_WEIGHTS)


def _scale_loader(name: str, n: int, rank: int, world_size: int) -> Any:
    """The loader ``name`` of the scale suite: ``IndexDataset(n)`` (or ``mixture_sources(n)``), 256 items or a
    budget of 4096."""
    if name == "FastLoader":
        return FastLoader(IndexDataset(n), 256, rank=rank, world_size=world_size)
    data = mixture_sources(n) if name == "Mixture" else IndexDataset(n)
    return FastSizeAwareLoader(data, index_sizes, 4096, rank=rank, world_size=world_size)


def _save_mid_epoch(name: str, n: int, rank: int, world_size: int, path: str) -> None:
    """Write to ``path`` the state of ``name``'s batch sampler after about half its epoch; print the steps."""
    loader = _scale_loader(name, n, rank, world_size)
    # NOTE: len() of a size-aware epoch plans it whole; half the steps are estimated from the
    # mean size (49) instead, which puts the state a little before the middle
    total = len(loader) if name == "FastLoader" else n * 49 // 4096 // world_size
    sampler = loader.batch_sampler()
    batches = iter(sampler)
    for _ in itertools.islice(batches, total // 2):
        pass
    with open(path, "w") as file:
        json.dump(sampler.state_dict(), file)
    print(json.dumps([total // 2]))


def _resume_here(name: str, n: int, rank: int, world_size: int, path: str, repeat: int) -> None:
    """Print ``[best seconds, peak RSS growth in MiB]`` from ``load_state_dict`` to the first batch."""
    with open(path) as file:
        state = json.load(file)
    before = _memory_kib("VmRSS")
    best, growth = float("inf"), 0.0
    for run in range(repeat):
        loader = _scale_loader(name, n, rank, world_size)
        start = time.perf_counter()
        loader.load_state_dict(state)
        next(iter(loader))
        best = min(best, time.perf_counter() - start)
        if run == 0:
            growth = (_memory_kib("VmHWM") - before) / 1024
    print(json.dumps([best, growth]))


def _in_process(call: str) -> list[float]:
    """The last line ``call`` (a function of this module) prints, run in a fresh process."""
    script = f"import fastsab.bench.scale as bench; bench.{call}"
    done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return [float(value) for value in json.loads(done.stdout.strip().splitlines()[-1])]


def _first_batch_here(name: str, n: int, rank: int, world_size: int, repeat: int) -> None:
    """Print ``[best seconds, peak RSS growth in MiB]`` of this process's first batches of ``name``.

    The growth is the peak RSS after the first batch less the RSS in use before the loader was
    made: an upper bound (a peak of the imports counts in it too, where it was higher).
    """
    before = _memory_kib("VmRSS")
    best, growth = float("inf"), 0.0
    for run in range(repeat):
        start = time.perf_counter()
        next(iter(_scale_loader(name, n, rank, world_size)))
        best = min(best, time.perf_counter() - start)
        if run == 0:
            growth = (_memory_kib("VmHWM") - before) / 1024
    print(json.dumps([best, growth]))


def _memory_kib(field: str) -> float:
    """This process's ``VmRSS`` (in use) or ``VmHWM`` (peak) in KiB, from ``/proc/self/status``.

    Where there is no ``/proc``, both are the peak ``ru_maxrss``, which can only understate the growth.
    """
    # NOTE: not ru_maxrss where /proc exists: Linux keeps it across exec, so a process started
    # by a large parent would report the parent's peak as its own; VmHWM is this image's
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return float(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform == "darwin" else float(peak)  # (bytes on macOS, KiB elsewhere)
