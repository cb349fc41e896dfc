from __future__ import annotations

import pytest
import torch

from fastsab import bench
from fastsab.bench.end_to_end import TokenModel
from fastsab.cli import main

PER_ITEM = "DataLoader, __getitem__ per item"
SIZE_AWARE = "SizeAwareBatchSampler(callable) + DataLoader"


def test_end_to_end_rows_time_every_loader_with_the_model():
    threads = torch.get_num_threads()
    rows = bench.end_to_end_rows(samples=1200, batch_size=40, epochs=1)
    assert torch.get_num_threads() == threads  # the suite's one thread is given back
    by_method = {row.method: row for row in rows}
    assert list(by_method) == [
        "model step alone (batches made beforehand)",
        PER_ITEM,
        "DataLoader + __getitems__",
        "FastLoader",
        SIZE_AWARE,
        "FastSizeAwareLoader",
    ]
    assert {row.suite for row in rows} == {"end-to-end"}
    assert by_method[PER_ITEM].speedup == pytest.approx(1.0)
    assert by_method[SIZE_AWARE].speedup == pytest.approx(1.0)
    assert rows[0].ratio == pytest.approx(1.0)
    for row in rows:
        assert row.seconds > 0 and row.speedup is not None and row.speedup > 0
        baseline = by_method[SIZE_AWARE if "Size" in row.method else PER_ITEM]
        assert row.speedup == pytest.approx(baseline.seconds / row.seconds)
    # every fixed-size loader runs the 30 steps of one epoch; each loader row gives its share of the epoch
    for method in (PER_ITEM, "DataLoader + __getitems__", "FastLoader"):
        assert by_method[method].note.endswith(" 30 steps")
    for row in rows[1:]:
        share = int(row.note.split("loader ")[1].split("%")[0])
        assert 0 <= share <= 100


def test_token_model_trains_on_a_batch_of_samples():
    torch.manual_seed(0)
    model = TokenModel(vocab=16, dim=4, hidden=8, classes=3)
    logits = model(torch.arange(100, 110))
    assert logits.shape == (10, 3)
    assert torch.equal(logits, model(torch.arange(100, 110) - 16 * 6))  # tokens wrap around the vocabulary


def test_end_to_end_suite_runs_from_the_command_line(capsys):
    argv = ["bench", "--suite", "end-to-end", "--samples", "1200", "--batch-size", "40", "--epochs", "1", "--quiet"]
    assert main([*argv, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "**end-to-end**" in out
    assert "| seed loop | FastLoader |" in out
    assert "| size-aware | FastSizeAwareLoader |" in out
