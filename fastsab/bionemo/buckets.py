"""Size buckets with the bionemo API: the bucketed batch sampler and bucket boundaries.

``BucketBatchSampler`` groups indices into size buckets and draws batches from
per-bucket batch samplers; ``create_buckets`` derives bucket boundaries from the sizes.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Sampler

from fastsab._arrays import native_order
from fastsab._checks import NotAnIntegerError, check_positive_int, user_stacklevel

__all__ = ["BucketBatchSampler", "Buckets", "NoElementInBucketsError", "create_buckets"]


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
            element lies outside the buckets (``NoElementInBucketsError``, also a
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
        ...     sizes=torch.arange(10),
        ...     bucket_boundaries=torch.tensor([-5, 0, 5, 10, 15]),  # the first and last buckets are empty
        ...     base_batch_sampler_class=torch.utils.data.BatchSampler,
        ...     base_batch_sampler_shared_kwargs={"drop_last": False},
        ...     base_batch_sampler_individual_kwargs={"batch_size": [1, 2, 3, 4]},
        ...     generator=torch.Generator().manual_seed(0),
        ... )
        >>> sampler.bucket_sizes.tolist(), list(sampler)
        ([0, 5, 5, 0], [[8, 9, 5], [4, 0], [1, 3], [2], [6, 7]])
        >>> list(sampler)  # the next pass draws on from the same generator
        [[1, 2], [3, 0], [6, 5, 7], [4], [8, 9]]
        >>> sampler = BucketBatchSampler(
        ...     torch.arange(25), torch.tensor([-25, 0, 25, 50]), torch.utils.data.BatchSampler,
        ...     {"drop_last": False}, {"batch_size": [2, 10, 4]}, shuffle=False)
        >>> sampler.num_buckets, sampler.bucket_sizes.tolist(), sampler.base_batch_sampler_individual_kwargs[1]
        (3, [0, 25, 0], {'batch_size': 10})

        With ``SizeAwareBatchSampler`` as base sampler, to cap each batch's total size:

        >>> from fastsab import SizeAwareBatchSampler
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
        base_batch_sampler_class: type[Sampler[list[int]]],
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
                f"{self.num_skipped} elements are outside the buckets provided and will be skipped",
                stacklevel=user_stacklevel(),
            )
        # NOTE: each base sampler keeps a reference to its bucket's list; shuffling the list in
        # place (as __iter__ does) reshuffles what the base sampler iterates over.
        self.base_batch_samplers: list[Sampler[list[int]]] = [
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


def _as_real_tensor(name: str, given: object) -> torch.Tensor:
    values = torch.from_numpy(native_order(given)) if isinstance(given, np.ndarray) else given
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
    """What ``create_buckets`` returns: a named tuple, so both
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
        A ``Buckets`` named tuple ``(bucket_boundaries, bucket_sizes)``: ascending
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
