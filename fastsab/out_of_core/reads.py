"""Reading samples by identity into chunks: ``read_input(id)`` for each read, stacked into preallocated arrays.

``SampleReads`` is the chunk loader of an ``OutOfCoreDataset`` made from
ids and ``read_input``; every sample it reads is checked against the layout of the first
(``fastsab.out_of_core.samples``) before it is written.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import optree
import torch

from fastsab.out_of_core.samples import Layout, as_numpy, check_dtypes, check_sample, empty_array

__all__ = ["ChunkLoader", "SampleReads"]

# NOTE: one lock for the first layout of every dataset (held only while it is unknown), so that
# a loader holds no lock to drop when pickled; renewed in a forked child, where a thread that
# held it does not exist
_FIRST_LAYOUT_LOCK = threading.Lock()


def _renew_first_layout_lock() -> None:
    global _FIRST_LAYOUT_LOCK
    _FIRST_LAYOUT_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_first_layout_lock)


class ChunkLoader(Protocol):
    """Reads ``[first, end)`` into one pytree of stacked tensors; knows the samples' layout once read."""

    @property
    def layout(self) -> Layout | None: ...

    def __call__(self, first: int, end: int) -> Any: ...


class SampleReads:
    """Reads ``ids[first:end]`` with ``read_input`` into one pytree of stacked tensors.

    Args:
        ids: The identities of the reads.
        read_input: ``read_input(id)`` gives a sample, or ``one_read_count`` samples.
        one_read_count: Samples per read.

    Attributes:
        layout: The layout of the first sample read (``None`` until one is read), which
            every other sample must have.
    """

    def __init__(self, ids: Sequence[Any], read_input: Callable[[Any], Any], one_read_count: int) -> None:
        self.ids = ids
        self.read_input = read_input
        self.one_read_count = one_read_count
        self.layout: Layout | None = None

    def __call__(self, first: int, end: int) -> Any:
        """Read ``ids[first:end]`` into one pytree of stacked arrays (preallocated).

        Every sample is checked against the layout of the first sample of the dataset
        before it is written, so a chunk never holds broadcast, cast or unwritten rows.
        """
        rows = (end - first) * self.one_read_count
        stacked: list[np.ndarray] = []
        layout = self.layout
        row = 0
        for read in range(first, end):
            for position, sample in enumerate(self._samples(read)):
                leaves, spec = optree.tree_flatten(sample)
                where = functools.partial(self._where, read, position)  # NOTE: formatted only for a message
                arrays = [as_numpy(leaf, where) for leaf in leaves]  # numbers too
                if layout is None:
                    check_dtypes(spec, arrays, where())
                    layout = self._first_layout(Layout.of(spec, arrays))
                check_sample(layout, spec, arrays, where)
                if row == 0:
                    stacked = [empty_array((rows, *shape), dtype) for shape, dtype in zip(layout.shapes, layout.dtypes)]
                for target, leaf in zip(stacked, arrays):
                    target[row] = leaf
                row += 1
        if layout is None:
            raise ValueError(f"cannot read reads {first} to {end}: there are none.")
        return optree.tree_unflatten(layout.spec, [torch.from_numpy(a) for a in stacked])

    def _samples(self, read: int) -> list[Any]:
        value = self.read_input(self.ids[read])
        if self.one_read_count == 1:
            return [value]  # the value is the sample, whatever its structure
        samples = list(value)
        if len(samples) != self.one_read_count:
            raise ValueError(
                f"read_input({self.ids[read]!r}) gave {len(samples)} samples; one_read_count is {self.one_read_count}."
            )
        return samples

    def _where(self, read: int, position: int) -> str:
        """Names a sample in messages: its read's id, and its position among the read's samples."""
        where = f"read_input({self.ids[read]!r}) gave a sample"
        return f"sample {position} of {where}" if self.one_read_count > 1 else where

    def _first_layout(self, layout: Layout) -> Layout:
        """Keep ``layout`` as the samples', unless another thread kept one first; return the one kept."""
        with _FIRST_LAYOUT_LOCK:
            if self.layout is None:
                self.layout = layout
            return self.layout
