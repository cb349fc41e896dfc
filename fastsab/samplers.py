"""Batch samplers with the bionemo API: size-aware and bucketed.

:class:`SizeAwareBatchSampler` wraps any index sampler and yields batches of indices whose
total size stays within ``max_total_size``; sizes given as an array go through the
vectorized kernel of :mod:`fastsab.batching`. :class:`BucketBatchSampler` groups indices
into size buckets and draws batches from per-bucket batch samplers; :func:`create_buckets`
derives bucket boundaries from the sizes.
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from fastsab._checks import (
    NotAnIntegerError,
    as_numeric_array,
    as_size,
    check_nonnegative_real,
    check_positive_int,
)
from fastsab.batching import report_batching, split_batches
from fastsab.cursor import EpochCursor
from fastsab.epochs import EpochStats
from fastsab.fetch import collate_batch

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
    warnings.warn(message, stacklevel=3)


class SizeAwareBatchSampler(Sampler[list[int]]):
    """Batches of indices whose total size does not exceed ``max_total_size``.

    Indices come from ``sampler`` in its order and are batched greedily (see
    :mod:`fastsab.batching`); an index whose size alone exceeds the cap is skipped, reported
    to ``warn_logger``, and counted in :attr:`num_skipped`. Sizes are looked up 2**16 indices
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
            pass. Defaults to :func:`warnings.warn`, so no skip goes unnoticed.

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
        self._max_total_size = check_nonnegative_real("max_total_size", max_total_size)
        self._sizes: np.ndarray | None = None
        self._sizeof: Callable[[Any], Any] | None = None
        if isinstance(sizeof, (np.ndarray, torch.Tensor)) or (
            isinstance(sizeof, Sequence) and not isinstance(sizeof, (str, bytes))
        ):
            self._sizes = as_numeric_array("sizeof", sizeof)
        elif isinstance(sizeof, Mapping):
            self._sizeof = sizeof.__getitem__
        elif callable(sizeof):
            self._sizeof = sizeof
        else:
            raise TypeError(
                "sizeof must be a callable, a mapping, a sequence, a numpy array or a tensor, "
                f"got {type(sizeof).__name__}."
            )
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
        sizes = []
        for index in chunk:
            try:
                size = sizeof(index)
            except Exception as err:
                raise RuntimeError(f"sizeof raised an error for index {index!r}: {err}") from err
            kind = type(size)
            # NOTE: one cheap test per index for a plain int or float >= 0; the rest (numpy and
            # tensor numbers, bad values) gets the full check, which names the index.
            if not ((kind is int and size >= 0) or (kind is float and 0 <= size < math.inf)):
                size = as_size("sizeof", size, index)
            sizes.append(size)
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
            split = split_batches(costs, self._max_total_size, ids=positions, carry=carry, final=final)
            kept = np.ones(len(chunk), dtype=bool)
            if split.skipped.size:
                where = split.skipped - n_samples
                kept[where] = False
                skipped += ids[where].tolist()
                if self._warn_logger is not None:
                    cap = self._max_total_size
                    pending.extend(
                        (position, f"Size of element {index} exceeds max_total_size ({size} > {cap}), skipping")
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
        report_batching(n_samples, n_batched, n_batches, self._max_total_size, self._info_logger, self._warn_logger)

    def _batches_and_warnings(
        self, split: Any, indices: np.ndarray, pending: deque[tuple[int, str]]
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
        for b in range(len(offsets) - 1):
            if pending:
                end = offsets[b + 1]
                # NOTE: the last batch of a final split has no successor: every skip comes first.
                limit = positions[end].item() if end < len(positions) else sys.maxsize
                while pending and pending[0][0] < limit:
                    self._report(pending.popleft()[1])
            yield indices[offsets[b] : offsets[b + 1]].tolist()
        if split.carry is None:
            while pending:
                self._report(pending.popleft()[1])

    def _report(self, message: str) -> None:
        if self._warn_logger is not None:  # NOTE: skips are pending only with a warn_logger
            self._warn_logger(message)


class BucketBatchSampler(Sampler[list[int]]):
    """Batches drawn from size buckets, each bucket with its own base batch sampler.

    Element sizes are put into the left-closed, right-open intervals given by the sorted
    ``bucket_boundaries`` (``len(bucket_boundaries) - 1`` buckets, empty ones included).
    Elements outside every bucket are skipped with a warning. For bucket ``k`` a base batch
    sampler is built as ``base_batch_sampler_class(indices_k, **shared_kwargs,
    **{key: values[k] ...})``. With ``shuffle=True`` the indices of each bucket are shuffled
    in place every pass and each batch comes from a bucket drawn with probability
    proportional to its remaining elements; otherwise buckets are visited in ascending
    order. The generator is used exactly as bionemo's ``BucketBatchSampler`` uses it, so a
    generator seeded the same way gives the same batches, pass after pass.

    Args:
        sizes: 1-D tensor (or array) of per-element sizes, integer or float, no NaN.
        bucket_boundaries: 1-D tensor (or array) of at least two distinct boundaries, no NaN.
        base_batch_sampler_class: A ``torch.utils.data.Sampler`` subclass producing batches.
        base_batch_sampler_shared_kwargs: Keyword arguments given to every base sampler.
        base_batch_sampler_individual_kwargs: Keyword arguments given per bucket: each value
            is an iterable with one entry per bucket.
        shuffle: Shuffle within buckets and draw buckets at random.
        generator: The ``torch.Generator`` used when shuffling (seeded at random if None).

    Attributes:
        sizes: The sizes, as a tensor.
        bucket_boundaries: The sorted boundaries.
        num_buckets: ``len(bucket_boundaries) - 1``.
        bucket_sizes: Number of elements of each bucket (a tensor, zeros for empty buckets).
        bucket_element_indices: Indices of the elements of each bucket (one list per bucket).
        num_samples: Number of elements inside the buckets.
        num_skipped: Number of elements outside every bucket.
        base_batch_sampler_class: The class of the base samplers.
        base_batch_sampler_shared_kwargs: The keyword arguments shared by the base samplers.
        base_batch_sampler_individual_kwargs: The keyword arguments of each bucket's base
            sampler, one dict per bucket.
        base_batch_samplers: The base samplers, one per bucket.
        shuffle: Whether batches are shuffled.
        generator: The generator used when shuffling.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: For bad sizes or boundaries, kwargs of the wrong length, or when every
            element lies outside the buckets (:class:`NoElementInBucketsError`, also a
            ``RuntimeError``).

    Examples:
        >>> import torch
        >>> sampler = BucketBatchSampler(
        ...     sizes=torch.arange(25),
        ...     bucket_boundaries=torch.tensor([0, 6, 15, 25]),
        ...     base_batch_sampler_class=torch.utils.data.BatchSampler,
        ...     base_batch_sampler_shared_kwargs={"drop_last": False},
        ...     base_batch_sampler_individual_kwargs={"batch_size": [2, 3, 5]},
        ...     shuffle=False,
        ... )
        >>> list(sampler)
        [[0, 1], [2, 3], [4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 23, 24]]

        Shuffled with a seeded generator (the batches bionemo gives for the same seed), and
        with empty buckets kept, each with its own keyword arguments:

        >>> sampler = BucketBatchSampler(
        ...     sizes=torch.arange(25),
        ...     bucket_boundaries=torch.tensor([0, 6, 15, 25]),
        ...     base_batch_sampler_class=torch.utils.data.BatchSampler,
        ...     base_batch_sampler_shared_kwargs={"drop_last": False},
        ...     base_batch_sampler_individual_kwargs={"batch_size": [2, 3, 5]},
        ...     generator=torch.Generator().manual_seed(0),
        ... )
        >>> list(sampler)
        [[2, 5], [24, 17, 16, 22, 19], [3, 0], [15, 18, 20, 21, 23], [12, 10, 11], [7, 13, 6], [1, 4], [14, 9, 8]]
        >>> list(sampler)  # the next pass draws on from the same generator
        [[6, 8, 14], [22, 19, 23, 17, 15], [4, 5], [1, 3], [0, 2], [13, 7, 9], [10, 12, 11], [16, 21, 18, 24, 20]]
        >>> sampler = BucketBatchSampler(
        ...     torch.arange(25), torch.tensor([-25, 0, 25, 50]), torch.utils.data.BatchSampler,
        ...     {"drop_last": False}, {"batch_size": [2, 10, 4]}, shuffle=False)
        >>> sampler.num_buckets, sampler.bucket_sizes.tolist(), sampler.base_batch_sampler_individual_kwargs[1]
        (3, [0, 25, 0], {'batch_size': 10})

        With :class:`SizeAwareBatchSampler` as base sampler, to cap each batch's total size:

        >>> costs = torch.arange(25).tolist()
        >>> sampler = BucketBatchSampler(
        ...     torch.arange(25), torch.tensor([0, 6, 15, 25]), SizeAwareBatchSampler,
        ...     base_batch_sampler_shared_kwargs={"sizeof": costs.__getitem__, "max_total_size": 40},
        ...     generator=torch.Generator().manual_seed(0))
        >>> list(sampler)
        [[2, 5, 3, 0, 1, 4], [24], [12, 10, 11, 7], [17, 16], [13, 6, 14], [22], [19, 15], [9, 8], [18, 20], [21], [23]]
    """

    def __init__(
        self,
        sizes: torch.Tensor | np.ndarray,
        bucket_boundaries: torch.Tensor | np.ndarray,
        base_batch_sampler_class: type[Sampler],
        base_batch_sampler_shared_kwargs: dict[str, Any] | None = None,
        base_batch_sampler_individual_kwargs: dict[str, Sequence[Any]] | None = None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        size_array = _check_not_nan("sizes", _as_real_tensor("sizes", sizes))
        boundaries = _check_not_nan("bucket_boundaries", _as_real_tensor("bucket_boundaries", bucket_boundaries))
        boundaries = torch.sort(boundaries)[0]
        if len(boundaries) < 2:
            raise ValueError(f"bucket_boundaries must have at least 2 values, got {boundaries.tolist()!r}.")
        if bool((boundaries[:-1] >= boundaries[1:]).any()):
            raise ValueError(f"bucket_boundaries must not repeat a value, got sorted {boundaries.tolist()!r}.")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {shuffle!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}.")
        if not (isinstance(base_batch_sampler_class, type) and issubclass(base_batch_sampler_class, Sampler)):
            raise TypeError(
                "base_batch_sampler_class must be a subclass of torch.utils.data.Sampler, "
                f"got {base_batch_sampler_class!r}."
            )
        shared = _check_kwargs("base_batch_sampler_shared_kwargs", base_batch_sampler_shared_kwargs)
        individual = _check_kwargs("base_batch_sampler_individual_kwargs", base_batch_sampler_individual_kwargs)
        num_buckets = len(boundaries) - 1
        per_bucket_values = {key: _per_bucket_values(key, values) for key, values in individual.items()}
        lengths = {key: len(values) for key, values in per_bucket_values.items()}
        if any(length != num_buckets for length in lengths.values()):
            raise ValueError(
                f"each value of base_batch_sampler_individual_kwargs must have {num_buckets} entries "
                f"(one per bucket), got lengths {lengths!r}."
            )

        self.sizes = size_array
        self.bucket_boundaries = boundaries
        self.num_buckets = num_buckets
        self.shuffle = shuffle
        if shuffle and generator is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        self.generator = generator
        self.base_batch_sampler_class = base_batch_sampler_class
        self.base_batch_sampler_shared_kwargs = shared
        #: The keyword arguments of each bucket's base sampler, one dict per bucket.
        self.base_batch_sampler_individual_kwargs = [
            {key: values[k] for key, values in per_bucket_values.items()} for k in range(num_buckets)
        ]

        # bucket k holds boundaries[k] <= size < boundaries[k + 1]; 0 and num_buckets + 1 are outside
        bucket_of = torch.bucketize(size_array, boundaries, right=True)
        order = torch.argsort(bucket_of, stable=True)
        counts = torch.bincount(bucket_of, minlength=num_buckets + 2)
        starts = (torch.cumsum(counts, 0) - counts).tolist()
        # NOTE: every bucket is kept, empty ones too, so that bucket k always has the k-th
        # individual kwargs and shuffling draws from the generator as bionemo does.
        self.bucket_element_indices: list[list[int]] = [
            order[starts[k] : starts[k] + int(counts[k])].tolist() for k in range(1, num_buckets + 1)
        ]
        self.bucket_sizes = counts[1 : num_buckets + 1].clone()
        self.num_samples = int(self.bucket_sizes.sum())
        self.num_skipped = len(size_array) - self.num_samples
        if self.num_samples == 0:
            raise NoElementInBucketsError(
                f"all {len(size_array)} sizes lie outside the bucket ranges {boundaries.tolist()!r}."
            )
        if self.num_skipped:
            warnings.warn(
                f"{self.num_skipped} elements are outside the buckets provided and will be skipped", stacklevel=2
            )
        # NOTE: each base sampler keeps a reference to its bucket's list; shuffling the list in
        # place (as __iter__ does) reshuffles what the base sampler iterates over.
        self.base_batch_samplers: list[Sampler] = [
            base_batch_sampler_class(indices, **shared, **kwargs)  # type: ignore[call-arg]
            for indices, kwargs in zip(self.bucket_element_indices, self.base_batch_sampler_individual_kwargs)
        ]

    def __len__(self) -> int:
        """Number of batches per pass: the sum over the base samplers' lengths."""
        return sum(len(sampler) for sampler in self.base_batch_samplers)  # type: ignore[arg-type,misc]

    def __iter__(self) -> Iterator[list[int]]:
        """Yield batches of indices from the buckets."""
        if self.shuffle:
            for indices in self.bucket_element_indices:
                permutation = torch.randperm(len(indices), generator=self.generator)
                indices[:] = torch.tensor(indices)[permutation].tolist()
        iterators = [iter(sampler) for sampler in self.base_batch_samplers]
        remaining = self.bucket_sizes.clone()
        total = int(remaining.sum())
        while total > 0:
            if self.shuffle:
                bucket = int(torch.multinomial(remaining / total, 1, generator=self.generator))
            else:
                bucket = int(torch.argmax((remaining > 0).to(torch.int64)))
            try:
                batch = next(iterators[bucket])
            except StopIteration:
                remaining[bucket] = 0
                total = int(remaining.sum())
                continue
            remaining[bucket] -= len(batch)
            total -= len(batch)
            yield batch


class NoElementInBucketsError(ValueError, RuntimeError):
    """Every size lies outside the buckets: a ``ValueError`` that is also the
    ``RuntimeError`` bionemo's ``BucketBatchSampler`` raises, for code written for it."""


def _as_real_tensor(name: str, values: Any) -> torch.Tensor:
    if isinstance(values, np.ndarray):
        values = torch.from_numpy(values)
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(values).__name__}.")
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}.")
    if values.dtype == torch.bool or values.is_complex():
        raise ValueError(f"{name} must hold integers or floats, got dtype {values.dtype}.")
    if values.dtype in (torch.uint16, torch.uint32, torch.uint64):
        # NOTE: torch does not promote these with other integer types (bucketize would fail).
        array = values.cpu().numpy()
        if array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} has values too large for int64: {array.max().item()!r}.")
        values = torch.from_numpy(array.astype(np.int64))
    return values


