"""The fidelity suite, small: measure -> fit -> batch -> measure on real CPU models keeps every batch in budget."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from fastsab.bench import fidelity
from fastsab.bench.fidelity import FidelityResult, Kind, fidelity_markdown, kinds, run_kind
from fastsab.cli import main


def small_kind(index: int, device: torch.device | str = "cpu") -> Kind:
    """Kind ``index`` of the suite on ``device``, with small items (a few seconds a run)."""
    kind = kinds(device=device)[index]
    small = {
        0: lambda n, rng: rng.integers(8, 49, size=(n, 2)),  # images
        1: lambda n, rng: np.stack([(v := rng.integers(5, 120, size=n)), v * rng.integers(2, 9, size=n)], axis=1),
        2: lambda n, rng: rng.integers(4, 65, size=(n, 1)),  # sequences, padded
        3: lambda n, rng: rng.integers(4, 65, size=(n, 1)),  # sequences, packed
    }[index]
    return dataclasses.replace(kind, features=small)


@pytest.mark.parametrize(("index", "window"), [(0, None), (1, None), (2, None), (3, None), (0, 32)])
def test_every_planned_batch_stays_within_the_budget(index: int, window: int | None) -> None:
    result, model = run_kind(small_kind(index), items=120, calibration=14, batches=8, sort_window=window)
    assert result.batches == 8 and result.over_budget == 0 and result.sort_window == window
    assert 0.5 < result.mean_use <= result.max_use <= 1.0
    assert model.report is not None and model.report.num_batches == 3


def test_sorted_windows_order_images_by_height_then_width() -> None:
    seen: list[np.ndarray] = []
    images = small_kind(0)
    recording = dataclasses.replace(images, step=lambda rows: (seen.append(rows), images.step(rows))[1])
    run_kind(recording, items=120, calibration=14, batches=8, sort_window=120)
    planned = seen[-8:]  # the planned batches are measured last
    # one window of the whole set, sorted (ascending) by H, then W
    assert all([tuple(row) for row in rows.tolist()] == sorted(map(tuple, rows.tolist())) for rows in planned)
    assert sum(int(np.ptp(rows[:, 0])) for rows in planned) < sum(int(np.ptp(rows[:, 1])) for rows in planned)


def test_calibration_batches_hold_the_kinds_numbers_of_items() -> None:
    features = np.arange(1, 101)[:, None]
    batches, alone = fidelity._calibration_batches(features, 20, np.random.default_rng(0), (8, 16))
    assert {len(batch) for batch in batches} <= set(range(8, 17)) and len({len(batch) for batch in batches}) > 1
    assert [int(batch[0, 0]) for batch in batches[:2]] == [99, 100]
    assert [batch.tolist() for batch in alone] == [[[99]], [[100]]]


@pytest.mark.parametrize("items", [(0, 4), (5, 4), (2.0, 8), [2, 8], (True, 3)])
def test_calibration_items_out_of_range_are_refused(items: object) -> None:
    kind = dataclasses.replace(small_kind(3), calibration_items=items)
    with pytest.raises(ValueError, match=r"calibration_items must be \(fewest, most\) integers .*, got "):
        run_kind(kind, items=20, calibration=4, batches=1)


def test_packed_kind_is_measured_on_batches_of_several_sequences() -> None:
    packed = kinds()[3]
    assert packed.cost == "sum" and packed.calibration_items == (8, 16)


def test_windowed_kinds_run_with_and_without_their_window(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(kind: Kind, *, sort_window: int | None = None, **options: Any) -> tuple[FidelityResult, None]:
        return FidelityResult(kind.name, kind.batching, 1, 0, 0.9, 0.9, 0.9, 0.0, 0.0, sort_window), None

    monkeypatch.setattr(fidelity, "run_kind", fake)
    rows = [(r.kind.split(",")[0], r.batching.split(" ")[0], r.sort_window) for r in fidelity.fidelity_results()]
    assert rows == [
        ("CNN", "padded", None),
        ("CNN", "padded", 200),
        ("GNN", "summed", None),
        ("transformer encoder", "padded", None),
        ("transformer encoder", "padded", 200),
        ("transformer encoder", "joined", None),
        ("transformer encoder", "joined", 200),
    ]


def test_markdown_table() -> None:
    rows = [
        FidelityResult("CNN", "padded", 30, 0, 0.93, 0.61, 0.99, 0.001, 20.0),
        FidelityResult("CNN", "padded", 30, 0, 0.95, 0.71, 0.99, 0.001, 21.0, 200),
    ]
    table = fidelity_markdown(rows)
    assert "| CNN | padded | - | 30 | 0 | 0.93 | 0.61 | 0.99 | 0.1% | 20 |" in table
    assert "| CNN | padded | 200 | 30 | 0 | 0.95 | 0.71 | 0.99 | 0.1% | 21 |" in table


def test_cli_runs_the_fidelity_suite(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    row = FidelityResult("GNN", "summed", 40, 0, 0.95, 0.86, 0.99, 0.0, 27.0, 200)
    devices: list[object] = []
    monkeypatch.setattr("fastsab.bench.fidelity.fidelity_results", lambda device: devices.append(device) or [row])
    assert main(["bench", "--suite", "fidelity", "--markdown"]) == 0
    assert "| GNN | summed | 200 | 40 | 0 | 0.95 | 0.86 | 0.99 | 0.0% | 27 |" in capsys.readouterr().out
    assert main(["bench", "--suite", "fidelity"]) == 0
    assert "window  200  batches  40  over budget  0  mean use 0.95" in capsys.readouterr().out
    assert devices == ["cpu", "cpu"]  # without --device, the models run on the CPU


def test_kinds_run_their_steps_on_the_device_they_are_made_for() -> None:
    for kind in kinds(device="cpu"):
        assert kind.device == torch.device("cpu")
    result, _ = run_kind(small_kind(1, "cpu"), items=60, calibration=6, batches=3)
    assert result.batches == 3 and result.over_budget == 0
