"""A collator's pad_to_multiple_of, charged by the loader that sees it as if it were given to the loader."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, PadCollator, RaggedDataset
from tests.plan.test_padded_budget import Samples, run


def loader_of(where: str, lengths: Any, sizes: Any, multiple: int | None, **options: Any) -> FastSizeAwareLoader:
    """A loader over ``lengths`` whose collator pads to a multiple of ``multiple``: the dataset's or ``collate_fn``."""
    collator = PadCollator(pad_to_multiple_of=multiple)
    if where == "dataset":
        sequences = [np.arange(int(n), dtype=np.int64) for n in lengths]
        return FastSizeAwareLoader(RaggedDataset.from_sequences(sequences, collator=collator), sizes, **options)
    return FastSizeAwareLoader(Samples(lengths), sizes, collate_fn=collator, **options)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=60),
    multiple=st.integers(2, 16),
    budget=st.integers(1, 400),
    window=st.none() | st.integers(1, 20),
    seed=st.integers(0, 3),
    where=st.sampled_from(["dataset", "collate_fn"]),
)
def test_a_collators_multiple_plans_as_the_same_multiple_given_to_the_loader(
    lengths, multiple, budget, window, seed, where
):
    # invariant: a collator's multiple left to the loader gives the batches, skipped items, figures and
    # state (fingerprint included) of the same pad_to_multiple_of given; every collated (B, L) holds at
    # most budget cells, and the padded tokens counted are those of the collated batches
    options = {"max_total_size": budget, "cost": "padded", "sort_window": window, "seed": seed}
    inferred = loader_of(where, lengths, lengths, multiple, **options)
    explicit = loader_of(where, lengths, lengths, multiple, pad_to_multiple_of=multiple, **options)
    counted = len(inferred), len(explicit)
    batches, shapes = run(inferred)
    assert (batches, shapes) == run(explicit)
    assert counted == (len(batches), len(batches))
    assert inferred.state_dict() == explicit.state_dict()
    assert inferred.stats.skipped == explicit.stats.skipped
    assert all(rows * width <= budget and width % multiple == 0 for rows, width in shapes)
    if batches:  # (an epoch of no batch counts no tokens)
        assert inferred.stats.padded_tokens == sum(rows * width for rows, width in shapes)
        assert inferred.stats.real_tokens == sum(lengths[i] for batch in batches for i in batch)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=60),
    budget=st.integers(8, 400),
    window=st.none() | st.integers(1, 20),
    where=st.sampled_from(["dataset", "collate_fn"]),
)
def test_sizes_rounded_up_by_hand_for_the_collator_hold_the_budget(lengths, budget, window, where):
    # invariant: sizes the user rounded up to the collator's multiple are charged as they are; every
    # collated (B, L) holds at most budget cells, and every item whose rounded size fits comes once
    sizes = (np.asarray(lengths) + 7) // 8 * 8
    loader = loader_of(where, lengths, sizes, 8, max_total_size=budget, cost="padded", sort_window=window, seed=1)
    batches, shapes = run(loader)
    assert all(rows * width <= budget for rows, width in shapes)
    assert sorted(i for batch in batches for i in batch) == [i for i, size in enumerate(sizes) if size <= budget]


@pytest.mark.parametrize("given", [4, 12])
@pytest.mark.parametrize("where", ["dataset", "collate_fn"])
def test_a_multiple_given_that_does_not_cover_the_collators_is_refused(given, where):
    lengths = [5, 9, 14]
    named = "the dataset's collator" if where == "dataset" else "collate_fn"
    message = (
        rf"{named} PadCollator\(pad_value=0, pad_to_multiple_of=8\) rounds every batch's length up to a multiple "
        rf"of 8, but pad_to_multiple_of={given} charges lengths rounded up to a multiple of {given}, which does not "
        r"cover it: pass pad_to_multiple_of=8 \(or a multiple of it\), or leave pad_to_multiple_of unset"
    )
    with pytest.raises(ValueError, match=message):
        loader_of(where, lengths, lengths, 8, max_total_size=64, cost="padded", pad_to_multiple_of=given)
    with pytest.raises(ValueError, match=message.replace("the dataset's collator", "collate_fn")):
        loader_of("collate_fn", lengths, lengths, 8, max_total_size=4096, buckets=2, pad_to_multiple_of=given)


LENGTHS = np.random.default_rng(0).integers(1, 300, 500)


