"""The streaming form of the greedy rule: the bionemo ``size_aware_batching`` generator.

``size_aware_batching`` batches a plain iterable item by item, with the rule of
``fastsab.plan.batching`` (the vectorized ``split_batches`` gives the same
batches); ``report_batching`` sends the end-of-epoch summary that the bionemo paths log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from fastsab._checks import check_nonnegative_real, short_repr
from fastsab.plan.costs import BatchCost
from fastsab.plan.item_sizes import item_size, oversize_message, per_item_sizeof

__all__ = ["report_batching", "size_aware_batching"]

Data = TypeVar("Data")


def size_aware_batching(
    dataset: Iterable[Data],
    sizeof: Callable[[Data], Any] | Mapping[Any, Any],
    max_total_size: int | float,
    collate_fn: Callable[[list[Data]], Any] | None = None,
    info_logger: Callable[[str], None] | None = None,
    warn_logger: Callable[[str], None] | None = None,
    *,
    max_batch_size: int | None = None,
) -> Iterator[Any]:
    """Batch an iterable so that no batch's total size exceeds ``max_total_size``.

    The streaming, per-item form of the greedy rule (bionemo compatible): it consumes
    ``dataset`` once and yields each batch as soon as the next item would not fit. Use it
    for plain iterables; for indexable data with known sizes prefer the vectorized
    ``SizeAwareBatchSampler`` or the fast loaders.

    Args:
        dataset: The input iterable.
        sizeof: A function (or mapping) giving the size of each element of ``dataset``.
        max_total_size: The inclusive cap on a batch's total size; a finite number >= 0
            (a huge one such as ``2**70`` works as "no practical cap"; with 0, the elements
            of size 0 are batched and the others skipped).
        collate_fn: Optional function applied to each batch (a list) before it is yielded.
        info_logger: Optional function called with a summary at the end.
        warn_logger: Optional function called for each skipped oversize element and with
            a count of the skipped ones at the end.
        max_batch_size: Optional cap on the number of elements of a batch (an extension of
            the bionemo API; the batch being filled is the generator's only buffer).

    Yields:
        Batches (lists of elements, or what ``collate_fn`` returns).

    Raises:
        TypeError: If ``dataset`` is not iterable, ``sizeof`` is neither callable nor a
            mapping, ``max_total_size`` is not a number, or ``sizeof`` gives an element a size
            that is not one real number (a 0-d tensor or a numpy number is fine).
        ValueError: If ``max_total_size`` is negative or not finite, or ``sizeof`` gives an
            element a NaN, infinite or negative size (checked as each element arrives).
        RuntimeError: If ``sizeof`` raises for an element.

    Examples:
        >>> import torch
        >>> from torch.utils.data import default_collate
        >>> dataset = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]),
        ...            torch.tensor([7, 8]), torch.tensor([9, 10])]
        >>> list(size_aware_batching(dataset, lambda x: x.numel(), 4, collate_fn=default_collate))
        [tensor([[1, 2],
                [3, 4]]), tensor([[5, 6],
                [7, 8]]), tensor([[ 9, 10]])]
    """
    if not (isinstance(dataset, Iterable) or hasattr(type(dataset), "__getitem__")):
        raise TypeError(f"dataset must be an iterable, got {short_repr(dataset)} of type {type(dataset).__name__}.")
    size = per_item_sizeof(sizeof, "a callable or a mapping")
    # NOTE: the bionemo API takes one cap (a number), checked before the rest of the rule
    rule = BatchCost(check_nonnegative_real("max_total_size", max_total_size), max_batch_size=max_batch_size)
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}.")
    return _size_aware_batches(dataset, size, rule, collate_fn, info_logger, warn_logger)


def _size_aware_batches(
    dataset: Iterable[Data],
    sizeof: Callable[[Data], Any],
    rule: BatchCost,
    collate_fn: Callable[[list[Data]], Any] | None,
    info_logger: Callable[[str], None] | None,
    warn_logger: Callable[[str], None] | None,
) -> Iterator[Any]:
    batch: list[Data] = []
    total: int | float = 0
    n_samples = n_batched = n_batches = 0
    fits = rule.fits
    for data in dataset:
        n_samples += 1
        size = item_size(sizeof, data, _describe_data)
        # NOTE: one test per item that joins the open batch: sizes are >= 0, so an item that
        # fits with the batch (or alone, into an empty one) is not oversize either
        if not fits(total + size, len(batch) + 1):
            if not (batch and fits(size, 1)):
                if warn_logger is not None:
                    warn_logger(oversize_message(data, size, rule.caps[0]))
                continue
            n_batches += 1
            yield batch if collate_fn is None else collate_fn(batch)
            batch, total = [], 0
        batch.append(data)
        total += size
        n_batched += 1
    if batch:
        n_batches += 1
        yield batch if collate_fn is None else collate_fn(batch)
    report_batching(n_samples, n_batched, n_batches, rule.caps[0], info_logger, warn_logger)


def _describe_data(data: object) -> str:
    return f"data={short_repr(data)}"


def report_batching(
    n_samples: int,
    n_batched: int,
    n_batches: int,
    max_total_size: Any,
    info_logger: Callable[[str], None] | None,
    warn_logger: Callable[[str], None] | None,
) -> None:
    """Send the end-of-epoch summary of a size-aware batching run to the loggers."""
    if warn_logger is not None and n_batched < n_samples:
        warn_logger(
            f"{n_batched} samples were batched from {n_samples} of the input data. Missing "
            f"samples are due to exceeding max_total_size={max_total_size}"
        )
    if info_logger is not None:
        info_logger(
            f"Batched {n_batched} samples into {n_batches} batches. If this doesn't match "
            "your expectation, consider adjusting max_total_size or the sizeof functor"
        )
