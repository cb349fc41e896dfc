"""``last_batch="round_down"``: fairseq's last batch, cut down to a multiple, the rest dropped and counted.

The split and the loaders against the plain loop of :mod:`tests.reference` followed by
:func:`tests.reference.round_down_last`, the loader properties of :mod:`tests.test_differential`
(ranks, resume) run again on such cases, and fairseq's own ``batch_by_size`` where it is importable.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, split_batches
from fastsab.plan.costs import BatchCost
from tests import test_differential as differential
from tests.reference import above, round_down_last

pytestmark = pytest.mark.filterwarnings("ignore:.*larger than max_total_size:UserWarning")


@st.composite
def round_down_cases(draw: Any, **options: Any) -> differential.Case:
    """Size-aware cases of ``tests.test_differential`` with ``last_batch="round_down"`` and a multiple > 1."""
    case = draw(differential.cases(kinds=("sized",), **options))
    return replace(case, last_batch="round_down", multiple=draw(st.sampled_from([2, 3, 4, 8])))


def expected_plan(case: differential.Case, order: list[int]) -> tuple[list[list[int]], list[int], list[int]]:
    """The plain loop over ``order`` then fairseq's last batch: batches, skipped, dropped."""
    batches, skipped = differential.reference(case, order)
    own = bool(batches) and len(batches[-1]) == 1 and above(case.sizes[batches[-1][0]], case.caps)
    kept, dropped = round_down_last(batches, case.multiple, own)
    return kept, skipped, dropped


@settings(max_examples=differential.examples(60))
@given(case=round_down_cases(oversize=("skip", "own_batch"), max_n=120), cuts=st.lists(st.integers(0, 120)))
def test_split_round_down_is_the_plain_loop_then_fairseqs_last_batch(case: differential.Case, cuts: list[int]) -> None:
    # invariant: the split's batches are the plain loop's, but the last one cut down to a
    # multiple; what it leaves out is in .dropped, in one call or chunk by chunk
    costs, caps, options = differential.split_arguments(case)
    expected, skipped, dropped = expected_plan(case, list(range(case.n)))
    split = split_batches(costs, caps, **options)
    assert [b.tolist() for b in split.batches()] == expected
    assert split.skipped.tolist() == skipped and split.dropped.tolist() == dropped
    batches, chunk_skipped, chunk_dropped = differential.split_in_chunks(costs, caps, cuts, options)
    if case.n:
        assert (batches, chunk_skipped, chunk_dropped) == (expected, skipped, dropped)


@settings(max_examples=differential.examples(60))
@given(case=round_down_cases())
def test_round_down_epoch_is_the_plain_loop_over_its_order(case: differential.Case) -> None:
    with ExitStack() as stack:
        loader = differential.make_loader(case, stack)
        announced = len(loader)
        batches = differential.epoch(loader, case, with_indices=True)
        stats = loader.stats
        order = [i for group in loader.order.chunks(0) for i in group.tolist()]
    expected, skipped, dropped = expected_plan(case, order)
    # invariant: the batches are the plain loop's over the epoch order, the last cut down;
    # len() announced them, and the items left out are counted in stats
    assert batches == expected and announced == len(expected) == stats.num_batches
    assert stats.dropped == dropped and stats.num_dropped == len(dropped)
    assert sorted(stats.skipped) == sorted(skipped)
    # invariant: every index is yielded, skipped or dropped, exactly once
    assert sorted(differential.flat(batches) + stats.skipped + stats.dropped) == list(range(case.n))


@settings(max_examples=differential.examples(40))
@given(case=round_down_cases(world_sizes=(2, 3, 4), windows=differential.WINDOWS))
def test_round_down_ranks_share_the_single_process_plan(case: differential.Case) -> None:
    differential.test_ranks_share_the_single_process_plan.hypothesis.inner_test(case)  # type: ignore[attr-defined]


# NOTE: 6 of the 25 cases in the quick suite, the other 19 in the slow one
@settings(max_examples=differential.examples(6))
@given(case=round_down_cases(world_sizes=(1, 2, 3), windows=differential.WINDOWS), data=st.data())
def test_round_down_resume_at_every_step(case: differential.Case, data: Any) -> None:
    differential.test_resume_at_every_step.hypothesis.inner_test(case, data)  # type: ignore[attr-defined]


@pytest.mark.slow
@settings(max_examples=differential.examples(19))
@given(case=round_down_cases(world_sizes=(1, 2, 3), windows=differential.WINDOWS), data=st.data())
def test_round_down_resume_at_every_step_more_cases(case: differential.Case, data: Any) -> None:
    differential.test_resume_at_every_step.hypothesis.inner_test(case, data)  # type: ignore[attr-defined]


def test_keep_is_the_default_and_round_down_changes_the_fingerprint() -> None:
    lengths = np.ones(23, dtype=np.int64)
    kept = FastSizeAwareLoader(np.arange(23), lengths, 5, batch_size_multiple=4, shuffle=False)
    cut = FastSizeAwareLoader(np.arange(23), lengths, 5, batch_size_multiple=4, shuffle=False, last_batch="round_down")
    assert [len(b) for b in kept] == [4, 4, 4, 4, 4, 3] and kept.stats.num_dropped == 0
    assert [len(b) for b in cut] == [4] * 5 and cut.stats.dropped == [20, 21, 22]
    # invariant: a state saved under one rule is refused by the other
    with pytest.raises(ValueError, match="last_batch"):
        cut.load_state_dict(kept.state_dict())
    # the options of a rule without it stay as they were (fingerprints of old states unchanged)
    assert "last_batch" not in BatchCost(5).options()


def test_bad_last_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="last_batch must be one of 'keep', 'round_down', got 'drop'"):
        split_batches([1, 2], 3, last_batch="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize("multiple", [1, 3, 8])
def test_round_down_is_fairseqs_batch_by_size(multiple: int) -> None:
    data_utils = pytest.importorskip("fairseq.data.data_utils")
    lengths = np.random.default_rng(multiple).integers(1, 200, 5000)
    budget = 4000
    order = np.random.default_rng(0).permutation(len(lengths))
    theirs = data_utils.batch_by_size(
        order, None, num_tokens_vec=lengths[order], max_tokens=budget, required_batch_size_multiple=multiple
    )
    ours = split_batches(
        lengths[order], budget, cost="padded", batch_size_multiple=multiple, last_batch="round_down", ids=order
    )
    assert [b.tolist() for b in ours.batches()] == [b.tolist() for b in theirs]
