"""The mixing suite at a small size: its tables' structure, the share error as defined, fastsab's within one item.

Times are not asserted; the peers' rows are checked where the peers import, and their absence
where they do not.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastsab.bench import mixing
from fastsab.bench.mixing import MixingRow, mix_lengths, mixing_markdown, mixing_results, share_error
from fastsab.bench.mixing_peers import PEER_NAMES, peer_mixers
from fastsab.cli import main

SAMPLES = 3_000


@pytest.fixture(scope="module")
def rows() -> list[MixingRow]:
    return mixing_results(SAMPLES, repeat=1)


def test_every_table_has_its_rows(rows):
    tables = [row.table for row in rows]
    assert list(dict.fromkeys(tables)) == ["share error", "planning", "padding", "resume"]
    share = [row.method for row in rows if row.table == "share error"]
    assert share[0] == "fastsab Mixture"
    # each peer: two rows (weights as given, weights by mean length), or one saying why it is not measured
    for name in PEER_NAMES:
        measured = [row for row in rows if row.table == "share error" and row.method == name]
        assert len(measured) in (1, 2)
        if len(measured) == 1:
            assert measured[0].figure is None and measured[0].note.startswith("not measured: ")
    planning = [row.method for row in rows if row.table == "planning"]
    compiled = [f"fastsab unmixed epoch {mixing.COMPILED}", f"fastsab Mixture epoch {mixing.COMPILED}"]
    numba = importlib.util.find_spec("numba") is not None
    assert planning == ["fastsab unmixed epoch", "fastsab Mixture epoch", *(compiled if numba else []), *PEER_NAMES]
    padding = [row.method for row in rows if row.table == "padding"]
    for label in ("sort_window=1,024", "buckets=8"):
        expected = [f"{name} alone, {label}" for name in mixing.MIX_MEANS]
        expected += [f"sources alone, pooled, {label}", f"fastsab Mixture, {label}"]
        assert [method for method in padding if method.endswith(label)] == expected
    (resume,) = [row for row in rows if row.table == "resume"]
    assert f"{100 * SAMPLES:,} items in 3 sources" in resume.workload and "rank 7 of 8" in resume.workload


def test_fastsabs_share_error_is_within_one_item(rows):
    row = next(row for row in rows if row.table == "share error")
    assert row.figure is not None and 0 < row.figure <= 1
    assert row.goal == "<= 1 (met)" and row.met


def test_goals_are_what_the_figures_say(rows):
    for row in rows:
        if row.met is not None:
            assert row.goal.endswith("(met)" if row.met else "(missed)")
    for mixed in [row for row in rows if row.method.startswith("fastsab Mixture epoch")]:
        assert mixed.met == (mixed.figure is not None and mixed.figure <= 1.3)
    for label in ("sort_window=1,024", "buckets=8"):
        pooled = next(row for row in rows if row.method == f"sources alone, pooled, {label}")
        ours = next(row for row in rows if row.method == f"fastsab Mixture, {label}")
        assert pooled.figure is not None and ours.figure is not None
        assert ours.met == (ours.figure >= pooled.figure - 0.01)
        assert 0 < ours.figure <= 1 and 0 < pooled.figure <= 1


def test_a_peer_that_mixes_by_samples_misses_the_token_shares(rows):
    pytest.importorskip("datasets")
    given_weights = next(row for row in rows if row.method == PEER_NAMES[0])
    # samples drawn 0.5/0.3/0.2 from sources whose lengths differ tenfold: tokens far from 0.5/0.3/0.2
    assert given_weights.figure is not None and given_weights.figure > 10


def test_share_error_is_the_largest_deviation_over_prefixes():
    # two sources, weights 3:1; costs 4, 4, 2: after item 1 (source 0): 4 - 0.75 * 4 = 1; after item 2
    # (source 1): 4 - 0.75 * 8 = -2; after item 3 (source 0): 6 - 0.75 * 10 = -1.5; largest 2, over 4
    assert share_error(np.array([0, 1, 0]), np.array([4.0, 4.0, 2.0]), [3, 1], 4.0) == 0.5


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 50)), min_size=1, max_size=40))
def test_share_error_against_a_plain_loop(items):
    sources = np.array([s for s, _ in items])
    costs = np.array([float(c) for _, c in items])
    weights = [0.5, 0.3, 0.2]
    worst, own, total = 0.0, [0.0, 0.0, 0.0], 0.0
    for s, c in items:
        own[s] += c
        total += c
        worst = max(worst, *(abs(own[r] - weights[r] * total) for r in range(3)))
    assert share_error(sources, costs, weights, 50.0) == pytest.approx(worst / 50.0)


def test_the_sources_tokens_stand_as_the_weights():
    lengths = mix_lengths(50_000)
    tokens = np.array([part.sum() for part in lengths.values()], dtype=np.float64)
    assert sum(map(len, lengths.values())) == 50_000
    assert np.allclose(tokens / tokens.sum(), [0.5, 0.3, 0.2], atol=0.02)
    means = [part.mean() for part in lengths.values()]
    assert means == sorted(means) and means[-1] > 10 * means[0]


def test_absent_peers_say_why(monkeypatch):
    # the peers are absent: importing them fails
    for name in ("datasets", "torchdata", "torchdata.nodes", "lhotse", "streaming"):
        monkeypatch.setitem(sys.modules, name, None)
    mixers = peer_mixers([5, 3])
    assert list(mixers) == list(PEER_NAMES)
    assert all(
        isinstance(m, str) and m.startswith("not measured: ModuleNotFoundError: import of ") for m in mixers.values()
    )


@pytest.mark.parametrize("name", PEER_NAMES[:3])
def test_each_peer_yields_its_sources_until_the_first_is_exhausted(name):
    mixer = peer_mixers([40, 30, 20])[name]
    if isinstance(mixer, str):
        pytest.skip(mixer)
    sources = mixer([0.5, 0.3, 0.2])()
    counts = np.bincount(sources, minlength=3)
    assert set(sources.tolist()) <= {0, 1, 2} and (counts <= [40, 30, 20]).all()
    assert (counts == [40, 30, 20]).any()


def test_markdown_has_one_table_a_kind_and_a_dash_where_not_measured():
    text = mixing_markdown(
        [
            MixingRow("share error", "w", "fastsab Mixture", 0.5, "<= 1 (met)", True),
            MixingRow("share error", "w", "peer", None, note="not measured: no"),
            MixingRow("padding", "w", "fastsab Mixture", 0.91),
        ]
    )
    assert text.splitlines()[0] == "**share error**" and "**padding**" in text and "**planning**" not in text
    assert "| w | peer | - |  | not measured: no |" in text and "| w | fastsab Mixture | 0.91 |  |  |" in text


def test_the_cli_runs_the_mixing_suite(capsys):
    assert main(["bench", "--suite", "mixing", "--samples", "2000", "--markdown", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Measured on ")
    assert all(f"**{table}**" in printed for table in ("share error", "planning", "padding", "resume"))
