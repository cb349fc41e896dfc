"""The rows of ``fastsab bench`` and how they are timed and rendered: ``Row``, ``time_best``,
``machine_info``, ``to_markdown``."""

from __future__ import annotations

import gc
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Row", "machine_info", "time_best", "to_markdown"]


@dataclass
class Row:
    """One measured line of a benchmark table.

    Attributes:
        suite: Table the row belongs to.
        workload: What was run (e.g. ``split n=10**7``).
        method: Who ran it.
        seconds: Best time over the repeats.
        baseline: Method the ratio refers to.
        ratio: ``seconds / baseline seconds`` (``< 1`` is faster than the baseline).
        note: Extra facts (batches, items).
        speedup: For loader rows, DataLoader-per-item time of the same workload / this time.
    """

    suite: str
    workload: str
    method: str
    seconds: float
    baseline: str
    ratio: float
    note: str = ""
    speedup: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_best(fn: Callable[[], Any], repeat: int = 3, warmup: int = 1) -> float:
    """Best wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs, in seconds.

    Examples:
        >>> time_best(lambda: sum(range(10)), repeat=2) >= 0
        True
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def machine_info(device: torch.device | None = None) -> str:
    """One line naming the machine and versions the numbers were measured on (and the GPU, for a CUDA ``device``)."""
    gpu = (
        f", {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
        if device and device.type == "cuda"
        else ""
    )
    return (
        f"{platform.machine()}, {torch.get_num_threads()} threads, Python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}{gpu}"
    )


def to_markdown(rows: list[Row]) -> str:
    """Render rows as one markdown table per suite.

    Examples:
        >>> print(to_markdown([Row("s", "n=1", "a", 0.002, "a", 1.0)]))
        **s** (x baseline = time / time of a on the same workload; lower is faster)
        <BLANKLINE>
        | workload | method | ms | x baseline | speed-up | note |
        |---|---|---:|---:|---:|---|
        | n=1 | a | 2 | 1 |  |  |
    """
    out: list[str] = []
    for suite in dict.fromkeys(row.suite for row in rows):
        if out:
            out.append("")
        suite_rows = [row for row in rows if row.suite == suite]
        baselines = " or ".join(dict.fromkeys(row.baseline for row in suite_rows))
        out += [f"**{suite}** (x baseline = time / time of {baselines} on the same workload; lower is faster)", ""]
        out += ["| workload | method | ms | x baseline | speed-up | note |", "|---|---|---:|---:|---:|---|"]
        for row in suite_rows:
            speedup = f"{row.speedup:.1f}x" if row.speedup is not None else ""
            cells = [row.workload, row.method, f"{row.seconds * 1e3:.4g}", f"{row.ratio:.3g}", speedup, row.note]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
