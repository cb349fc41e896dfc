"""The plan fingerprint: a digest of what determines a planner's batches, checked on resume.

:func:`plan_fingerprint` digests the number of items, the order options, the configured
limits and the sizes, so that a state saved for another dataset or batching configuration is
refused (see :func:`~fastsab.position.epoch_state.parse_state`). :func:`_plain` writes numbers
as plain Python numbers, one value whatever their type, for the digest and for the state.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from fastsab.plan.plans import Planner

__all__ = ["plan_fingerprint"]


def _plain(value: Any) -> Any:
    """Numbers (numpy or Python, also in lists) as plain Python numbers, for states and digests."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def plan_fingerprint(planner: Planner[Any]) -> str:
    """A short digest of what determines a planner's batches (besides seed and epoch).

    It covers the number of items, the order options, the configured limits and the sizes:
    all of them for an array of sizes, else the sizes of up to 4096 evenly spread items (a
    callable's sizes are not all computed just to fingerprint them). Numbers are compared by
    value: ``np.int64(100)``, ``100`` and ``100.0`` are the same cap.
    """
    kind, options, sizes = planner.plan_inputs()
    order = planner.order
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr((kind, order.n, order.shuffle, order.group_size, order.rotate)).encode())
    digest.update(json.dumps(_plain(options)).encode())
    digest.update(sizes)
    return digest.hexdigest()
