"""The GPU tests: CUDA paths run on a real device, and skipped with the reason where torch sees none.

Run them on a machine with a GPU: ``python -m pytest tests/gpu`` (or ``python tools/gpu_check.py``,
which runs them with ``fastsab bench --device cuda`` and prints a summary).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

SKIP_REASON = (
    "no CUDA device: torch.cuda.is_available() is False, and tests/gpu runs only on a GPU "
    "(python tools/gpu_check.py on a machine with one)"
)


@pytest.fixture(autouse=True)
def device() -> Iterator[torch.device]:
    """The CUDA device a test runs on; its cached memory is given back after each test."""
    if not torch.cuda.is_available():
        pytest.skip(SKIP_REASON)
    yield torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
