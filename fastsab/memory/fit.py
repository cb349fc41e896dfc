"""The measure -> fit -> save workflow for a module over synthetic inputs.

``fit_memory_model`` measures the peak memory of ``work(size)`` for a range of sizes,
fits a ``PolynomialRegression`` that upper-bounds the measured
peaks, and returns everything needed to save, plot and use it (``fastsab fit-memory`` is
its command-line form). ``module_work`` builds ``work`` for a ``torch.nn.Module``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optree
import torch

from fastsab.memory.measure import collect_peak_alloc
from fastsab.memory.model import FitReport, PolynomialRegression

__all__ = ["MemoryFit", "fit_memory_model", "module_work"]


@dataclass
class MemoryFit:
    """A fitted memory model and the measurements behind it.

    Attributes:
        model: The fitted model (predicts peak bytes of one input from its size).
        sizes: The sizes that were measured.
        peaks: Their peak bytes.
        report: How the model matches the measurements.
        skipped: Sizes that ran out of memory while measuring.
    """

    model: PolynomialRegression
    sizes: list[float]
    peaks: list[int]
    report: FitReport
    skipped: list[float] = field(default_factory=list)

    def plot(self, path: str | Path) -> None:
        """Draw measured peaks and the fitted curve to a PNG file (needs matplotlib)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        grid = torch.linspace(min(self.sizes), max(self.sizes), 200, dtype=torch.float64)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.sizes, [p / 2**20 for p in self.peaks], "o", label="measured peak")
        ax.plot(grid.tolist(), (self.model(grid) / 2**20).tolist(), "-", label=f"fit (degree {self.model.degree})")
        ax.set_xlabel("input size")
        ax.set_ylabel("peak memory (MiB)")
        ax.set_title(f"max under-prediction after bound: {self.report.max_under_prediction_final / 2**20:.3f} MiB")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def fit_memory_model(
    work: Callable[[Any], Any],
    sizes: Sequence[int | float],
    *,
    degree: int = 2,
    device: torch.device | str = "cpu",
    warmup: int = 2,
    cleanup: Callable[[], None] | None = None,
    upper_quantile: float | None = 1.0,
    safety_margin: float = 0.0,
    progress: bool = True,
) -> MemoryFit:
    """Measure ``work(size)`` for every size, then fit a polynomial memory model.

    Args:
        work: Runs the workload for one input of the given size (e.g. a forward and
            backward pass over a sequence of that length).
        sizes: The sizes to measure; use more than ``degree + 1`` spread over the range the
            model will be used on.
        degree: Degree of the polynomial (2 for attention over sequence length).
        device: ``"cpu"`` (profiler) or a CUDA device (allocator statistics).
        warmup: Runs of ``work(sizes[0])`` before measuring, so that lazily allocated
            buffers do not make the first points look small.
        cleanup: Called after each measured item (e.g. ``model.zero_grad(set_to_none=True)``).
        upper_quantile: Passed to ``PolynomialRegression.fit`` (``1.0``: upper bound).
        safety_margin: Passed to ``PolynomialRegression.fit``.
        progress: Show a progress bar over the sizes (drawn only where stderr is a terminal).

    Returns:
        A ``MemoryFit``.

    Raises:
        ValueError: If ``sizes`` has fewer points than the polynomial has coefficients.

    Examples:
        >>> fit = fit_memory_model(lambda n: torch.zeros(n, 1024).sum(), [64, 128, 256, 512], degree=1)
        >>> round(float(fit.model(torch.tensor([1024.0]))) / 2**20, 1)  # 1024 x 1024 float32
        4.0
    """
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must not be empty.")
    for _ in range(warmup):
        work(sizes[0])
        if cleanup is not None:
            cleanup()

    def measure(size: int | float) -> int | float:
        work(size)
        return size

    measured = collect_peak_alloc(sizes, measure, device, cleanup, baseline="subtract", progress=progress)
    skipped = [sizes[position] for position in measured.skipped]
    model = PolynomialRegression(degree)
    x = torch.tensor([float(s) for s in measured.features], dtype=torch.float64)
    y = torch.tensor([float(p) for p in measured.peaks], dtype=torch.float64)
    report = model.fit(x, y, upper_quantile=upper_quantile, safety_margin=safety_margin)
    return MemoryFit(model, x.tolist(), list(measured.peaks), report, skipped)


def module_work(
    module: torch.nn.Module,
    make_input: Callable[[int], Any],
    *,
    train: bool = True,
) -> tuple[Callable[[int], None], Callable[[], None]]:
    """``work(size)`` and ``cleanup()`` for measuring a module on inputs of a given size.

    ``work`` calls ``module(make_input(size))`` (a tuple input is unpacked as arguments)
    and, with ``train=True``, backpropagates the sum of the floating point outputs;
    ``cleanup`` drops the gradients so that every size starts from the same state.

    Examples:
        >>> work, cleanup = module_work(torch.nn.Linear(8, 4), lambda n: torch.randn(n, 8))
        >>> work(3); cleanup()
    """

    def call(size: int) -> Any:
        inputs = make_input(size)
        return module(*inputs) if isinstance(inputs, tuple) else module(inputs)

    def work(size: int) -> None:
        if not train:
            with torch.no_grad():
                call(size)
            return
        leaves = [leaf for leaf in optree.tree_leaves(call(size)) if isinstance(leaf, torch.Tensor)]
        loss = sum(leaf.float().sum() for leaf in leaves if leaf.is_floating_point())
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            torch.autograd.backward(loss)

    def cleanup() -> None:
        module.zero_grad(set_to_none=True)

    return work, cleanup
