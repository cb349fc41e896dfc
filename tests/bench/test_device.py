"""The device suite (``fastsab bench --device``) run on the CPU: every case, its rows and the command line.

Figures measured here say nothing about a GPU; the suite's CUDA run is ``tools/gpu_check.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fastsab.bench import device as device_suite
from fastsab.bench.device import (
    PLAIN_COPY_FLOOR,
    PLAIN_DATALOADER,
    STEP_ALONE,
    bench_device,
    device_rows,
)
from fastsab.bench.fidelity import FidelityResult
from fastsab.bench.report import machine_info
from fastsab.cli import main

CPU = torch.device("cpu")


def test_device_rows_time_every_case_against_the_copy_and_the_step_alone() -> None:
    rows = device_rows("cpu", samples=1200, batch_size=40, epochs=1)
    copies = [row for row in rows if row.suite == "host-to-device"]
    steps = [row for row in rows if row.suite == "device step"]
    loaders = [PLAIN_DATALOADER, "FastLoader", "FastSizeAwareLoader"]
    assert [row.method for row in copies] == [PLAIN_COPY_FLOOR, *loaders]
    assert [row.method for row in steps] == [STEP_ALONE, *loaders]
    assert [row.workload for row in copies] == ["seed loop on cpu"] * 3 + ["size-aware on cpu"]
    for table in (copies, steps):
        floor, dataloader = table[0], table[1]
        assert floor.ratio == pytest.approx(1.0) and floor.speedup is None and dataloader.speedup == pytest.approx(1)
        for row in table:
            assert row.seconds > 0 and row.baseline == floor.method
            assert row.ratio == pytest.approx(row.seconds / floor.seconds)
            if row is not floor:
                assert row.speedup == pytest.approx(dataloader.seconds / row.seconds)
    # the fixed-size cases move the 30 batches of 40 rows of one epoch (the copy: 1); the notes give bytes per second
    assert copies[0].note.startswith("1 batch; ")
    for row in copies[1:3] + steps[:3]:
        assert row.note.startswith("30 batches")
    nbytes = 1200 * device_suite.ROW_FLOATS * 4
    for row in copies:
        gbs = float(row.note.split("; ")[1].split(" GB/s")[0])
        assert gbs == pytest.approx(nbytes / row.seconds / 1e9, rel=0.01, abs=0.01)
        assert row.note.endswith(f"{copies[0].seconds / row.seconds:.0%} of the floor's")


def test_the_copy_floor_moves_every_row_in_order_in_one_copy() -> None:
    data = torch.randn(23, 4)
    floor = device_suite._CopyFloor(data, CPU)
    first, second = list(floor), list(floor)
    assert len(first) == len(second) == 1 and torch.equal(first[0], data) and torch.equal(second[0], data)
    assert first[0].data_ptr() == second[0].data_ptr() == floor.buffer.data_ptr()  # no allocation per epoch
    assert floor.host.data_ptr() != data.data_ptr()  # a copy of its own, like the pinned one on CUDA


def test_timed_epochs_run_the_step_on_every_batch_moved() -> None:
    stepped: list[list[int]] = []
    loader = device_suite._Moved([torch.arange(3), torch.arange(3, 5)], CPU)
    timed = device_suite._Timed(loader, CPU, lambda batch: stepped.append(batch.tolist()))
    assert [batch.tolist() for batch in timed] == [[0, 1, 2], [3, 4]]
    assert stepped == [[0, 1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu", "device 'gpu' is not one the device suite runs on: pass 'cpu' or 'cuda'"),
        ("meta", "device 'meta' is not one the device suite runs on: pass 'cpu' or 'cuda'"),
        ("cpu:x", "device 'cpu:x' is not a torch device"),
    ],
)
def test_bench_device_refuses_other_devices(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bench_device(text)


def test_without_cuda_the_device_suite_fails_with_a_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device 'cuda:1' needs a CUDA device, and there is no CUDA device here"):
        bench_device("cuda:1")
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--device", "cuda"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "argument --device: device 'cuda' needs a CUDA device, and there is no CUDA device here" in err
    assert "pass --device cpu to run the same suite on the CPU." in err


def test_the_machine_line_names_the_gpu_of_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: a fake name: this checks how the line is written, not a GPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"Named GPU {device}")
    assert machine_info(torch.device("cuda", 0)).endswith(f", Named GPU cuda:0 (CUDA {torch.version.cuda})")
    assert "GPU" not in machine_info(CPU) and machine_info() == machine_info(CPU)


def test_device_cpu_runs_the_device_and_fidelity_suites_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    devices: list[object] = []
    result = FidelityResult("GNN", "summed", 40, 0, 0.95, 0.86, 0.99, 0.0, 27.0)
    monkeypatch.setattr("fastsab.bench.fidelity.fidelity_results", lambda device: devices.append(device) or [result])
    path = tmp_path / "bench.json"
    argv = ["bench", "--device", "cpu", "--samples", "1200", "--batch-size", "40", "--epochs", "1", "--quiet"]
    assert main([*argv, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert devices == [CPU]
    assert "host-to-device  (ratio = time / copy_ of the same bytes" in out and "device step  (ratio" in out
    assert "over budget  0  mean use 0.95" in out
    assert "loaders  (ratio" not in out  # --device alone runs the device and fidelity suites only
    payload = json.loads(path.read_text())
    assert {row["suite"] for row in payload["rows"]} == {"host-to-device", "device step"}
    assert payload["fidelity"] == [
        {
            "kind": "GNN",
            "batching": "summed",
            "batches": 40,
            "over_budget": 0,
            "mean_use": 0.95,
            "min_use": 0.86,
            "max_use": 0.99,
            "margin": 0.0,
            "seconds": 27.0,
            "sort_window": None,
        }
    ]
    assert main([*argv, "--suite", "fidelity", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| GNN | summed | - | 40 | 0 | 0.95 |" in out and "**host-to-device**" in out and "**device step**" in out
