"""The shape buckets recipe (docs/recipes/bucket-batch-sizes.md): its code runs, and does what the page says."""

from __future__ import annotations

import ast
import os

import pytest
import torch

from fastsab.plan.shape_buckets import ShapeBuckets
from tests.docs_pages import page_script
from tests.test_docs_site import run_script

# NOTE: the page searches a small model's batch sizes under a real memory limit: tens of seconds on a
# loaded machine, and a process of its own, since the limit holds for the whole process
pytestmark = pytest.mark.slow

PAGE = "recipes/bucket-batch-sizes.md"


def test_the_page_measures_saves_and_loads_a_table(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the page's process: one thread on the shared cores
    # the process runs out of memory for real, many times, and survives
    lengths, sizes, source, shapes = run_script(page_script(PAGE), tmp_path)
    table = ShapeBuckets.load(tmp_path / "buckets.json")
    assert table.lengths == ast.literal_eval(lengths) and table.lengths[-1] == 512
    assert dict(zip(table.lengths, table.batch_sizes or ())) == ast.literal_eval(sizes)
    assert (
        table.source
        == source
        == (f"measured by max_batch_sizes on cpu ({os.uname().machine}), torch {torch.__version__}, gap 0.05")
    )
    batch_sizes = table.batch_sizes or ()
    # every size a multiple of 8, the shortest buckets the most rows, and (as the page says) rows
    # times length about the same: the step's memory grows with a batch's tokens
    assert all(size % 8 == 0 for size in batch_sizes) and list(batch_sizes) == sorted(batch_sizes, reverse=True)
    tokens = [size * length for size, length in zip(batch_sizes, table.lengths)]
    assert max(tokens) <= 1.5 * min(tokens)
    # invariant: the loader given the table makes one shape per bucket, its batch size by its length
    assert shapes == "True"
    # the search stopped at the memory's limit, not at max_batch_size: far below it
    assert batch_sizes[0] < 2**16 // 4
