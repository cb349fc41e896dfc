"""The batch size of each shape bucket: the largest that a training step runs without running out of memory.

A batch of shape bucket ``k`` holds ``B_k`` rows padded to ``L_k`` (see ``ShapeBuckets``).
``max_batch_sizes`` finds each ``B_k`` in one of two ways:

* measured: run ``step`` on made-up ``(B, L)`` batches, growing ``B`` geometrically until it runs
  out of memory, then bisecting until the largest batch that ran and the smallest that did not
  are within a relative ``gap`` (the longest bucket first: a longer bucket's result is where a
  shorter one's search starts, since its batches fit at least as many rows);
* predicted: the largest ``B`` whose peak a fitted ``BatchMemoryModel`` predicts within a
  ``budget`` (``fixed + B * per_item(L)``), exactly, without running anything.

The table returned says in its ``source`` how it was found, and is saved as JSON with it.
"""

from __future__ import annotations

import gc
import math
import platform
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastsab._checks import as_real_number, check_positive_int, user_stacklevel
from fastsab.adaptive.oom import is_out_of_memory
from fastsab.memory.batch import BatchMemoryModel
from fastsab.plan.shape_buckets import ShapeBuckets

__all__ = ["max_batch_sizes", "padded_batch"]

#: A step's outcome on one batch size: ``None`` if it ran, else the out-of-memory message.
Outcome = str | None


