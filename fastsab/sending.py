"""Sending a batch from a worker process to the loop's process: :func:`in_band`.

A worker's batch is pickled into its pipe to the loop's process. torch moves a tensor's memory
through shared memory, which costs the loop's process a connection to the worker per tensor;
:func:`in_band` marks the batch's small plain CPU tensors (at most :data:`IN_BAND_BYTES`) to be
sent as their bytes with the batch instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastsab.pytree import tree_map_arrays

__all__ = ["IN_BAND_BYTES", "in_band"]

#: Largest tensor of a batch that a worker sends with the batch itself rather than in shared memory.
# NOTE: torch shares a tensor's memory by passing a file descriptor, which costs the loop's process a
# connection to the worker (a socket, an authentication, a wait for a thread of the busy worker) per
# tensor; copying the bytes through the worker's pipe costs with the size instead. This process's CPU
# per tensor, shared memory against the pipe (2 cores): 0.51 against 0.35 ms at 256 KiB, 0.60 against
# 0.51 ms at 512 KiB, 0.60 against 0.92 ms at 768 KiB, 0.69 against 1.58 ms at 1 MiB.
IN_BAND_BYTES = 2**19


class _InBand:
    """A tensor that pickles as its bytes (a copy sent with the batch), unpickled as a tensor again."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        tensor = self.tensor
        try:
            return _from_bytes, _as_bytes(tensor)
        except Exception:
            # NOTE: an error raised here (in the worker's queue feeder thread) is printed and the batch is
            # never sent, the loop waiting for it forever: a tensor its bytes cannot describe goes as torch sends it
            return _same, (tensor,)


def _as_bytes(tensor: torch.Tensor) -> tuple[Any, ...]:
    """The arguments of :func:`_from_bytes` that make ``tensor`` again."""
    if tensor.is_contiguous():
        data = tensor.reshape(-1).view(torch.uint8).numpy()  # every dtype as bytes
        return data, tensor.dtype, tuple(tensor.shape)
    # NOTE: the tensor's own layout (channels_last, a transpose) is kept, as shared memory keeps it:
    # the copy preserve_format makes is dense with the same strides, its storage read in memory order
    dense = tensor.clone(memory_format=torch.preserve_format)
    data = dense.as_strided((dense.numel(),), (1,)).view(torch.uint8).numpy()
    return data, tensor.dtype, tuple(tensor.shape), dense.stride()


def _same(value: Any) -> Any:
    """``value`` itself: what an :class:`_InBand` whose tensor goes through torch's own pickling unpickles to."""
    return value


def _from_bytes(
    data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...] | None = None
) -> torch.Tensor:
    """The tensor an :class:`_InBand` pickled (``data``: its bytes in memory order, writable and owned, as
    unpickled; ``strides``: the tensor's, ``None`` when contiguous)."""
    flat = torch.from_numpy(data).view(dtype)
    return flat.reshape(shape) if strides is None else flat.as_strided(shape, strides)


def _sent_in_band(leaf: Any) -> Any:
    if (
        type(leaf) is torch.Tensor
        and leaf.device.type == "cpu"
        and leaf.layout == torch.strided
        and leaf.nbytes <= IN_BAND_BYTES
        and not (leaf.requires_grad or leaf.is_quantized or leaf.is_nested or leaf.is_conj() or leaf.is_neg())
    ):
        return _InBand(leaf)
    return leaf


def in_band(batch: Any) -> Any:
    """``batch`` with its small plain CPU tensors (at most :data:`IN_BAND_BYTES`) sent as bytes when pickled.

    What a worker returns: unpickled in the loop's process, those tensors are tensors again
    (the same dtype, shape, values and strides, or dense strides in the same order for a tensor
    with gaps or overlaps, such as an expanded one); a tensor found at several places of the
    batch is one tensor again. Other leaves, larger tensors and tensors that share their storage
    with another tensor of the batch (views of one tensor) are left to torch (tensors in shared
    memory, still views of one storage).

    Examples:
        >>> import pickle
        >>> batch = {"x": torch.arange(6.0).reshape(2, 3).t(), "n": 2}
        >>> pickle.loads(pickle.dumps(in_band(batch)))
        {'x': tensor([[0., 3.],
                [1., 4.],
                [2., 5.]]), 'n': 2}
    """
    if type(batch) is torch.Tensor:  # the common batch: one tensor
        return _sent_in_band(batch)
    # NOTE: tensors that are views of one storage (inputs and labels shifted by a token) are left to
    # torch, whose shared memory keeps them views of one storage; bytes would make them copies
    sent: dict[int, Any] = {id(view): view for view in _views_of_one_storage(batch)}

    def send(leaf: Any) -> Any:
        # NOTE: one wrapper per tensor, which pickle then sends once: the same tensor under two keys
        # (labels that are the input ids) stays one tensor, as it does in shared memory
        wrapped = sent.get(id(leaf))
        if wrapped is None:
            wrapped = sent[id(leaf)] = _sent_in_band(leaf)
        return wrapped

    return tree_map_arrays(send, batch)


def _views_of_one_storage(batch: Any) -> list[torch.Tensor]:
    """The distinct tensors of ``batch`` whose storage another distinct tensor of it shares."""
    by_storage: dict[int, dict[int, torch.Tensor]] = {}

    def note(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided and leaf.untyped_storage().nbytes():
            by_storage.setdefault(leaf.untyped_storage().data_ptr(), {})[id(leaf)] = leaf
        return leaf

    tree_map_arrays(note, batch)
    return [view for views in by_storage.values() if len(views) > 1 for view in views.values()]
