"""Mixtures measured: ``fastsab bench --suite mixing``.

Three sources of log-normal lengths with different means (``MIX_MEANS``), sized so that their
tokens stand as the weights 0.5 / 0.3 / 0.2 do, mixed by those weights in tokens. Four tables:

- **share error**: the largest ``|cost_s - target_s|`` over the sources and over every prefix of
  an epoch (``share_error``), in units of the largest item's cost: fastsab's ``Mixture`` (goal
  <= 1), and each peer of ``fastsab.bench.mixing_peers`` that imports, which draws samples at
  random with the weights given (what its users get), and with the weights divided by the
  sources' mean lengths (the probabilities that give the token shares on average);
- **planning**: an epoch of a ``FastSizeAwareLoader``'s batches (its ``batch_sampler()``) over
  the mixture against one over the same items unmixed (goal <= 1.3x), and each peer's epoch of
  mixing (with the probabilities by mean length, all its items) against the mixed epoch (goal:
  fastsab >= 50x faster);
- **padding**: the padded efficiency of the mixture with ``sort_window`` or ``buckets`` against
  the sources batched alone, their real and padded tokens pooled (goal: within 1 point);
- **resume**: a mixture of ``100 x`` as many items (``fastsab.bench.scale.mixture_sources``),
  rank 7 of 8, from ``load_state_dict`` of a state saved about half-way to the first batch:
  time (goal < 1 s) and peak memory growth (goal < 512 MiB), in a process of its own.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastsab.bench.epochs import Progress
from fastsab.bench.mixing_peers import peer_mixers
from fastsab.bench.scale import MIXTURE_WEIGHTS, RESUME_SECONDS, SCALE_MIB, resume_figures
from fastsab.bench.workloads import best_interleaved, lognormal_lengths
from fastsab.fetch.mixture import Mixture
from fastsab.loaders.loader import FastSizeAwareLoader
from fastsab.plan.compiled import use_compiled

__all__ = ["MIX_MEANS", "MIX_SAMPLES", "MixingRow", "mix_lengths", "mixing_markdown", "mixing_results", "share_error"]

#: Items of the three sources together.
MIX_SAMPLES = 10**6
#: The mean length of each source's log-normal lengths (cut to 8..4000).
MIX_MEANS = {"web": 100.0, "code": 400.0, "books": 1500.0}
#: Tokens a batch may hold.
MIX_BUDGET = 65_536
#: What the planning and padding rows aim at.
MIXED_OVER_UNMIXED, PEER_OVER_MIXED, PADDING_POINTS = 1.3, 50.0, 0.01
TABLES = {
    "share error": "share error (largest items)",
    "planning": "ratio",
    "padding": "padded efficiency",
    "resume": "s to first batch",
}


@dataclass(frozen=True)
class MixingRow:
    """One row of the suite: a figure, the goal it is held to, whether it meets it.

    Attributes:
        table: ``"share error"``, ``"planning"``, ``"padding"`` or ``"resume"``.
        workload: What was mixed.
        method: Who mixed it.
        figure: The table's figure (``None``: not measured, the note says why).
        goal: The goal, in words (empty: none).
        met: Whether the figure meets the goal (``None``: no goal, or not measured).
        note: Extra facts.
    """

    table: str
    workload: str
    method: str
    figure: float | None
    goal: str = ""
    met: bool | None = None
    note: str = ""


#: The rows' label of epochs planned with the compiled walks (``use_compiled``), where numba is installed.
COMPILED = "(use_compiled)"


def mix_lengths(n: int = MIX_SAMPLES) -> dict[str, np.ndarray]:
    """The lengths of each source, ``n`` items in all: as many that each source's tokens stand as its weight.

    Examples:
        >>> lengths = mix_lengths(100_000)
        >>> tokens = {name: int(part.sum()) for name, part in lengths.items()}
        >>> sum(map(len, lengths.values())), [round(t / sum(tokens.values()), 1) for t in tokens.values()]
        (100000, [0.5, 0.3, 0.2])
    """
    # NOTE: the means after the cut to 8..4000 (lower than asked for the long source), from a large draw
    means = [lognormal_lengths(10**5, seed=s, mean=m).mean() for s, m in enumerate(MIX_MEANS.values())]
    share = np.array(list(MIXTURE_WEIGHTS.values())) / np.array(means)
    counts = np.floor(n * share / share.sum()).astype(np.int64)
    counts[0] += n - counts.sum()
    return {
        name: lognormal_lengths(int(count), seed=s, mean=mean)
        for s, (name, count, mean) in enumerate(zip(MIX_MEANS, counts, MIX_MEANS.values()))
    }


def share_error(sources: np.ndarray, costs: np.ndarray, weights: Sequence[float], largest: float) -> float:
    """The largest ``|cost_s - share_s * total|`` over sources ``s`` and every prefix, over ``largest``.

    ``sources[i]`` is the source of the ``i``-th item of the order, ``costs[i]`` its cost.

    Examples:
        >>> share_error(np.array([0, 1, 0, 1]), np.array([2.0, 2.0, 2.0, 2.0]), [0.5, 0.5], 2.0)
        0.5
    """
    total = np.cumsum(costs)
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    worst = 0.0
    for s, share in enumerate(shares):
        own = np.cumsum(np.where(sources == s, costs, 0.0))
        worst = max(worst, float(np.abs(own - share * total).max(initial=0.0)))
    return worst / largest


def _mixture(lengths: Mapping[str, np.ndarray], **options: Any) -> FastSizeAwareLoader[Any]:
    sources = {name: torch.arange(len(part)) for name, part in lengths.items()}
    # NOTE: the sources' lengths end to end, as a mapping {source: lengths} is joined (Mixture.joined)
    sizes = np.concatenate(list(lengths.values()))
    return FastSizeAwareLoader(Mixture(sources, MIXTURE_WEIGHTS), sizes, MIX_BUDGET, **options)


def _alone(lengths: np.ndarray, **options: Any) -> FastSizeAwareLoader[Any]:
    return FastSizeAwareLoader(torch.arange(len(lengths)), lengths, MIX_BUDGET, **options)


def _epoch(loader: FastSizeAwareLoader[Any]) -> list[Any]:
    """One epoch of ``loader``'s batches of ids, planned by its ``batch_sampler()`` (nothing read)."""
    return list(loader.batch_sampler())