def _per_bucket_values(key: str, values: Any) -> list[Any]:
    if not isinstance(values, Iterable):
        raise TypeError(
            f"base_batch_sampler_individual_kwargs[{key!r}] must be a sequence with one value per bucket, "
            f"got {values!r}."
        )
    return list(values)


def _check_not_nan(name: str, values: torch.Tensor) -> torch.Tensor:
    # NOTE: a NaN size would silently fall outside every bucket, a NaN boundary would make
    # bucketing meaningless; infinities compare fine and are allowed.
    if values.is_floating_point():
        nan = torch.isnan(values)
        if bool(nan.any()):
            raise ValueError(f"{name} must not hold NaN, got nan at position {int(torch.argmax(nan.to(torch.int8)))}.")
    return values


def _check_kwargs(name: str, kwargs: Any) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"{name} must be a dict of keyword arguments, got {type(kwargs).__name__}.")
    bad = [key for key in kwargs if not isinstance(key, str)]
    if bad:
        raise TypeError(f"{name} must have string keys, got {bad!r}.")
    return kwargs


class Buckets(NamedTuple):
    """What :func:`create_buckets` returns: a named tuple, so both
    ``boundaries, counts = create_buckets(...)`` and ``result.bucket_boundaries`` work.

    Attributes:
        bucket_boundaries: 1-D tensor of ascending boundaries (``num_buckets + 1`` values).
        bucket_sizes: 1-D tensor of the number of elements of each bucket.
    """

    bucket_boundaries: torch.Tensor
    bucket_sizes: torch.Tensor


