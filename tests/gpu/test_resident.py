"""Datasets that live on the GPU are gathered there: batches on the device, no copy to or from the host."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import TensorDataset

from fastsab import FastLoader, FastSizeAwareLoader

N = 2000


def _rows() -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32)[:, None] * 4 + torch.arange(4)


def _datasets(device: torch.device) -> dict[str, Any]:
    rows = _rows().to(device)
    return {
        "tensor": rows,
        "pytree": {"x": rows, "y": torch.arange(N, device=device)},
        "TensorDataset": TensorDataset(rows, torch.arange(N, device=device)),
    }


def _first(batch: Any) -> torch.Tensor:
    return batch if isinstance(batch, torch.Tensor) else batch["x"] if isinstance(batch, dict) else batch[0]


@pytest.mark.parametrize("form", ["tensor", "pytree", "TensorDataset"])
@pytest.mark.parametrize("moved", [False, True])
def test_a_cuda_dataset_is_gathered_on_the_device(form: str, moved: bool, device: torch.device) -> None:
    options: dict[str, Any] = {"device": device, "pin_memory": True} if moved else {}
    loader = FastLoader(_datasets(device)[form], 64, seed=2, **options)
    plain = FastLoader(_rows(), 64, seed=2)  # the same plan on the CPU
    count = 0
    for (ids, batch), (plain_ids, rows) in zip(loader.iter_with_indices(), plain.iter_with_indices()):
        assert np.array_equal(ids, plain_ids)
        leaves = [batch] if isinstance(batch, torch.Tensor) else list(batch.values()) if form == "pytree" else batch
        assert all(leaf.device == device for leaf in leaves)
        assert torch.equal(_first(batch).cpu(), rows)
        if form != "tensor":
            assert torch.equal(leaves[1].cpu(), torch.from_numpy(ids))
        count += 1
    assert count == len(loader) == len(plain)


def test_a_size_aware_epoch_of_a_cuda_dataset_copies_nothing_from_the_device(device: torch.device) -> None:
    rows = _rows().to(device)
    lengths = np.random.default_rng(0).integers(1, 50, N)
    loader = FastSizeAwareLoader(rows, lengths, 400, seed=1, device=device)
    expected = [ids for ids, _ in FastSizeAwareLoader(_rows(), lengths, 400, seed=1).iter_with_indices()]
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        batches = [(ids, batch.sum(dim=1)) for ids, batch in loader.iter_with_indices()]
        torch.cuda.synchronize(device)
    names = [event.name for event in prof.events()]
    kernels = [event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA activity here (no CUPTI): copies cannot be counted")
    # NOTE: the index of each batch goes to the device (a host-to-device copy of its ids); the rows never
    # leave it, and nothing comes back to the host
    assert not [name for name in names if "DtoH" in name or "Device -> Pageable" in name or "Device -> Pinned" in name]
    assert [ids.tolist() for ids, _ in batches] == [ids.tolist() for ids in expected]
    for ids, sums in batches:
        assert torch.equal(sums.cpu(), _rows()[torch.from_numpy(ids)].sum(dim=1))
