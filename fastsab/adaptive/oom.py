"""Recognizing out-of-memory errors of every torch backend.

Backends report running out of memory in different ways: ``torch.OutOfMemoryError`` (CUDA,
and others in recent torch), ``RuntimeError`` messages from CUDA, cuBLAS, cuDNN, ROCm/HIP,
MIOpen, XPU, MPS and the CPU allocator, and Python's own ``MemoryError``.
``is_out_of_memory`` knows them all; anything else is not an out-of-memory error.

A ``RuntimeError`` counts only if its message *begins* with the allocator's own words
(``OOM_MESSAGES``): a message that merely mentions memory somewhere ("not enough memory
in my cache"), and cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED`` (an unsupported configuration,
which a smaller batch does not cure), are not out-of-memory errors.
"""

from __future__ import annotations

import re

import torch

__all__ = ["OOM_MESSAGES", "is_out_of_memory"]

#: How torch's allocators begin the ``RuntimeError`` message when memory runs out, per backend.
OOM_MESSAGES = (
    "CUDA out of memory",  # the CUDA caching allocator
    "CUDA error: out of memory",  # the CUDA runtime (cudaErrorMemoryAllocation)
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not allocate its workspace
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",  # cuDNN 9
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9
    "HIP out of memory",  # the ROCm caching allocator
    "HIP error: out of memory",  # the HIP runtime
    "HIP error: hipErrorOutOfMemory",
    "miopenStatusAllocFailed",  # MIOpen, ROCm's cuDNN
    "XPU out of memory",
    "MPS backend out of memory",
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator (POSIX)
    "DefaultCPUAllocator: not enough memory",  # the CPU allocator (Windows, Android)
)

# NOTE: the CPU allocator reports through CAFFE_ENFORCE, which puts its own prefix in front:
# "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: ..."
_ENFORCE_PREFIX = r"(?:\[enforce fail at [^\]\n]*\] [^\n]*?)?"
_CPU_MESSAGES = tuple(message for message in OOM_MESSAGES if message.startswith("DefaultCPUAllocator"))
_DEVICE_MESSAGES = tuple(message for message in OOM_MESSAGES if message not in _CPU_MESSAGES)
_OOM_PATTERN = re.compile(
    r"\A(?:"
    + "|".join(map(re.escape, _DEVICE_MESSAGES))
    + "|"
    + _ENFORCE_PREFIX
    + "(?:"
    + "|".join(map(re.escape, _CPU_MESSAGES))
    + "))"
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says that memory ran out (on any device or the host).

    True for ``torch.OutOfMemoryError`` and ``MemoryError`` (and their subclasses), and for
    a ``RuntimeError`` whose message begins with one of ``OOM_MESSAGES`` (after the
    ``[enforce fail at ...]`` prefix the CPU allocator's messages carry).

    Examples:
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
        True
        >>> is_out_of_memory(RuntimeError("not enough memory in my cache"))
        False
        >>> is_out_of_memory(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"))
        False
    """
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(error, RuntimeError) and error.args:
        return _OOM_PATTERN.match(str(error.args[0])) is not None
    return False