def create_buckets(sizes: torch.Tensor | np.ndarray, max_width: int, min_bucket_count: int) -> Buckets:
    """Bucket boundaries for integer sizes, with a maximal width and a minimal count.

    Walking the distinct sizes in ascending order, a bucket takes sizes while it has fewer
    than ``min_bucket_count`` elements and the size is less than ``max_width`` above the
    bucket's lower boundary; a gap wider than ``max_width`` up to the next size is filled
    with empty buckets of width ``max_width``. Buckets are left-closed, right-open.

    Args:
        sizes: Non-empty 1-D integer tensor (or array).
        max_width: Maximal width of a bucket, a positive integer.
        min_bucket_count: Minimal number of elements of a bucket (unless the width limit is
            reached first), a positive integer.

    Returns:
        A :class:`Buckets` named tuple ``(bucket_boundaries, bucket_sizes)``: ascending
        boundaries and the element count of each bucket.

    Raises:
        TypeError: If ``sizes`` is not a tensor or array. A ``max_width`` or
            ``min_bucket_count`` that is not an integer raises ``NotAnIntegerError``, both a
            ``TypeError`` and a ``ValueError``.
        ValueError: If ``sizes`` is empty, not 1-D or not integer, or ``max_width`` or
            ``min_bucket_count`` is not positive.

    Examples:
        >>> sizes = torch.tensor([1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 22, 22, 22, 22])
        >>> buckets = create_buckets(sizes, max_width=5, min_bucket_count=10)
        >>> buckets.bucket_boundaries
        tensor([ 1,  6, 11, 16, 21, 23])
        >>> buckets.bucket_sizes
        tensor([12,  0,  0,  0,  4])
        >>> boundaries, counts = create_buckets(torch.arange(20), max_width=10, min_bucket_count=5)
        >>> boundaries, counts
        (tensor([ 0,  5, 10, 15, 20]), tensor([5, 5, 5, 5]))
    """
    tensor = _as_real_tensor("sizes", sizes)
    if tensor.is_floating_point():
        raise ValueError(f"sizes must hold integers, got dtype {tensor.dtype}.")
    if len(tensor) == 0:
        raise ValueError("sizes must not be empty.")
    max_width = check_positive_int("max_width", max_width, error=NotAnIntegerError)
    min_bucket_count = check_positive_int("min_bucket_count", min_bucket_count, error=NotAnIntegerError)
    values_t, counts_t = torch.unique(tensor, sorted=True, return_counts=True)
    values, counts = values_t.tolist(), counts_t.tolist()
    boundaries = [values[0]]
    bucket_sizes: list[int] = []
    start = 0
    while start < len(values):
        end, count = start + 1, counts[start]
        while end < len(values) and count < min_bucket_count and values[end] - boundaries[-1] < max_width:
            count += counts[end]
            end += 1
        upper = values[end] if end < len(values) else values[-1] + 1
        n_wide = (upper - boundaries[-1]) // max_width
        bucket_sizes.append(count)
        if n_wide > 0:
            low = boundaries[-1]
            boundaries += [low + max_width * j for j in range(1, n_wide + 1)]
            bucket_sizes += [0] * (n_wide - 1)
        else:
            boundaries.append(upper)
        start = end
    return Buckets(torch.tensor(boundaries), torch.tensor(bucket_sizes))


