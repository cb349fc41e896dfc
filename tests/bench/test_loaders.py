from __future__ import annotations

import importlib.util

import pytest
import torch

from fastsab.bench.epochs import epoch_times, one_thread
from fastsab.bench.loaders import NUMPY_FLOOR, SIZE_AWARE_COMPILED, SIZE_AWARE_FLOOR, TENSOR_FLOOR, per_batch_rows
from fastsab.bench.scale import resume_rows
from fastsab.cli import main
from fastsab.plan.compiled import compiled_sum_walk, compiled_walk


def test_per_batch_rows_sweep_the_batch_sizes_against_both_floors():
    rows = per_batch_rows(samples=3000, batch_sizes=(16, 64), epochs=1)
    # where numba imports, the size-aware loader also with its split compiled, the same batches
    numba = importlib.util.find_spec("numba") is not None
    compiled = [SIZE_AWARE_COMPILED] if numba else []
    # and the least a size-aware loader takes: FastLoader's epoch plus the split's own work
    floors = [SIZE_AWARE_FLOOR, f"{SIZE_AWARE_FLOOR} (use_compiled)"] if numba else [SIZE_AWARE_FLOOR]
    methods = [NUMPY_FLOOR, TENSOR_FLOOR, "FastLoader", "FastSizeAwareLoader", *compiled, *floors]
    per_size = len(methods)
    assert [row.workload for row in rows] == ["batch size 16"] * per_size + ["batch size 64"] * per_size
    assert [row.method for row in rows] == methods * 2
    assert all(row.suite == "per-batch" and row.baseline == NUMPY_FLOOR and row.seconds > 0 for row in rows)
    assert rows[0].ratio == 1.0 and rows[per_size].ratio == 1.0
    assert rows[2].note.startswith("188 batches; ") and rows[per_size + 2].note.startswith("47 batches; ")
    if compiled:
        assert rows[3].note.split(";")[0] == rows[4].note.split(";")[0]
    for row in rows[: len(methods)]:
        if row.method.startswith(SIZE_AWARE_FLOOR):  # (FastLoader's batches)
            assert row.note.startswith("188 batches; ")
    assert compiled_walk() is None and compiled_sum_walk() is None  # the numpy walks again after
    assert all("us/batch over the numpy floor" in row.note and "over the tensor floor" in row.note for row in rows)
    assert "+0.00 us/batch over the numpy floor" in rows[0].note and rows[1].note.endswith(
        "+0.00 over the tensor floor"
    )


def test_the_loaders_suite_prints_the_per_batch_sweep(capsys):
    argv = ["bench", "--suite", "loaders", "--samples", "2000", "--batch-size", "20", "--epochs", "1", "--quiet"]
    assert main([*argv, "--batch-sizes", "16, 64", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert "**per-batch**" in printed and "| batch size 16 | FastLoader |" in printed
    assert "| batch size 64 | FastSizeAwareLoader |" in printed and "batch size 1024" not in printed


@pytest.mark.parametrize("sizes", ["16,0", "x", "16,,64"])
def test_bad_batch_sizes_exit_with_usage(sizes, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--batch-sizes", sizes])
    assert exit_info.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def test_one_thread_computes_in_one_thread_and_gives_the_count_back_after_an_error():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(KeyError), one_thread():
            assert torch.get_num_threads() == 1
            raise KeyError("step")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_first_batch_rows_time_each_loader_against_one_permutation():
    # the three loaders, then (with numba) the padded one compiled, then the three right after use_compiled()
    from fastsab.bench.loaders import PADDED_LOADER, SUM_LOADER, first_batch_rows

    rows = first_batch_rows(n=50_000, repeat=1)
    loaders = [f"{name} first batch" for name in ("FastLoader", SUM_LOADER, PADDED_LOADER)]
    methods = [row.method for row in rows]
    assert methods[:4] == ["numpy permutation", *loaders]
    assert all(row.suite == "first batch" and row.baseline == "numpy permutation" for row in rows)
    assert all(
        row.ratio == row.seconds / rows[0].seconds
        and row.note.startswith(f"{rows[0].seconds / row.seconds:,.0f}x sooner")
        for row in rows[1:]
    )
    try:
        import numba  # noqa: F401
    except ImportError:
        assert len(rows) == 4
        return
    assert methods[4:] == [loaders[2], *loaders]
    assert rows[4].note.endswith("its split compiled (use_compiled)")
    assert all("right after use_compiled()" in row.note for row in rows[5:])


def test_resume_rows_time_a_mid_epoch_state_of_each_loader_in_a_fresh_process():
    rows = resume_rows(n=200_000, rank=1, world_size=2, repeat=1)
    assert [row.method for row in rows] == ["FastLoader resumed first batch", "FastSizeAwareLoader resumed first batch"]
    # about half the epoch's steps: 200,000 / 256 / 2 / 2 (fixed), 200,000 * 49 / 4096 / 2 / 2 (sizes)
    assert [row.workload for row in rows] == [
        "n=200,000, rank 1 of 2, resumed at step 195",
        "n=200,000, rank 1 of 2, resumed at step 598",
    ]
    assert all(row.suite == "scale" and row.seconds > 0 and row.baseline == "target 1.0 s, 512 MiB" for row in rows)
    assert all(row.note.startswith("load_state_dict to first batch; peak RSS +") for row in rows)


def test_epoch_times_run_every_case_in_one_torch_thread():
    seen = []

    def case():
        seen.append(torch.get_num_threads())
        return [torch.get_num_threads()]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        measured = epoch_times([("a", case), ("b", lambda: iter([0]))], epochs=2)
        assert seen == [1] and measured["a"][1] == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
