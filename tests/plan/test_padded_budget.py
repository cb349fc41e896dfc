"""A padded budget with pad_to_multiple_of: it charges the length PadCollator pads to."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, RaggedDataset
from fastsab.plan.cost_sources import padded_length
from fastsab.plan.costs import BatchCost
from fastsab.varlen.collate import PackCollator, PadCollator
from tests.reference import greedy_loop


def ragged(lengths: list[int], multiple: int | None) -> RaggedDataset:
    sequences = [np.arange(n, dtype=np.int64) + 1000 * i for i, n in enumerate(lengths)]
    return RaggedDataset.from_sequences(sequences, collator=PadCollator(pad_to_multiple_of=multiple))


class Samples(torch.utils.data.Dataset):
    """Dict samples of 1-D ``input_ids``, collated by the loader's ``collate_fn``."""

    def __init__(self, lengths: list[int]) -> None:
        self.samples = [{"input_ids": torch.ones(n, dtype=torch.long), "index": i} for i, n in enumerate(lengths)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitems__(self, indices: list[int]) -> list[dict[str, object]]:
        return [self.samples[i] for i in indices]


def loaders(lengths: list[int], budget: int, multiple: int, **options: object) -> list[FastSizeAwareLoader]:
    """A RaggedDataset (its gathers) and a dataset of samples (PadCollator as collate_fn), both padding to ``multiple``."""
    return [
        FastSizeAwareLoader(
            ragged(lengths, multiple), lengths, budget, cost="padded", pad_to_multiple_of=multiple, **options
        ),
        FastSizeAwareLoader(
            Samples(lengths),
            lengths,
            budget,
            cost="padded",
            pad_to_multiple_of=multiple,
            collate_fn=PadCollator(pad_to_multiple_of=multiple),
            **options,
        ),
    ]


def run(loader: FastSizeAwareLoader) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """The epoch's batches (dataset indices) and the shape of each padded ``input_ids`` tensor."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped items are warned about
        pairs = list(loader.iter_with_indices())
    return [ids.tolist() for ids, _ in pairs], [tuple(batch["input_ids"].shape) for _, batch in pairs]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=50),
    multiple=st.integers(1, 16),
    budget=st.integers(1, 400),
)
def test_a_padded_batch_stays_within_the_budget_and_is_the_greedy_loops(lengths, multiple, budget):
    # invariant: every padded (B, L) tensor holds at most budget cells, and the batches are those of
    # the greedy loop charging len(batch) * roundup(max length, multiple), oversize items skipped
    def rounded(row):
        return (-(-row[0] // multiple) * multiple,)

    expected, skipped = greedy_loop(
        range(len(lengths)), [(n,) for n in lengths], [budget], cost="padded", feature_cost=rounded
    )
    for loader in loaders(lengths, budget, multiple, shuffle=False):
        batches, shapes = run(loader)
        assert all(rows * width <= budget for rows, width in shapes)
        assert all(width % multiple == 0 for _, width in shapes)
        assert batches == expected
        assert sorted(loader.stats.skipped) == skipped
        assert len(loader) == len(expected)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=50),
    multiple=st.integers(1, 16),
    budget=st.integers(1, 400),
    window=st.integers(1, 20),
)
def test_sorted_windows_keep_padded_batches_within_the_budget(lengths, multiple, budget, window):
    # invariant: with sort_window too, every padded tensor within the budget, every item within it once
    for loader in loaders(lengths, budget, multiple, sort_window=window, seed=1):
        batches, shapes = run(loader)
        assert all(rows * width <= budget for rows, width in shapes)
        seen = sorted(i for batch in batches for i in batch)
        fits = [i for i, n in enumerate(lengths) if -(-n // multiple) * multiple <= budget]
        assert seen == fits and sorted(loader.stats.skipped) == sorted(set(range(len(lengths))) - set(fits))


def test_an_item_whose_padded_length_exceeds_the_cap_is_oversize():
    lengths = [3, 10, 4]  # 10 pads to 16 > 12
    loader = FastSizeAwareLoader(ragged(lengths, 8), lengths, 12, cost="padded", pad_to_multiple_of=8, shuffle=False)
    with pytest.warns(UserWarning, match=r"1 items were larger than max_total_size"):
        list(loader)
    assert run(loader) == ([[0], [2]], [(1, 8), (1, 8)]) and loader.stats.skipped == [1]
    own = FastSizeAwareLoader(
        ragged(lengths, 8), lengths, 12, cost="padded", pad_to_multiple_of=8, shuffle=False, oversize="own_batch"
    )
    assert run(own) == ([[0], [1], [2]], [(1, 8), (1, 16), (1, 8)])
    with pytest.raises(
        ValueError, match=r"item 1 has cost 16 \(its length padded to a multiple of 8\) above max_total_size 12"
    ):
        list(FastSizeAwareLoader(torch.arange(3), lengths, 12, cost="padded", pad_to_multiple_of=8, oversize="error"))


class _ConfiguredCollator:
    """A collator whose multiple was read from a configuration as a numpy integer."""

    pad_to_multiple_of = np.int64(8)

    def __call__(self, samples: list[dict[str, object]]) -> list[dict[str, object]]:
        return samples


def test_a_collators_multiple_held_as_a_numpy_integer_is_charged_too():
    lengths = [5, 9, 14]
    inferred = FastSizeAwareLoader(Samples(lengths), lengths, 64, cost="padded", collate_fn=_ConfiguredCollator())
    explicit = FastSizeAwareLoader(
        Samples(lengths), lengths, 64, cost="padded", collate_fn=_ConfiguredCollator(), pad_to_multiple_of=8
    )
    assert inferred.planner.rule.pad_to_multiple_of == 8 and inferred.state_dict() == explicit.state_dict()
    with pytest.raises(ValueError, match=r"multiple of 8, but pad_to_multiple_of=4 charges lengths rounded up"):
        FastSizeAwareLoader(
            Samples(lengths), lengths, 64, cost="padded", collate_fn=_ConfiguredCollator(), pad_to_multiple_of=4
        )


def test_collators_the_budget_covers_are_accepted():
    lengths = [5, 9, 14]
    for multiple, collator in [(16, PadCollator(pad_to_multiple_of=8)), (8, PadCollator()), (None, PackCollator())]:
        FastSizeAwareLoader(
            Samples(lengths), lengths, 64, cost="padded", collate_fn=collator, pad_to_multiple_of=multiple
        )
    # a token budget charges the real tokens by choice: a padding collator is not checked against it
    FastSizeAwareLoader(Samples(lengths), lengths, 64, collate_fn=PadCollator(pad_to_multiple_of=8))


def test_pad_to_multiple_of_needs_a_padded_budget_of_one_column_of_lengths():
    with pytest.raises(
        ValueError,
        match=r"pad_to_multiple_of=8 rounds up the lengths a padded batch charges, so it needs cost='padded'",
    ):
        BatchCost(64, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match=r"not padded features\), got cost='padded' with padded features"):
        BatchCost(64, cost="padded", pad_to_multiple_of=8, feature_cost=lambda rows: rows[:, 0])
    with pytest.raises(ValueError, match=r"pad_to_multiple_of must be a positive integer, got 0"):
        BatchCost(64, cost="padded", pad_to_multiple_of=0)
    with pytest.raises(
        ValueError, match=r"pad_to_multiple_of=8 rounds up one column of lengths, but costs has 2 columns"
    ):
        FastSizeAwareLoader(torch.arange(3), np.ones((3, 2)), [64, 64], cost="padded", pad_to_multiple_of=8)


def test_the_padded_length_is_the_collators_width():
    lengths = np.array([0, 1, 7, 8, 9, 17])
    assert padded_length(lengths, 8).tolist() == [0, 8, 8, 8, 16, 24]
    assert padded_length(lengths, None) is lengths
    for multiple in (None, 1, 3, 8):
        assert PadCollator(pad_to_multiple_of=multiple).width(lengths) == padded_length(17, multiple)


def test_a_state_of_another_multiple_is_refused():
    lengths = [5, 9, 14, 3]
    saved = FastSizeAwareLoader(torch.arange(4), lengths, 40, cost="padded", pad_to_multiple_of=8)
    other = FastSizeAwareLoader(torch.arange(4), lengths, 40, cost="padded")
    with pytest.raises(ValueError, match=r"fingerprint|batching configuration"):
        other.load_state_dict(saved.state_dict())


def test_a_data_loaders_collator_is_checked_too():
    lengths = [5, 9, 14]
    loader = FastSizeAwareLoader(Samples(lengths), lengths, 64, cost="padded")
    with pytest.raises(ValueError, match=r"data_loader's collate_fn PadCollator\(pad_value=0, pad_to_multiple_of=8\)"):
        loader.data_loader(collate_fn=PadCollator(pad_to_multiple_of=8))
    padded = FastSizeAwareLoader(Samples(lengths), lengths, 64, cost="padded", pad_to_multiple_of=8, shuffle=False)
    batches = list(padded.data_loader(collate_fn=PadCollator(pad_to_multiple_of=8)))
    assert all(b["input_ids"].numel() <= 64 for b in batches) and sum(len(b["index"]) for b in batches) == 3
