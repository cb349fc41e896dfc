"""A limit on this process's address space, so that allocations beyond it fail instead of swapping."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def set_cpu_memory_limit(gib: float) -> float:
    """Limit this process's address space to ``gib`` GiB (``RLIMIT_AS``); return the old limit.

    Allocations beyond it fail with an out-of-memory error instead of swapping. Unix only.
    ``math.inf`` lifts the limit (as far as the hard limit allows). The old limit is returned
    in GiB, ``math.inf`` if there was none, so that ``set_cpu_memory_limit(old)`` restores it:

    ``old = set_cpu_memory_limit(8); ...; set_cpu_memory_limit(old)``

    Args:
        gib: The limit in GiB (1 GiB = 2**30 bytes), or ``math.inf`` for no limit.

    Returns:
        The previous (soft) limit in GiB, ``math.inf`` if there was none.

    Raises:
        TypeError: If ``gib`` is not a number.
        ValueError: If ``gib`` is not positive (or NaN), is below one byte or too large for
            the system, or is above the hard limit (which an unprivileged process cannot raise).
        RuntimeError: Where the ``resource`` module (``setrlimit``) is unavailable.
    """
    try:
        import resource
    except ImportError as err:  # pragma: no cover - Windows
        raise RuntimeError("set_cpu_memory_limit needs resource.setrlimit, which this platform lacks.") from err
    limit = _limit_bytes(gib, resource.RLIM_INFINITY)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and (limit == resource.RLIM_INFINITY or limit > hard):
        raise ValueError(
            f"gib={gib!r} is above the hard limit of {hard / 2**30:.2f} GiB, which this process cannot raise."
        )
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    # NOTE: soft / 2**30 * 2**30 gives soft back exactly for every limit below 2**53 bytes (8 PiB)
    return math.inf if soft == resource.RLIM_INFINITY else soft / 2**30


def _limit_bytes(gib: Any, unlimited: int) -> int:
    """``gib`` GiB in bytes for ``setrlimit``; ``unlimited`` for ``math.inf``."""
    if isinstance(gib, bool) or not isinstance(gib, Real):
        raise TypeError(f"gib must be a number, got {gib!r} of type {type(gib).__name__}.")
    try:
        value = float(gib)
    except OverflowError:  # an integer beyond float range
        raise ValueError(f"gib={gib!r} is too large for an address-space limit; pass math.inf for no limit.") from None
    if not value > 0:
        raise ValueError(f"gib must be a positive number or math.inf (no limit), got {gib!r}.")
    if math.isinf(value):
        return unlimited
    limit = int(value * 2**30)
    if limit < 1:
        raise ValueError(f"gib={gib!r} is less than one byte.")
    # NOTE: setrlimit takes a signed 64-bit number here (the unsigned 2**64 - 1 is RLIM_INFINITY)
    if limit >= 2**63 - 1:
        raise ValueError(f"gib={gib!r} is too large for an address-space limit; pass math.inf for no limit.")
    return limit
