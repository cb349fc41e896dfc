"""How well memory budgets hold on real models: the ``fastsab bench --suite fidelity`` workloads.

For each kind of model (a CNN on images padded in 2-D, a GNN on graphs joined into one, a
transformer encoder on padded sequences and on packed ones), the whole workflow runs on one device (the CPU
by default, or a CUDA device: ``kinds(device=...)``): measure the
peak of a few batches of several shapes (``measure_batches``), fit a
``BatchMemoryModel``, batch a dataset under a budget of
``budget_factor`` times the largest item's measured peak, and measure every planned batch's
real peak. ``fidelity_results`` reports, per kind, the batches run, how many went over
the budget, and the mean and smallest share of the budget they used; the kinds that batch
better in size-sorted windows (``sort_window``) are run with and without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastsab.loaders.loader import FastSizeAwareLoader
from fastsab.memory.batch import BatchMemoryModel, fit_batch_memory, measure_batches

__all__ = ["FidelityResult", "Kind", "fidelity_markdown", "fidelity_results", "kinds"]

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Kind:
    """A kind of model and its items.

    Attributes:
        name: What it is.
        batching: How its batches are formed and counted.
        cost: ``"sum"`` or ``"padded"``.
        degree: Degree of the fitted per-item model.
        features: ``features(n, rng)``: the ``(n, d)`` features of ``n`` items.
        step: ``step(rows)``: a training step on one batch of items with these features.
        calibration_items: The fewest and most items of a measured batch.
        sort_window: A ``sort_window`` the suite also runs this kind with (``None``: none).
        device: Where ``step`` runs, and so whose allocator the peaks are read from.
    """

    name: str
    batching: str
    cost: str
    degree: int
    features: Callable[[int, np.random.Generator], np.ndarray]
    step: Callable[[np.ndarray], None]
    calibration_items: tuple[int, int] = (2, 8)
    sort_window: int | None = None
    device: torch.device = _CPU


@dataclass(frozen=True)
class FidelityResult:
    """One kind's workflow, measured.

    Attributes:
        kind: The kind's name.
        batching: How its batches are formed and counted.
        batches: Planned batches run and measured.
        over_budget: Batches whose measured peak exceeded the budget.
        mean_use: Mean measured peak / budget.
        min_use: Smallest measured peak / budget.
        max_use: Largest measured peak / budget.
        margin: The fitted model's relative safety margin.
        seconds: Time of the whole measure -> fit -> batch -> measure loop.
        sort_window: The loader's ``sort_window`` (``None``: none).
    """

    kind: str
    batching: str
    batches: int
    over_budget: int
    mean_use: float
    min_use: float
    max_use: float
    margin: float
    seconds: float
    sort_window: int | None = None


class _Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


class _Gnn(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2 * width, width) for _ in range(2)])

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            messages = torch.zeros_like(h).index_add(0, edges[1], h[edges[0]])
            h = torch.relu(layer(torch.cat([h, messages], dim=1)))
        total: torch.Tensor = h.sum()
        return total


class _PackedEncoder(torch.nn.Module):
    """A transformer encoder layer on sequences joined into one, attending within each sequence."""

    def __init__(self, width: int = 32, heads: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.feedforward = torch.nn.Sequential(
            torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width)
        )
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(width) for _ in range(2)])

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        tokens, width = x.shape
        q, k, v = self.qkv(x).view(tokens, 3, self.heads, width // self.heads).unbind(1)
        # NOTE: attention runs per sequence, as variable-length kernels do: no token attends
        # across sequences and no (tokens x tokens) mask is built
        parts = [
            torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in qkv))
            for qkv in zip(q.split(lengths), k.split(lengths), v.split(lengths))
        ]
        attended = torch.cat([part[0].transpose(0, 1).reshape(-1, width) for part in parts])
        h = self.norms[0](x + self.out(attended))
        out: torch.Tensor = self.norms[1](h + self.feedforward(h))
        return out


def _image_features(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(32, 257, size=(n, 2))


def _graph_features(n: int, rng: np.random.Generator) -> np.ndarray:
    nodes = rng.integers(10, 2001, size=n)
    return np.stack([nodes, nodes * rng.integers(2, 9, size=n)], axis=1)


def _sequence_features(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(16, 513, size=(n, 1))


def kinds(seed: int = 0, device: torch.device | str = "cpu") -> list[Kind]:
    """The four kinds of the fidelity suite, with their models (seeded) and steps on ``device``."""
    on = torch.device(device)
    torch.manual_seed(seed)
    cnn, gnn = _Cnn().to(on), _Gnn().to(on)
    encoder = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True).to(on)
    packed = _PackedEncoder().to(on)

    def cnn_step(rows: np.ndarray) -> None:
        height, width = (int(v) for v in rows.max(axis=0))
        cnn(torch.randn(len(rows), 3, height, width, device=on)).sum().backward()
        cnn.zero_grad(set_to_none=True)

    def gnn_step(rows: np.ndarray) -> None:
        nodes, edges = int(rows[:, 0].sum()), int(rows[:, 1].sum())
        gnn(torch.randn(nodes, 8, device=on), torch.randint(0, nodes, (2, edges), device=on)).backward()
        gnn.zero_grad(set_to_none=True)

    def encoder_step(rows: np.ndarray) -> None:
        length = int(rows[:, 0].max())  # sequences padded to the batch's longest
        encoder(torch.randn(len(rows), length, 32, device=on)).sum().backward()
        encoder.zero_grad(set_to_none=True)

    def packed_step(rows: np.ndarray) -> None:
        lengths = [int(v) for v in rows[:, 0]]
        packed(torch.randn(sum(lengths), 32, device=on), lengths).sum().backward()
        packed.zero_grad(set_to_none=True)

    return [
        Kind(
            "CNN, images 32..256 x 32..256",
            "padded to the batch's max H and max W",
            "padded",
            2,
            _image_features,
            cnn_step,
            # NOTE: windows sort by H, then W: a batch holds images of one height and padding
            # is in W alone; sorting by area first would batch tall images with wide ones
            sort_window=200,
            device=on,
        ),
        Kind(
            "GNN, graphs of 10..2000 nodes joined into one",
            "summed nodes and edges",
            "sum",
            1,
            _graph_features,
            gnn_step,
            device=on,
        ),
        Kind(
            "transformer encoder, sequences 16..512",
            "padded to the batch's longest sequence",
            "padded",
            2,
            _sequence_features,
            encoder_step,
            sort_window=200,
            device=on,
        ),
        Kind(
            "transformer encoder, sequences 16..512 packed",
            "joined into one, attention per sequence",
            "sum",
            1,
            _sequence_features,
            packed_step,
            # NOTE: a packed step's peak is fixed + a * tokens, unless one sequence holds most of
            # the tokens: then that sequence's attention peaks higher (one sequence alone uses
            # about 20% more per token), yet at most about 15% above the largest item's peak
            # alone, far under a budget of several items. Measured batches of 8 to 16 items are
            # of the kind the budget plans, and the fit is exact for them
            calibration_items=(8, 16),
            sort_window=200,
            device=on,
        ),
    ]


def _calibration_batches(
    features: np.ndarray, count: int, rng: np.random.Generator, items: tuple[int, int] = (2, 8)
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``count`` batches of ``items`` (fewest, most) random items, the first two with the largest; those alone."""
    # NOTE: batches of several items, as the budget plans them: a batch of one item can use more
    # per item (a workspace that several items share), which a fixed + per-item model would
    # then pay for every item of every batch
    largest = np.argsort(features.prod(axis=1))[-2:]
    batches = []
    for number in range(count):
        chosen = rng.choice(len(features), size=int(rng.integers(items[0], items[1] + 1)), replace=False)
        if number < len(largest):
            chosen[0] = largest[number]
        batches.append(features[chosen])
    return batches, [features[[i]] for i in largest]


