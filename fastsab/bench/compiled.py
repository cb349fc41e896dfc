"""A small token model compiled for static shapes, trained on a loader's padded batches: graphs built, steps run
eagerly past the recompile limit, epoch times (the compiled part of ``fastsab bench --suite shapes``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fastsab.bench.epochs import one_thread
from fastsab.loaders.loader import FastSizeAwareLoader

__all__ = ["VOCAB", "CompiledEpochs", "MaskedTokenModel", "compiled_epochs"]

#: Tokens of the model's vocabulary.
VOCAB = 32


class MaskedTokenModel(nn.Module):
    """A small token model: an embedding, a residual two-layer MLP and a head over the vocabulary.

    Its loss is the mean cross-entropy of the tokens ``attention_mask`` and ``sample_mask`` keep
    (each token its own target: the work of a step, not what it learns).
    """

    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding(input_ids)
        logits = self.head(hidden + self.mlp(hidden))
        losses = nn.functional.cross_entropy(logits.flatten(0, 1), input_ids.flatten(), reduction="none")
        weights = attention_mask * sample_mask[:, None]
        loss: torch.Tensor = (losses.view(input_ids.shape) * weights).sum() / weights.sum().clamp(min=1)
        return loss


@dataclass(frozen=True)
class CompiledEpochs:
    """Two epochs of ``MaskedTokenModel`` compiled with ``dynamic=False`` on a method's batches, then one eager.

    Attributes:
        graphs: Graphs dynamo built (``counters["stats"]["unique_graphs"]``).
        eager_steps: Steps of a shape no graph was built for (past the recompile limit), run eagerly.
        steps: Steps of both compiled epochs.
        shapes: Distinct ``(B, L)`` shapes of both compiled epochs.
        epoch_seconds: The second compiled epoch's CPU time (on a GPU: its wall time, the device synchronized).
        total_seconds: Both compiled epochs' time, the compiles included.
        eager_seconds: The time of an epoch of the model not compiled (the second epoch's batches again,
            where the loader has ``set_epoch``).
    """

    graphs: int
    eager_steps: int
    steps: int
    shapes: int
    epoch_seconds: float
    total_seconds: float
    eager_seconds: float


@contextmanager
def _dynamo_quiet() -> Iterator[None]:
    """Dynamo's warning at the recompile limit silenced (the table counts what it says)."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _train_epoch(
    loader: Iterable[Mapping[str, Any]],
    model: Callable[..., Any],
    optimizer: torch.optim.Optimizer,
    epoch: int,
    step_done: Callable[[tuple[int, int]], None],
    device: torch.device,
) -> float:
    """Seconds of an epoch of SGD steps of ``model`` on ``loader``'s batches (moved to ``device``), each shape told."""
    if isinstance(loader, FastSizeAwareLoader):
        loader.set_epoch(epoch)
    # NOTE: on the CPU, CPU time of this process, as in the end-to-end suite: the loader, the compiles and the steps
    # run in it (one thread), so a shared machine's waits for a core are left out; on a GPU, wall time from a
    # synchronized device to a synchronized device (its work is not this process's CPU time)
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    if cuda:
        torch.cuda.synchronize(device)
    start = clock()
    for batch in loader:
        ids = batch["input_ids"].to(device, non_blocking=True)
        keep = batch["sample_mask"] if "sample_mask" in batch else torch.ones(len(ids), dtype=torch.bool)
        model(ids, batch["attention_mask"].to(device, non_blocking=True), keep.to(device)).backward()
        optimizer.step()
        optimizer.zero_grad()
        step_done((len(ids), ids.shape[1]))
    if cuda:
        torch.cuda.synchronize(device)
    return clock() - start


def compiled_epochs(
    loader: Iterable[Mapping[str, Any]], epochs: int = 2, device: torch.device | None = None, backend: str | None = None
) -> CompiledEpochs:
    """Train a fresh ``MaskedTokenModel``, compiled for static shapes, ``epochs`` epochs on ``loader``'s batches.

    Args:
        loader: The batches (dicts of ``input_ids``, ``attention_mask`` and maybe ``sample_mask``).
        epochs: Compiled epochs; one more runs the model not compiled.
        device: Where the model trains (default the CPU).
        backend: ``torch.compile``'s backend: by default ``"aot_eager"`` on the CPU (graphs are built and
            counted, no code is generated: a compiled step costs what an eager one does) and ``"cudagraphs"``
            on a GPU (each shape's step recorded once as a CUDA graph and replayed: the launch costs of a small
            model's many kernels paid once per shape).
    """
    from torch._dynamo.utils import counters

    device = torch.device("cpu") if device is None else device
    backend = backend or ("cudagraphs" if device.type == "cuda" else "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MaskedTokenModel().to(device)
    compiled = torch.compile(model, dynamic=False, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[tuple[int, int]] = []
    built: set[tuple[int, int]] = set()

    def step_done(shape: tuple[int, int]) -> None:
        # NOTE: the graph count grows only while a step compiles, so a step that grew it built its shape's
        if counters["stats"]["unique_graphs"] > len(built):
            built.add(shape)
        seen.append(shape)

    with one_thread(), _dynamo_quiet():
        times = [_train_epoch(loader, compiled, optimizer, epoch, step_done, device) for epoch in range(epochs)]
        eager = _train_epoch(loader, model, optimizer, epochs - 1, lambda shape: None, device)
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    eager_steps = sum(shape not in built for shape in seen)
    return CompiledEpochs(graphs, eager_steps, len(seen), len(set(seen)), times[-1], sum(times), eager)
