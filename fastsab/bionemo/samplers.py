"""The bionemo-compatible size-aware batch sampler.

``SizeAwareBatchSampler`` wraps any index sampler and yields batches of indices whose
total size stays within ``max_total_size``; sizes given as an array go through the
vectorized kernel of ``fastsab.plan.batching``. The bucketed sampler and
``create_buckets`` live in ``fastsab.bionemo.buckets``, the loader's plan as a
``DataLoader`` batch sampler in ``fastsab.loaders.planned``; both are importable from here too.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from fastsab._checks import as_numeric_array, check_nonnegative_real, user_stacklevel

# NOTE: the names of buckets.py and planned.py are re-exported (listed in __all__):
# ``from fastsab.bionemo.samplers import ...`` gives every sampler name.
from fastsab.bionemo.buckets import BucketBatchSampler, Buckets, NoElementInBucketsError, create_buckets
from fastsab.bionemo.streaming import report_batching
from fastsab.loaders.planned import PlannedBatchSampler, PlannedDataLoader
from fastsab.plan.batching import split_with
from fastsab.plan.cost_sources import size_array
from fastsab.plan.costs import BatchCost
from fastsab.plan.item_sizes import item_size, oversize_message, per_item_sizeof
from fastsab.plan.plans import PlanChunk

__all__ = [
    "BucketBatchSampler",
    "Buckets",
    "NoElementInBucketsError",
    "PlannedBatchSampler",
    "PlannedDataLoader",
    "SizeAwareBatchSampler",
    "create_buckets",
]

#: Indices taken from the underlying sampler per vectorized split.
CHUNK_SIZE = 2**16


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=user_stacklevel())


class SizeAwareBatchSampler(Sampler[list[int]]):
    """Batches of indices whose total size does not exceed ``max_total_size``.

    Indices come from ``sampler`` in its order and are batched greedily (see
    ``fastsab.plan.batching``); an index whose size alone exceeds the cap is skipped, reported
    to ``warn_logger``, and counted in ``num_skipped``. Sizes are looked up 2**16 indices
    ahead, yet each skip is reported where bionemo's item-by-item sampler reports it: after
    the batches that such a loop yields before it reaches the skipped index.

    Args:
        sampler: The underlying index sampler (a ``Sampler`` or any iterable of indices).
        sizeof: Size of each index: a callable ``index -> size``, a mapping, a sequence,
            a 1-D numpy array or a 1-D tensor of per-index sizes. Array-like sizes are
            validated once and batched by the vectorized kernel, 2**16 indices at a time.
        max_total_size: The inclusive cap on a batch's total size; a finite number >= 0
            (with 0, the indices of size 0 are batched and the others skipped).
        info_logger: Called with a summary after each pass. Defaults to ``None``.
        warn_logger: Called for each skipped index and with a count of skips after each
            pass. Defaults to ``warnings.warn``, so no skip goes unnoticed.

    Raises:
        TypeError: If ``sampler`` is not iterable or ``sizeof`` is of an unsupported type.
        ValueError: If ``max_total_size`` is negative or not finite, or array-like sizes are
            negative, NaN or infinite. A ``max_total_size`` that is not a number raises
            ``NotANumberError``, both a ``TypeError`` and a ``ValueError``.

    Examples:
        >>> import torch
        >>> dataset = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]),
        ...            torch.tensor([7, 8]), torch.tensor([9, 10])]
        >>> sampler = SizeAwareBatchSampler(
        ...     torch.utils.data.SequentialSampler(dataset), lambda i: dataset[i].numel(), 4)
        >>> list(sampler)
        [[0, 1], [2, 3], [4]]
        >>> list(SizeAwareBatchSampler(range(5), torch.tensor([2, 2, 2, 2, 2]), 4))
        [[0, 1], [2, 3], [4]]

        Skipped indices go to ``warn_logger`` (``warnings.warn`` by default):

        >>> sizes = [1, 5, 1, 1]
        >>> list(SizeAwareBatchSampler(range(4), sizes.__getitem__, 2, warn_logger=print))
        Size of element 1 exceeds max_total_size (5 > 2), skipping
        3 samples were batched from 4 of the input data. Missing samples are due to exceeding max_total_size=2
        [[0, 2], [3]]
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        sizeof: Callable[[Any], Any] | Mapping[Any, Any] | Sequence[Any] | np.ndarray | torch.Tensor,
        max_total_size: int | float,
        info_logger: Callable[[str], None] | None = None,
        warn_logger: Callable[[str], None] | None = _warn,
    ) -> None:
        if isinstance(sampler, (str, bytes)) or not isinstance(sampler, (Sampler, Iterable)):
            raise TypeError(
                f"sampler must be a torch.utils.data.Sampler or an iterable of indices, got {type(sampler).__name__}."
            )
        self._rule = BatchCost(check_nonnegative_real("max_total_size", max_total_size))
        self._sizes = size_array(sizeof)
        self._sizeof: Callable[[Any], Any] | None = None
        if self._sizes is None:
            self._sizeof = per_item_sizeof(sizeof, "a callable, a mapping, a sequence, a numpy array or a tensor")
        self._sampler = sampler
        self._info_logger = info_logger
        self._warn_logger = warn_logger
        self.num_skipped = 0
        self.skipped: list[Any] = []

    def _chunk_costs(self, chunk: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Ids and costs of a chunk of indices taken from the sampler."""
        if self._sizes is not None:
            ids = np.asarray(chunk)
            if ids.dtype.kind not in "iu":
                raise TypeError(f"sampler must yield integer indices when sizeof is array-like, got {chunk[0]!r}.")
            bad = (ids < 0) | (ids >= len(self._sizes))
            if bad.any():
                raise IndexError(
                    f"sampler yielded index {ids[bad][0].item()!r}, outside the {len(self._sizes)} sizes of sizeof."
                )
            return ids, self._sizes[ids]
        sizeof = self._sizeof
        assert sizeof is not None  # NOTE: set whenever _sizes is None (see __init__)
        sizes = [item_size(sizeof, index, _describe_index) for index in chunk]
        ids = np.empty(len(chunk), dtype=object)
        ids[:] = chunk
        return ids, as_numeric_array("sizeof values", sizes)

    def __iter__(self) -> Iterator[list[int]]:
        """Yield batches of indices, planning 2**16 indices at a time."""
        iterator = iter(self._sampler)
        carry = None
        carry_indices: np.ndarray | None = None  # the sampler's indices of the carried items
        n_samples = n_batched = n_batches = 0
        skipped: list[Any] = []
        pending: deque[tuple[int, str]] = deque()  # (sampler position, message) of skips not yet reported
        while True:
            chunk = list(itertools.islice(iterator, CHUNK_SIZE))
            final = len(chunk) < CHUNK_SIZE
            if chunk:
                ids, costs = self._chunk_costs(chunk)
            else:
                ids, costs = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
            # NOTE: the split works on positions in the sampler's order (an index may come
            # twice); they place each skip among the batches, and map back to the indices.
            positions = np.arange(n_samples, n_samples + len(chunk), dtype=np.int64)
            split = split_with(self._rule, costs, ids=positions, carry=carry, final=final)
            kept = np.ones(len(chunk), dtype=bool)
            if split.skipped.size:
                where = split.skipped - n_samples
                kept[where] = False
                skipped += ids[where].tolist()
                if self._warn_logger is not None:
                    cap = self._rule.caps[0]
                    pending.extend(
                        (position, oversize_message(index, size, cap))
                        for position, index, size in zip(
                            split.skipped.tolist(), ids[where].tolist(), costs[where].tolist()
                        )
                    )
            # the split's items are the carried ones, then the chunk's kept ones, in order
            indices = ids[kept] if carry_indices is None else np.concatenate([carry_indices, ids[kept]])
            n_samples += len(chunk)
            n_batched += len(split.ids)
            n_batches += split.num_batches
            yield from self._batches_and_warnings(split, indices, pending)
            carry = split.carry
            carry_indices = indices[len(split.ids) :]
            if final:
                break
        self.skipped = skipped
        self.num_skipped = len(skipped)
        report_batching(n_samples, n_batched, n_batches, self._rule.caps[0], self._info_logger, self._warn_logger)

    def _batches_and_warnings(
        self, split: PlanChunk, indices: np.ndarray, pending: deque[tuple[int, str]]
    ) -> Iterator[list[int]]:
        """Yield the split's batches (of positions) as indices, reporting each skip where an
        item-by-item loop would.

        Such a loop reports a skipped item when it reaches it and yields a batch when it
        reaches the first item of the next batch (the last batch after the whole input), so
        each batch comes after the skips that precede its successor's first item.
        """
        offsets = split.offsets.tolist()
        positions = split.ids
        if split.carry is not None and len(split.carry):
            positions = np.concatenate([positions, split.carry.ids[:1]])
        for end, batch in zip(offsets[1:], split.batches_of(indices)):
            if pending:
                # NOTE: the last batch of a final split has no successor: every skip comes first.
                limit = positions[end].item() if end < len(positions) else sys.maxsize
                while pending and pending[0][0] < limit:
                    self._report(pending.popleft()[1])
            yield batch.tolist()
        if split.carry is None:
            while pending:
                self._report(pending.popleft()[1])

    def _report(self, message: str) -> None:
        if self._warn_logger is not None:  # NOTE: skips are pending only with a warn_logger
            self._warn_logger(message)


def _describe_index(index: object) -> str:
    return f"index {index!r}"
