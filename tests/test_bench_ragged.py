"""The ragged-dataset measurement of the bench package: its rows on a small workload (not its timings)."""

from __future__ import annotations

import importlib.util

from fastsab.bench.ragged import FLOOR, HF, ragged_rows


def test_ragged_rows_measure_every_case_on_the_same_batches():
    rows = ragged_rows(samples=400, budget=3000, epochs=1)
    methods = [row.method for row in rows]
    with_datasets = importlib.util.find_spec("datasets") is not None
    assert methods[6:] == ([f"{HF}PadCollator", f"{HF}PackCollator"] if with_datasets else [])
    assert methods[:6] == [
        FLOOR,
        "RaggedDataset, padded",
        "RaggedDataset, packed",
        "list of tensors, DataLoader + PadCollator",
        "list of tensors, DataLoader + PackCollator",
        "list of tensors + __getitems__, FastSizeAwareLoader + PadCollator",
    ]
    assert all(row.seconds > 0 and row.suite == "ragged" and row.baseline == FLOOR for row in rows)
    assert len({row.note.split(";")[0] for row in rows[1:]}) == 1  # the same plan for every size-aware case
    assert rows[0].ratio == 1.0
    assert [row.speedup is not None for row in rows[:6]] == [False, True, True, False, False, False]
    assert all(("faster than the Hugging Face Dataset" in row.note) == with_datasets for row in rows[1:3])