def _check_calibration_items(value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is ``(fewest, most)`` items, ``1 <= fewest <= most``."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 1 <= value[0] <= value[1]
    ):
        raise ValueError(f"calibration_items must be (fewest, most) integers with 1 <= fewest <= most, got {value!r}.")


def run_kind(
    kind: Kind,
    *,
    items: int = 800,
    calibration: int = 24,
    batches: int = 40,
    budget_factor: float = 6.0,
    sort_window: int | None = None,
    seed: int = 0,
) -> tuple[FidelityResult, BatchMemoryModel]:
    """Measure, fit, batch (in windows of ``sort_window`` items if given) and measure again one kind."""
    _check_calibration_items(kind.calibration_items)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    features = kind.features(items, rng)
    for _ in range(2):  # warm up: lazily allocated buffers do not count in the first peaks
        kind.step(features[:2])
    calibrate, alone = _calibration_batches(features, calibration, rng, kind.calibration_items)
    peaks = measure_batches(kind.step, calibrate, kind.device)
    model = fit_batch_memory(calibrate, peaks, cost=kind.cost, degree=kind.degree)  # type: ignore[arg-type]
    budget = budget_factor * max(measure_batches(kind.step, alone, kind.device))  # the largest items, each alone
    per_item = features[:, 0] if features.shape[1] == 1 else features  # a one-feature model takes 1-D features
    options = model.loader_options(budget)
    loader = FastSizeAwareLoader(np.arange(items), features=per_item, seed=seed, sort_window=sort_window, **options)
    planned = [features[np.asarray(batch)] for batch, _ in zip(loader, range(batches))]
    use = np.array(measure_batches(kind.step, planned, kind.device), dtype=np.float64) / budget
    result = FidelityResult(
        kind=kind.name,
        batching=kind.batching,
        batches=len(planned),
        over_budget=int((use > 1).sum()),
        mean_use=float(use.mean()),
        min_use=float(use.min()),
        max_use=float(use.max()),
        margin=model.margin,
        seconds=time.perf_counter() - start,
        sort_window=sort_window,
    )
    return result, model


def fidelity_results(seed: int = 0, device: torch.device | str = "cpu", **options: Any) -> list[FidelityResult]:
    """Every kind's ``run_kind`` result on ``device``, then the same kind's in its ``sort_window`` if it has one."""
    results = []
    for kind in kinds(seed, device):
        for window in (None, kind.sort_window) if kind.sort_window else (None,):
            results.append(run_kind(kind, sort_window=window, seed=seed, **options)[0])
    return results


def fidelity_markdown(results: list[FidelityResult]) -> str:
    """The results as a markdown table."""
    lines = [
        "| model | batching | sort window | batches | over budget | mean use of budget | min use | max use | margin "
        "| seconds |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.kind} | {r.batching} | {r.sort_window or '-'} | {r.batches} | {r.over_budget} | {r.mean_use:.2f} | "
            f"{r.min_use:.2f} | {r.max_use:.2f} | {r.margin:.1%} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)
