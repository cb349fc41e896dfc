from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fastsab import bench
from fastsab.cli import SUITES, main


@pytest.mark.slow
def test_bench_small_run_writes_json_plot_and_table(tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert (
        main(
            [
                "bench",
                "--samples",
                "3000",
                "--batch-size",
                "30",
                "--epochs",
                "1",
                "--quiet",
                "--json",
                str(out_json),
                "--plot",
                str(out_png),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "FastLoader" in printed and "FastSizeAwareLoader" in printed and "speed-up" in printed
    payload = json.loads(out_json.read_text())
    methods = [row["method"] for row in payload["rows"]]
    assert methods[0].startswith("numpy permutation+reshape") and "FastLoader" in methods
    assert all(row["seconds"] > 0 and row["ratio"] > 0 for row in payload["rows"])
    assert payload["rows"][0]["ratio"] == 1.0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_bench_markdown_output(capsys):
    assert main(["bench", "--samples", "2000", "--batch-size", "20", "--epochs", "1", "--quiet", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Measured on ")
    assert "| workload | method | ms | x baseline | speed-up | note |" in printed


def test_module_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "fastsab", "bench", "--help"], capture_output=True, text=True, check=True
    )
    assert "--samples" in result.stdout and "--plot" in result.stdout


@pytest.mark.parametrize(
    "args", [["bench", "--samples", "0"], ["bench", "--epochs", "x"], ["bench", "--suite", "nope"], []]
)
def test_bad_arguments_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert "usage: fastsab" in capsys.readouterr().err


@pytest.mark.slow
def test_loader_rows_report_speedups():
    rows = bench.loader_rows(samples=2000, batch_size=20, epochs=1)
    by_method = {row.method: row for row in rows}
    assert by_method["DataLoader, __getitem__ per item"].speedup == pytest.approx(1.0)
    assert all(row.speedup is not None and row.speedup > 0 for row in rows)
    assert by_method["FastLoader"].note == "100 batches"


@pytest.mark.slow
def test_adaptive_rows_measure_the_default_cache_from_a_deep_stack_too():
    rows = bench.adaptive_rows(calls=5, repeat=1)
    names = [row.method for row in rows if row.workload == "no-op"]
    assert names == [
        "direct call",
        "batch, StackMemoryCache (default)",
        "batch, StackMemoryCache (default), 16 frames deep",
        "batch, GlobalCache",
        "batch, NoCache",
    ]
    assert [row.method for row in rows if row.workload == "~2 ms op"] == names
    assert all(row.seconds > 0 and row.note.endswith(" us per call") for row in rows)


def test_the_bench_module_keeps_its_names():
    from fastsab.bench import end_to_end, loaders, report, varlen, workloads

    assert bench.__all__ == [
        "Row",
        "adaptive_rows",
        "end_to_end_rows",
        "first_batch_rows",
        "kernel_rows",
        "loader_rows",
        "lognormal_lengths",
        "machine_info",
        "permutation_rows",
        "plot_varlen",
        "time_best",
        "to_markdown",
        "varlen_rows",
    ]
    parts = {**vars(report), **vars(workloads), **vars(loaders), **vars(varlen), **vars(end_to_end)}
    for name in [*bench.__all__, "PerItemDataset", "BatchedDataset"]:
        assert getattr(bench, name) is parts[name]


@pytest.mark.slow
def test_varlen_suite_prints_efficiencies_and_plots_them(tmp_path, capsys):
    out_png = tmp_path / "varlen.png"
    argv = ["bench", "--suite", "varlen", "--samples", "4000", "--epochs", "1", "--quiet", "--markdown"]
    assert main([*argv, "--plot", str(out_png)]) == 0
    printed = capsys.readouterr().out
    assert "**varlen**" in printed and "sort_window=2,048" in printed and "megabatch" in printed
    assert "DataLoader(batch_size=32)" in printed and "packing eff." in printed and "padded eff." in printed
    # the ragged dataset's epochs against fixed-shape rows and a list of tensors, in the same run
    assert "**ragged**" in printed and "RaggedDataset, packed" in printed and "list of tensors" in printed
    assert "| RaggedDataset, padded, sort_window=2,048 |" in printed and "the floor is " in printed
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_varlen_rows_compare_each_method_with_the_loader_without_window():
    rows = bench.varlen_rows(n=3000, epochs=1)
    windowed = [row for row in rows if row.suite == "varlen" and "sort_window" in row.method]
    assert len(windowed) == 4
    assert all(row.baseline.startswith("FastSizeAwareLoader") and "sort_window" not in row.baseline for row in windowed)
    assert all(row.seconds > 0 and row.ratio > 0 for row in rows)


@pytest.mark.slow
def test_kernel_suite_times_sum_and_padded_splits_of_one_to_three_columns():
    rows = bench.kernel_rows([3000], repeat=1)
    kinds = ["int", "float", "int (n, 2)", "int (n, 3)"]
    expected = [
        m
        for kind in kinds
        for m in (f"np.cumsum {kind} (floor)", *(f"split_batches {kind} {x}" for x in ("sum", "padded")))
    ]
    # (fairseq's kernel and the compiled walk, where they import, add rows of their own: tests/bench/test_peers.py)
    optional = [row for row in rows if row.method.startswith("fairseq") or row.method.endswith(", compiled")]
    assert [row.method for row in rows if row not in optional] == expected
    assert all(row.workload == "n=3,000" and row.seconds > 0 and row.ratio > 0 for row in rows)
    assert all(row.note.endswith(" batches") for row in rows if row.method.startswith("split_batches"))


def test_kernel_suite_costs_are_c_contiguous_so_the_floor_is_one_pass():
    from fastsab.bench.workloads import kernel_cases

    cases = kernel_cases(500)
    assert [kind for kind, _, _ in cases] == ["int", "float", "int (n, 2)", "int (n, 3)"]
    assert all(costs.flags.c_contiguous and len(costs) == 500 for _, costs, _ in cases)
    assert [costs.shape[1] for _, costs, _ in cases[2:]] == [2, 3]


@pytest.mark.slow
def test_scale_suite_reports_a_ranks_first_batch_and_its_memory(capsys):
    # the suite `--suite all` (and so the tables of docs/benchmarks.md) includes: both loaders, rank 7 of 8
    assert "scale" in SUITES
    assert main(["bench", "--suite", "scale", "--samples", "100000", "--quiet", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert "**scale**" in printed and "n=100,000, rank 7 of 8" in printed and "peak RSS +" in printed
    assert "FastLoader first batch" in printed and "FastSizeAwareLoader first batch" in printed
    # and the first batch after load_state_dict of a state saved about half-way through the epoch
    assert "| n=100,000, rank 7 of 8, resumed at step 24 | FastLoader resumed first batch |" in printed
    assert "| n=100,000, rank 7 of 8, resumed at step 74 | FastSizeAwareLoader resumed first batch |" in printed
