"""Batch shapes of variable-length batches, and what a compiled model pays for them: ``fastsab bench --suite shapes``.

A model compiled for static shapes (``torch.compile(dynamic=False)``, CUDA graphs) builds a graph
for every new input shape, and after ``torch._dynamo.config.recompile_limit`` graphs (8) runs the
rest in eager mode. Padded variable-length batches change shape nearly every step. Each method
batches the same sequences, padded by a ``PadCollator``:

- ``DataLoader(batch_size=32)`` padded to each batch's longest sequence, and padded to the
  longest sequence of the dataset (one shape, mostly padding);
- ``FastSizeAwareLoader`` under a budget of padded tokens with ``sort_window``;
- ``FastSizeAwareLoader`` with shape ``buckets`` (``K`` lengths, a batch size each, the last
  batch of each bucket filled with repeats marked in ``sample_mask``).

Every figure is read from the batches themselves: the distinct ``(B, L)`` shapes of an epoch,
the padded efficiency (real tokens of real rows / ``B * L`` summed; filler rows are padding),
steps, batches over the budget and filler rows. A small model (``MaskedTokenModel``) is then
compiled (``backend="aot_eager"``) and trained two epochs on each method's batches of fewer
sequences, counting the graphs built, the steps run in eager mode for want of one, the
second epoch's time and both epochs' time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastsab.bench.compiled import VOCAB, CompiledEpochs, MaskedTokenModel, compiled_epochs
from fastsab.bench.epochs import Progress
from fastsab.bench.varlen import DATALOADER_BATCH, varlen_lengths
from fastsab.loaders.loader import FastSizeAwareLoader
from fastsab.varlen.collate import PadCollator

__all__ = [
    "CompiledEpochs",
    "MaskedTokenModel",
    "ShapesResult",
    "ShapesWorkload",
    "TokenSequences",
    "compiled_epochs",
    "epoch_shapes",
    "shapes_markdown",
    "shapes_methods",
    "shapes_results",
    "shapes_workloads",
]

#: Sequences per epoch of the shape and efficiency figures.
SHAPES_SAMPLES = 50_000
#: The budget of a batch, in padded tokens: ``32 x 512``, what ``DataLoader(batch_size=32)`` pads to at most on
#: the log-normal workload.
SHAPES_BUDGET = 16_384
#: The ``sort_window`` of the sorted row (items).
SORT_WINDOW = 1_024
#: The bucket counts ``K`` of the bucketed rows.
BUCKET_COUNTS = (4, 8, 16)
#: The method the compiled epochs are compared with.
REFERENCE = "FastSizeAwareLoader(buckets=8)"


class TokenSequences(Dataset[dict[str, Any]]):
    """Token sequences of the given lengths, one sample a dict of ``input_ids`` and the sample's ``index``.

    Args:
        lengths: Each sequence's length.
        seed: Seed of the random tokens.
    """

    def __init__(self, lengths: np.ndarray, seed: int = 0) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, VOCAB, int(self.lengths.sum())))
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.tokens[self.offsets[index] : self.offsets[index + 1]], "index": int(index)}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [self[i] for i in indices]


@dataclass(frozen=True)
class ShapesWorkload:
    """Sequence lengths, the budget of a batch, and how many of the sequences the compiled epochs train on.

    Attributes:
        name: What the lengths are.
        lengths: The sequences' lengths.
        budget: Padded tokens a batch of the size-aware loaders may hold.
        compile_samples: The first this many sequences make the compiled model's epochs.
    """

    name: str
    lengths: np.ndarray
    budget: int
    compile_samples: int


def shapes_workloads(n: int = SHAPES_SAMPLES, compile_samples: int | None = None) -> list[ShapesWorkload]:
    """The two workloads of the suite, ``n`` sequences each.

    - log-normal lengths of text (median 100, sigma 0.8, cut to 1..512: a tokenizer's truncation);
    - the varlen suite's long tail (median 150, sigma 1, 10..2000), whose unsorted batches of 32
      exceed the budget.

    Args:
        n: Sequences of the shape and efficiency figures.
        compile_samples: Sequences of the compiled epochs (default 8,000 and 3,000: the long tail's
            batches padded to 2,000 tokens are slow to train on), at most ``n``.

    Examples:
        >>> short, long = shapes_workloads(10_000)
        >>> int(np.median(short.lengths)), int(short.lengths.max()), int(long.lengths.max()), short.compile_samples
        (99, 512, 2000, 8000)
    """
    rng = np.random.default_rng(1)
    text = np.clip(np.rint(rng.lognormal(np.log(100.0), 0.8, n)), 1, 512).astype(np.int64)
    return [
        ShapesWorkload("log-normal 1..512", text, SHAPES_BUDGET, min(n, compile_samples or 8_000)),
        ShapesWorkload("long tail 10..2000", varlen_lengths(n), SHAPES_BUDGET, min(n, compile_samples or 3_000)),
    ]


#: A method: its name, and what makes its loader over a dataset of ``TokenSequences``.
Method = tuple[str, Callable[[TokenSequences], Iterable[Mapping[str, Any]]]]


def shapes_methods(
    budget: int, bucket_counts: Sequence[int] = BUCKET_COUNTS, window: int = SORT_WINDOW
) -> list[Method]:
    """The suite's methods over a budget of ``budget`` padded tokens, all padding with a ``PadCollator``."""

    def data_loader(padded_to_longest: bool) -> Callable[[TokenSequences], DataLoader[Any]]:
        def make(data: TokenSequences) -> DataLoader[Any]:
            # NOTE: a bucket of the dataset's longest length pads every batch to it: one shape
            collate = PadCollator(bucket_lengths=[int(data.lengths.max())]) if padded_to_longest else PadCollator()
            generator = torch.Generator().manual_seed(0)
            return DataLoader(data, DATALOADER_BATCH, shuffle=True, collate_fn=collate, generator=generator)

        return make

    def size_aware(**options: Any) -> Callable[[TokenSequences], FastSizeAwareLoader[Any]]:
        return lambda data: FastSizeAwareLoader(data, data.lengths, budget, collate_fn=PadCollator(), **options)

    methods: list[Method] = [
        (f"DataLoader(batch_size={DATALOADER_BATCH}), padded per batch", data_loader(False)),
        (f"DataLoader(batch_size={DATALOADER_BATCH}), padded to the longest item", data_loader(True)),
        (f'FastSizeAwareLoader(cost="padded", sort_window={window:,})', size_aware(cost="padded", sort_window=window)),
    ]
    return methods + [(f"FastSizeAwareLoader(buckets={k})", size_aware(buckets=k)) for k in bucket_counts]


@dataclass(frozen=True)
class EpochShapes:
    """What an epoch's padded batches show.

    Attributes:
        shapes: The distinct ``(B, L)`` shapes of ``input_ids``.
        real_tokens: Real tokens of real rows (``attention_mask`` on the rows ``sample_mask`` keeps).
        padded_tokens: ``B * L`` summed over the batches, filler rows included.
        steps: Batches.
        over_budget: Batches whose ``B * L`` exceeds the budget.
        filler_rows: Rows ``sample_mask`` marks False.
    """

    shapes: frozenset[tuple[int, int]]
    real_tokens: int
    padded_tokens: int
    steps: int
    over_budget: int
    filler_rows: int

    @property
    def efficiency(self) -> float:
        """Real tokens / padded tokens."""
        return self.real_tokens / max(self.padded_tokens, 1)


def epoch_shapes(batches: Iterable[Mapping[str, Any]], budget: int) -> EpochShapes:
    """The figures of an epoch of padded ``batches``: dicts of ``input_ids``, ``attention_mask`` and ``sample_mask``.

    Examples:
        >>> batch = {"input_ids": torch.zeros(3, 4), "attention_mask": torch.tensor([[1, 1, 0, 0]] * 3),
        ...          "sample_mask": torch.tensor([True, True, False])}
        >>> figures = epoch_shapes([batch], budget=10)
        >>> sorted(figures.shapes), figures.efficiency, figures.over_budget, figures.filler_rows
        ([(3, 4)], 0.3333333333333333, 1, 1)
    """
    shapes: set[tuple[int, int]] = set()
    real = padded = steps = over = fillers = 0
    for batch in batches:
        rows, width = batch["input_ids"].shape
        mask = batch["attention_mask"]
        if "sample_mask" in batch:
            keep = batch["sample_mask"]
            fillers += rows - int(keep.sum())
            mask = mask[keep]
        shapes.add((rows, width))
        real += int(mask.sum())
        padded += rows * width
        over += rows * width > budget
        steps += 1
    return EpochShapes(frozenset(shapes), real, padded, steps, over, fillers)


@dataclass(frozen=True)
class ShapesResult:
    """One method on one workload.

    Attributes:
        workload: The workload's name.
        method: The method's name.
        epoch: The figures of one epoch of all the workload's sequences.
        stats_efficiency: ``loader.stats.padding_efficiency`` of that epoch (``None`` for a ``DataLoader``).
        compiled: The compiled model's epochs over the workload's first ``compile_samples`` sequences.
    """

    workload: str
    method: str
    epoch: EpochShapes
    stats_efficiency: float | None
    compiled: CompiledEpochs


def shapes_results(
    n: int = SHAPES_SAMPLES,
    compile_samples: int | None = None,
    bucket_counts: Sequence[int] = BUCKET_COUNTS,
    progress: Progress | None = None,
    device: torch.device | None = None,
) -> list[ShapesResult]:
    """Every method on every workload of ``shapes_workloads(n, compile_samples)``, the model trained on ``device``."""
    _warm_up(device)
    results = []
    for workload in shapes_workloads(n, compile_samples):
        data = TokenSequences(workload.lengths)
        compile_data = TokenSequences(workload.lengths[: workload.compile_samples])
        for method, make in shapes_methods(workload.budget, bucket_counts):
            if progress is not None:
                progress(f"{workload.name}: {method}")
            loader = make(data)
            figures = epoch_shapes(loader, workload.budget)
            stats = loader.stats if isinstance(loader, FastSizeAwareLoader) else None
            compiled = compiled_epochs(make(compile_data), device=device)
            efficiency = None if stats is None else stats.padding_efficiency
            results.append(ShapesResult(workload.name, method, figures, efficiency, compiled))
    return results


def _warm_up(device: torch.device | None = None) -> None:
    """Compile once beforehand, so that the first method does not pay dynamo's own start-up."""
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.int64), "attention_mask": torch.ones(2, 3, dtype=torch.int64)}
    compiled_epochs([batch], epochs=1, device=device)