@pytest.mark.parametrize("buckets", [4, [64, 128, 320]])
def test_shape_buckets_charge_the_collators_multiple(buckets):
    # the lengths buckets=K chooses are multiples of the collator's, and the plan is that of the same
    # multiple given to the loader
    options = {"max_total_size": 8192, "buckets": buckets, "partial": "keep", "seed": 2}
    inferred = loader_of("collate_fn", LENGTHS, LENGTHS, 8, **options)
    explicit = loader_of("collate_fn", LENGTHS, LENGTHS, 8, pad_to_multiple_of=8, **options)
    assert all(length % 8 == 0 for length in inferred.buckets.lengths)
    batches, shapes = run(inferred)
    assert (batches, shapes) == run(explicit)
    assert inferred.state_dict() == explicit.state_dict()
    assert all(rows * width <= 8192 and width in inferred.buckets.lengths for rows, width in shapes)


def test_a_multiple_of_one_rounds_nothing_and_leaves_the_plan_as_it_was():
    lengths = [5, 9, 14, 3]
    plain = FastSizeAwareLoader(Samples(lengths), lengths, 40, cost="padded")
    unit = FastSizeAwareLoader(
        Samples(lengths), lengths, 40, cost="padded", collate_fn=PadCollator(pad_to_multiple_of=1)
    )
    assert unit.state_dict() == plain.state_dict()


def test_a_token_budget_charges_the_real_tokens_whatever_the_collator():
    lengths = [5, 9, 14, 3]
    plain = FastSizeAwareLoader(Samples(lengths), lengths, 40)
    padded = FastSizeAwareLoader(Samples(lengths), lengths, 40, collate_fn=PadCollator(pad_to_multiple_of=8))
    assert padded.state_dict() == plain.state_dict()


OLD_LENGTHS = [(i * 37) % 300 + 1 for i in range(40)]
OLD_PLAN = {"kind": "SizeAwarePlanner", "n": 40, "shuffle": True, "group_size": 65536, "rotate": True}
OLD_POSITION = {"format": "fastsab.epoch-state/2", "seed": 3, "epoch": 0, "world_size": 1, "steps": 2}
OLD_POSITION |= {"even_batches": None, "balance": None, "lowered": [], "history": []}

# NOTE: states saved two batches into an epoch by fastsab before it charged a collator's multiple,
# for the loaders it accepted with a padding collator and no pad_to_multiple_of
OLD_STATES = {
    "buckets": (
        {"buckets": [64, 128, 256], "oversize": "own_batch", "partial": "keep", "pad": 8},
        OLD_POSITION
        | {
            "fingerprint": "602c82329ba84f0c242dca0f",
            "plan": OLD_PLAN
            | {
                "kind": "BucketPlanner",
                "options": {
                    "limit": [1024],
                    "cost": "padded",
                    "max_batch_size": None,
                    "batch_size_multiple": 1,
                    "oversize": "own_batch",
                    "bucket_lengths": [64, 128, 256],
                    "bucket_batch_sizes": [16, 8, 4],
                    "partial": "keep",
                },
            },
        },
    ),
    "unit": (
        {"cost": "padded", "pad": 1},
        OLD_POSITION
        | {
            "fingerprint": "fc0a0e3a322a2bd901ce5360",
            "plan": OLD_PLAN
            | {
                "options": {
                    "limit": [1024],
                    "oversize": "skip",
                    "cost": "padded",
                    "max_batch_size": None,
                    "batch_size_multiple": 1,
                }
            },
            "resume": {"batch": 0, "item": 17, "rng": None},
        },
    ),
    "sum": (
        {"pad": 8},
        OLD_POSITION
        | {
            "fingerprint": "d1a0076850ac5f49bcf891d8",
            "plan": OLD_PLAN
            | {
                "options": {
                    "limit": [1024],
                    "oversize": "skip",
                    "cost": "sum",
                    "max_batch_size": None,
                    "batch_size_multiple": 1,
                }
            },
            "resume": {"batch": 0, "item": 17, "rng": None},
        },
    ),
}


@pytest.mark.parametrize("name", sorted(OLD_STATES))
def test_a_state_saved_before_the_collators_multiple_was_charged_resumes(name):
    options, state = OLD_STATES[name]
    options = dict(options)
    pad = options.pop("pad")

    def made() -> FastSizeAwareLoader:
        return loader_of("collate_fn", OLD_LENGTHS, OLD_LENGTHS, pad, max_total_size=1024, seed=3, **options)

    uninterrupted, _ = run(made())
    resumed = made()
    resumed.load_state_dict(state)
    assert run(resumed)[0] == uninterrupted[2:]
