"""The ``peers`` suite of ``fastsab bench``: fastsab's padded split beside fairseq's and lhotse's samplers.

fastsab's split is timed with its numpy walk (the default) and, where numba is installed, its
compiled walk (``fastsab.plan.compiled``). Every peer batches the same log-normal lengths, in the
same order (unshuffled), under the same padded budget (300 x the mean length): fairseq's
``batch_by_size_vec`` (its compiled kernel), lhotse's ``SimpleCutSampler`` and
``DynamicBucketingSampler`` (cuts whose duration is the length, ``max_duration`` the budget). A
peer that is not importable has no row. Each row's note says whether its batches are identical to
fastsab's.

fairseq's kernel is found by ``fastsab.bench.workloads.fairseq_kernel``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from fastsab.bench.report import Row, time_best
from fastsab.bench.workloads import (
    best_interleaved,
    compiled_split,
    fairseq_batches,
    fairseq_kernel,
    lognormal_lengths,
)
from fastsab.plan.batching import split_batches
from fastsab.plan.compiled import use_compiled

__all__ = ["PEERS_SAMPLES", "peer_rows"]

#: Lengths the peers suite batches unless told otherwise.
PEERS_SAMPLES = 10**6


def peer_rows(n: int, repeat: int = 3) -> list[Row]:
    """One epoch of index batches of ``n`` log-normal lengths by fastsab and each importable peer.

    The ratio is to fastsab's ``split_batches(cost="padded")`` on the same lengths, measured in
    the same run; lhotse's samplers are timed over one epoch, of cuts made beforehand.

    Examples:
        >>> [row.method for row in peer_rows(1000, repeat=1)][0]
        'fastsab split_batches padded'
    """
    lengths = lognormal_lengths(n)
    budget = 300 * int(lengths.mean())
    work = f"n={n:,}, budget {budget:,}"
    ours = split_batches(lengths, budget, cost="padded")
    base = "fastsab split_batches padded"
    expected = [b.tolist() for b in ours.batches()]
    # NOTE: the kernels timed in turn each repeat, so that drifts of a shared machine hit them alike
    methods: dict[str, Callable[[], Any]] = {base: partial(split_batches, lengths, budget, cost="padded")}
    if use_compiled(wait=True):
        use_compiled(False)
        methods[f"{base}, compiled"] = partial(compiled_split, lengths, budget)
    kernel = fairseq_kernel()
    if kernel is not None:
        methods["fairseq batch_by_size_vec"] = partial(fairseq_batches, kernel, lengths, budget)
    best = best_interleaved(methods, repeat)
    floor = best[base]
    rows = [Row("peers", work, base, floor, base, 1.0, f"{ours.num_batches:,} batches")]
    for name, fn in list(methods.items())[1:]:
        result = fn()  # fairseq's list of batches, or fastsab's PlanChunk
        same = [b.tolist() for b in (result if isinstance(result, list) else result.batches())] == expected
        rows.append(Row("peers", work, name, best[name], base, best[name] / floor, _same(same)))
    for name, sampler in _lhotse_samplers(lengths, budget):
        # NOTE: one timed epoch, whose batches are the ones compared: an epoch of lhotse's
        # samplers takes seconds at 10**6 cuts, where the kernels take milliseconds
        batches: list[list[int]] = []
        seconds = time_best(partial(_epoch, sampler, batches), repeat=1, warmup=0)
        rows.append(Row("peers", work, f"lhotse {name}", seconds, base, seconds / floor, _same(batches == expected)))
    return rows


def _same(same: bool) -> str:
    return "identical batches" if same else "other batches (another rule)"


def _epoch(sampler: Any, batches: list[list[int]]) -> None:
    """One epoch of ``sampler``'s batches, as lists of indices appended to ``batches``."""
    for batch in sampler:
        batches.append([int(cut.id) for cut in batch])


def _lhotse_samplers(lengths: np.ndarray, budget: int) -> list[tuple[str, Any]]:
    """lhotse's samplers over cuts of these durations, or none where lhotse is not importable."""
    try:
        from lhotse import CutSet
        from lhotse.cut import MonoCut
        from lhotse.dataset import DynamicBucketingSampler, SimpleCutSampler
    except ImportError:
        return []
    cuts = CutSet.from_cuts(
        MonoCut(id=str(i), start=0.0, duration=float(length), channel=0) for i, length in enumerate(lengths.tolist())
    )
    with warnings.catch_warnings():
        # NOTE: lhotse warns that an eager CutSet gains nothing from dynamic bucketing; the cuts
        # are made in memory beforehand so that only the sampling is timed
        warnings.simplefilter("ignore", UserWarning)
        bucketing = DynamicBucketingSampler(cuts, max_duration=budget, shuffle=False)
    return [
        ("SimpleCutSampler", SimpleCutSampler(cuts, max_duration=budget, shuffle=False)),
        ("DynamicBucketingSampler", bucketing),
    ]
