"""The peers suite and the kernels suite's fairseq row: rows for the peers that import, skipped for the others.

fairseq's kernel is the one ``benchmarks/fairseq_kernel.py`` builds from fairseq's source (or
fairseq itself where it is installed); lhotse is the installed package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from fastsab import split_batches
from fastsab.bench.peers import peer_rows
from fastsab.bench.workloads import fairseq_batches, fairseq_kernel, kernel_rows, lognormal_lengths
from fastsab.cli import main
from fastsab.plan.compiled import compiled_walk

BUILD = Path(__file__).resolve().parents[2] / "benchmarks" / "_build"


@pytest.fixture
def fairseq(monkeypatch):
    """fairseq's ``batch_by_size_vec``, from fairseq or the bench's build of it; the test is skipped without it."""
    monkeypatch.syspath_prepend(str(BUILD))
    before = set(sys.modules)
    kernel = fairseq_kernel()
    if kernel is None:
        pytest.skip("fairseq's kernel is not built (python benchmarks/fairseq_kernel.py) nor installed")
    yield kernel
    # NOTE: the bench's build leaves with its folder: the other tests run without fairseq's kernel
    for name in set(sys.modules) - before:
        if name.startswith("fairseq"):
            del sys.modules[name]


def test_fairseqs_kernel_gives_the_padded_split(fairseq):
    lengths = lognormal_lengths(20_000, seed=3)
    budget = 300 * int(lengths.mean())
    theirs = fairseq_batches(fairseq, lengths, budget)
    ours = split_batches(lengths, budget, cost="padded")
    assert [b.tolist() for b in theirs] == [b.tolist() for b in ours.batches()]


def test_the_kernels_suite_has_a_fairseq_row_that_checks_the_batches(fairseq):
    rows = kernel_rows([3000], repeat=1)
    row = next(row for row in rows if row.method == "fairseq batch_by_size_vec int padded")
    padded = next(row for row in rows if row.method == "split_batches int padded")
    assert row.note == f"{padded.note}, identical to split_batches padded" and row.seconds > 0
    assert not [row for row in rows if row.method.startswith("fairseq") and "float" in row.method]


def test_the_kernels_suite_has_a_row_of_the_compiled_walk():
    pytest.importorskip("numba")
    rows = kernel_rows([3000], repeat=1)
    row = next(row for row in rows if row.method == "split_batches int padded, compiled")
    padded = next(row for row in rows if row.method == "split_batches int padded")
    assert row.note == padded.note and row.seconds > 0
    # invariant: the numpy walk is back after the suite
    assert compiled_walk() is None


def test_the_peers_suite_without_its_peers_has_fastsabs_row_alone(monkeypatch):
    # the peers are absent: importing them fails
    for name in ("fairseq.data.data_utils_fast", "fairseq_data_utils_fast", "lhotse", "numba"):
        monkeypatch.setitem(sys.modules, name, None)
    rows = peer_rows(500, repeat=1)
    lengths = lognormal_lengths(500)
    expected = split_batches(lengths, 300 * int(lengths.mean()), cost="padded")
    assert [row.method for row in rows] == ["fastsab split_batches padded"]
    assert rows[0].ratio == 1.0 and rows[0].note == f"{expected.num_batches:,} batches"


def test_the_peers_suite_compares_the_batches_of_each_peer(fairseq):
    pytest.importorskip("lhotse")
    rows = {row.method: row for row in peer_rows(2000, repeat=1)}
    compiled = ["fastsab split_batches padded, compiled"] if importlib.util.find_spec("numba") else []
    assert list(rows) == [
        "fastsab split_batches padded",
        *compiled,
        "fairseq batch_by_size_vec",
        "lhotse SimpleCutSampler",
        "lhotse DynamicBucketingSampler",
    ]
    # fairseq's kernel and lhotse's SimpleCutSampler follow the padded greedy rule: the same batches
    assert rows["fairseq batch_by_size_vec"].note == "identical batches"
    assert all(rows[name].note == "identical batches" for name in compiled)
    assert rows["lhotse SimpleCutSampler"].note == "identical batches"
    # lhotse's bucketing sampler groups cuts of similar durations: other batches, said so
    assert rows["lhotse DynamicBucketingSampler"].note == "other batches (another rule)"
    assert all(row.baseline == "fastsab split_batches padded" and row.seconds > 0 for row in rows.values())


def test_the_cli_runs_the_peers_suite(capsys):
    assert main(["bench", "--suite", "peers", "--samples", "800", "--markdown", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "**peers**" in printed and "| n=800, budget" in printed and "fastsab split_batches padded" in printed


@pytest.mark.parametrize("multiple", [1, 2, 3, 8])
@pytest.mark.parametrize("max_sentences", [None, 40])
def test_round_down_is_fairseqs_kernel_and_last_batch_rule(fairseq, multiple, max_sentences):
    # fairseq's batch_by_size (fairseq/data/data_utils.py, main branch and fairseq-fixed 0.12.3.1):
    # the kernel's batches, the last one left out when its length is not a multiple
    rng = np.random.default_rng(multiple)
    lengths = rng.integers(1, 300, 4000)
    order = rng.permutation(len(lengths))
    theirs = fairseq(order, lengths[order], 6000, -1 if max_sentences is None else max_sentences, multiple)
    if multiple > 1 and len(theirs[-1]) % multiple != 0:
        theirs = theirs[:-1]
    ours = split_batches(
        lengths[order],
        6000,
        cost="padded",
        max_batch_size=max_sentences,
        batch_size_multiple=multiple,
        last_batch="round_down",
        ids=order,
    )
    assert [b.tolist() for b in ours.batches()] == [b.tolist() for b in theirs]
    # what fastsab counts as dropped is what fairseq leaves out
    assert sorted(ours.dropped.tolist()) == sorted(set(order.tolist()) - {i for b in theirs for i in b.tolist()})
