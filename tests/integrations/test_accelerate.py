"""The fast loaders under Hugging Face Accelerate (``fastsab.integrations.accelerate``)."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch.utils.data import DataLoader

from fastsab import FastLoader
from fastsab.integrations.accelerate import AcceleratedLoader, prepare_loader
from tests.docs_pages import page_files, page_script

WORKER = Path(__file__).with_name("accelerate_worker.py")


def start(directory: Path, processes: int, *args: Any) -> subprocess.Popen[str]:
    """Start ``accelerate_worker.py`` in ``processes`` CPU processes (see :func:`launch`)."""
    directory.mkdir(exist_ok=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    command = [*(torchrun if processes > 1 else [sys.executable]), str(WORKER), *map(str, args)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}  # as `accelerate launch --cpu`
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=directory)


def finish(run: subprocess.Popen[str]) -> tuple[str, str]:
    """The output of ``run``, once it ended."""
    try:
        return run.communicate(timeout=180)  # a hang guard
    finally:
        run.kill()  # (nothing left to end, but after a timeout)
        run.wait()


def launch(directory: Path, processes: int, *args: Any) -> list[dict[str, Any]]:
    """Run ``accelerate_worker.py`` in ``processes`` CPU processes; what each rank wrote."""
    run = start(directory, processes, *args)
    _, stderr = finish(run)
    assert run.returncode == 0, stderr[-3000:]
    return [json.loads((directory / f"{args[0]}_{rank}.json").read_text()) for rank in range(processes)]


def per_epoch(record: dict[str, Any], epoch: int) -> list[Any]:
    return [step for step in record["steps"] if step[0] == epoch]


def check_resumed(tmp_path: Path, full: list[dict[str, Any]], kind: str, stop: int | None = None) -> None:
    """The uninterrupted run ``full`` against one saved after ``stop`` steps (default: 8 into epoch 1) and resumed."""
    processes = len(full)
    if stop is None:  # a step after which gradients are synced: accelerate saves no gradients being accumulated
        stop = len(per_epoch(full[0], 0)) + 8
    run = tmp_path / "run"
    interrupted = launch(run, processes, "train", kind, run, stop)
    resumed = launch(run, processes, "resume", kind, run)
    for rank in range(processes):
        # invariant: rank by rank and step by step, the samples (and syncs) of the uninterrupted run
        assert len(interrupted[rank]["steps"]) == stop
        assert interrupted[rank]["steps"] + resumed[rank]["steps"] == full[rank]["steps"]
        assert resumed[rank]["weight"] == full[rank]["weight"]
        assert resumed[rank]["len"] == len(per_epoch(full[rank], full[rank]["steps"][stop][0]))


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """3 epochs of a FastLoader (35 batches each) in one process, uninterrupted."""
    directory = tmp_path_factory.mktemp("full")
    return launch(directory, 1, "train", "fixed", directory)


def check_syncs_at_epoch_ends(full: list[dict[str, Any]]) -> None:
    for record in full:
        for epoch in range(3):
            syncs = [synced for _, _, synced in per_epoch(record, epoch)]
            # invariant: gradients are synced every 4 steps and on the epoch's last one
            assert syncs == [(step + 1) % 4 == 0 or step + 1 == len(syncs) for step in range(len(syncs))]
            assert sum(syncs) == math.ceil(len(syncs) / 4)


@pytest.mark.slow
def test_one_process_resumed_run_sees_the_uninterrupted_runs_batches(tmp_path, one_process_run):
    full = one_process_run
    check_resumed(tmp_path, full, "fixed")
    assert full[0]["len"] == 35
    for epoch in range(3):  # every sample once per epoch
        assert sorted(i for _, batch, _ in per_epoch(full[0], epoch) for i in batch) == list(range(240))
    check_syncs_at_epoch_ends(full)
    assert [sum(synced for _, _, synced in per_epoch(full[0], epoch)) for epoch in range(3)] == [9, 9, 9]


@pytest.mark.slow
def test_one_process_run_saved_after_the_last_batch_of_an_epoch_resumes_with_the_next(tmp_path, one_process_run):
    check_resumed(tmp_path, one_process_run, "fixed", stop=35)


@pytest.mark.slow
def test_two_processes_resumed_run_sees_the_uninterrupted_runs_batches(tmp_path):
    full = launch(tmp_path / "full", 2, "train", "sized", tmp_path / "full")
    check_resumed(tmp_path, full, "sized")
    for epoch in range(3):
        steps = [per_epoch(record, epoch) for record in full]
        assert len(steps[0]) == len(steps[1])  # equal steps per rank
        assert {i for rank in steps for _, batch, _ in rank for i in batch} == set(range(240))
    check_syncs_at_epoch_ends(full)


@pytest.mark.slow
def test_prepare_of_a_planned_data_loader_under_two_processes_refuses_to_shard_the_plan_again(tmp_path):
    # (without the check each rank ran 9 of its 18 steps: 119 of the 240 samples were never seen)
    for rank, record in enumerate(launch(tmp_path, 2, "naive", "fixed", tmp_path)):
        assert record["steps"] == []
        assert f"the plan already is the share of rank {rank} of 2" in record["error"]
        assert "fastsab.integrations.accelerate.prepare_loader(accelerator, loader)" in record["error"]


@pytest.mark.slow
def test_prepare_of_a_planned_data_loader_refuses_to_dispatch_the_main_processs_plan(tmp_path):
    # (without the check the main process's share was dealt to both processes, the other's never seen)
    run = start(tmp_path, 2, "naive", "dispatch", tmp_path)
    _, stderr = finish(run)
    assert run.returncode != 0
    assert "the plan already is the share of rank 0 of 2" in stderr


# -- one process, in this one ----------------------------------------------------------------


@pytest.fixture(scope="module")
def accelerator() -> Iterator[Accelerator]:
    # NOTE: accelerate's state is one per process: start from none, and leave none to other tests
    AcceleratorState._reset_state(True)
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    # NOTE: the loaders registered with the accelerator, and the worker processes of their
    # iterations, end here rather than whenever the collector meets their cycles (later tests
    # count the processes this one has)
    gc.collect()


def test_state_counts_the_batches_received_not_the_one_fetched_ahead(accelerator):
    loader = FastLoader(torch.arange(40), 4, seed=3)
    prepared = prepare_loader(accelerator, loader)
    batches = iter(prepared)
    received = [next(batches).tolist() for _ in range(3)]
    assert loader.state_dict()["steps"] == 4  # handed out
    state = prepared.state_dict()
    assert state["steps"] == 3
    resumed = prepare_loader(accelerator, FastLoader(torch.arange(40), 4, seed=3))
    resumed.load_state_dict(state)
    assert len(resumed) == 10  # the whole epoch's steps
    rest = [batch.tolist() for batch in resumed]
    everything = [batch.tolist() for batch in FastLoader(torch.arange(40), 4, seed=3)]
    assert received + rest == everything
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["steps"] == 0


def test_end_of_dataloader_is_set_on_the_last_batch_only(accelerator):
    prepared = prepare_loader(accelerator, FastLoader(torch.arange(10), 4).data_loader())
    ends = [accelerator.gradient_state.end_of_dataloader for _ in prepared]
    assert ends == [False, False, True]
    assert not accelerator.gradient_state.in_dataloader


def test_batches_go_to_the_accelerators_device_unless_the_loader_moves_them(accelerator):
    assert prepare_loader(accelerator, FastLoader(torch.arange(4), 2)).move_to == accelerator.device
    assert prepare_loader(accelerator, FastLoader(torch.arange(4), 2), device_placement=False).device is None
    own = prepare_loader(accelerator, FastLoader(torch.arange(4), 2, device="cpu"))
    assert own.move_to is None and own.device == torch.device("cpu")


def test_prepare_loader_refuses_what_it_cannot_prepare(accelerator):
    with pytest.raises(TypeError, match=r"loader must be a FastLoader.*got DataLoader; prepare other DataLoader"):
        prepare_loader(accelerator, DataLoader(torch.arange(4)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"accelerator must be an accelerate.Accelerator, got str"):
        prepare_loader("cpu", FastLoader(torch.arange(4), 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"loader plans for rank 1 of 2, but the accelerator runs process 0 of 1"):
        prepare_loader(accelerator, FastLoader(torch.arange(4), 2, rank=1, world_size=2))


def test_prepared_loader_is_registered_for_checkpointing(accelerator):
    prepared = prepare_loader(accelerator, FastLoader(torch.arange(4), 2))
    assert isinstance(prepared, AcceleratedLoader)
    assert accelerator._custom_objects[-1] is prepared


def test_state_of_a_planned_data_loader_with_workers_counts_the_batches_received(accelerator):
    loader = FastLoader(torch.arange(40), 4, seed=3)
    prepared = prepare_loader(accelerator, loader.data_loader(num_workers=1))
    batches = iter(prepared)
    received = [next(batches).tolist() for _ in range(3)]
    state = prepared.state_dict()
    del batches
    assert state["steps"] == 3
    resumed = prepare_loader(accelerator, FastLoader(torch.arange(40), 4, seed=3).data_loader())
    resumed.load_state_dict(state)
    everything = [batch.tolist() for batch in FastLoader(torch.arange(40), 4, seed=3)]
    assert received + [batch.tolist() for batch in resumed] == everything


# -- the docs page ----------------------------------------------------------------------------


@pytest.mark.slow
def test_docs_page_train_script_resumes_exactly_under_two_processes(tmp_path):
    (tmp_path / "train.py").write_text(page_files("trainers/accelerate.md")["train.py"])
    assert page_script("trainers/accelerate.md").strip() == ""  # the page's code is the script

    def run(*args: str) -> list[tuple[int, int, bool, list[int]]]:
        logs = tmp_path / f"logs{len(args)}"  # one stdout file per rank: their lines do not interleave
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        torchrun += [f"--log-dir={logs}", "--redirects=1"]
        env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
        out = subprocess.run(
            [*torchrun, "train.py", *args], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr[-3000:]
        lines = [line.split(" ", 7) for log in logs.rglob("stdout.log") for line in log.read_text().splitlines()]
        return [(int(w[1]), int(w[3]), w[5] == "True", json.loads(w[7])) for w in lines if w[0] == "rank"]

    interrupted, resumed = run("20"), run()
    assert [len([s for s in interrupted if s[0] == rank]) for rank in (0, 1)] == [20, 20]
    assert resumed[0][1] == 1  # epoch 0 has 18 steps per rank: the resumed run starts in epoch 1
    steps = interrupted + resumed
    for epoch in range(3):
        ranks = [[s for s in steps if s[:2] == (rank, epoch)] for rank in (0, 1)]
        # invariant: the interrupted and resumed runs together run every epoch once, each sample in it
        assert len(ranks[0]) == len(ranks[1])
        assert {i for rank in ranks for s in rank for i in s[3]} == set(range(240))
        assert all(rank[-1][2] for rank in ranks)  # synced on the epoch's last step


def test_state_saved_between_epochs_resumes_at_the_next_one(accelerator):
    prepared = prepare_loader(accelerator, FastLoader(torch.arange(12), 4, seed=3))
    first = [batch.tolist() for batch in prepared]
    resumed = prepare_loader(accelerator, FastLoader(torch.arange(12), 4, seed=3))
    resumed.load_state_dict(prepared.state_dict())
    assert resumed.epoch == 1 and len(resumed) == 3
    second = [batch.tolist() for batch in resumed]
    reference = FastLoader(torch.arange(12), 4, seed=3)
    assert [first, second] == [[b.tolist() for b in reference], [b.tolist() for b in reference]]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_a_loop_left_mid_epoch_then_set_epoch_saves_the_chosen_epoch(accelerator, workers):
    # (with a worker, the plan of this short epoch is all handed out before the loop leaves it)
    def make() -> AcceleratedLoader:
        loader = FastLoader(torch.arange(16), 4, seed=3)
        return prepare_loader(accelerator, loader.data_loader(num_workers=workers) if workers else loader)

    reference = FastLoader(torch.arange(16), 4, seed=3)
    epochs = [[batch.tolist() for batch in reference] for _ in range(3)]
    prepared = make()
    for count, _ in enumerate(prepared, 1):
        if count == 2:  # as a loop that caps an epoch's steps
            break
    prepared.set_epoch(1)
    state = prepared.state_dict()
    assert (state["epoch"], state["steps"]) == (1, 0)
    resumed = make()
    resumed.load_state_dict(state)
    assert [[[batch.tolist() for batch in loader] for _ in range(2)] for loader in (resumed, prepared)] == [
        epochs[1:],
        epochs[1:],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("into_epoch", [4, 8])
def test_two_processes_resumed_past_an_epochs_first_chunk_see_the_uninterrupted_runs_batches(
    tmp_path, monkeypatch, into_epoch
):
    # NOTE: 9,600 samples in batches of about 280 (40 times the default's): 4 steps of 2 ranks stop
    # inside the epoch's first plan chunk of 4096 samples, 8 steps past it (both after a synced step)
    monkeypatch.setenv("FASTSAB_WORKER_N", str(240 * 40))
    full = launch(tmp_path / "full", 2, "train", "sized", tmp_path / "full")
    check_resumed(tmp_path, full, "sized", stop=len(per_epoch(full[0], 0)) + into_epoch)


def test_a_mixture_resumed_mid_epoch_runs_the_uninterrupted_batches(accelerator):
    # web's sample i is i, code's (a quarter as many, upsampled: stop="last") 1000 + i
    import numpy as np

    from fastsab import FastSizeAwareLoader, Mixture

    def make() -> FastSizeAwareLoader:
        sources = {"web": torch.arange(40), "code": torch.arange(1000, 1010)}
        mixture = Mixture(sources, weights={"web": 0.6, "code": 0.4}, stop="last")
        sizes = {"web": np.arange(40) % 7 + 1, "code": np.arange(10) % 5 + 3}
        return FastSizeAwareLoader(mixture, sizes, 20, seed=5)

    reference = make()
    epochs = [[batch.tolist() for batch in reference] for _ in range(2)]
    assert [len(batches) for batches in epochs] == [15, 15]
    prepared = prepare_loader(accelerator, make())
    received = []
    for batch in prepared:
        received.append(batch.tolist())
        if len(received) == 9:
            break
    resumed = prepare_loader(accelerator, make())
    resumed.load_state_dict(prepared.state_dict())
    assert len(resumed) == 15  # the whole epoch's steps
    rest, ends = [], []
    for epoch in range(2):
        resumed.set_epoch(epoch)
        for batch in resumed:
            rest.append(batch.tolist())
            ends.append(accelerator.gradient_state.end_of_dataloader)
    # invariant: received + resumed == the loader's own epochs, batch by batch; each epoch ends on its last
    assert received + rest == epochs[0] + epochs[1]
    assert [i for i, end in enumerate(ends) if end] == [15 - 9 - 1, 15 - 9 + 15 - 1]
