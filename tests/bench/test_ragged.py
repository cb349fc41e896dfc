"""The ragged-dataset measurement of the bench package: its rows on a small workload (not its timings)."""

from __future__ import annotations

import importlib.util

from fastsab.bench.ragged import FLOOR, HF, ragged_rows


def test_ragged_rows_measure_every_case_on_the_same_batches():
    rows = ragged_rows(samples=400, budget=3000, epochs=1, window=128)
    methods = [row.method for row in rows]
    with_datasets = importlib.util.find_spec("datasets") is not None
    assert methods[8:] == ([f"{HF}PadCollator", f"{HF}PackCollator"] if with_datasets else [])
    assert methods[:8] == [
        FLOOR,
        "RaggedDataset, padded",
        "RaggedDataset, padded, sort_window=128",
        "RaggedDataset, packed",
        "list of tensors, DataLoader + PadCollator",
        "list of tensors, DataLoader + PadCollator, sort_window=128",
        "list of tensors, DataLoader + PackCollator",
        "list of tensors + __getitems__, FastSizeAwareLoader + PadCollator",
    ]
    assert all(row.seconds > 0 and row.suite == "ragged" and row.baseline == FLOOR for row in rows)
    batches = {row.method: row.note.split(";")[0] for row in rows}
    sorted_rows = [name for name in batches if "sort_window" in name]
    assert len({batches[name] for name in batches if name not in sorted_rows and name != FLOOR}) == 1
    assert batches[sorted_rows[0]] == batches[sorted_rows[1]]  # the same sorted plan for both
    assert rows[0].ratio == 1.0
    assert [row.speedup is not None for row in rows[:8]] == [False, True, True, True, False, False, False, False]
    by_name = {row.method: row for row in rows}
    for ragged, listed in [(1, 4), (2, 5), (3, 6)]:
        row, baseline = rows[ragged], rows[listed]
        assert row.speedup == baseline.seconds / row.seconds
        assert (
            f"; the floor is {baseline.seconds / by_name[FLOOR].seconds:.1f}x faster than that DataLoader" in row.note
        )
    hf_notes = ["faster than the Hugging Face Dataset" in rows[i].note for i in (1, 2, 3)]
    assert hf_notes == [with_datasets, False, with_datasets]
