from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
import torch

from fastsab import FastLoader
from fastsab.fetch.pytree import tree_arrays, tree_map_arrays
from fastsab.fetch.transfer import Transfer, to_device

Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass(frozen=True)
class Scaled:
    """Transforms its input once, when it is made."""

    x: torch.Tensor

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", self.x * 2)


@dataclasses.dataclass
class Counted:
    x: torch.Tensor
    count: int = dataclasses.field(init=False, default=0)


class ScaledBatches:
    """A dataset whose ``__getitems__`` returns a ``Scaled`` batch."""

    def __len__(self) -> int:
        return 6

    def __getitems__(self, indices: list[int]) -> Scaled:
        return Scaled(torch.tensor(indices))


def test_moving_a_dataclass_batch_does_not_make_it_again():
    batch = Scaled(torch.arange(3))
    assert to_device(batch, torch.device("cpu")).x.tolist() == [0, 2, 4]
    counted = Counted(torch.arange(2))
    counted.count = 5
    moved = to_device(counted, torch.device("cpu"))
    assert moved.count == 5 and moved.x.tolist() == [0, 1]
    assert counted.count == 5 and moved is not counted


def test_a_loader_moving_dataclass_batches_gives_what_the_dataset_returned():
    plain = [b.x.tolist() for b in FastLoader(ScaledBatches(), 3, shuffle=False, prefetch=0)]
    moved = [b.x.tolist() for b in FastLoader(ScaledBatches(), 3, shuffle=False, prefetch=0, device="cpu")]
    assert plain == moved == [[0, 2, 4], [6, 8, 10]]


def test_tree_map_arrays_keeps_containers_and_plain_leaves():
    tree = {
        "pair": Pair(np.arange(2), torch.arange(2)),
        "ordered": OrderedDict([("b", torch.ones(1)), ("a", None)]),
        "default": defaultdict(list, {"z": [torch.zeros(1), "name"]}),
        "number": 3,
    }
    out = tree_map_arrays(lambda leaf: leaf[:1], tree)
    assert isinstance(out["pair"], Pair) and out["pair"].x.tolist() == [0]
    assert list(out["ordered"]) == ["b", "a"] and out["ordered"]["a"] is None
    assert out["default"].default_factory is list and out["default"]["z"][1] == "name"
    assert out["number"] == 3
    assert sorted(type(leaf).__name__ for leaf in tree_arrays(out)) == ["Tensor", "Tensor", "Tensor", "ndarray"]


def test_transfer_checks_its_values_and_moves_numpy_to_tensors():
    with pytest.raises(TypeError, match=r"pin_memory must be a bool, got 1"):
        Transfer.create(None, pin_memory=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"non_blocking must be a bool, got 'no'"):
        Transfer.create(None, non_blocking="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"device 'gpu' is not a torch device"):
        Transfer.create("gpu")
    batch = {"x": np.arange(3)}
    assert Transfer.create(None)(batch) is batch
    assert torch.equal(Transfer.create("cpu")(batch)["x"], torch.arange(3))
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="pin_memory=True has no effect"):
            assert Transfer.create(None, pin_memory=True).pin_memory is False
