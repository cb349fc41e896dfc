"""The variable-length workload of ``fastsab bench --suite varlen``: how much of a batch is real data.

Sequences with log-normal lengths (10 to 2000 tokens) are batched under a token budget by
``FastSizeAwareLoader`` without and with ``sort_window``, by a "megabatch"
baseline (random order, windows sorted by length and split on their own, as fairseq and the
"group by length" samplers do) and by ``DataLoader(batch_size=32)``. Efficiencies are
computed from the batches' lengths alone, whatever would collate them:

- padded efficiency: real tokens / padded tokens, a batch padded to ``len(batch) * max(length)``;
- packing efficiency: real tokens / (batches x budget), batches packed into rows of ``budget``;
- steps per epoch and the epoch's time (the loaders over an index tensor: planning and gathers).

Epochs over a ragged dataset (padded and packed batches gathered from flat token storage,
against a list of tensors and fixed-shape rows) are the rows of
``fastsab.bench.ragged.ragged_rows``, printed with this suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastsab.bench.epochs import Progress, epoch_times
from fastsab.bench.loaders import BatchedDataset, _identity
from fastsab.bench.ragged import ragged_rows
from fastsab.bench.report import Row
from fastsab.loaders.loader import FastSizeAwareLoader
from fastsab.plan.batching import split_batches

__all__ = [
    "VarlenResult",
    "efficiency",
    "megabatch_batches",
    "plot_varlen",
    "varlen_lengths",
    "varlen_markdown",
    "varlen_results",
    "varlen_rows",
]

#: Sequences per epoch of the workload.
VARLEN_SAMPLES = 50_000
#: The token budget of a batch: 8 times the longest sequence.
VARLEN_BUDGET = 16_384
#: The two window sizes of the table (items): about 16 and 32 padded batches of the workload, 2% and 4% of it.
VARLEN_WINDOWS = (1_024, 2_048)
#: The window sizes of the efficiency plot.
PLOT_WINDOWS = (16, 64, 256, 1_024, 4_096, 16_384)
#: Items per batch of the DataLoader row.
DATALOADER_BATCH = 32


def varlen_lengths(n: int = VARLEN_SAMPLES, seed: int = 0) -> np.ndarray:
    """Log-normal sequence lengths (median about 150) clipped to [10, 2000].

    Examples:
        >>> lengths = varlen_lengths(10_000)
        >>> int(lengths.min()) >= 10 and int(lengths.max()) <= 2000
        True
    """
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(150.0), 1.0, n), 10, 2000).astype(np.int64)


@dataclass(frozen=True)
class VarlenResult:
    """One method on the workload: its efficiencies, steps and (if timed) epoch time.

    Attributes:
        method: Who batched.
        cost: ``"padded"`` (budget on padded tokens) or ``"sum"`` (budget on real tokens).
        window: Items per sorted window (``None``: none).
        padded: Real tokens / padded tokens.
        packed: Real tokens / (steps x budget).
        steps: Batches per epoch.
        seconds: Best epoch time (``nan`` if not timed).
    """

    method: str
    cost: str
    window: int | None
    padded: float
    packed: float
    steps: int
    seconds: float = float("nan")


def efficiency(batches: Sequence[np.ndarray], lengths: np.ndarray, budget: int) -> tuple[float, float, int]:
    """``(padded efficiency, packing efficiency, steps)`` of ``batches`` of indices into ``lengths``.

    Examples:
        >>> efficiency([np.array([0, 1]), np.array([2])], np.array([2, 4, 3]), budget=8)
        (0.8181818181818182, 0.5625, 2)
    """
    sizes = np.array([len(batch) for batch in batches], dtype=np.int64)
    ids = np.concatenate(batches) if len(batches) else np.empty(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    real = int(lengths[ids].sum())
    longest = np.maximum.reduceat(lengths[ids], starts) if len(ids) else np.empty(0, dtype=np.int64)
    padded = int((sizes * longest).sum())
    steps = len(batches)
    return real / max(padded, 1), real / max(steps * budget, 1), steps


def megabatch_batches(
    lengths: np.ndarray, window: int, budget: int, *, cost: str = "padded", seed: int = 0, epoch: int = 0
) -> list[np.ndarray]:
    """The megabatch baseline: a random order cut into windows, each sorted by length and split alone.

    The batches' order is shuffled, as the samplers that do this shuffle it.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    for start in range(0, len(order), window):
        ids = order[start : start + window]
        ids = ids[np.argsort(lengths[ids], kind="stable")]
        batches += split_batches(lengths[ids], budget, cost=cost, ids=ids).batches()  # type: ignore[arg-type]
    return [batches[i] for i in rng.permutation(len(batches))]


def _loader(data: torch.Tensor, lengths: np.ndarray, budget: int, cost: str, window: int | None) -> Any:
    return FastSizeAwareLoader(data, lengths, budget, cost=cost, sort_window=window)  # type: ignore[arg-type]


