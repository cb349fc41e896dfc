"""pytest-benchmark suite: the adaptive decorator's overhead on its cached path (toma's benchmark).

Run with ``python -m pytest benchmarks -n 0 --benchmark-enable -k adaptive``; compare within the
group: ``direct`` is the operation called without a wrapper.
"""

from __future__ import annotations

import pytest
import torch

from fastsab import adaptive

LEFT, RIGHT = torch.randn(300, 300), torch.randn(300, 300)


def operation(batch_size: int) -> torch.Tensor:
    out = LEFT
    for _ in range(8):
        out = torch.mm(LEFT, RIGHT)
    return out


WRAPPED = {
    "direct": lambda: operation(64),
    "stack-memory-cache": adaptive.batch(operation, initial_batch_size=64),
    "global-cache": adaptive.batch(operation, initial_batch_size=64, cache=adaptive.GlobalCache),
    "no-cache": adaptive.batch(operation, initial_batch_size=64, cache=None),
}


@pytest.mark.parametrize("name", list(WRAPPED))
def test_adaptive_overhead(benchmark, name):
    benchmark.group = "adaptive overhead"
    out = benchmark(WRAPPED[name])
    assert out.shape == (300, 300)
