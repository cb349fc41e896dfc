"""docs/trainers/torchrun.md: its train.py under torchrun, stopped and resumed, against a run never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.docs_pages import page_files, page_script

PAGE = "trainers/torchrun.md"


def torchrun(script: Path, run_dir: Path, *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*command, str(run_dir), *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, f"stdout:\n{out.stdout[-2000:]}\nstderr:\n{out.stderr[-4000:]}"


def steps(run_dir: Path, rank: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_torchrun_page_resumes_each_rank_step_by_step(tmp_path):
    # invariant: a run stopped after a checkpoint and resumed trains, rank by rank and step by
    # step, on the samples of the run never stopped, and ends with its weights
    assert page_script(PAGE) == ""  # the page's code is its train.py
    script = tmp_path / "train.py"
    script.write_text(page_files(PAGE)["train.py"])
    whole = tmp_path / "whole"
    torchrun(script, whole)
    ranks = [steps(whole, rank) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1])  # equal steps
    for epoch in range(3):
        seen = {i for rank in ranks for s in rank if s["epoch"] == epoch for i in s["indices"]}
        assert seen == set(range(600))
    first_epoch = sum(s["epoch"] == 0 for s in ranks[0])
    stop = (first_epoch + 4) // 4 * 4  # a checkpoint step in the second epoch
    assert ranks[0][stop - 1]["epoch"] == 1 and ranks[0][stop]["epoch"] == 1
    resumed = tmp_path / "resumed"
    torchrun(script, resumed, str(stop))
    assert len(steps(resumed, 0)) == stop
    torchrun(script, resumed)
    for rank in range(2):
        assert steps(resumed, rank) == ranks[rank]
    final = [torch.load(run / "final.pt") for run in (whole, resumed)]
    assert all(torch.allclose(final[0][key], final[1][key]) for key in final[0])
