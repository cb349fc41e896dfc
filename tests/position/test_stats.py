"""EpochStats: the counts and the figures of the batches an epoch yielded, against hand counts."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastLoader, FastSizeAwareLoader, PadCollator
from fastsab.plan.cost_sources import padded_length
from tests.reference import as_rows, batch_cost, greedy_loop

N = 400
LENGTHS = np.random.default_rng(1).integers(1, 60, N)
BUDGET = 300


def ids_of(loader: Any, **iterate: Any) -> list[list[int]]:
    """One epoch of ``loader`` as batches of dataset indices."""
    return [ids.tolist() for ids, _ in loader.iter_with_indices(**iterate)]


def hand_counts(
    batches: Sequence[Sequence[int]], cost: str, budget: float, multiple: int | None = None, fixed: float = 0
) -> dict[str, Any]:
    """Fill and tokens of ``batches`` counted item by item (one column of lengths)."""
    fills, real, padded = [], 0, 0
    for batch in batches:
        lengths = [int(LENGTHS[i]) for i in batch]
        charged = [padded_length(n, multiple) for n in lengths] if cost == "padded" else lengths
        total = fixed + (sum(charged) if cost == "sum" else len(lengths) * max(charged))
        fills.append(total / budget)
        real += sum(lengths)
        padded += len(lengths) * padded_length(max(lengths), multiple)
    return {"mean_fill": sum(fills) / len(fills), "min_fill": min(fills), "real": real, "padded": padded}


def check(stats: Any, counted: dict[str, Any], tokens: bool) -> None:
    assert stats.mean_fill == pytest.approx(counted["mean_fill"], rel=1e-12)
    assert stats.min_fill == pytest.approx(counted["min_fill"], rel=1e-12)
    if tokens:
        assert (stats.real_tokens, stats.padded_tokens) == (counted["real"], counted["padded"])
        assert stats.padding_efficiency == pytest.approx(counted["real"] / counted["padded"])
    else:
        assert stats.real_tokens is stats.padded_tokens is stats.padding_efficiency is None


@pytest.mark.parametrize(
    "options",
    [
        {"cost": "sum"},
        {"cost": "sum", "fixed_cost": 40},
        {"cost": "padded"},
        {"cost": "padded", "pad_to_multiple_of": 8},
        {"cost": "padded", "sort_window": 64},
        {"cost": "padded", "max_batch_size": 5, "batch_size_multiple": 2},
    ],
)
def test_fill_and_tokens_are_those_of_the_batches_yielded(options: dict[str, Any]) -> None:
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, group_size=64, seed=2, **options)
    for _ in range(2):  # reset per epoch: each epoch reports its own batches
        batches = ids_of(loader)
        multiple, fixed = options.get("pad_to_multiple_of"), options.get("fixed_cost", 0)
        check(loader.stats, hand_counts(batches, options["cost"], BUDGET, multiple, fixed), options["cost"] == "padded")
        assert loader.stats.num_batches == len(batches) and loader.stats.num_items == N


def test_a_pad_collator_counts_the_tokens_of_the_batches_it_makes() -> None:
    # the hand count reads the padded batches themselves: their attention masks
    class Sequences(torch.utils.data.Dataset[dict[str, list[int]]]):
        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> dict[str, list[int]]:
            return {"input_ids": [i] * int(LENGTHS[i])}

    collate = PadCollator(pad_to_multiple_of=8)
    loader = FastSizeAwareLoader(Sequences(), LENGTHS, BUDGET, collate_fn=collate, group_size=64)
    masks = [batch["attention_mask"] for batch in loader]
    real, padded = sum(int(mask.sum()) for mask in masks), sum(mask.numel() for mask in masks)
    stats = loader.stats
    assert (stats.real_tokens, stats.padded_tokens) == (real, padded)
    assert stats.padding_efficiency == pytest.approx(real / padded)
    assert stats.mean_fill == pytest.approx(np.mean([int(mask.sum()) / BUDGET for mask in masks]))


def test_padded_features_count_each_items_cost_and_the_maxima_cost() -> None:
    features = np.stack([LENGTHS, LENGTHS % 7 + 1], axis=1)

    def pixels(rows: Any) -> Any:
        return rows[:, 0] * rows[:, 1]

    loader = FastSizeAwareLoader(torch.arange(N), pixels, 4 * BUDGET, features=features, cost="padded", group_size=64)
    batches = ids_of(loader)
    real = sum(int(features[i, 0] * features[i, 1]) for batch in batches for i in batch)
    padded = [len(b) * int(features[b, 0].max() * features[b, 1].max()) for b in map(np.array, batches)]
    stats = loader.stats
    assert (stats.real_tokens, stats.padded_tokens) == (real, sum(padded))
    assert stats.mean_fill == pytest.approx(np.mean(padded) / (4 * BUDGET))
    assert stats.min_fill == pytest.approx(min(padded) / (4 * BUDGET))


def test_fastloader_and_several_cost_columns_have_no_figures() -> None:
    loader = FastLoader(torch.arange(10), 3)
    list(loader)
    assert loader.stats.mean_fill is loader.stats.min_fill is loader.stats.real_tokens is None
    columns = np.stack([LENGTHS, LENGTHS // 2], axis=1)
    two = FastSizeAwareLoader(torch.arange(N), columns, [BUDGET, BUDGET], cost="padded")
    batches = ids_of(two)
    fills = [max(len(b) * LENGTHS[b].max() / BUDGET, len(b) * (LENGTHS[b] // 2).max() / BUDGET) for b in batches]
    assert two.stats.mean_fill == pytest.approx(np.mean(fills)) and two.stats.real_tokens is None


def test_a_partial_epoch_counts_the_batches_yielded_not_those_prefetched() -> None:
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, cost="padded", group_size=64, prefetch=4)
    assert loader.stats is None
    source = loader.iter_with_indices()
    batches = [next(source)[0].tolist() for _ in range(7)]
    check(loader.stats, hand_counts(batches, "padded", BUDGET), tokens=True)
    source.close()


def test_a_resumed_epoch_counts_the_batches_yielded_since_the_resume() -> None:
    def make() -> FastSizeAwareLoader[Any]:
        return FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, cost="padded", group_size=64, seed=5)

    whole = ids_of(make())
    loader = make()
    source = loader.iter_with_indices()
    for _ in range(9):
        next(source)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    rest = ids_of(resumed)
    assert rest == whole[9:]
    check(resumed.stats, hand_counts(rest, "padded", BUDGET), tokens=True)


@pytest.mark.parametrize("retry", [False, True])
@pytest.mark.parametrize("prefetch", [0, 3])
def test_batches_planned_again_under_a_lowered_limit_count_once(retry: bool, prefetch: int) -> None:
    # the lowered limit re-plans batches already planned (or prefetched), and a retry takes back
    # the batch last yielded: only the batches yielded count, against the configured budget;
    # small chunks, so that some lowering falls where a chunk ends
    for at in range(8):
        loader = FastSizeAwareLoader(
            torch.arange(N), LENGTHS, BUDGET, cost="padded", group_size=16, prefetch=prefetch, seed=at
        )
        batches = []
        for number, (ids, _) in enumerate(loader.iter_with_indices()):
            batches.append(ids.tolist())
            if number == at:
                (loader.retry_last_batch if retry else loader.lower_limit)(BUDGET // 3)
                if retry:
                    batches.pop()
        assert sorted(i for batch in batches for i in batch) == list(range(N))
        assert loader.stats.num_batches == len(batches)
        check(loader.stats, hand_counts(batches, "padded", BUDGET), tokens=True)


def test_a_planned_data_loader_reports_the_figures_of_its_batches() -> None:
    loader = FastSizeAwareLoader(torch.arange(N), LENGTHS, BUDGET, cost="padded", group_size=64, seed=4)
    data_loader = loader.data_loader()
    batches = [batch.tolist() for batch in data_loader]
    check(data_loader.stats, hand_counts(batches, "padded", BUDGET), tokens=True)


@pytest.mark.parametrize("rank", [0, 1])
def test_under_ranks_each_rank_counts_its_share(rank: int) -> None:
    # the dealt shares come without the planner's figures: they are measured from their ids
    loader = FastSizeAwareLoader(
        torch.arange(N), LENGTHS, BUDGET, cost="padded", group_size=64, rank=rank, world_size=2, even_batches="pad"
    )
    batches = ids_of(loader)
    check(loader.stats, hand_counts(batches, "padded", BUDGET), tokens=True)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    budget=st.integers(1, 120),
    cost=st.sampled_from(["sum", "padded"]),
    group_size=st.integers(1, 16),
    seed=st.integers(0, 3),
)
def test_figures_match_the_plain_loop(lengths: list[int], budget: int, cost: str, group_size: int, seed: int) -> None:
    # invariant: the stats' figures are those of the batches the item-by-item loop makes
    n = len(lengths)
    loader = FastSizeAwareLoader(torch.arange(n), lengths, budget, cost=cost, group_size=group_size, seed=seed)
    yielded = ids_of(loader)
    order = np.concatenate(list(loader.order.chunks(0))).tolist()  # (the order is tested elsewhere)
    rows = as_rows(lengths)
    expected, _ = greedy_loop(order, rows, [budget], cost=cost)
    assert yielded == expected
    stats = loader.stats
    if not expected:
        assert stats.mean_fill is None
        return
    fills = [batch_cost([rows[i] for i in batch], 0, cost) / budget for batch in expected]
    assert stats.mean_fill == pytest.approx(sum(fills) / len(fills)) and stats.min_fill == pytest.approx(min(fills))
    if cost == "padded":
        real = sum(lengths[i] for batch in expected for i in batch)
        padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in expected)
        assert (stats.real_tokens, stats.padded_tokens) == (real, padded)
        assert stats.padding_efficiency == (real / padded if padded else None)


def bench_stderr(stderr: int) -> bytes:
    """What ``fastsab bench`` (a small run) writes to ``stderr`` (a file descriptor)."""
    argv = [sys.executable, "-m", "fastsab", "bench", "--samples", "600", "--batch-size", "20", "--epochs", "1"]
    argv += ["--batch-sizes", "20", "--suite", "loaders"]
    read, write = os.pipe() if stderr < 0 else (stderr, stderr)
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=write, timeout=120, check=False)
    assert done.returncode == 0
    if stderr < 0:
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            return pipe.read()
    return b""


def test_bench_draws_no_progress_bar_into_a_redirected_stderr() -> None:
    assert b"fastsab bench" not in bench_stderr(-1)


def test_bench_draws_its_progress_bar_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    # NOTE: a new terminal is 0 columns wide, in which tqdm draws an empty bar
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        bench_stderr(follower)
        os.set_blocking(leader, False)
        drawn = b""
        try:
            while chunk := os.read(leader, 65536):
                drawn += chunk
        except (BlockingIOError, OSError):
            pass
    finally:
        os.close(leader)
        os.close(follower)
    assert b"fastsab bench" in drawn
