"""Recognizing out-of-memory errors of every torch backend.

Backends report running out of memory in different ways: ``torch.OutOfMemoryError`` (CUDA,
and others in recent torch), ``RuntimeError`` messages from CUDA, cuDNN, ROCm/HIP, XPU,
MPS and the CPU allocator, and Python's own ``MemoryError``. :func:`is_out_of_memory`
knows them all; anything else is not an out-of-memory error.
"""

from __future__ import annotations

import torch

__all__ = ["OOM_MESSAGES", "is_out_of_memory"]

#: Substrings of ``RuntimeError`` messages that mean the device (or host) ran out of memory.
OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN's answer when its workspace cannot be allocated
    "CUDNN_STATUS_ALLOC_FAILED",
    "HIP out of memory",
    "hipErrorOutOfMemory",
    "XPU out of memory",
    "MPS backend out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "not enough memory",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says that memory ran out (on any device or the host).

    Examples:
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
        True
        >>> is_out_of_memory(RuntimeError("shape mismatch"))
        False
    """
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(error, RuntimeError) and error.args:
        message = str(error.args[0])
        return any(pattern in message for pattern in OOM_MESSAGES)
    return False
