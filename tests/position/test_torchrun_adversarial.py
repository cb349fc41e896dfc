"""Real torchrun processes (gloo) stopped mid-epoch, inside and past its first plan chunk, and
resumed on as many processes and on one: the samples of the run never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("torchrun_resume_worker.py")


def launch(out: Path, processes: int, mode: str) -> list[list[list[int]]]:
    """Run the worker in ``processes`` processes; each rank's steps."""
    command = [sys.executable, str(WORKER)]
    if processes > 1:
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, str(out), mode], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"{mode}.rank{rank}.json").read_text()) for rank in range(processes)]


@pytest.mark.slow
@pytest.mark.parametrize("stop", [1, 20, 40])
def test_two_processes_stopped_resume_on_two_and_on_one(tmp_path, stop):
    # NOTE: batches of about 60 samples: 20 steps of 2 ranks stop inside the epoch's first plan
    # chunk of 4096 samples, 40 past it
    whole = launch(tmp_path, 2, "0")
    assert len(whole[0]) > stop + 10
    before = launch(tmp_path, 2, str(stop))
    states = [json.loads((tmp_path / f"state.rank{rank}.json").read_text()) for rank in range(2)]
    assert states[0] == states[1] and "resume" in states[0]
    # invariant: rank by rank and step by step, the uninterrupted run's samples
    assert launch(tmp_path, 2, "resume") == [steps[stop:] for steps in whole]
    assert before == [steps[:stop] for steps in whole]
    # invariant: on one process, the batches not yet run, each once (the run's padded repeats aside)
    (alone,) = launch(tmp_path, 1, "resume")
    left = Counter(tuple(batch) for steps in whole for batch in steps[stop:])
    assert Counter(tuple(batch) for batch in alone) == Counter(dict.fromkeys(left, 1))