def _goal(text: str, met: bool) -> tuple[str, bool]:
    return f"{text} ({'met' if met else 'missed'})", met


def mixing_results(n: int = MIX_SAMPLES, repeat: int = 3, progress: Progress | None = None) -> list[MixingRow]:
    """Every row of the suite over ``n`` items (the resume row over ``100 * n``)."""
    say = progress or (lambda _: None)
    lengths = mix_lengths(n)
    counts = [len(part) for part in lengths.values()]
    joined = np.concatenate(list(lengths.values())).astype(np.float64)
    largest = float(joined.max())
    weights = list(MIXTURE_WEIGHTS.values())
    offsets = np.concatenate([[0], np.cumsum(counts)])
    means = ", ".join(f"{name} {part.mean():.0f}" for name, part in lengths.items())
    work = f"{n:,} items, mean lengths {means}, weights {'/'.join(f'{w:g}' for w in weights)} in tokens"

    def error_row(method: str, sources: np.ndarray, note: str, items: np.ndarray | None = None) -> MixingRow:
        # NOTE: a peer's order names sources, not items: see _ranks
        items = offsets[sources] + _ranks(sources) if items is None else items
        error = share_error(sources, joined[items], weights, largest)
        goal, met = _goal("<= 1", error <= 1) if method.startswith("fastsab") else ("", None)
        return MixingRow("share error", work, method, error, goal, met, f"{len(sources):,} items; {note}")

    say("fastsab: an epoch mixed and unmixed")
    # NOTE: a new loader for every epoch timed: a loader keeps the plan of an epoch it has planned
    mixed = iter([_mixture(lengths) for _ in range(repeat + 2)])
    unmixed = iter([_alone(joined.astype(np.int64)) for _ in range(repeat + 1)])
    best = best_interleaved({"mixed": lambda: _epoch(next(mixed)), "unmixed": lambda: _epoch(next(unmixed))}, repeat)
    ids = np.concatenate(_epoch(next(mixed))) % n
    ours = np.searchsorted(offsets, ids, side="right") - 1
    note = f"mixed by tokens, stop='first', a budget of {MIX_BUDGET:,} tokens"
    rows = [error_row("fastsab Mixture", ours, note, ids)]
    plan_work = f"{work}, a budget of {MIX_BUDGET:,} tokens"
    plan = [
        MixingRow("planning", plan_work, "fastsab unmixed epoch", 1.0, "", None, _ms(best["unmixed"], n)),
        MixingRow(
            "planning",
            plan_work,
            "fastsab Mixture epoch",
            best["mixed"] / best["unmixed"],
            *_goal(f"<= {MIXED_OVER_UNMIXED:g}x unmixed", best["mixed"] <= MIXED_OVER_UNMIXED * best["unmixed"]),
            f"{_ms(best['mixed'], len(ids))}; batch_sampler() epochs, best of {repeat}",
        ),
    ]
    if use_compiled(wait=True):  # (numba installed: the rule's loop and the splits compiled too)
        say("fastsab: an epoch mixed and unmixed, compiled")
        try:
            mixed_compiled = iter([_mixture(lengths) for _ in range(repeat + 1)])
            unmixed_compiled = iter([_alone(joined.astype(np.int64)) for _ in range(repeat + 1)])
            timed = {"mixed": lambda: _epoch(next(mixed_compiled)), "unmixed": lambda: _epoch(next(unmixed_compiled))}
            compiled = best_interleaved(timed, repeat)
        finally:
            use_compiled(False)
        ratio = compiled["mixed"] / compiled["unmixed"]
        plan += [
            MixingRow(
                "planning", plan_work, f"fastsab unmixed epoch {COMPILED}", 1.0, "", None, _ms(compiled["unmixed"], n)
            ),
            MixingRow(
                "planning",
                plan_work,
                f"fastsab Mixture epoch {COMPILED}",
                ratio,
                *_goal(f"<= {MIXED_OVER_UNMIXED:g}x unmixed", ratio <= MIXED_OVER_UNMIXED),
                f"{_ms(compiled['mixed'], len(ids))}; batch_sampler() epochs, best of {repeat}",
            ),
        ]
    by_length = [w / part.mean() for w, part in zip(weights, lengths.values())]
    by_length = [p / sum(by_length) for p in by_length]
    say("peers: making their sources")
    for name, mixer in peer_mixers(counts).items():
        if isinstance(mixer, str):
            rows.append(MixingRow("share error", work, name, None, note=mixer))
            plan.append(MixingRow("planning", plan_work, name, None, note=mixer))
            continue
        say(f"{name}: weights as given")
        rows.append(error_row(name, mixer(weights)(), "samples drawn with the weights as given"))
        say(f"{name}: weights by mean length")
        gc.collect()
        start = time.perf_counter()  # (one epoch: a peer's takes seconds)
        read = mixer(by_length)
        seconds = time.perf_counter() - start
        theirs = read()
        rows.append(error_row(name, theirs, "samples drawn with the weights / mean length"))
        ratio = seconds / best["mixed"]
        goal = f">= {PEER_OVER_MIXED:g}x fastsab Mixture"
        note = f"{_ms(seconds, len(theirs))}; one epoch, weights / mean length, stopped at the first exhausted"
        plan.append(MixingRow("planning", plan_work, name, ratio, *_goal(goal, ratio >= PEER_OVER_MIXED), note))
    say("padding")
    return rows + plan + _padding_rows(lengths, work) + [_resume_row(100 * n)]


