"""Out-of-memory adaptive execution: retry with smaller batches, remember what worked.

The decorators ``batch``, ``range`` and ``chunked`` run a function with a batch
size (or a step) and, when it runs out of memory (any device, see ``fastsab.adaptive.oom``),
free what can be freed, shrink the size by ``factor`` and try again, down to a minimum.
The size that worked is remembered by a cache, keyed by default by the call site and the
available memory, so the next call starts there.

Examples:
    >>> @batch(initial_batch_size=64, cache=None)
    ... def step(batch_size, limit):
    ...     if batch_size > limit:
    ...         raise torch.OutOfMemoryError(f"CUDA out of memory ({batch_size})")
    ...     return batch_size
    >>> step(20)  # 64 and 32 ran out of memory; 16 fit
    16
    >>> explicit.batch(step.__wrapped__, 8, 100)  # the call form, no decorator
    8
"""

from __future__ import annotations

import torch  # noqa: F401  # NOTE: used by the examples of the docstring (their namespace is this module's)

from fastsab.adaptive.caches import (
    BatchSizeCache,
    GlobalCache,
    NoCache,
    StackMemoryCache,
    call_site,
    code_context,
    set_default_cache,
)
from fastsab.adaptive.forms import batch, chunked, execute, explicit
from fastsab.adaptive.forms import range_ as range
from fastsab.adaptive.limits import set_cpu_memory_limit
from fastsab.adaptive.loop import run
from fastsab.adaptive.retry import AdaptiveOOMError, free_memory

__all__ = [
    "AdaptiveOOMError",
    "BatchSizeCache",
    "GlobalCache",
    "NoCache",
    "StackMemoryCache",
    "batch",
    "call_site",
    "chunked",
    "code_context",
    "execute",
    "explicit",
    "free_memory",
    "range",
    "run",
    "set_cpu_memory_limit",
    "set_default_cache",
]
