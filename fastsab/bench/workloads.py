"""The workloads of ``fastsab bench`` without a loader: the split kernel, grouped permutations, the adaptive
decorator's overhead, and the log-normal lengths every size-aware workload uses."""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Literal

import numpy as np
import torch

from fastsab import adaptive
from fastsab.bench.report import Row, time_best
from fastsab.plan.batching import split_batches
from fastsab.plan.compiled import use_compiled
from fastsab.plan.shuffle import GroupedPermutation

__all__ = [
    "IndexDataset",
    "adaptive_rows",
    "best_interleaved",
    "compiled_split",
    "fairseq_batches",
    "fairseq_kernel",
    "index_sizes",
    "kernel_cases",
    "kernel_rows",
    "lognormal_lengths",
    "permutation_rows",
]


def lognormal_lengths(n: int, seed: int = 0, mean: float = 150.0, sigma: float = 1.0) -> np.ndarray:
    """The size-aware workload: log-normal lengths with the given mean, clipped to [8, 4000].

    Examples:
        >>> lengths = lognormal_lengths(100_000)
        >>> bool(lengths.min() >= 8 and lengths.max() <= 4000), bool(130 < lengths.mean() < 170)
        (True, True)
    """
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, n), 8, 4000).astype(np.int64)


#: Where fairseq's ``batch_by_size_vec`` is looked for: fairseq itself, then the module that
#: ``benchmarks/fairseq_kernel.py`` compiles from fairseq's source (on the path).
FAIRSEQ_MODULES = ("fairseq.data.data_utils_fast", "fairseq_data_utils_fast")


def fairseq_kernel() -> Callable[..., list[np.ndarray]] | None:
    """fairseq's compiled ``batch_by_size_vec``, or ``None`` where neither module of ``FAIRSEQ_MODULES`` imports."""
    for name in FAIRSEQ_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        kernel: Callable[..., list[np.ndarray]] = module.batch_by_size_vec
        return kernel
    return None


