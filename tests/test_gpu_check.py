"""tools/gpu_check.py: where there is no GPU it says so and exits 0; its summary of a run, from real rows.

The summary is made here from the device suite's rows measured on the CPU and a JUnit report
written out: what is checked is how the check counts and judges, not a GPU's figures.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastsab.bench.device import device_rows
from fastsab.bench.fidelity import FidelityResult
from fastsab.cli import build_parser
from tools.gpu_check import MEAN_USE_TARGET, ROOT, junit_counts, render, summarize

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
skipped="1" tests="5"><testcase classname="tests.gpu.test_oom" name="test_a"/><testcase
classname="tests.gpu.test_oom" name="test_b"><failure message="assert 1 == 2">x</failure></testcase><testcase
classname="tests.gpu.test_measure" name="test_c"><error message="fixture">y</error></testcase><testcase
classname="tests.gpu.test_measure" name="test_d"><skipped message="no">z</skipped></testcase><testcase
classname="tests.gpu.test_measure" name="test_e"/></testsuite></testsuites>"""
GPU = {"cuda": True, "gpu": "a GPU", "gpu_memory_gib": 80.0, "torch": "2.13", "cuda_version": "12.8"}


def test_without_a_gpu_the_check_says_so_runs_nothing_and_exits_0(tmp_path: Path) -> None:
    # NOTE: no GPU visible, even on a machine with one: the check's own answer to that is tested
    env = {**os.environ, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no CUDA device: torch.cuda.is_available() is False")
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["cuda"] is False and written["message"].startswith("no CUDA device")


def test_junit_counts_tell_passed_failed_and_skipped_tests_apart() -> None:
    assert junit_counts(JUNIT) == {
        "passed": 2,
        "failed": 2,
        "skipped": 1,
        "failures": ["tests.gpu.test_oom::test_b", "tests.gpu.test_measure::test_c"],
    }


def _fidelity(over: int, mean: float) -> dict[str, object]:
    return vars(FidelityResult("GNN", "summed", 40, over, mean, 0.8, 1.0, 0.0, 3.0))


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return [row.as_dict() for row in device_rows("cpu", samples=1200, batch_size=40, epochs=1)]


def test_the_summary_gives_each_loaders_ratios_and_judges_the_run(rows: list[dict[str, object]]) -> None:
    tests = {"passed": 28, "failed": 0, "skipped": 0, "failures": [], "exit_code": 0, "seconds": 40.0}
    bench = {"ok": True, "seconds": 60.0, "machine": "m", "rows": rows, "fidelity": [_fidelity(0, 0.95)]}
    summary = summarize(GPU, tests, bench)
    assert summary["ok"] and summary["gpu"] == "a GPU" and summary["rows"] == rows
    copies = [row for row in rows if row["suite"] == "host-to-device"][1:]
    assert [row["method"] for row in summary["host_to_device"]] == [row["method"] for row in copies]
    for ratios, row in zip(summary["host_to_device"], copies):
        assert ratios["time_over_pinned_copy"] == pytest.approx(row["ratio"], abs=1e-3)
        assert ratios["share_of_copy_throughput"] == pytest.approx(1 / row["ratio"], abs=1e-3)
    assert [row["method"] for row in summary["device_step"]] == [
        "DataLoader + .to(device) (no pinning on the CPU)",
        "FastLoader",
        "FastSizeAwareLoader",
    ]
    assert summary["fidelity"] == [
        {"kind": "GNN", "sort_window": None, "batches": 40, "over_budget": 0, "mean_use": 0.95, "meets_target": True}
    ]
    text = render(summary)
    assert text.startswith("GPU check: OK\na GPU (80.0 GiB), torch 2.13, CUDA 12.8\ntests/gpu: 28 passed, 0 failed")
    assert "host-to-device  FastLoader" in text and "of its throughput)" in text
    assert "fidelity  GNN: 0 of 40 batches over budget, mean use 0.95 (meets the target)" in text


def test_failed_tests_a_failed_bench_or_a_batch_over_budget_fail_the_check(rows: list[dict[str, object]]) -> None:
    passed = {"passed": 3, "failed": 0, "skipped": 0, "failures": [], "exit_code": 0, "seconds": 1.0}
    failed = {**junit_counts(JUNIT), "exit_code": 1, "seconds": 1.0}
    bench = {"ok": True, "rows": rows, "fidelity": [_fidelity(0, MEAN_USE_TARGET - 0.01)]}
    low = summarize(GPU, passed, bench)
    assert low["ok"] and low["fidelity"][0]["meets_target"] is False  # a low use is reported, not failed
    assert "(MISSES the target)" in render(low)
    over = summarize(GPU, passed, {**bench, "fidelity": [_fidelity(1, 0.99)]})
    assert not over["ok"]
    broken = summarize(GPU, failed, bench)
    assert not broken["ok"] and "  failed: tests.gpu.test_oom::test_b" in render(broken)
    crashed = summarize(GPU, passed, {"ok": False, "error": "exit code 1", "output_tail": "Traceback"})
    assert not crashed["ok"] and "fastsab bench --device cuda: exit code 1" in render(crashed)
    assert crashed["host_to_device"] == [] and crashed["fidelity"] == []


def test_the_docs_page_gives_the_commands_of_the_check_and_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    page = (ROOT / "docs" / "gpu.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    commands = [shlex.split(line.split("#")[0]) for block in blocks for line in block.splitlines()]
    assert [words for words in commands if "tools/gpu_check.py" in words] == [
        ["python", "tools/gpu_check.py"],
        ["OUT=results", "python", "tools/gpu_check.py"],
    ]
    # NOTE: a CUDA device is faked for parsing alone: the page's --device cuda is a valid command line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parsed = [build_parser().parse_args(words[1:]) for words in commands if words[0] == "fastsab"]
    assert [(args.device, args.samples, args.epochs) for args in parsed] == [
        (torch.device("cuda"), 200_000, 3),
        (torch.device("cpu"), 20_000, 1),
    ]


def test_the_shapes_suite_is_reported_not_judged(rows: list[dict[str, object]]) -> None:
    from tools.gpu_check import run_shapes

    tests = {"passed": 28, "failed": 0, "skipped": 0, "failures": [], "exit_code": 0, "seconds": 40.0}
    summary = summarize(GPU, tests, {"ok": True, "seconds": 60.0, "machine": "m", "rows": rows, "fidelity": []})
    if not torch.cuda.is_available():
        # without a GPU the suite's command refuses --device cuda: the check says so and stays OK
        shapes = run_shapes()
        assert shapes["ok"] is False and shapes["error"] == "exit code 2"
        summary["shapes"] = shapes
        assert summary["ok"] and "fastsab bench --suite shapes --device cuda:\n  exit code 2 after" in render(summary)
    summary["shapes"] = {"ok": True, "seconds": 90.0, "table": "| workload | method |"}
    assert render(summary).endswith("fastsab bench --suite shapes --device cuda:\n| workload | method |")
