"""Pinned, asynchronous transfers on a GPU give the batches of a plain loop on the CPU.

Each sample's values encode its index, so a batch copied too early, too late or into memory
that another batch then reused shows up as wrong values, not only as a wrong count.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.fetch.transfer import Transfer

N = 3000
WIDTH = 256


def _samples() -> torch.Tensor:
    """Sample ``i`` is ``i * WIDTH + arange(WIDTH)`` (float64, exact): its values name it."""
    return (torch.arange(N, dtype=torch.float64)[:, None] * WIDTH + torch.arange(WIDTH)).contiguous()


class Fetched(torch.utils.data.Dataset[torch.Tensor]):
    """The samples read with ``__getitems__``: a dataset that fetches (a prefetch thread by default)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.data[indices]


def _make(kind: str, data: Any, **options: Any) -> FastLoader | FastSizeAwareLoader:
    if kind == "size-aware":
        lengths = np.random.default_rng(0).integers(1, 60, N)
        return FastSizeAwareLoader(data, lengths, 600, seed=5, **options)
    return FastLoader(data, 97, seed=5, **options)


CASES = [
    ("fixed", "tensor", 0),
    ("fixed", "tensor", 2),
    ("fixed", "fetched", None),  # prefetch chosen for a fetching dataset: a thread
    ("size-aware", "tensor", 0),
    ("size-aware", "fetched", 2),
]


def _plain_loop(kind: str) -> list[tuple[list[int], torch.Tensor]]:
    return [(ids.tolist(), batch) for ids, batch in _make(kind, _samples()).iter_with_indices()]


@pytest.mark.parametrize(("kind", "source", "prefetch"), CASES)
def test_pinned_non_blocking_batches_equal_the_plain_loop(
    kind: str, source: str, prefetch: int | None, device: torch.device
) -> None:
    data = _samples() if source == "tensor" else Fetched(_samples())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pinning is available: no "pin_memory=True has no effect"
        loader = _make(kind, data, device=device, pin_memory=True, non_blocking=True, prefetch=prefetch)
    expected = _plain_loop(kind)
    seen, kept = [], []
    for ids, batch in loader.iter_with_indices():
        assert batch.device == device
        # NOTE: used at once, on the current stream, as a training step uses it; and kept, so that a
        # batch whose memory is reused by a later copy would differ at the end
        seen.append((ids.tolist(), (batch * 2 + 1).cpu()))
        kept.append(batch)
    assert [ids for ids, _ in seen] == [ids for ids, _ in expected]  # the same samples, step by step
    for (ids, used), batch, (_, plain) in zip(seen, kept, expected):
        assert torch.equal(plain, torch.tensor(ids, dtype=torch.float64)[:, None] * WIDTH + torch.arange(WIDTH))
        assert torch.equal(used, plain * 2 + 1)
        assert torch.equal(batch.cpu(), plain)


@pytest.mark.parametrize(("source", "prefetch"), [("tensor", 0), ("tensor", 2), ("fetched", None)])
def test_batches_used_on_a_side_stream_equal_the_plain_loop(
    source: str, prefetch: int | None, device: torch.device
) -> None:
    # NOTE: made in this thread (prefetch=0) or in a prefetch thread, the batches' copies are queued on
    # the loop's stream, the side stream, before the work that reads them. What the side stream read is
    # compared with the plain loop: a read before a copy ended, or of memory that the allocator gave to
    # a later copy while the side stream had yet to read it, would show as wrong values
    data = _samples() if source == "tensor" else Fetched(_samples())
    loader = _make("fixed", data, device=device, pin_memory=True, prefetch=prefetch)
    side = torch.cuda.Stream(device)
    sums, kept = [], []
    with torch.cuda.stream(side):
        for batch in loader:
            sums.append(batch.sum(dim=1))
            kept.append(batch * 1)
    side.synchronize()
    expected = [batch for _, batch in _plain_loop("fixed")]
    assert len(sums) == len(expected)
    assert all(torch.equal(got.cpu(), want.sum(dim=1)) for got, want in zip(sums, expected))
    assert all(torch.equal(got.cpu(), want) for got, want in zip(kept, expected))


def test_the_transfer_pins_where_a_gpu_is_available(device: torch.device) -> None:
    move = Transfer.create(device, pin_memory=True)
    assert move.pin_memory and move.non_blocking and move.device == device
    out = move({"x": torch.arange(6), "y": np.arange(3), "n": 4})
    assert out["x"].device == device and out["y"].device == device and out["n"] == 4
    assert torch.equal(out["x"].cpu(), torch.arange(6)) and torch.equal(out["y"].cpu(), torch.arange(3))
