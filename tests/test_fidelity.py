"""The fidelity suite, small: measure -> fit -> batch -> measure on real CPU models keeps every batch in budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fastsab.bench.fidelity import FidelityResult, fidelity_markdown, kinds, run_kind
from fastsab.cli import main


def _small(index: int) -> object:
    kind = kinds()[index]
    small = {
        0: lambda n, rng: rng.integers(8, 49, size=(n, 2)),  # images
        1: lambda n, rng: np.stack([(v := rng.integers(5, 120, size=n)), v * rng.integers(2, 9, size=n)], axis=1),
        2: lambda n, rng: rng.integers(4, 65, size=(n, 1)),  # sequences
    }[index]
    return dataclasses.replace(kind, features=small)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_planned_batch_stays_within_the_budget(index: int) -> None:
    result, model = run_kind(_small(index), items=120, calibration=14, batches=8)  # type: ignore[arg-type]
    assert result.batches == 8 and result.over_budget == 0
    assert 0.5 < result.mean_use <= result.max_use <= 1.0
    assert model.report is not None and model.report.num_batches == 3


def test_markdown_table() -> None:
    row = FidelityResult("CNN", "padded", 30, 0, 0.93, 0.61, 0.99, 0.001, 20.0)
    table = fidelity_markdown([row])
    assert "| CNN | padded | 30 | 0 | 0.93 | 0.61 | 0.99 | 0.1% | 20 |" in table


def test_cli_runs_the_fidelity_suite(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    row = FidelityResult("GNN", "summed", 40, 0, 0.95, 0.86, 0.99, 0.0, 27.0)
    monkeypatch.setattr("fastsab.bench.fidelity.fidelity_results", lambda: [row])
    assert main(["bench", "--suite", "fidelity", "--markdown"]) == 0
    assert "| GNN | summed | 40 | 0 | 0.95 | 0.86 | 0.99 | 0.0% | 27 |" in capsys.readouterr().out
    assert main(["bench", "--suite", "fidelity"]) == 0
    assert "batches  40  over budget  0  mean use 0.95" in capsys.readouterr().out
