"""The device suite of ``fastsab bench --device``: batches moved to a device, against the physical limit.

- ``host-to-device``: an epoch of the loaders' batches moved to the device (pinned and asynchronous
  on CUDA), and ``DataLoader(pin_memory=True)``'s batches moved the same way, against a ``copy_`` of
  the same bytes in one copy from pinned memory into a buffer on the device: the most the link
  moves. The ratio is time / the copy's time (1 is the link's speed).
- ``device step``: the same loaders feeding a small model's training step on the device, against
  the step alone on batches already there.

On the CPU (``--device cpu``) the copy is a plain one and nothing is pinned, so that the suite
runs, and is tested, where there is no GPU; its figures then say nothing about a device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastsab.bench.end_to_end import TokenModel, _train_step
from fastsab.bench.epochs import Case, Progress, epoch_times
from fastsab.bench.loaders import BatchedDataset
from fastsab.bench.report import Row
from fastsab.bench.workloads import lognormal_lengths
from fastsab.fetch.transfer import resolve_device
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader

__all__ = ["DEVICE_SAMPLES", "ROW_FLOATS", "bench_device", "device_rows"]

#: Samples per epoch of the device suite by default.
DEVICE_SAMPLES = 200_000
#: Floats per sample of the host-to-device workload (1 KiB a sample).
ROW_FLOATS = 256
COPY_FLOOR = "pinned copy_ of the same bytes (the link's limit)"
PLAIN_COPY_FLOOR = "copy_ of the same bytes (no pinning on the CPU)"
DATALOADER = "DataLoader(pin_memory=True) + .to(device)"
PLAIN_DATALOADER = "DataLoader + .to(device) (no pinning on the CPU)"
STEP_ALONE = "model step alone (batches on the device beforehand)"


def bench_device(text: str) -> torch.device:
    """The device of ``fastsab bench --device``: the CPU, or a CUDA device that is available here.

    Raises:
        ValueError: If ``text`` is not a device, is neither the CPU nor CUDA, or names a CUDA
            device this machine does not have.

    Examples:
        >>> bench_device("cpu")
        device(type='cpu')
    """
    if text.partition(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device {text!r} is not one the device suite runs on: pass 'cpu' or 'cuda' ('cuda:1').")
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device {text!r} needs a CUDA device, and there is no CUDA device here (torch.cuda.is_available() is "
            "False): run it on a machine with a GPU, or pass --device cpu to run the same suite on the CPU."
        )
    resolve_device(text)  # NOTE: refuses a malformed one ('cuda:x') and a GPU index this machine lacks
    return torch.device(text)


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Timed:
    """Epochs of ``iterable`` with ``step`` run on each batch and the device's work awaited at the end.

    Iterating it is what ``epoch_times`` times: without the wait, copies and kernels still queued
    on the device would be left out of the epoch's time.
    """

    def __init__(self, iterable: Iterable[Any], device: torch.device, step: Callable[[Any], Any] | None) -> None:
        self.iterable, self.device, self.step = iterable, device, step

    def __iter__(self) -> Iterator[Any]:
        for batch in self.iterable:
            if self.step is not None:
                self.step(batch)
            yield batch
        _synchronize(self.device)


class _Moved:
    """``DataLoader``'s batches moved to ``device`` as a training loop moves them (asynchronously)."""

    def __init__(self, loader: Iterable[torch.Tensor], device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (batch.to(self.device, non_blocking=True) for batch in self.loader)


class _CopyFloor:
    """Epochs of one ``copy_`` of all the rows into a device buffer, from pinned memory on CUDA."""

    def __init__(self, data: torch.Tensor, device: torch.device) -> None:
        # NOTE: the rows in order, already pinned, in one copy into a buffer allocated once: no
        # gather, no allocation, no pinning, no copy per batch (a loader moves a shuffle group of
        # in-memory rows in one copy too): the most the link moves
        self.host = data.pin_memory() if device.type == "cuda" else data.clone()
        self.buffer = torch.empty_like(data, device=device)

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield self.buffer.copy_(self.host, non_blocking=True)


def _identity(batch: Any) -> Any:
    return batch


def _loader_cases(data: torch.Tensor, batch_size: int, device: torch.device) -> list[Case]:
    """The loaders moving batches of ``data`` to ``device``: DataLoader, FastLoader, FastSizeAwareLoader."""
    pin = device.type == "cuda"  # NOTE: DataLoader and the loaders warn about pinning without an accelerator
    lengths = lognormal_lengths(len(data))
    budget = batch_size * int(lengths.mean())
    dataset = BatchedDataset(data)
    return [
        (
            DATALOADER if pin else PLAIN_DATALOADER,
            lambda: _Moved(DataLoader(dataset, batch_size, True, collate_fn=_identity, pin_memory=pin), device),
        ),
        ("FastLoader", partial(FastLoader, data, batch_size, device=device, pin_memory=pin)),
        ("FastSizeAwareLoader", partial(FastSizeAwareLoader, data, lengths, budget, device=device, pin_memory=pin)),
    ]


def device_rows(
    device: torch.device | str,
    samples: int = DEVICE_SAMPLES,
    batch_size: int = 300,
    epochs: int = 3,
    progress: Progress | None = None,
) -> list[Row]:
    """Host-to-device epochs against the copy's limit, and the loaders feeding a step on ``device``.

    Host-to-device: ``samples`` rows of ``ROW_FLOATS`` float32 (1 KiB each), shuffled, in
    batches of ``batch_size`` (the size-aware loader: log-normal lengths with a budget of
    ``batch_size`` x mean length); each row's ratio is its time over the copy floor's, its
    note the bytes per second and the share of the floor's. Device step: ``torch.arange(samples)``
    as tokens of ``TokenModel`` (forward, backward, SGD) on ``device``; ratios are to the step
    alone on batches made on the device beforehand. Speed-ups are DataLoader's time over a row's.
    Times are the best of ``epochs`` epochs, each ending when the device's work is done.
    """
    device = bench_device(str(device))
    data = torch.randn(samples, ROW_FLOATS)
    floor_name = COPY_FLOOR if device.type == "cuda" else PLAIN_COPY_FLOOR
    copies: list[Case] = [(floor_name, partial(_CopyFloor, data, device))]
    copies += _loader_cases(data, batch_size, device)
    timed: list[Case] = [(name, partial(_timed, make, device, None)) for name, make in copies]
    rows = _rows("host-to-device", device, epoch_times(timed, epochs, progress), data.nbytes)

    tokens = torch.arange(samples)
    torch.manual_seed(0)
    model = TokenModel().to(device)
    step = _train_step(model, torch.optim.SGD(model.parameters(), lr=0.01))
    alone: Case = (STEP_ALONE, lambda: list(FastLoader(tokens, batch_size, device=device)))
    stepped: list[Case] = [
        (name, partial(_timed, make, device, step))
        for name, make in [alone, *_loader_cases(tokens, batch_size, device)]
    ]
    return rows + _rows("device step", device, epoch_times(stepped, epochs, progress), None)


def _timed(make: Callable[[], Iterable[Any]], device: torch.device, step: Callable[[Any], Any] | None) -> _Timed:
    return _Timed(make(), device, step)


def _rows(suite: str, device: torch.device, measured: dict[str, tuple[float, int]], nbytes: int | None) -> list[Row]:
    """Rows against the first case (the floor), with speed-ups over DataLoader's time."""
    floor_name = next(iter(measured))
    floor = measured[floor_name][0]
    dataloader = next(seconds for name, (seconds, _) in measured.items() if name.startswith("DataLoader"))
    rows = []
    for name, (seconds, batches) in measured.items():
        note = f"{batches:,} batch" + ("es" if batches != 1 else "")
        if nbytes is not None:
            note += f"; {nbytes / seconds / 1e9:.2f} GB/s, {floor / seconds:.0%} of the floor's"
        workload = f"{'size-aware' if 'Size' in name else 'seed loop'} on {device}"
        speedup = None if name == floor_name else dataloader / seconds
        rows.append(Row(suite, workload, name, seconds, floor_name, seconds / floor, note, speedup))
    return rows