def fairseq_batches(kernel: Callable[..., list[np.ndarray]], lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """fairseq's padded batches of ``lengths`` (in order) under ``budget`` tokens, no cap on sentences."""
    # NOTE: -1 is fairseq's "no max_sentences"; a multiple of 1 leaves every batch whole
    return kernel(np.arange(len(lengths), dtype=np.int64), lengths.astype(np.int64, copy=False), budget, -1, 1)


def compiled_split(costs: np.ndarray, cap: Any) -> Any:
    """``split_batches(costs, cap, cost="padded")`` by the compiled walk (``use_compiled``); the numpy walk after."""
    use_compiled(True)
    try:
        return split_batches(costs, cap, cost="padded")
    finally:
        use_compiled(False)


def kernel_rows(sizes: Iterable[int], repeat: int = 5) -> list[Row]:
    """Split kernel vs one ``np.cumsum`` over the same costs (int and float, sum and padded, 1 to 3 columns).

    Budget is 300 x the mean length, as in the size-aware loader workload; ``(n, k)`` costs
    hold the lengths and ``k - 1`` shifted copies of them, each column under that budget, and
    their floor is one ``np.cumsum`` over all ``n * k`` costs. Each repeat times the floor and
    the splits in turn, so that drifts of a shared machine hit them alike.

    Examples:
        >>> [row.method for row in kernel_rows([1000], repeat=1)][:3]
        ['np.cumsum int (floor)', 'split_batches int sum', 'split_batches int padded']
    """
    rows = []
    for n in sizes:
        for kind, costs, cap in kernel_cases(n):
            rows += _kernel_case(f"n={n:,}", kind, costs, cap, repeat)
    return rows


def kernel_cases(n: int) -> list[tuple[str, np.ndarray, Any]]:
    """The costs and caps ``kernel_rows`` splits: ``(kind, costs, cap)``, every array C-contiguous.

    Examples:
        >>> [(kind, costs.shape) for kind, costs, _ in kernel_cases(10)]
        [('int', (10,)), ('float', (10,)), ('int (n, 2)', (10, 2)), ('int (n, 3)', (10, 3))]
    """
    lengths = lognormal_lengths(n)
    budget = 300 * int(lengths.mean())
    floats = lengths * 1.0009765625  # non-integer float costs, exact in binary
    # NOTE: each (n, k) array is made C-contiguous: a strided view (columns[:, :2]) makes
    # np.cumsum copy it first, which would time the copy as part of the floor
    columns = [np.stack([np.roll(lengths, 7 * j) for j in range(k)], axis=1) for k in (2, 3)]
    return [
        ("int", lengths, budget),
        ("float", floats, float(budget)),
        ("int (n, 2)", columns[0], [budget] * 2),
        ("int (n, 3)", columns[1], [budget] * 3),
    ]


def _kernel_case(work: str, kind: str, costs: np.ndarray, cap: Any, repeat: int) -> list[Row]:
    """The floor and the sum and padded splits of one kind of costs, timed in turn each repeat."""
    base = f"np.cumsum {kind} (floor)"
    # NOTE: the floor is one pass over all the n * k costs in memory order: np.cumsum of the
    # flat array. np.cumsum(costs, axis=0) would run k strided passes, slower and noisier
    methods: dict[str, Callable[[], Any]] = {base: partial(np.cumsum, costs.ravel())}
    modes: tuple[Literal["sum", "padded"], ...] = ("sum", "padded")
    for mode in modes:
        methods[f"split_batches {kind} {mode}"] = partial(split_batches, costs, cap, cost=mode)
    if kind == "int" and use_compiled(wait=True):
        methods[f"split_batches {kind} padded, compiled"] = partial(compiled_split, costs, cap)
        use_compiled(False)
    kernel = fairseq_kernel() if kind == "int" else None
    if kernel is not None:
        methods["fairseq batch_by_size_vec int padded"] = partial(fairseq_batches, kernel, costs, cap)
    best = best_interleaved(methods, repeat)
    floor = best[base]
    rows = [Row("split kernel", work, base, floor, base, 1.0)]
    sizes = np.diff(methods[f"split_batches {kind} padded"]().offsets).tolist()
    for name, fn in list(methods.items())[1:]:
        result = fn()
        if isinstance(result, list):
            # NOTE: both split the positions 0..n-1 in order: equal batch sizes are equal batches
            same = [len(b) for b in result] == sizes
            note = f"{len(result):,} batches, {'identical to' if same else 'not'} split_batches padded"
        else:
            note = f"{result.num_batches:,} batches"
        rows.append(Row("split kernel", work, name, best[name], base, best[name] / floor, note))
    return rows


def best_interleaved(methods: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Best wall time of each method over ``repeat`` rounds (after one warm-up), the methods run in turn each round."""
    for fn in methods.values():
        fn()
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(repeat):
        for name, fn in methods.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def permutation_rows(sizes: Iterable[int], repeat: int = 3, group_size: int = 2**16) -> list[Row]:
    """A grouped permutation per epoch and to its first group, vs numpy and torch."""
    rows = []
    for n in sizes:
        rng = np.random.default_rng(0)
        perm = GroupedPermutation(n, group_size, seed=0)
        work = f"n={n:,}"
        base = "numpy permutation"
        floor = time_best(partial(rng.permutation, n), repeat)
        rows.append(Row("permutation", work, base, floor, base, 1.0))
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("torch.randperm", partial(torch.randperm, n)),
            ("GroupedPermutation epoch", partial(perm.permutation, 1)),
            ("GroupedPermutation first group", partial(_first_group, perm)),
        ]
        for name, fn in cases:
            seconds = time_best(fn, repeat)
            rows.append(Row("permutation", work, name, seconds, base, seconds / floor))
    return rows


def _first_group(perm: GroupedPermutation) -> np.ndarray:
    return next(perm.groups(1))


def adaptive_rows(calls: int = 200, repeat: int = 9) -> list[Row]:
    """Overhead of the adaptive batch decorator on its cached fast path (no OOM).

    Two workloads: a no-op (the wrapper's own cost per call, in isolation) and matrix
    products repeated to take about 2 ms per call. Each row is the time per call over
    ``calls`` calls, best of ``repeat``, with the methods measured in turn each repeat so
    that drifts of a shared machine hit them alike. The default cache reads the caller's
    stack, up to 16 frames: it is measured both from here and from a loop
    ``_DEEP_FRAMES`` frames further down, where it reads all 16.
    """
    left, right = torch.randn(300, 300), torch.randn(300, 300)
    reps = 10

    def matmuls(batch_size: int) -> torch.Tensor:
        out = left
        for _ in range(reps):
            out = torch.mm(left, right)
        return out

    reps = max(1, round(2e-3 / (time_best(partial(matmuls, 0), 10) / reps)))  # about 2 ms per call

    def noop(batch_size: int) -> int:
        return batch_size

    rows = []
    for workload, operation in (("no-op", noop), ("~2 ms op", matmuls)):
        default = adaptive.batch(operation, initial_batch_size=64)
        global_cache = adaptive.batch(operation, initial_batch_size=64, cache=adaptive.GlobalCache)
        methods: list[tuple[str, Callable[[int], float]]] = [
            ("direct call", partial(_loop_seconds, partial(operation, 64))),
            ("batch, StackMemoryCache (default)", partial(_loop_seconds, default)),
            ("batch, StackMemoryCache (default), 16 frames deep", partial(_deep, _DEEP_FRAMES, default)),
            ("batch, GlobalCache", partial(_loop_seconds, global_cache)),
            ("batch, NoCache", partial(_loop_seconds, adaptive.batch(operation, initial_batch_size=64, cache=None))),
        ]
        best = dict.fromkeys((name for name, _ in methods), float("inf"))
        for _ in range(repeat):
            for name, run in methods:
                gc.collect()
                best[name] = min(best[name], run(calls) / calls)
        floor = best["direct call"]
        for name, seconds in best.items():
            overhead = f"{(seconds - floor) * 1e6:+.1f} us per call"
            rows.append(Row("adaptive overhead", workload, name, seconds, "direct call", seconds / floor, overhead))
    return rows


_DEEP_FRAMES = 16


def _loop_seconds(fn: Callable[[], Any], calls: int) -> float:
    """Seconds to call ``fn()`` ``calls`` times in a loop."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


def _deep(frames: int, fn: Callable[[], Any], calls: int) -> float:
    """``_loop_seconds`` run ``frames`` frames below this one."""
    return _loop_seconds(fn, calls) if frames == 0 else _deep(frames - 1, fn, calls)


class IndexDataset:
    """``n`` items that are their own indices, made on demand: a dataset of any length without its data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(indices, dtype=np.int64))


def index_sizes(indices: np.ndarray) -> np.ndarray:
    """Sizes 1..97 computed from the indices, vectorized: a ``sizeof`` for any number of items."""
    return np.asarray(indices, dtype=np.int64) % 97 + 1
