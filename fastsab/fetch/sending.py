"""Sending a batch from a worker process to the loop's process: ``in_band``, ``pickled``.

A worker's batch is pickled into its pipe to the loop's process. torch moves a tensor's memory
through shared memory, which costs the loop's process a connection to the worker per tensor;
``in_band`` marks the batch's small plain CPU tensors (at most ``IN_BAND_BYTES``) to be
sent as their bytes with the batch instead. ``pickled`` pickles the rest of the batch in the
worker's own thread, so that what does not pickle raises there, as an error of the worker.
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from fastsab.fetch.pytree import tree_map_arrays

__all__ = ["IN_BAND_BYTES", "in_band", "pickled"]

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
    """The arguments of ``_from_bytes`` that make ``tensor`` again."""
    if tensor.is_contiguous():
        data = tensor.reshape(-1).view(torch.uint8).numpy()  # every dtype as bytes
        return data, tensor.dtype, tuple(tensor.shape)
    # NOTE: the tensor's own layout (channels_last, a transpose) is kept, as shared memory keeps it:
    # the copy preserve_format makes is dense with the same strides, its storage read in memory order
    dense = tensor.clone(memory_format=torch.preserve_format)
    data = dense.as_strided((dense.numel(),), (1,)).view(torch.uint8).numpy()
    return data, tensor.dtype, tuple(tensor.shape), dense.stride()


def _same(value: Any) -> Any:
    """``value`` itself: what an ``_InBand`` whose tensor goes through torch's own pickling unpickles to."""
    return value


def _from_bytes(
    data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...] | None = None
) -> torch.Tensor:
    """The tensor an ``_InBand`` pickled (``data``: its bytes in memory order, writable and owned, as
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
    """``batch`` with its small plain CPU tensors (at most ``IN_BAND_BYTES``) sent as bytes when pickled.

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


class _BatchPickler(ForkingPickler):
    """Pickles as a worker's queue does (tensors in shared memory), leaving the ``_InBand`` tensors out."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.in_band: list[_InBand] = []
        self._index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is not _InBand:
            return None
        index = self._index.get(id(obj))
        if index is None:  # (a tensor at several places of the batch: sent once, one tensor again)
            index = self._index[id(obj)] = len(self.in_band)
            self.in_band.append(obj)
        return index


class _Pickled:
    """A batch pickled by ``pickled``: its pickle, and its in-band tensors pickled with it."""

    __slots__ = ("data", "in_band")

    def __init__(self, data: bytes, in_band: list[_InBand]) -> None:
        self.data = data
        self.in_band = in_band

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpickled, (self.data, self.in_band)


def _unpickled(data: bytes, tensors: list[torch.Tensor]) -> Any:
    """The batch a ``_Pickled`` holds (``tensors``: its in-band tensors, unpickled)."""
    unpickler = pickle.Unpickler(io.BytesIO(data))
    # NOTE: set on the instance (C code calls it), which costs less per batch than a subclass
    unpickler.persistent_load = tensors.__getitem__  # type: ignore[method-assign]
    return unpickler.load()


def pickled(batch: Any) -> Any:
    """``batch`` (made by ``in_band``) pickled now, sent as its pickle; unpickled, the batch again.

    A worker's queue pickles what it sends in a thread of its own, which prints an error and
    drops the batch; pickled here, in the worker's thread, an error is the worker's. The
    in-band tensors are left out of this pickle and pickled with it, so that their bytes are
    copied once, as before.

    Raises:
        TypeError: If ``batch`` does not pickle, naming the part of it that does not.

    Examples:
        >>> pickle.loads(pickle.dumps(pickled(in_band({"x": torch.arange(3), "n": 2}))))
        {'x': tensor([0, 1, 2]), 'n': 2}
        >>> import threading
        >>> pickled({"x": torch.arange(3), "lock": threading.Lock()})
        Traceback (most recent call last):
        ...
        TypeError: a batch fetched in a worker process is pickled ... but batch['lock'] (lock) does not pickle ...
    """
    if type(batch) is _InBand:  # the common batch: one small tensor, which pickles
        return batch
    file = io.BytesIO()
    pickler = _BatchPickler(file)
    try:
        pickler.dump(batch)
    except Exception as error:
        path, part, reason = _unpicklable(batch, "batch", set()) or ("batch", batch, error)
        raise TypeError(
            f"a batch fetched in a worker process is pickled to be sent to the loop's process, but {path} "
            f"({type(part).__name__}) does not pickle ({type(reason).__name__}: {reason}). Return from the dataset and "
            "collate_fn only what pickles (tensors, arrays, numbers, strings and containers of them; a tensor that "
            "requires grad detached), or fetch in the loop's process (num_workers=0)."
        ) from error
    return _Pickled(file.getvalue(), pickler.in_band)


def _unpicklable(value: Any, path: str, seen: set[int]) -> tuple[str, Any, Exception] | None:
    """The innermost part of ``value`` (at ``path``) that does not pickle, with its error; ``None`` if it pickles."""
    try:
        _BatchPickler(io.BytesIO()).dump(value)
    except Exception as error:
        seen.add(id(value))
        for step, part in _parts(value):
            found = None if id(part) in seen else _unpicklable(part, path + step, seen)
            if found is not None:
                return found
        return path, value, error
    return None


def _parts(value: Any) -> list[tuple[str, Any]]:
    """The parts of a container (dict, list, tuple) or object (its attributes), with the path step to each."""
    if isinstance(value, dict):
        return [(f"[{key!r}]", part) for key, part in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{index}]", part) for index, part in enumerate(value)]
    attributes = getattr(value, "__dict__", None)
    return [(f".{name}", part) for name, part in attributes.items()] if isinstance(attributes, dict) else []