def _ranks(sources: np.ndarray) -> np.ndarray:
    """Each item's place among the items of its own source before it (its index in a source read in order).

    A peer's order names the source of each item, not which item: its sources are read in order,
    so the ``k``-th item of source ``s`` in the order is item ``k`` of ``s``.
    """
    ranks = np.empty(len(sources), dtype=np.int64)
    for s in np.unique(sources).tolist():
        where = np.flatnonzero(sources == s)
        ranks[where] = np.arange(len(where))
    return ranks


def _ms(seconds: float, items: int) -> str:
    return f"{seconds * 1e3:,.0f} ms, {items:,} items"


def _padding_rows(lengths: Mapping[str, np.ndarray], work: str) -> list[MixingRow]:
    """Padded efficiency with ``sort_window=1024`` and with ``buckets=8``: each source alone, pooled, the mixture."""
    rows = []
    for option, value in (("sort_window", 1024), ("buckets", 8)):
        # NOTE: partial="keep": the batches are ids, not dicts to mark filler rows in
        extra: dict[str, Any] = {"partial": "keep"} if option == "buckets" else {"cost": "padded"}
        options = {option: value, **extra}
        label = f"{option}={value:,}"
        mixture = _mixture(lengths, **options)
        mixed = _stats(mixture).padding_efficiency
        alone_options = dict(options)
        if mixture.buckets is not None:
            # NOTE: one table of shapes serves all the sources: each alone is padded to the same lengths
            alone_options["buckets"] = [int(length) for length in mixture.buckets.lengths]
        real = padded = 0
        for name, part in lengths.items():
            stats = _stats(_alone(part, **alone_options))
            real, padded = real + stats.real_tokens, padded + stats.padded_tokens
            rows.append(MixingRow("padding", work, f"{name} alone, {label}", stats.padding_efficiency))
        pooled = real / padded
        same = f"padded to the mixture's {value} lengths" if mixture.buckets is not None else ""
        rows.append(MixingRow("padding", work, f"sources alone, pooled, {label}", pooled, note=same))
        points = (mixed - pooled) * 100
        goal = f"within {PADDING_POINTS * 100:g} point of pooled"
        met = mixed >= pooled - PADDING_POINTS
        note = f"{points:+.2f} points"
        rows.append(MixingRow("padding", work, f"fastsab Mixture, {label}", mixed, *_goal(goal, met), note))
    return rows