class PlannedBatchSampler(EpochCursor, Sampler[list[int]]):
    """A loader's batch plan as a ``torch.utils.data.Sampler[list[int]]``.

    Made by :meth:`FastLoader.batch_sampler() <fastsab.FastLoader.batch_sampler>`. Like the
    loaders, each ``iter()`` starts the next epoch unless :meth:`set_epoch` was called,
    ``len()`` is exact, it yields this rank's share under ``torch.distributed``, and it
    resumes from :meth:`state_dict`. ``stats`` reports the epoch as the loaders' does
    (skipped, dropped and padded items, with the same warning about skipped items), its
    batches counted as handed out.

    Its position counts the batches it handed out. A ``DataLoader`` with worker processes
    takes batches ahead of the training loop (``prefetch_factor * num_workers``), so the
    sampler's position is ahead of what was trained on: use
    :class:`~fastsab.PlannedDataLoader` (``loader.data_loader(num_workers=...)``), whose
    ``state_dict`` counts the batches the loop received. :meth:`state_dict` refuses to
    answer when it sees this sampler iterated by a ``DataLoader`` with workers.
    """

    def __init__(
        self, planner: Any, rank: int, world_size: int, even_batches: Any, balance: Any, *, epoch: int = 0
    ) -> None:
        self._init_cursor(planner, rank, world_size, even_batches, balance, epoch)
        self._ahead = False  # iterated by a DataLoader whose workers fetch ahead
        self._counted_by: object | None = None  # the PlannedDataLoader that counts received batches
        self.stats: EpochStats | None = None

    def __iter__(self) -> Iterator[list[int]]:
        self._ahead = self._counted_by is None and _called_by_worker_loader(sys._getframe(1))
        stats = EpochStats(self.epoch)
        _, stream = self._start_epoch(stats)
        self.stats = stats
        for chunk in stream:
            for batch in chunk.batches():
                stats.num_batches += 1
                stats.num_items += len(batch)
                self._step_done()  # counted as handed out
                yield batch.tolist()
        self._epoch_done(stats)

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands, counted in batches handed out (see the class docstring).

        Raises:
            RuntimeError: If a ``DataLoader`` with worker processes iterates this sampler:
                the count would include batches never trained on.
        """
        if self._ahead and self._progress is not None:
            raise RuntimeError(
                "this PlannedBatchSampler is iterated by a DataLoader with worker processes, which takes batches "
                "ahead of the training loop, so its position would skip batches never trained on; use "
                "loader.data_loader(num_workers=...) (a PlannedDataLoader) and its state_dict() instead."
            )
        return super().state_dict()


class PlannedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over a :class:`PlannedBatchSampler` whose state counts received batches.

    Worker processes fetch whole batches (``dataset.__getitems__`` when it exists) ahead of
    the loop; :meth:`state_dict` counts only the batches this loader's iterator returned, so
    a resume yields exactly the batches not trained on. ``len()``, :meth:`set_epoch` and
    :meth:`load_state_dict` act on the sampler. Made by ``loader.data_loader(...)``.

    Args:
        dataset: The dataset to fetch from.
        batch_sampler: The plan, from ``loader.batch_sampler()``.
        **options: Further ``DataLoader`` options (``num_workers``, ``collate_fn``,
            ``pin_memory``, ``prefetch_factor``, ``persistent_workers``, ...). The default
            ``collate_fn`` is :func:`~fastsab.collate_batch`, which also takes the whole
            batches :class:`~fastsab.OutOfCoreDataset` returns.
    """

    def __init__(self, dataset: Any, batch_sampler: PlannedBatchSampler, **options: Any) -> None:
        if not isinstance(batch_sampler, PlannedBatchSampler):
            raise TypeError(f"batch_sampler must be a PlannedBatchSampler, got {type(batch_sampler).__name__}.")
        for name in ("batch_size", "shuffle", "sampler", "drop_last"):
            if name in options:
                raise ValueError(f"{name} is decided by the batch plan; do not pass it to PlannedDataLoader.")
        if options.get("in_order", True) is not True:
            # NOTE: the state counts the batches received; out of order they are not the plan's first ones
            raise ValueError(
                f"PlannedDataLoader yields batches in the order of the plan, so that a saved state resumes "
                f"exactly; got in_order={options['in_order']!r}."
            )
        options.setdefault("collate_fn", collate_batch)
        super().__init__(dataset, batch_sampler=batch_sampler, **options)
        batch_sampler._counted_by = self
        self.plan = batch_sampler
        self._received: tuple[int, int] | None = None  # (epoch, steps) counted in received batches

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._counted(super().__iter__())

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        epoch, steps = -1, 0
        for batch in batches:
            if epoch < 0:  # the sampler has started its epoch by the time a batch arrives
                epoch, steps = self.plan.start_position or (self.plan.epoch, 0)
            steps += 1
            self._received = (epoch, steps)
            yield batch
        self._received = None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration."""
        self.plan.set_epoch(epoch)

    @property
    def stats(self) -> EpochStats | None:
        """The plan's report of the epoch (see :class:`~fastsab.PlannedBatchSampler`)."""
        return self.plan.stats

    def state_dict(self) -> dict[str, Any]:
        """The plan's state, counted in batches this loader returned to the loop."""
        if self._received is None:
            return self.plan.state_dict()
        return self.plan._state(*self._received)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see :meth:`PlannedBatchSampler.load_state_dict`)."""
        self._received = None
        self.plan.load_state_dict(state)


def _called_by_worker_loader(frame: Any) -> bool:
    """Whether ``frame`` (the caller of ``iter()``) belongs to a DataLoader iterator with workers."""
    from torch.utils.data import dataloader

    owner = frame.f_locals.get("self") if frame is not None else None
    return isinstance(owner, getattr(dataloader, "_MultiProcessingDataLoaderIter", ()))
