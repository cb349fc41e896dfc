"""From memory budgets to a batch size and a number of samples to hold in host memory.

``plan_memory`` answers the two questions a run near its memory limits starts with:
how large can a batch be on the accelerator, and how many samples fit in CPU memory at
once. It counts what it is told about: the model's parameters, gradients and optimizer
state, the bytes of a sample's input and output, and the activations, given per sample
or as a fitted memory model of the peak over the batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from fastsab._checks import check_optional_positive_int, check_positive_int
from fastsab.fetch.transfer import tree_arrays

__all__ = ["GiB", "KiB", "MemoryPlan", "MiB", "plan_memory", "sample_nbytes"]

#: Optimizer states kept per parameter (element-wise), by optimizer name.
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "sgd_momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2}


def KiB(value: float) -> int:
    """``value`` kibibytes in bytes."""
    return int(value * 2**10)


def MiB(value: float) -> int:
    """``value`` mebibytes in bytes.

    Examples:
        >>> MiB(1.5)
        1572864
    """
    return int(value * 2**20)


def GiB(value: float) -> int:
    """``value`` gibibytes in bytes.

    Examples:
        >>> GiB(2)
        2147483648
    """
    return int(value * 2**30)


def sample_nbytes(sample: Any) -> int:
    """Bytes of the tensors and arrays of a sample pytree.

    Examples:
        >>> sample_nbytes({"x": torch.zeros(3, 4), "y": np.zeros(2, dtype=np.int64)})
        64
    """
    return sum(
        leaf.numel() * leaf.element_size() if isinstance(leaf, torch.Tensor) else leaf.nbytes
        for leaf in tree_arrays(sample)
    )


def _shape_bytes(shape: Any, dtype: Any) -> int:
    if shape is None:
        return 0
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"shapes must be tuples of non-negative integers, got {shape!r}.")
    if isinstance(dtype, torch.dtype):
        itemsize = torch.empty((), dtype=dtype).element_size()
    else:
        itemsize = np.dtype(dtype).itemsize
    return int(np.prod(shape, dtype=np.int64)) * itemsize


@dataclass(frozen=True)
class MemoryPlan:
    """A batch size and a number of samples to hold in CPU memory, with the arithmetic.

    All sizes are bytes. Printing the plan shows a table.
    """

    batch_size: int
    max_batch_size: int | None
    samples_in_memory: int | None
    reads_in_memory: int | None
    gpu_memory_limit: int | None
    cpu_memory_limit: int | None
    model_bytes: int
    per_sample_gpu_bytes: int
    per_sample_cpu_bytes: int
    gpu_bytes_at_batch: int | None
    cpu_bytes_held: int | None
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        def size(value: int | None) -> str:
            return "-" if value is None else f"{value / 2**20:,.1f} MiB"

        rows = [
            ("batch size", str(self.batch_size)),
            ("largest batch that fits the GPU", "-" if self.max_batch_size is None else str(self.max_batch_size)),
            ("samples held in CPU memory", "-" if self.samples_in_memory is None else str(self.samples_in_memory)),
            ("reads held in CPU memory", "-" if self.reads_in_memory is None else str(self.reads_in_memory)),
            ("GPU limit", size(self.gpu_memory_limit)),
            ("  model: parameters, gradients, optimizer", size(self.model_bytes)),
            ("  per sample on the GPU", size(self.per_sample_gpu_bytes)),
            ("  GPU use at the batch size", size(self.gpu_bytes_at_batch)),
            ("CPU limit", size(self.cpu_memory_limit)),
            ("  per sample in CPU memory", size(self.per_sample_cpu_bytes)),
            ("  CPU use by the held samples", size(self.cpu_bytes_held)),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value:>14}" for name, value in rows]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])

    def __str__(self) -> str:
        return self.table()


def _model_bytes(model: torch.nn.Module | None, optimizer: str, train: bool) -> int:
    if model is None:
        return 0
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)!r}, got {optimizer!r}.")
    states = OPTIMIZER_STATES[optimizer] if train else 0
    return parameters + buffers + (trainable * (1 + states) if train else 0)


def plan_memory(
    *,
    gpu_memory_limit: int | None = None,
    cpu_memory_limit: int | None = None,
    sample: Any = None,
    input_shape: Any = None,
    input_dtype: Any = np.float32,
    output_shape: Any = None,
    output_dtype: Any = np.float32,
    model: torch.nn.Module | None = None,
    optimizer: str = "adam",
    train: bool = True,
    activation_bytes_per_sample: int = 0,
    memory_model: Any = None,
    preferred_batch_size: int | None = None,
    one_read_count: int = 1,
    total_sample_count: int | None = None,
    cpu_overhead_bytes: int = 0,
) -> MemoryPlan:
    """Plan a batch size for a GPU budget and the samples to hold for a CPU budget.

    GPU: ``model_bytes + batch * (sample bytes + activation bytes per sample)`` must stay
    within ``gpu_memory_limit``, or, with a ``memory_model`` (a callable mapping a batch
    size tensor to predicted peak bytes, e.g. a fitted ``PolynomialRegression``), the
    model's prediction plus ``model_bytes`` must. The batch size is the largest multiple of
    ``one_read_count`` that fits, capped by ``preferred_batch_size`` and the sample count.

    CPU: samples cost their input and output bytes; the number held at once is the
    largest multiple of the batch size (or else of ``one_read_count``) that fits in
    ``cpu_memory_limit - cpu_overhead_bytes``.

    Args:
        gpu_memory_limit: The GPU budget in bytes (see ``GiB``), or ``None`` (not planned).
        cpu_memory_limit: The CPU budget in bytes, or ``None`` (not planned).
        sample: A sample pytree (its tensors and arrays are counted), or the shapes below.
        input_shape: One sample's input shape (instead of ``sample``).
        input_dtype: The dtype of ``input_shape``.
        output_shape: One sample's output shape (instead of ``sample``).
        output_dtype: The dtype of ``output_shape``.
        model: Counted as parameters and buffers, plus gradients and optimizer state when
            ``train``.
        optimizer: Optimizer states per parameter: ``"adam"`` (2), ``"sgd_momentum"`` (1),
            ``"sgd"`` (0), ...
        train: Count gradients and optimizer state.
        activation_bytes_per_sample: Activations per sample, if known.
        memory_model: Predicts the peak activation bytes of a batch from its size.
        preferred_batch_size: Used when it fits (rounded down to ``one_read_count``).
        one_read_count: Samples produced by one read (the feeder seed's augmentations): the
            batch size and the samples held are multiples of it.
        total_sample_count: Caps the batch size and the samples held.
        cpu_overhead_bytes: Host memory to leave for everything else.

    Raises:
        ValueError: If nothing says how much a sample needs, or a budget cannot hold the
            model, one batch of ``one_read_count`` samples, or one batch in CPU memory.

    Examples:
        >>> plan = plan_memory(gpu_memory_limit=GiB(1), cpu_memory_limit=MiB(512),
        ...                    input_shape=(3, 256, 256), output_shape=(10,), one_read_count=2,
        ...                    preferred_batch_size=100, activation_bytes_per_sample=MiB(4))
        >>> plan.batch_size, plan.max_batch_size, plan.samples_in_memory
        (100, 215, 600)
    """
    reads = check_positive_int("one_read_count", one_read_count)
    preferred = check_optional_positive_int("preferred_batch_size", preferred_batch_size)
    total = check_optional_positive_int("total_sample_count", total_sample_count)
    for name, value in (("gpu_memory_limit", gpu_memory_limit), ("cpu_memory_limit", cpu_memory_limit)):
        check_optional_positive_int(name, value)
    if sample is not None and (input_shape is not None or output_shape is not None):
        raise ValueError("give either sample or input_shape/output_shape, not both.")
    per_sample = (
        sample_nbytes(sample)
        if sample is not None
        else (_shape_bytes(input_shape, input_dtype) + _shape_bytes(output_shape, output_dtype))
    )
    if per_sample == 0 and memory_model is None and not activation_bytes_per_sample:
        raise ValueError(
            "nothing says how much memory a sample needs: give sample=, input_shape= (and output_shape=), "
            "activation_bytes_per_sample= or memory_model=."
        )
    model_bytes = _model_bytes(model, optimizer, train)
    per_sample_gpu = per_sample + int(activation_bytes_per_sample)
    notes = []
    if model is not None and not activation_bytes_per_sample and memory_model is None:
        notes.append("activations are not counted: give activation_bytes_per_sample= or memory_model=")

    cap = min(x for x in (preferred, total) if x is not None) if (preferred or total) else None
    max_fit: int | None = None
    gpu_at_batch: int | None = None
    if gpu_memory_limit is not None:
        room = gpu_memory_limit - model_bytes
        if room <= 0:
            raise ValueError(
                f"the model's parameters, gradients and optimizer state need {model_bytes / 2**20:,.1f} MiB, "
                f"more than gpu_memory_limit={gpu_memory_limit / 2**20:,.1f} MiB."
            )

        def need(batch: int) -> int:
            activations = 0 if memory_model is None else _predict(memory_model, batch)
            return batch * per_sample_gpu + activations

        max_fit = _largest_fitting(need, room, total)
        if max_fit < reads:
            raise ValueError(
                f"gpu_memory_limit={gpu_memory_limit / 2**20:,.1f} MiB cannot hold one read of {reads} samples "
                f"({need(reads) / 2**20:,.1f} MiB besides the model's {model_bytes / 2**20:,.1f} MiB)."
            )
    limit = min(x for x in (cap, max_fit) if x is not None) if (cap or max_fit) else None
    if limit is None:
        raise ValueError(
            "no batch size can be planned: give gpu_memory_limit=, preferred_batch_size= or total_sample_count=."
        )
    batch = max(reads, limit // reads * reads)
    if max_fit is not None:
        gpu_at_batch = model_bytes + need(batch)
    if preferred is not None and batch != preferred:
        notes.append(f"preferred_batch_size={preferred} became {batch} (GPU budget, sample count, one_read_count)")

    held = (
        _Held()
        if cpu_memory_limit is None
        else _held(cpu_memory_limit, cpu_overhead_bytes, per_sample, batch, total, reads)
    )
    return MemoryPlan(
        batch_size=batch,
        max_batch_size=max_fit,
        gpu_memory_limit=gpu_memory_limit,
        cpu_memory_limit=cpu_memory_limit,
        model_bytes=model_bytes,
        per_sample_gpu_bytes=per_sample_gpu,
        per_sample_cpu_bytes=per_sample,
        gpu_bytes_at_batch=gpu_at_batch,
        notes=notes,
        **held._asdict(),
    )


class _Held(NamedTuple):
    """The CPU side of a ``MemoryPlan`` (``None`` without a CPU budget)."""

    samples_in_memory: int | None = None
    reads_in_memory: int | None = None
    cpu_bytes_held: int | None = None


def _held(limit: int, overhead: int, per_sample: int, batch: int, total: int | None, reads: int) -> _Held:
    """The samples ``limit`` bytes hold (less ``overhead``): a multiple of ``batch``, or all ``total`` of them.

    Raises:
        ValueError: If not even one batch fits.
    """
    room = limit - int(overhead)
    fit = room // max(per_sample, 1) if room > 0 else 0
    if total is not None:
        fit = min(fit, total)
    if fit < batch:
        raise ValueError(
            f"cpu_memory_limit={limit / 2**20:,.1f} MiB (less {int(overhead) / 2**20:,.1f} "
            f"MiB of overhead) cannot hold one batch of {batch} samples ({batch * per_sample / 2**20:,.1f} MiB)."
        )
    held = fit // batch * batch if total is None or fit < total else fit
    return _Held(samples_in_memory=held, reads_in_memory=held // reads, cpu_bytes_held=held * per_sample)


def _predict(memory_model: Any, batch: int) -> int:
    value = memory_model(torch.tensor([float(batch)], dtype=torch.float64))
    value = float(value.reshape(-1)[0]) if isinstance(value, torch.Tensor) else float(value)
    if not math.isfinite(value):
        raise ValueError(f"memory_model predicted {value!r} bytes for a batch of {batch}.")
    return max(0, math.ceil(value))


def _largest_fitting(need: Any, room: int, total: int | None) -> int:
    """Largest batch with ``need(batch) <= room`` (``need`` non-decreasing), by galloping."""
    if need(1) > room:
        return 0
    low, high = 1, 2
    ceiling = total if total is not None else 2**40
    while high <= ceiling and need(high) <= room:
        low, high = high, high * 2
    high = min(high, ceiling + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if need(middle) <= room:
            low = middle
        else:
            high = middle
    return low