def shapes_markdown(results: Sequence[ShapesResult]) -> str:
    """The table of ``results``: shapes and efficiency of an epoch, then the compiled model's graphs and times.

    ``x buckets=8`` is a compiled epoch's time over that of ``FastSizeAwareLoader(buckets=8)`` on the
    same workload (lower is faster); the last column is an epoch of the same model not compiled.
    """
    reference = {r.workload: r.compiled.epoch_seconds for r in results if r.method == REFERENCE}
    lines = [
        "| workload | method | shapes an epoch | padded efficiency | steps | over budget | filler rows | "
        "graphs (2 epochs) | eager steps | compiled epoch s | x buckets=8 | 2 epochs s | not compiled: epoch s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        epoch, compiled = r.epoch, r.compiled
        ratio = compiled.epoch_seconds / reference[r.workload] if r.workload in reference else float("nan")
        cells = [
            r.workload,
            r.method,
            f"{len(epoch.shapes):,}",
            f"{epoch.efficiency:.3f}",
            f"{epoch.steps:,}",
            f"{epoch.over_budget:,}",
            f"{epoch.filler_rows:,}",
            f"{compiled.graphs}",
            f"{compiled.eager_steps:,} of {compiled.steps:,}",
            f"{compiled.epoch_seconds:.2f}",
            f"{ratio:.2f}",
            f"{compiled.total_seconds:.1f}",
            f"{compiled.eager_seconds:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
