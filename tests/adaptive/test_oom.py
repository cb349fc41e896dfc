from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fastsab.adaptive.oom import OOM_MESSAGES, is_out_of_memory

# The messages torch raises when memory runs out, as they read in full.
ALLOCATOR_MESSAGES = [
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.44 MiB "
    "is free. Of the allocated memory 7.12 GiB is allocated by PyTorch.",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "HIP out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.98 GiB total capacity)",
    "HIP error: out of memory",
    "HIP error: hipErrorOutOfMemory",
    "miopenStatusAllocFailed",
    "XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 28.55 GiB",
    "MPS backend out of memory (MPS allocated: 17.21 GiB, other allocations: 1.00 GiB, max allowed: 20.13 GiB).",
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)",
    "[enforce fail at C:\\actions-runner\\_work\\pytorch\\c10\\core\\impl\\alloc_cpu.cpp:72] data. "
    "DefaultCPUAllocator: not enough memory: you tried to allocate 22500000000 bytes.",
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.",
]


@pytest.mark.parametrize("message", ALLOCATOR_MESSAGES)
def test_allocator_messages_are_out_of_memory(message):
    assert is_out_of_memory(RuntimeError(message))
    assert is_out_of_memory(torch.AcceleratorError(message))  # how recent torch raises CUDA runtime errors


def test_every_listed_message_is_recognized():
    for message in OOM_MESSAGES:
        assert is_out_of_memory(RuntimeError(message + ": details"))


@pytest.mark.parametrize(
    "message",
    [
        "not enough memory in my cache",  # a user's own check
        "the pool has not enough memory left for this request",
        "worker ran out of memory budget; increase max_items",
        "my allocator: out of memory",
        "expected the run to fail with 'CUDA out of memory', but it passed",  # the words, quoted in another error
        "retry failed: CUDA error: out of memory",  # an allocator's words, not at the start
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
        "CUDA error: device-side assert triggered",
        "CUDA error: an illegal memory access was encountered",
        "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
        "[enforce fail at foo.cpp:3] x. the cache said: not enough memory",
        "DefaultCPUAllocator said nothing",
        "",
    ],
)
def test_other_messages_are_not_out_of_memory(message):
    assert not is_out_of_memory(RuntimeError(message))


def test_exception_types():
    assert is_out_of_memory(torch.OutOfMemoryError("any text"))
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("any text"))
    assert is_out_of_memory(MemoryError())
    with pytest.raises(MemoryError) as raised:  # numpy's own MemoryError subclass
        np.empty(2**62, dtype=np.uint8)
    assert is_out_of_memory(raised.value)
    assert not is_out_of_memory(ValueError("CUDA out of memory"))  # only RuntimeErrors carry allocator messages
    assert not is_out_of_memory(RuntimeError())
    assert not is_out_of_memory(KeyboardInterrupt())


def test_a_real_cpu_allocator_failure_is_out_of_memory():
    # a real allocation failure under an address-space limit, in a child process (the limit is per process)
    script = textwrap.dedent(
        """
        import resource
        import torch
        from fastsab.adaptive.oom import is_out_of_memory
        vsz = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vsz + 256 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
        try:
            torch.empty(2**32, dtype=torch.uint8)
        except RuntimeError as error:
            print(is_out_of_memory(error), str(error).splitlines()[0])
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    recognized, message = out.stdout.strip().split(" ", 1)
    assert recognized == "True", message
    assert "DefaultCPUAllocator: can't allocate memory" in message


def test_the_former_module_path_gives_the_same_objects():
    # the module the README named before the package had stage folders still imports
    import fastsab.adaptive.oom
    import fastsab.oom

    assert fastsab.oom.is_out_of_memory is fastsab.adaptive.oom.is_out_of_memory
    assert fastsab.oom.OOM_MESSAGES is fastsab.adaptive.oom.OOM_MESSAGES
    assert fastsab.oom.__all__ == ["OOM_MESSAGES", "is_out_of_memory"]
