"""The resume state format: segments, the lowered record, and the checks of a state read back."""

from __future__ import annotations

import pytest

from fastsab.position.epoch_state import STATE_FORMAT, Segment, check_steps, lowered_at, parse_state


def check_limit(limit):
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}.")
    return limit


def state(**change):
    segment = {"world_size": 1, "steps": 3, "even_batches": None, "balance": None, "lowered": []}
    return {"format": STATE_FORMAT, "seed": 5, "epoch": 2, "fingerprint": "abc", "history": [], **segment, **change}


def parse(raw):
    return parse_state(raw, seed=5, fingerprint="abc", check_limit=check_limit)


def test_a_state_parses_into_its_epoch_and_stretches_the_last_one_current():
    earlier = {"world_size": 4, "steps": 2, "even_batches": "drop", "balance": False, "lowered": []}
    epoch, segments = parse(state(history=[earlier], lowered=[[1, 8], [4, 2]]))
    assert epoch == 2
    assert segments == [Segment(4, 2, "drop", False), Segment(1, 3, None, None, [(1, 8), (4, 2)])]


def test_a_segment_as_a_dict_parses_back_into_itself():
    segment = Segment(3, 7, "pad", True)
    assert parse(state(**segment.as_dict()))[1] == [segment]


def test_one_rank_ignores_the_dealing_options():
    assert parse(state(even_batches="bogus", balance=3))[1] == [Segment(1, 3)]


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        ([], TypeError, "state must be a dict from state_dict\\(\\), got list"),
        (state(format="fastsab.epoch-state/1"), ValueError, "not a fastsab epoch state of this version"),
        (state(seed=6), ValueError, "state was saved with seed 6, but this object has seed 5"),
        (state(seed="5"), TypeError, r"state\['seed'\] must be an integer, got '5' \(str\)"),
        (state(fingerprint="abd"), ValueError, "another dataset, sizes or batching configuration"),
        (state(epoch=2.0), TypeError, r"state\['epoch'\] must be an integer, got 2.0 \(a number that is not"),
        (state(epoch=True), TypeError, r"state\['epoch'\] must be an integer, got True"),
        (state(epoch=2**63), ValueError, r"state\['epoch'\] must be below 2\*\*63"),
        (state(history={}), TypeError, r"state\['history'\] must be a list, got \{\}"),
        (state(history=[3]), TypeError, r"each of state\['history'\] must be a dict, got 3"),
        (state(steps=-1), ValueError, r"state\['steps'\] must be a non-negative integer, got -1"),
        (state(world_size=0), ValueError, "state has world_size=0; it must be from 1 to 16777216"),
        (state(world_size=2, even_batches="even"), ValueError, r"state\['even_batches'\]"),
        (state(world_size=2, even_batches="pad", balance=1), TypeError, r"state\['balance'\] must be a bool, got 1"),
        (state(lowered=None), ValueError, r"state\['lowered'\] must be a list \(empty for several ranks\)"),
        (
            state(world_size=2, even_batches="pad", balance=True, lowered=[[1, 2]]),
            ValueError,
            r"state\['lowered'\] must be a list \(empty for several ranks\)",
        ),
        (state(resume_at=4), ValueError, r"state has an unknown entry 'resume_at' \(entries are .*\); pass a dict"),
        (
            state(
                history=[{"world_size": 2, "steps": 1, "even_batches": "pad", "balance": True, "lowered": [], "x": 0}]
            ),
            ValueError,
            r"state\['history'\] has an unknown entry 'x' \(entries are .*\); pass a dict",
        ),
        (state(lowered=[[1]]), ValueError, r"each of state\['lowered'\] must be \[position, limit\], got \[1\]"),
        (state(lowered=[[-1, 2]]), ValueError, r"state\['lowered position'\] must be a non-negative integer"),
        (state(lowered=[[2, 4], [1, 3]]), ValueError, r"state\['lowered'\] positions must not decrease"),
        (state(lowered=[[1, 8], [2, 4], [2, 3], [1, 2]]), ValueError, r"positions must not decrease, got \[\[1, 8\]"),
        (
            state(lowered=[[2, 0]]),
            ValueError,
            r"state\['lowered'\] has a bad limit 0: limit must be a positive integer, got 0",
        ),
    ],
)
def test_a_bad_state_is_refused_naming_the_value(raw, error, message):
    with pytest.raises(error, match=message):
        parse(raw)


@pytest.mark.parametrize("key", ["seed", "epoch", "history", "fingerprint", "world_size", "steps", "lowered"])
def test_a_missing_entry_is_named(key):
    raw = state()
    del raw[key]
    with pytest.raises(ValueError, match=f"state has no '{key}' entry; pass a dict made by state_dict"):
        parse(raw)


def test_several_lowerings_at_one_position_parse_in_their_order():
    # invariant: lowerings applied one after the other at one position (a batch retried, then
    # its first part retried again) are all kept, in the order applied
    assert parse(state(lowered=[[1, 8], [1, 4], [1, 4], [3, 2]]))[1] == [
        Segment(1, 3, None, None, [(1, 8), (1, 4), (1, 4), (3, 2)])
    ]


def test_lowered_at_keeps_the_earlier_entries_and_those_of_its_position_and_replaces_the_later_ones():
    assert lowered_at([], 3, 8) == [(3, 8)]
    assert lowered_at([(1, 9), (3, 8), (6, 4)], 3, 2) == [(1, 9), (3, 8), (3, 2)]
    assert lowered_at([(1, 9), (3, 8), (3, 5)], 3, 2) == [(1, 9), (3, 8), (3, 5), (3, 2)]
    assert lowered_at([(1, 9), (3, 8)], 5, 2) == [(1, 9), (3, 8), (5, 2)]


def test_check_steps_refuses_steps_past_the_end_naming_the_ranks():
    check_steps(Segment(2, 5), 5, 0)
    with pytest.raises(ValueError, match="state has steps=6, past the 5 steps of epoch 1 on 2 ranks"):
        check_steps(Segment(2, 6), 5, 1)
    with pytest.raises(ValueError, match="past the 0 steps of epoch 0 on 1 rank\\."):
        check_steps(Segment(1, 1), 0, 0)
