"""Filler rows: a shape bucket's last batch completed with repeats of its own items, marked in ``sample_mask``.

A loader with shape buckets and ``partial="fill"`` (``fastsab.plan.bucket_planner``) plans a
bucket's last batch of an epoch as its real items followed by repeats of them, so that the batch
has the bucket's shape. An item occurs once in an epoch, so a filler is any repeat of an id within
its batch, and the real rows come first: the mask is read from the ids alone, on every path
(in this process, from worker processes, for the parts of a split batch). Every batch of such a
loader gets the ``sample_mask`` key, so that its keys do not change from batch to batch either.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import numpy as np
import torch

from fastsab.fetch.batch_maker import IndexArray, Run
from fastsab.fetch.transfer import Transfer
from fastsab.plan.plans import PlanChunk

__all__ = ["MASK_KEY", "masked", "not_a_mapping", "with_sample_mask"]

#: The key of the boolean mask of real rows (``False`` on filler rows).
MASK_KEY = "sample_mask"


def not_a_mapping(batch_type: str) -> TypeError:
    """The error for batches of ``batch_type``, which cannot hold the ``sample_mask`` key."""
    return TypeError(
        f"partial='fill' marks the filler rows of a bucket's last batch in a {MASK_KEY!r} key, so batches must "
        f"be dicts (got {batch_type}): return a dict from collate_fn (PadCollator does), or pass "
        "partial='keep' (the last batch of each bucket is then an extra, smaller shape)."
    )


def masked(batch: Any, ids: IndexArray, transfer: Transfer) -> Any:
    """``batch`` (of the rows ``ids``) with its ``sample_mask``: ``True`` on the first place of each id.

    Raises:
        TypeError: If ``batch`` is not a mapping (a dict of tensors), which the mask is added to.
        ValueError: If ``batch`` already has a ``sample_mask``.
    """
    return _with_mask(batch, _first_places(ids), transfer)


def _first_places(ids: IndexArray) -> np.ndarray:
    """Whether each row of a batch of ``ids`` is the first place of its id (a real row, not a filler)."""
    return PlanChunk(ids, np.array([0, len(ids)], dtype=np.int64)).first_places()


def _with_mask(batch: Any, mask: np.ndarray, transfer: Transfer) -> Any:
    """``batch`` with ``mask`` as its ``sample_mask``, checked as ``masked`` checks it."""
    if not isinstance(batch, Mapping):
        raise not_a_mapping(type(batch).__name__)
    if MASK_KEY in batch:
        raise ValueError(
            f"the batch already has a {MASK_KEY!r} key, where partial='fill' puts the mask of its filler rows: "
            "rename that key, or pass partial='keep'."
        )
    return {**batch, MASK_KEY: transfer(torch.from_numpy(mask))}


def with_sample_mask(
    runs: Generator[Run, None, None], transfer: Transfer, with_indices: bool
) -> Generator[Run, None, None]:
    """The batches of ``runs`` (made with their ids) with their ``sample_mask``; sizes count real rows."""
    try:
        for run in runs:
            if run.ids is None:
                raise RuntimeError("with_sample_mask reads the filler rows from the ids: make the runs with their ids.")
            # NOTE: one mask per batch gives both its real rows (for the counts) and its sample_mask
            masks = [_first_places(part) for part in run.ids]
            batches = (_with_mask(batch, mask, transfer) for batch, mask in zip(run.batches, masks))
            yield Run([int(mask.sum()) for mask in masks], run.ids if with_indices else None, batches)
    finally:
        runs.close()
