"""tools/workers_check.py's summary (its goal lines, PASS or FAIL) on made-up rows, and ``fastsab bench --workers``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastsab.bench.workers import parse_worker_counts
from fastsab.cli import build_parser, main
from tools.workers_check import DATALOADER_GOAL, goal, render, summarize

# -- the option ------------------------------------------------------------------------


def test_worker_counts_parse_and_default_to_two():
    assert parse_worker_counts("1, 2,4,8") == (1, 2, 4, 8)
    assert build_parser().parse_args(["bench"]).workers is None  # (2 workers, texts tokenized in Python)
    assert build_parser().parse_args(["bench", "--workers", "4,1"]).workers == (4, 1)
    assert build_parser().parse_args(["bench"]).workers_dataset is None


def test_the_pages_describing_the_workers_suite_give_options_that_parse():
    root = Path(__file__).resolve().parent.parent
    for page in ("docs/recipes/workers.md", "docs/getting-started.md"):
        text = " ".join((root / page).read_text().split())
        assert "`--workers 1,2,4,8` sweeps the" in text and "`--workers-dataset io`" in text, page
    assert "`python tools/workers_check.py` runs both sweeps" in " ".join(
        (root / "docs/recipes/workers.md").read_text().split()
    )
    args = build_parser().parse_args(["bench", "--suite", "workers", "--workers", "1,2,4,8", "--workers-dataset", "io"])
    assert (args.workers, args.workers_dataset) == ((1, 2, 4, 8), "io")
    assert (root / "tools" / "workers_check.py").exists()


@pytest.mark.parametrize("text", ["0", "1,x", "2,,4", "-2", "", "2,4,2"])
def test_bad_worker_counts_are_refused_naming_the_option_and_value(text, capsys):
    message = (
        f"--workers names a worker count more than once, got {text!r}; give each count once."
        if text == "2,4,2"
        else f"--workers must be worker counts of at least 1 (one process is always measured), such as 1,2,4,8; "
        f"got {text!r}."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_worker_counts(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--suite", "workers", "--workers", text])
    assert exit_info.value.code == 2
    assert f"argument --workers: {message}" in capsys.readouterr().err


# -- the check script's summary --------------------------------------------------------


def _rows(dataset: str, one: float, times: dict[int, tuple[float, float, float]]) -> list[dict[str, object]]:
    """Made-up later-epoch rows of one sweep: per count, (started per epoch, persistent, DataLoader) seconds."""
    rows = []
    for kind, name in (("fixed size", "FastLoader"), ("size-aware", "FastSizeAwareLoader")):
        workload = f"{kind}, 100 {dataset}, later epochs"
        cases = [(f"{name}(prefetch=2), one process", one, times[min(times)][2])]
        for count, (started, persistent, dataloader) in times.items():
            name_dl = f"DataLoader(num_workers={count}, persistent_workers=True, batch_sampler={name}.batch_sampler())"
            cases += [
                (f"{name}(num_workers={count})", started, dataloader),
                (f"{name}(num_workers={count}, persistent_workers=True)", persistent, dataloader),
                (name_dl, dataloader, dataloader),
            ]
        first = f"{kind}, 100 {dataset}, first epoch"
        rows.append({"workload": first, "method": cases[1][0], "ratio": 9.0, "speedup": 0.1})  # (not judged)
        for method, seconds, dataloader in cases:
            rows.append(
                {"workload": workload, "method": method, "ratio": seconds / one, "speedup": dataloader / seconds}
            )
    return rows


def test_the_check_judges_speed_up_per_worker_and_against_the_dataloader():
    cpu = _rows("texts", 1.0, {1: (1.2, 1.0, 1.0), 2: (0.6, 0.5, 0.5), 4: (0.4, 0.3, 0.3), 8: (0.2, 0.2, 0.15)})
    io = _rows("reads", 1.0, {1: (1.1, 1.0, 1.0), 8: (0.2, 0.16, 0.16)})
    summary = summarize(4, 8, {"cpu": {"ok": True, "seconds": 60.0, "rows": cpu}, "io": {"ok": True, "rows": io}})
    lines = {(line["dataset"], line["kind"], line["workers"]): line for line in summary["lines"]}
    assert len(lines) == 2 * 4 + 2 * 2
    fixed2 = lines[("cpu", "fixed size", 2)]
    assert (fixed2["speedup"], fixed2["per_worker"], fixed2["started_per_epoch_speedup"]) == (2.0, 1.0, 1.667)
    assert (fixed2["dataloader_speedup"], fixed2["over_dataloader"], fixed2["meets_goal"]) == (2.0, 1.0, True)
    four = lines[("cpu", "size-aware", 4)]  # 3.33x: 0.83 per worker, as fast as the DataLoader
    assert four["meets_goal"] and four["meets_dataloader_goal"] and four["goal"] == ">= 0.75 per worker"
    eight = lines[("cpu", "fixed size", 8)]  # more workers than the 4 cores: shown, not judged
    assert eight["goal"] is None and eight["meets_goal"] is None and eight["speedup"] == 5.0
    io8 = lines[("io", "fixed size", 8)]  # 6.25x of 8 (0.78 per worker) passes, whatever the cores
    assert io8["meets_goal"] and io8["per_worker"] == 0.781 and io8["meets_dataloader_goal"]
    assert summary["ok"]
    text = render(summary)
    assert text.startswith("workers check: PASS (4 usable cores of 8")
    assert "io  fixed size  8 workers:  6.25x one process, 0.78 per worker" in text
    assert "cpu size-aware  8 workers:  5.00x one process, 0.62 per worker" in text and "not judged" in text

    slow = _rows("reads", 1.0, {8: (0.2, 0.2, 0.16)})  # 5x of 8 (0.62 per worker), 0.8x the DataLoader's speed
    failed = summarize(16, 16, {"io": {"ok": True, "rows": slow}})
    assert not failed["ok"] and not failed["lines"][0]["meets_goal"] and not failed["lines"][0]["meets_dataloader_goal"]
    assert "FAIL (goal >= 0.75 per worker); 0.80x DataLoader's speed FAIL (goal >= 0.95)" in render(failed)
    assert render(failed).startswith("workers check: FAIL")


def test_the_check_holds_two_cores_to_1_4x_with_two_workers_and_fails_a_sweep_that_did_not_run():
    assert goal("cpu", 2, 2) == (1.4, ">= 1.4x one process on 2 cores")
    assert goal("cpu", 4, 2) is None and goal("io", 4, 2) == (3.0, ">= 0.75 per worker") and goal("io", 16, 32) is None
    rows = _rows("texts", 1.0, {2: (0.75, 0.7, 0.7)})  # 1.43x with 2 workers on 2 cores
    summary = summarize(2, 2, {"cpu": {"ok": True, "rows": rows}})
    assert summary["ok"] and all(line["meets_goal"] for line in summary["lines"])
    assert DATALOADER_GOAL == 0.95
    stopped = {"ok": False, "error": "timed out", "seconds": 100.0, "output_tail": "..."}
    failed = summarize(2, 2, {"cpu": {"ok": True, "rows": rows}, "io": stopped})
    assert not failed["ok"] and "io: fastsab bench --suite workers timed out after 100.0 s" in render(failed)


def test_a_sweep_that_ran_without_the_rows_of_a_count_asked_fails_that_count():
    rows = _rows("texts", 1.0, {1: (1.2, 1.0, 1.0), 2: (0.6, 0.5, 0.5)})
    half = [row for row in rows if "FastSizeAwareLoader(num_workers=2, persistent" not in str(row["method"])]
    summary = summarize(
        16, 16, {"cpu": {"ok": True, "counts": [1, 2, 4], "rows": half}, "io": {"ok": True, "rows": []}}
    )
    missing = {(line["dataset"], line["kind"], line["workers"]) for line in summary["lines"] if line["missing"]}
    # the size-aware rows of 2 workers, both loaders' rows of 4 workers: asked, not measured
    assert missing == {("cpu", "size-aware", 2), ("cpu", "fixed size", 4), ("cpu", "size-aware", 4)}
    assert all(line["meets_goal"] for line in summary["lines"] if not line["missing"])
    assert not summary["ok"]
    text = render(summary)
    assert text.startswith("workers check: FAIL")
    assert "cpu size-aware  4 workers: FAIL (no rows for this count in the sweep's table)" in text
    # a sweep that ran but judged nothing fails too
    empty = summarize(16, 16, {"io": {"ok": True, "rows": []}})
    assert not empty["ok"] and "io: the sweep's table has no later-epoch rows to judge" in render(empty)


def test_the_workers_options_run_the_workers_suite_or_are_refused_with_another(monkeypatch, capsys):
    import fastsab.cli as cli

    asked = []
    monkeypatch.setattr(cli, "workers_rows", lambda *args, **kwargs: asked.append(kwargs) or [])
    monkeypatch.setattr(cli.bench, "loader_rows", lambda *args, **kwargs: pytest.fail("the loaders suite ran"))
    assert main(["bench", "--workers", "1,2", "--quiet"]) == 0  # (no --suite: the workers suite alone)
    assert main(["bench", "--workers-dataset", "io", "--quiet"]) == 0
    assert [(kwargs["worker_counts"], kwargs["dataset"]) for kwargs in asked] == [((1, 2), "cpu"), ((2,), "io")]
    for argv in (["--suite", "kernels", "--workers", "4"], ["--suite", "loaders", "--workers-dataset", "io"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", *argv])
        assert exit_info.value.code == 2
        assert "set the workers suite, which --suite" in capsys.readouterr().err