def varlen_results(
    n: int = VARLEN_SAMPLES,
    budget: int = VARLEN_BUDGET,
    windows: Sequence[int] = VARLEN_WINDOWS,
    epochs: int = 0,
    progress: Progress | None = None,
) -> list[VarlenResult]:
    """Every method's efficiencies on one epoch of ``n`` sequences; best epoch times if ``epochs``."""
    lengths = varlen_lengths(n)
    data = torch.arange(n)
    methods: list[tuple[str, str, int | None, Callable[[], Iterable[Any]]]] = []
    for cost in ("padded", "sum"):
        label = "padded budget" if cost == "padded" else "token budget"
        for window in (None, *windows):
            name = f"FastSizeAwareLoader, {label}" + ("" if window is None else f", sort_window={window:,}")
            methods.append((name, cost, window, partial(_loader, data, lengths, budget, cost, window)))
        for window in windows:
            methods.append(
                (
                    f"megabatch, {label}, window={window:,}",
                    cost,
                    window,
                    partial(_Megabatch, lengths, window, budget, cost),
                )
            )
    methods.append(
        (
            f"DataLoader(batch_size={DATALOADER_BATCH})",
            "none",
            None,
            lambda: DataLoader(BatchedDataset(data), DATALOADER_BATCH, shuffle=True, collate_fn=_identity),
        )
    )
    times = epoch_times([(name, make) for name, _, _, make in methods], epochs, progress) if epochs else {}
    results = []
    for name, cost, window, make in methods:
        batches = [np.asarray(batch, dtype=np.int64) for batch in make()]
        padded, packed, steps = efficiency(batches, lengths, budget)
        seconds = times[name][0] if name in times else float("nan")
        results.append(VarlenResult(name, cost, window, padded, packed, steps, seconds))
    return results


def varlen_markdown(results: Sequence[VarlenResult]) -> str:
    """The efficiencies of ``results`` as a markdown table (no timings: they are the bench's).

    Examples:
        >>> print(varlen_markdown([VarlenResult("m", "sum", 64, 0.9, 0.98, 10)]))
        | method | budget on | window | padded efficiency | packing efficiency | steps |
        |---|---|---:|---:|---:|---:|
        | m | real tokens | 64 | 0.900 | 0.980 | 10 |
    """
    budget_on = {"padded": "padded tokens", "sum": "real tokens", "none": "(32 items)"}
    lines = [
        "| method | budget on | window | padded efficiency | packing efficiency | steps |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for result in results:
        window = "" if result.window is None else f"{result.window:,}"
        lines.append(
            f"| {result.method} | {budget_on[result.cost]} | {window} | {result.padded:.3f} | "
            f"{result.packed:.3f} | {result.steps:,} |"
        )
    return "\n".join(lines)


class _Megabatch:
    """The megabatch baseline as an iterable of epochs (each iteration the next epoch)."""

    def __init__(self, lengths: np.ndarray, window: int, budget: int, cost: str) -> None:
        self.lengths, self.window, self.budget, self.cost = lengths, window, budget, cost
        self.epoch = 0

    def __iter__(self) -> Any:
        batches = megabatch_batches(self.lengths, self.window, self.budget, cost=self.cost, epoch=self.epoch)
        self.epoch += 1
        return iter(batches)


def varlen_rows(n: int = VARLEN_SAMPLES, epochs: int = 3, progress: Progress | None = None) -> list[Row]:
    """The table of ``fastsab bench --suite varlen``: time ratios to the same loader without window."""
    results = varlen_results(n, epochs=epochs, progress=progress)
    base = {result.cost: result for result in results if result.window is None}
    rows = []
    for result in results:
        reference = base.get(result.cost, result)
        note = f"padded eff. {result.padded:.3f}, {result.steps:,} steps"
        if result.cost == "sum":
            note = f"packing eff. {result.packed:.3f}, padded eff. {result.padded:.3f}, {result.steps:,} steps"
        workload = {"padded": "padded", "sum": "packed", "none": "fixed 32"}[result.cost]
        rows.append(
            Row(
                "varlen",
                f"{workload}, n={n:,}",
                result.method,
                result.seconds,
                reference.method,
                result.seconds / reference.seconds,
                note,
            )
        )
    return rows + ragged_rows(samples=n, budget=VARLEN_BUDGET, epochs=epochs, progress=progress)


def plot_varlen(path: Path, n: int = VARLEN_SAMPLES, budget: int = VARLEN_BUDGET) -> None:
    """Padded efficiency against window size: ``sort_window`` and the megabatch baseline (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from err
    lengths = varlen_lengths(n)
    data = torch.arange(n)
    curves: dict[str, list[float]] = {"sort_window": [], "megabatch": []}
    for window in PLOT_WINDOWS:
        loader = _loader(data, lengths, budget, "padded", window)
        curves["sort_window"].append(efficiency([b.numpy() for b in loader], lengths, budget)[0])
        curves["megabatch"].append(efficiency(megabatch_batches(lengths, window, budget), lengths, budget)[0])
    unsorted = efficiency([b.numpy() for b in _loader(data, lengths, budget, "padded", None)], lengths, budget)[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in curves.items():
        ax.plot(PLOT_WINDOWS, values, marker="o", label=name)
    ax.axhline(unsorted, color="#90a4ae", linestyle="--", label="no window")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window (items)")
    ax.set_ylabel("padded efficiency (real / padded tokens)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{n:,} log-normal lengths 10..2000, padded budget {budget:,}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
