"""Size-sorted windows (``sort_window=``): the sort, the randomness of the epochs, the efficiency goals, where it flows."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from fastsab import FastSizeAwareLoader, OutOfCoreDataset
from fastsab.bench.varlen import efficiency, megabatch_batches, varlen_lengths
from fastsab.plan.windows import batch_order, window_order
from tests.reference import as_rows, sorted_windows

# the workload of the varlen bench: 50,000 log-normal lengths 10..2000, 16,384 tokens a batch
N = 50_000
BUDGET = 16_384


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return varlen_lengths(N)


def epoch_batches(loader: FastSizeAwareLoader[Any], epoch: int) -> list[np.ndarray]:
    loader.set_epoch(epoch)
    return [batch.numpy() for batch in loader]


# -- the sort ----------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 64])
@pytest.mark.parametrize("columns", [1, 2])
def test_window_order_is_the_plain_sort(window: int, columns: int) -> None:
    rng = np.random.default_rng(window)
    for dtype in (np.int64, np.float64):
        sizes = rng.integers(0, 4, (37, columns)).astype(dtype)
        costs = sizes[:, 0] if columns == 1 else sizes
        expected = sorted_windows([list(range(37))], as_rows(sizes), window)
        assert window_order(costs, window).tolist() == expected


@pytest.mark.parametrize("low", [-2, 0, 2**16 - 2, 2**40, 2**62])
def test_window_order_is_the_plain_sort_of_any_integers(low: int) -> None:
    # invariant: each sort (16-bit radix, int32 or int64 keys, stable argsort) orders as the plain sort
    rng = np.random.default_rng(low % 1000)
    sizes = rng.integers(0, 4, 101) + low
    expected = sorted_windows([list(range(101))], as_rows(sizes[:, None]), 16)
    assert window_order(sizes, 16).tolist() == expected


def test_window_order_of_nothing() -> None:
    assert window_order(np.empty(0, dtype=np.int64), 4).tolist() == []


def test_batch_order_keeps_negative_labels_in_place() -> None:
    labels = np.array([-2, -1, 0, 0, 0, 1, 1])
    order = batch_order(labels, np.random.default_rng(1))
    assert order[:2].tolist() == [0, 1]
    assert sorted(order[2:5].tolist()) == [2, 3, 4] and sorted(order[5:].tolist()) == [5, 6]
    assert batch_order(labels, None).tolist() == list(range(7))


def test_two_columns_sort_by_the_first_then_the_second() -> None:
    sizes = np.array([[3, 0], [1, 5], [1, 2], [2, 9]])
    loader = FastSizeAwareLoader(torch.arange(4), sizes, [100, 100], shuffle=False, sort_window=4)
    assert [b.tolist() for b in loader] == [[2, 1, 3, 0]]


# -- randomness ---------------------------------------------------------------------------------


def co_batched(batches: list[np.ndarray]) -> np.ndarray:
    """Every pair of items batched together, as ``i * N + j`` with ``i < j``."""
    pairs = []
    for batch in batches:
        ordered = np.sort(batch)
        i, j = np.triu_indices(len(ordered), 1)
        pairs.append(ordered[i] * N + ordered[j])
    return np.unique(np.concatenate(pairs))


def test_co_batched_counts_each_pair_once() -> None:
    assert co_batched([np.array([3, 1, 2]), np.array([1, 3])]).tolist() == [1 * N + 2, 1 * N + 3, 2 * N + 3]


@pytest.mark.slow
@pytest.mark.parametrize(("cost", "window"), [("padded", 1_024), ("padded", 2_048), ("sum", 2_048)])
def test_pairs_batched_together_rarely_meet_again_next_epoch(lengths: np.ndarray, cost: str, window: int) -> None:
    # NOTE: the share grows with the window's part of the dataset (or of a shuffle group): two
    # items of about the same size meet again when the next epoch puts them in one window
    loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost=cost, sort_window=window)  # type: ignore[arg-type]
    first, second = co_batched(epoch_batches(loader, 0)), co_batched(epoch_batches(loader, 1))
    assert len(np.intersect1d(first, second, assume_unique=True)) / len(first) <= 0.05


@pytest.mark.parametrize(("cost", "window"), [("padded", 1_024), ("padded", 8_192), ("sum", 2_048)])
@pytest.mark.parametrize("group_size", [None, 4_096])
def test_batch_order_is_not_sorted_by_size(lengths: np.ndarray, cost: str, window: int, group_size: int | None) -> None:
    loader = FastSizeAwareLoader(
        torch.arange(N),
        lengths,
        BUDGET,
        cost=cost,  # type: ignore[arg-type]
        sort_window=window,
        group_size=group_size,
    )
    for epoch in range(3):
        means = [lengths[batch].mean() for batch in epoch_batches(loader, epoch)]
        rho = spearmanr(np.arange(len(means)), means).statistic
        assert abs(rho) < 0.2, f"epoch {epoch}: Spearman {rho:.3f}"


def test_the_same_seed_and_epoch_give_the_same_batches(lengths: np.ndarray) -> None:
    def run(seed: int, epoch: int) -> list[list[int]]:
        loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, sort_window=512, seed=seed)
        return [batch.tolist() for batch in epoch_batches(loader, epoch)]

    assert run(3, 1) == run(3, 1)
    assert run(3, 1) != run(3, 2) and run(3, 1) != run(4, 1)


def test_unshuffled_windows_are_not_shuffled() -> None:
    lengths = np.array([5, 1, 4, 2, 3, 3, 1, 9])
    loader = FastSizeAwareLoader(torch.arange(8), lengths, 10, shuffle=False, sort_window=4)
    # window 0 ascending: sizes 1 2 4 5; window 1 descending: 9 3 3 1 (equal sizes reversed)
    assert [b.tolist() for b in loader] == [[1, 3, 2], [0], [7], [5, 4, 6]]


# -- the goals, from the batches' lengths ------------------------------------------------------------


@pytest.mark.parametrize("window", [1_024, 2_048])
def test_padded_efficiency_reaches_the_goal_and_the_megabatch_baseline(lengths: np.ndarray, window: int) -> None:
    loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost="padded", sort_window=window)
    padded, _, steps = efficiency(epoch_batches(loader, 0), lengths, BUDGET)
    unsorted, _, unsorted_steps = efficiency(
        epoch_batches(FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost="padded"), 0), lengths, BUDGET
    )
    baseline, _, _ = efficiency(megabatch_batches(lengths, window, BUDGET), lengths, BUDGET)
    assert unsorted < 0.35 and steps < unsorted_steps / 3
    assert padded >= baseline - 0.005
    if window >= 2_048:
        assert padded >= 0.90


def test_packing_efficiency_with_a_token_budget(lengths: np.ndarray) -> None:
    # a budget eight times the longest sequence: batches packed into rows of the budget
    loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost="sum", sort_window=2_048)
    padded, packed, _ = efficiency(epoch_batches(loader, 0), lengths, BUDGET)
    assert packed >= 0.97 and padded >= 0.90


# -- every guarantee, where the options flow --------------------------------------------------------


def test_a_state_of_another_window_size_is_refused(lengths: np.ndarray) -> None:
    def make(window: int | None) -> FastSizeAwareLoader[Any]:
        return FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, sort_window=window)

    loader = make(512)
    source = iter(loader)
    next(source)
    state = json.loads(json.dumps(loader.state_dict()))
    for other in (1_024, None):
        with pytest.raises(ValueError, match="state was saved for another dataset, sizes or batching configuration"):
            make(other).load_state_dict(state)
    resumed = make(512)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in source]


def test_batch_sampler_and_data_loader_keep_the_windows(lengths: np.ndarray) -> None:
    loader = FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost="padded", sort_window=1_024, seed=5)
    expected = [
        batch.tolist()
        for batch in FastSizeAwareLoader(torch.arange(N), lengths, BUDGET, cost="padded", sort_window=1_024, seed=5)
    ]
    assert [list(batch) for batch in loader.batch_sampler()] == expected
    assert [batch.tolist() for batch in loader.data_loader()] == expected


def test_an_out_of_core_dataset_is_read_chunk_by_chunk_once(lengths: np.ndarray) -> None:
    n = 4_000
    dataset = OutOfCoreDataset(range(n), lambda i: np.array([i]), cpu_memory_limit=16 * 500)
    try:
        loader = FastSizeAwareLoader(dataset, lengths[:n], BUDGET, cost="padded", sort_window=128, prefetch=0)
        seen = [int(i) for batch in loader for i in batch.reshape(-1).tolist()]
        assert sorted(seen) == list(range(n))
        assert dataset.chunk_reads == dataset.num_chunks
    finally:
        dataset.close()


@pytest.mark.filterwarnings("ignore:the training loader's epochs differ:UserWarning")
def test_the_lightning_module_passes_the_window_on(lengths: np.ndarray) -> None:
    pytest.importorskip("lightning")
    from fastsab.integrations.lightning import FastDataModule

    module = FastDataModule(train=torch.arange(N), sizeof={"train": lengths}, max_total_size=BUDGET, sort_window=512)
    loader = module.train_dataloader().loader
    assert loader.planner.sort_window == 512