def _stats(loader: FastSizeAwareLoader[Any]) -> Any:
    sampler = loader.batch_sampler()
    for _ in sampler:
        pass
    return sampler.stats


def _resume_row(n: int) -> MixingRow:
    steps, seconds, mib = resume_figures("Mixture", n, 7, 8, 3)
    met = seconds < RESUME_SECONDS and mib < SCALE_MIB
    goal, _ = _goal(f"< {RESUME_SECONDS:g} s, < {SCALE_MIB} MiB", met)
    work = f"{n:,} items in 3 sources (sizes computed), rank 7 of 8, resumed at step {steps:,}"
    note = f"load_state_dict to first batch, best of 3; peak RSS +{mib:.0f} MiB; state saved about half-way"
    return MixingRow("resume", work, "fastsab Mixture", seconds, goal, met, note)


def mixing_markdown(rows: Sequence[MixingRow]) -> str:
    """The suite's tables: one a table kind, each row's figure, goal and note.

    Examples:
        >>> print(mixing_markdown([MixingRow("resume", "n=8", "fastsab Mixture", 0.25, "< 1 s (met)", True)]))
        **resume**
        <BLANKLINE>
        | workload | method | s to first batch | goal | note |
        |---|---|---:|---|---|
        | n=8 | fastsab Mixture | 0.25 | < 1 s (met) |  |
    """
    out: list[str] = []
    for table, header in TABLES.items():
        shown = [row for row in rows if row.table == table]
        if not shown:
            continue
        out += ["", f"**{table}**", ""] if out else [f"**{table}**", ""]
        out += [f"| workload | method | {header} | goal | note |", "|---|---|---:|---|---|"]
        for row in shown:
            figure = "-" if row.figure is None else f"{row.figure:.3g}"
            out.append(f"| {row.workload} | {row.method} | {figure} | {row.goal} | {row.note} |")
    return "\n".join(out)
