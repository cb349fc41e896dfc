"""The end-to-end workload of ``fastsab bench``: the loaders of the loaders suite feeding a small model's training
step, so that what a loader saves is seen against the work of a step."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler

from fastsab.bench.epochs import Case, Progress, one_thread
from fastsab.bench.loaders import BatchedDataset, PerItemDataset
from fastsab.bench.report import Row
from fastsab.bench.workloads import lognormal_lengths
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader

__all__ = ["TokenModel", "end_to_end_rows"]

#: Samples per epoch of the end-to-end suite by default: 200 steps of 300 samples.
END_TO_END_SAMPLES = 60_000
#: The timed epochs per case are at most this many, so that the suite stays within about 30 s.
END_TO_END_MAX_EPOCHS = 3

_PER_ITEM = "DataLoader, __getitem__ per item"
_SIZE_AWARE_BASELINE = "SizeAwareBatchSampler(callable) + DataLoader"


class TokenModel(nn.Module):
    """A small token classifier: an embedding and a two-layer MLP (about 1 ms a step of 300 tokens on one core).

    Args:
        vocab: Tokens of the embedding; a sample's token is its value modulo ``vocab``.
        dim: Width of the embedding.
        hidden: Width of the hidden layer.
        classes: Classes of the output.
    """

    def __init__(self, vocab: int = 4096, dim: int = 64, hidden: int = 256, classes: int = 128) -> None:
        super().__init__()
        self.vocab, self.classes = vocab, classes
        self.embedding = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.mlp(self.embedding(tokens % self.vocab))
        return logits


def _train_step(model: TokenModel, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
    """One SGD step of ``model`` on a batch of samples: forward, cross-entropy, backward and update."""
    loss_fn = nn.CrossEntropyLoss()

    def step(batch: torch.Tensor) -> None:
        # NOTE: a target that depends on the sample, so that every loader's batches do the same work
        loss = loss_fn(model(batch), (batch * 7 + 1) % model.classes)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _identity(batch: Any) -> Any:
    return batch


def _epoch(iterable: Iterable[Any], step: Callable[[torch.Tensor], None] | None) -> tuple[float, int]:
    """CPU seconds of one epoch over ``iterable`` (running ``step`` on each batch unless ``None``), and its batches."""
    batches = 0
    # NOTE: the CPU time of this process: the loaders (no workers) and the steps (one thread) run in it, so on
    # an idle machine it is the wall time, and on a shared one the time spent waiting for a core is left out
    start = time.process_time()
    for batch in iterable:
        if step is not None:
            step(batch)
        batches += 1
    return time.process_time() - start, batches


def end_to_end_rows(
    samples: int = END_TO_END_SAMPLES,
    batch_size: int = 300,
    epochs: int = END_TO_END_MAX_EPOCHS,
    progress: Progress | None = None,
) -> list[Row]:
    """One epoch of a small model's training loop fed by each loader, against DataLoader.

    The data are those of the loaders suite (``torch.arange(samples)``, shuffled, batches of
    ``batch_size``; log-normal lengths with a budget of ``batch_size`` x mean length for the
    size-aware rows), each batch a step of ``TokenModel`` (forward, backward, SGD) on one
    thread, timed in CPU time of the process. Each case runs one epoch of the loader alone and
    one with the steps, in turn with the other cases, ``epochs`` rounds after a warm-up round;
    a row is the best epoch with the steps. Its note gives the loader's share of that epoch (the
    best epoch of the loader alone over the best with the steps), and the speed-up is the
    DataLoader epoch (per-item ``__getitem__``, or the bionemo-style sampler for the size-aware
    rows) over this one. The first row runs the steps on batches made beforehand: the model's
    own time, the floor of the ratios.
    """
    data = torch.arange(samples)
    lengths = lognormal_lengths(samples)
    budget = batch_size * int(lengths.mean())
    length_list = lengths.tolist()

    def size_aware_dataloader() -> Iterable[Any]:
        sampler = SizeAwareBatchSampler(RandomSampler(data), length_list.__getitem__, budget, warn_logger=None)
        return DataLoader(BatchedDataset(data), batch_sampler=sampler, collate_fn=_identity)

    cases: list[Case] = [
        ("model step alone (batches made beforehand)", lambda: list(FastLoader(data, batch_size))),
        (_PER_ITEM, lambda: DataLoader(PerItemDataset(data), batch_size, shuffle=True)),
        (
            "DataLoader + __getitems__",
            lambda: DataLoader(BatchedDataset(data), batch_size, shuffle=True, collate_fn=_identity),
        ),
        ("FastLoader", lambda: FastLoader(data, batch_size)),
        (_SIZE_AWARE_BASELINE, size_aware_dataloader),
        ("FastSizeAwareLoader", lambda: FastSizeAwareLoader(data, lengths, budget)),
    ]
    # NOTE: one thread: the model's step then takes a steady time, and the loader's share is not
    # that of a step sped up by threads the loaders do not use
    with one_thread():
        measured = _measure(cases, epochs, progress)
    return _rows(measured)


def _measure(cases: list[Case], epochs: int, progress: Progress | None) -> dict[str, tuple[float, float, int]]:
    """Per case: best epoch with the steps, best epoch of the loader alone, batches."""
    torch.manual_seed(0)
    model = TokenModel()
    step = _train_step(model, torch.optim.SGD(model.parameters(), lr=0.01))
    iterables = {}
    for name, make in cases:
        if progress is not None:
            progress(name)
        iterables[name] = make()
    trained = dict.fromkeys(iterables, float("inf"))
    alone = dict.fromkeys(iterables, float("inf"))
    batches = dict.fromkeys(iterables, 0)
    for round_ in range(epochs + 1):  # the first round warms up
        # NOTE: once a round, not before every epoch: a full collection costs about 0.1 s once torch is imported
        gc.collect()
        for name, iterable in iterables.items():
            loader_seconds, _ = _epoch(iterable, None)
            seconds, batches[name] = _epoch(iterable, step)
            if round_:
                alone[name], trained[name] = min(alone[name], loader_seconds), min(trained[name], seconds)
    return {name: (trained[name], alone[name], batches[name]) for name in iterables}


def _rows(measured: dict[str, tuple[float, float, int]]) -> list[Row]:
    floor_name = next(iter(measured))
    floor = measured[floor_name][0]
    rows = []
    for name, (seconds, loader_seconds, n_batches) in measured.items():
        size_aware = "Size" in name
        baseline = _SIZE_AWARE_BASELINE if size_aware else _PER_ITEM
        share = "" if name == floor_name else f"loader {min(1.0, loader_seconds / seconds):.0%} of the epoch; "
        note = f"{share}{seconds / n_batches * 1e3:.2f} ms a step, {n_batches:,} steps"
        workload = "size-aware" if size_aware else "seed loop"
        speedup = measured[baseline][0] / seconds
        rows.append(Row("end-to-end", workload, name, seconds, floor_name, seconds / floor, note, speedup))
    return rows