def padded_batch(batch_size: int, length: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A made-up batch of ``batch_size`` rows of ``length`` tokens, as ``PadCollator`` makes it.

    ``input_ids`` (int64 zeros, ``(B, L)``), ``attention_mask`` (int64 ones, ``(B, L)``: every
    row is as long as the bucket, the worst case) and ``sample_mask`` (bool ones, ``(B,)``: every
    row a real sample), on ``device``. ``max_batch_sizes`` measures with it unless given
    ``make_batch``.

    Examples:
        >>> batch = padded_batch(2, 3)
        >>> {key: (tuple(value.shape), value.dtype) for key, value in batch.items()}
        {'input_ids': ((2, 3), torch.int64), 'attention_mask': ((2, 3), torch.int64), 'sample_mask': ((2,), torch.bool)}
    """
    shape = (batch_size, length)
    return {
        "input_ids": torch.zeros(shape, dtype=torch.int64, device=device),
        "attention_mask": torch.ones(shape, dtype=torch.int64, device=device),
        "sample_mask": torch.ones(batch_size, dtype=torch.bool, device=device),
    }


def max_batch_sizes(
    step: Callable[[Any], Any] | None,
    lengths: Sequence[int] | ShapeBuckets,
    device: torch.device | str | None = None,
    *,
    make_batch: Callable[[int, int], Any] | None = None,
    model: BatchMemoryModel | None = None,
    budget: float | None = None,
    start: int = 16,
    max_batch_size: int = 2**16,
    gap: float = 0.05,
    batch_size_multiple: int = 1,
) -> ShapeBuckets:
    """The largest batch size of each bucket length: measured by running ``step``, or predicted by ``model``.

    Measured (``step`` given): for each length ``L``, longest first, ``step(make_batch(B, L))``
    runs with ``B`` growing twofold from ``start`` (from the longer bucket's result for the
    others) until it runs out of memory, then halfway between the largest ``B`` that ran and the
    smallest that did not, until they are within ``gap`` of the latter (or adjacent). ``B_k`` is
    the largest that ran (the search takes it that a batch size that runs means that the smaller
    ones of the same length run too). Out of memory is what ``is_out_of_memory`` says it is (CUDA's
    ``torch.OutOfMemoryError``, the CPU allocator's failure, ``MemoryError``); any other error
    propagates. Memory is freed between tries (``gc.collect``, and ``torch.cuda.empty_cache`` on
    a CUDA device).

    Predicted (``model`` and ``budget`` given): ``B_k`` is the largest ``B`` with
    ``model.fixed + B * model.per_item(L_k) <= budget``: the model's prediction for ``B`` rows of
    ``L_k`` tokens (both of its costs agree on such a batch); nothing runs.

    Every size tried or returned is a multiple of ``batch_size_multiple`` and at most
    ``max_batch_size``; a bucket that reaches ``max_batch_size`` is named in a warning.

    Args:
        step: One training step on a batch (forward, backward, optimizer step: what training
            holds at its peak), or ``None`` to predict with ``model``.
        lengths: The bucket lengths, or a ``ShapeBuckets`` (its batch sizes are replaced).
        device: Where the batches are made and memory is freed: ``None`` for the current CUDA
            device if there is one, else the CPU. On the CPU, memory runs out only under a limit
            (``fastsab.adaptive.set_cpu_memory_limit``); without one the system may kill the
            process instead.
        make_batch: ``(batch_size, length) -> batch`` for ``step``; by default ``padded_batch``
            on ``device`` (a ``PadCollator`` batch: ``input_ids``, ``attention_mask``,
            ``sample_mask``).
        model: A fitted ``BatchMemoryModel`` of one feature per item, its length.
        budget: The memory ``model``'s predictions must stay within (its unit, bytes).
        start: The first batch size tried (measured; ``max_batch_size`` if that is smaller).
        max_batch_size: The largest batch size tried or returned.
        gap: The relative gap between the largest batch that ran and the smallest that ran out
            of memory at which a search stops, in ``(0, 1)``: the result is within it of the
            largest batch that runs.
        batch_size_multiple: Every batch size is a multiple of this (e.g. 8 for tensor cores).

    Returns:
        The bucket lengths with their batch sizes, and a ``source`` that says how they were found.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If an argument is out of range, the mode is unclear (``step`` with ``model``,
            ``model`` without ``budget``), or no batch of a bucket fits (its length is named).

    Examples:
        >>> def step(batch):  # a device that holds 4096 tokens
        ...     if batch["input_ids"].numel() > 4096:
        ...         raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        >>> table = max_batch_sizes(step, [64, 128, 512], "cpu", gap=0.01)
        >>> table.lengths, table.batch_sizes
        ((64, 128, 512), (64, 32, 8))
    """
    table = lengths if isinstance(lengths, ShapeBuckets) else ShapeBuckets(lengths)
    gap = _checked_gap(gap)
    multiple = check_positive_int("batch_size_multiple", batch_size_multiple)
    limit = check_positive_int("max_batch_size", max_batch_size)
    if limit < multiple:
        raise ValueError(f"max_batch_size must be at least batch_size_multiple ({multiple}), got {limit!r}: raise it.")
    first = check_positive_int("start", start)
    if model is not None or budget is not None:
        if step is not None or make_batch is not None or device is not None:
            raise ValueError(
                "pass either step (with make_batch and device) to measure the batch sizes, or model and budget "
                f"to predict them, not both: got step={step!r}, make_batch={make_batch!r}, device={device!r}."
            )
        sizes, source = _predicted(table.lengths, model, budget, multiple, limit)
    else:
        if not callable(step):
            raise TypeError(f"step must be a callable that runs one training step on a batch, got {step!r}.")
        if make_batch is not None and not callable(make_batch):
            raise TypeError(f"make_batch must be a callable (batch_size, length) -> batch, got {make_batch!r}.")
        sizes, source = _measured(step, table.lengths, _device(device), make_batch, first, multiple, limit, gap)
    capped = [length for length, size in zip(table.lengths, sizes) if size > limit - multiple]
    if capped:
        warnings.warn(
            f"max_batch_sizes reached max_batch_size={limit} at bucket lengths {capped} with memory to spare: "
            "larger batches may fit there; raise max_batch_size to find them.",
            stacklevel=user_stacklevel(),
        )
    return table.with_batch_sizes(sizes, source)


def largest_fitting(fits: Callable[[int], Outcome], start: int, limit: int, gap: float) -> tuple[int, Outcome]:
    """The largest ``n`` in ``[1, limit]`` for which ``fits(n)`` is ``None``, within ``gap``.

    ``n`` doubles from ``start`` while ``fits`` succeeds, halves while it fails and nothing has
    succeeded yet, then bisects until the largest success and the smallest failure are
    adjacent or within ``gap`` of the failure. Returns the largest success (0 if ``fits(1)``
    failed) and the last failure's message (``None`` if nothing failed).

    Examples:
        >>> tried = []
        >>> def fits(n):
        ...     tried.append(n)
        ...     return None if n <= 100 else "out of memory"
        >>> largest_fitting(fits, 16, 1000, 0.05), tried
        ((100, 'out of memory'), [16, 32, 64, 128, 96, 112, 104, 100])
    """
    ran, failed, message = 0, 0, None
    size = min(start, limit)
    while True:
        outcome = fits(size)
        if outcome is None:
            ran = size
        else:
            failed, message = size, outcome
        if not failed:
            if ran == limit:
                return ran, message
            size = min(2 * ran, limit)
        elif not ran:
            if size == 1:
                return 0, message
            size //= 2
        elif failed - ran <= 1 or failed - ran <= gap * failed:
            return ran, message
        else:
            size = (ran + failed) // 2


def _measured(
    step: Callable[[Any], Any],
    lengths: tuple[int, ...],
    device: torch.device,
    make_batch: Callable[[int, int], Any] | None,
    start: int,
    multiple: int,
    limit: int,
    gap: float,
) -> tuple[list[int], str]:
    """Each length's largest batch size that ``step`` runs, longest first, and the table's source."""
    make = make_batch if make_batch is not None else (lambda rows, length: padded_batch(rows, length, device))
    sizes: dict[int, int] = {}
    # NOTE: searched in units of batch_size_multiple, so that every size tried is one and the
    # result is the largest multiple that runs, not a smaller size rounded down
    units = max(1, start // multiple)
    for length in reversed(lengths):

        def fits(count: int, length: int = length) -> Outcome:
            return _try(step, make, count * multiple, length, device)

        found, message = largest_fitting(fits, units, limit // multiple, gap)
        if not found:
            raise ValueError(
                f"bucket length {length} runs out of memory even with a batch of {multiple} row(s) ({message}): "
                "use shorter bucket lengths, a smaller model or step, or a device with more memory."
            )
        sizes[length] = found * multiple
        units = found
    source = f"measured by max_batch_sizes on {_device_name(device)}, torch {torch.__version__}, gap {gap:g}"
    return [sizes[length] for length in lengths], source


def _try(
    step: Callable[[Any], Any], make: Callable[[int, int], Any], rows: int, length: int, device: torch.device
) -> Outcome:
    """Run ``step`` on a ``(rows, length)`` batch: ``None`` if it ran, its message if it ran out of memory."""
    outcome = None
    try:
        # NOTE: the batch is not named here, so that it is freed as soon as the step returns
        step(make(rows, length))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        # NOTE: only the message is kept: the error's traceback holds the step's frames and the
        # tensors in them, which must be freed before the next try
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return outcome


def _predicted(
    lengths: tuple[int, ...], model: BatchMemoryModel | None, budget: Any, multiple: int, limit: int
) -> tuple[list[int], str]:
    """Each length's largest batch size whose predicted peak fits ``budget``, and the table's source."""
    if model is None:
        raise ValueError(
            f"budget is given without model (budget={budget!r}): pass the fitted BatchMemoryModel its predictions "
            "are compared with, or step to measure instead."
        )
    if not isinstance(model, BatchMemoryModel):
        raise TypeError(f"model must be a fitted BatchMemoryModel (fit_batch_memory), got {model!r}.")
    if budget is None:
        raise ValueError("budget must be given with model: the memory its predictions must stay within.")
    budget = as_real_number("budget", budget)
    if not math.isfinite(budget) or budget <= model.fixed:
        raise ValueError(
            f"budget must be a finite number above the model's fixed cost ({model.fixed:.0f}), got {budget!r}."
        )
    if model.per_item.num_features != 1:
        raise ValueError(
            "model must predict from one feature per item, its length, got a model of "
            f"{model.per_item.num_features} features."
        )
    per_row = model.per_item(torch.tensor(lengths, dtype=torch.float64)).numpy().astype(np.float64)
    sizes = []
    for length, cost in zip(lengths, per_row.tolist()):
        most = limit // multiple
        if cost > 0:
            # NOTE: the division guesses; the prediction itself decides, one multiple at a time
            most = min(most, int((budget - model.fixed) / (cost * multiple)) + 1)
            while most > 0 and model.fixed + most * multiple * cost > budget:
                most -= 1
        if not most:
            raise ValueError(
                f"bucket length {length}: a batch of {multiple} row(s) is predicted to need "
                f"{model.fixed + multiple * cost:.0f}, above budget={budget!r}: raise the budget or shorten the bucket."
            )
        sizes.append(most * multiple)
    source = (
        f"predicted by a BatchMemoryModel (cost {model.cost!r}, fixed {model.fixed:.0f}, margin {model.margin:.3g}) "
        f"within a budget of {budget:.0f}"
    )
    return sizes, source


def _checked_gap(gap: Any) -> float:
    number = as_real_number("gap", gap)
    if not 0 < number < 1:
        raise ValueError(f"gap must be a number in (0, 1), got {gap!r}: e.g. 0.05 for batch sizes within 5%.")
    return float(number)


def _device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"device must be a torch.device, a string or None, got {device!r}.")
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({platform.machine() or 'unknown machine'})"
    return str(device)
