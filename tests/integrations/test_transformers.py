"""FastTrainer: a fast loader in ``transformers.Trainer``, exact over interruptions and resumes.

Each test trains a tiny model in new processes (``tests/integrations/transformers_trainer_worker.py``):
the whole run, then the same run stopped right after a checkpoint (the process ends there),
then that run resumed from its checkpoint in a new process. The samples of every step, rank
by rank, are compared with the loader's own plan and between the runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.integrations.transformers import LOADER_STATE_NAME, FastTrainer
from tests.docs_pages import page_script
from tests.integrations.transformers_trainer_worker import make_loader

WORKER = Path(__file__).with_name("transformers_trainer_worker.py")
ACCUMULATE = 2  # the worker's gradient accumulation


def _launch(root: Path, kind: str, phase: str, world_size: int, stop: int | None) -> None:
    if world_size == 1:
        command = [sys.executable, str(WORKER)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"]
        command.append(str(WORKER))
    # NOTE: a generous hang guard only: the processes import transformers (seconds each)
    arguments = [str(root), kind, phase] + ([] if stop is None else [str(stop)])
    done = subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_resume(root: Path, kind: str, world_size: int, stop: int | None = None) -> list[int]:
    """Run, stop (after step ``stop``, or the worker's) and resume; check every rank's steps.

    Returns the steps of each epoch.
    """
    _launch(root, kind, "first", world_size, stop)
    meta = json.loads((root / "meta.json").read_text())
    epoch_steps, stop, once, also = meta["epoch_steps"], meta["stop"], set(meta["once"]), set(meta["also"])
    updates = [-(-steps // ACCUMULATE) for steps in epoch_steps]
    # the interrupted run stopped in a later epoch, after the checkpoint of step `stop`
    stopped = {rank: _records(root / f"stopped.rank{rank}.jsonl") for rank in range(world_size)}
    assert all(records[-1]["step"] == stop - 1 for records in stopped.values())
    assert all(records[-1]["epoch"] >= 1 for records in stopped.values())
    covered: list[Counter[int]] = [Counter() for _ in epoch_steps]
    for rank in range(world_size):
        full = _records(root / f"full.rank{rank}.jsonl")
        plan = json.loads((root / f"plan.rank{rank}.json").read_text())
        # invariant: the uninterrupted run trains on exactly the loader's batches, epoch by epoch,
        # each epoch's last optimizer step taking the batches left (gradient accumulation)
        expected = [
            {"epoch": epoch, "step": sum(updates[:epoch]) + position // ACCUMULATE, "indices": batch}
            for epoch, batches in enumerate(plan)
            for position, batch in enumerate(batches)
        ]
        assert full == expected
        assert [len(batches) for batches in plan] == epoch_steps  # every rank runs as many steps
        for epoch, batches in enumerate(plan):
            covered[epoch].update(index for batch in batches for index in batch)
    # invariant: every sample once per epoch over the ranks (a padded step may repeat some), and
    # every sample of an upsampled source at least once
    for counts in covered:
        assert set(counts) == once | also
        assert world_size > 1 or {counts[index] for index in once} == {1}
    _launch(root, kind, "resume", world_size, stop)
    for rank in range(world_size):
        # invariant: stopped + resumed in a new process == uninterrupted, step by step
        assert _records(root / f"stopped.rank{rank}.jsonl") == _records(root / f"full.rank{rank}.jsonl")
    # the checkpoints of both runs agree: steps, epochs (with the fraction) and the loader's state
    checkpoints = sorted(path.name for path in (root / "full").glob("checkpoint-*"))
    assert checkpoints == sorted(path.name for path in (root / "stopped").glob("checkpoint-*"))
    assert f"checkpoint-{sum(updates)}" in checkpoints
    for name in checkpoints:
        saved = [_checkpoint(root / run / name) for run in ("full", "stopped")]
        assert saved[0] == saved[1]
    assert _checkpoint(root / "full" / f"checkpoint-{sum(updates)}")[:3] == (sum(updates), sum(updates), len(updates))
    return epoch_steps


def _checkpoint(folder: Path) -> tuple[object, ...]:
    """What a checkpoint says of the position: global step, max steps, epoch, the loader's state, and
    the step and epoch of each log entry."""
    state = json.loads((folder / "trainer_state.json").read_text())
    loader = json.loads((folder / "fastsab_train_loader.json").read_text())
    logged = [(entry["step"], entry["epoch"]) for entry in state["log_history"]]
    return state["global_step"], state["max_steps"], state["epoch"], loader, logged


@pytest.mark.slow
def test_fixed_size_resume_is_exact(tmp_path: Path) -> None:
    assert _check_resume(tmp_path, "fixed", 1) == [12, 12, 12]


@pytest.mark.slow
def test_size_aware_epochs_of_differing_lengths_resume_exactly(tmp_path: Path) -> None:
    epoch_steps = _check_resume(tmp_path, "sized", 1)
    assert len(set(epoch_steps)) > 1  # the epochs differ in length
    assert any(steps % ACCUMULATE for steps in epoch_steps)  # some epoch ends with a partial accumulation


@pytest.mark.slow
def test_a_checkpoint_at_the_end_of_an_epoch_with_a_partial_accumulation_resumes_at_the_next(tmp_path: Path) -> None:
    epoch_steps = _check_resume(tmp_path, "sized", 1, stop=26)
    assert epoch_steps[:2] == [24, 27]  # step 26 is the last of epoch 1, whose 27th batch is accumulated alone


@pytest.mark.slow
def test_torchrun_two_processes_resume_exactly(tmp_path: Path) -> None:
    epoch_steps = _check_resume(tmp_path, "sized", 2)
    assert len(set(epoch_steps)) > 1


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "stop"), [(1, 13), (1, 15), (2, 6), (2, 8)])
def test_a_resume_inside_and_past_an_epochs_first_chunk_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_size: int, stop: int
) -> None:
    # NOTE: 9,600 samples in batches of about 480 (200 times the default's budget): the checkpoint
    # falls in epoch 1, inside its first plan chunk of 4096 samples (13 on one rank, 6 on two) or past it
    monkeypatch.setenv("FASTSAB_WORKER_N", str(48 * 200))
    assert _check_resume(tmp_path, "sized", world_size, stop=stop) == [20 // world_size] * 3


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_mixture_resumes_exactly(tmp_path: Path, world_size: int) -> None:
    # stopped in epoch 1 (of 42, 42 and 43 batches on one rank), the upsampled source's samples
    # coming more than once in every epoch
    epoch_steps = _check_resume(tmp_path, "mixed", world_size)
    assert epoch_steps == [[42, 42, 43], [21, 21, 22]][world_size - 1]
    # invariant: each rank's steps are the plan the loader gives that rank made in this one process
    for rank in range(world_size):
        planned = make_loader("mixed", rank=rank, world_size=world_size)
        plan = [[batch["index"].tolist() for batch in planned] for _ in range(3)]
        assert json.loads((tmp_path / f"plan.rank{rank}.json").read_text()) == plan
        full = _records(tmp_path / f"full.rank{rank}.jsonl")
        assert [record["indices"] for record in full] == [batch for batches in plan for batch in batches]


def test_loader_type_is_checked() -> None:
    with pytest.raises(TypeError, match=r"train_loader must be a FastLoader or FastSizeAwareLoader, got list\."):
        FastTrainer(model=torch.nn.Linear(1, 1), train_loader=[1, 2])  # type: ignore[arg-type]


def test_a_loader_of_another_rank_a_train_dataset_too_or_auto_batch_sizes_are_refused(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    model, loader = torch.nn.Linear(1, 1), FastLoader(torch.arange(8), 2)
    with pytest.raises(ValueError, match=r"train_loader plans for rank 1 of 2, but this process is rank 0 of 1"):
        FastTrainer(model=model, args=args, train_loader=FastLoader(torch.arange(8), 2, rank=1, world_size=2))
    with pytest.raises(ValueError, match=r"pass FastTrainer train_loader= or train_dataset=, not both"):
        FastTrainer(model=model, args=args, train_loader=loader, train_dataset=torch.arange(8))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], auto_find_batch_size=True)
    with pytest.raises(ValueError, match=r"FastTrainer does not take auto_find_batch_size=True"):
        FastTrainer(model=model, args=args, train_loader=loader)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, index: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": (self.weight * x).pow(2).mean()}


def _train(root: Path, seed: int, accumulate: int = 1, resume: str | None = None) -> None:
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(root),
        use_cpu=True,
        report_to=[],
        save_steps=2,
        max_steps=2,
        gradient_accumulation_steps=accumulate,
        disable_tqdm=True,
    )
    loader = FastLoader({"index": torch.arange(12), "x": torch.linspace(0, 1, 12)}, 2, seed=seed)
    FastTrainer(model=_Model(), args=args, train_loader=loader).train(resume_from_checkpoint=resume)


def test_a_checkpoint_of_another_loader_or_run_or_without_the_loader_state_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, seed=0)
    checkpoint = str(tmp_path / "checkpoint-2")
    with pytest.raises(ValueError, match=r"state was saved with seed 0, but this object has seed 1\."):
        _train(tmp_path, seed=1, resume=checkpoint)
    with pytest.raises(
        ValueError, match=r"is at epoch 0, step 2, but the checkpoint's global step 2 is at epoch 0, step 4"
    ):
        _train(tmp_path, seed=0, accumulate=2, resume=checkpoint)
    (tmp_path / "checkpoint-2" / LOADER_STATE_NAME).unlink()
    with pytest.raises(ValueError, match=r"has no fastsab_train_loader.json: it was not saved by FastTrainer"):
        _train(tmp_path, seed=0, resume=checkpoint)


def test_items_skipped_as_oversize_are_reported_every_epoch(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], num_train_epochs=2, save_strategy="no", disable_tqdm=True
    )
    sizes = torch.ones(12)
    sizes[5] = 100  # above the cap: skipped, and reported at the end of each epoch
    loader = FastSizeAwareLoader({"index": torch.arange(12), "x": torch.linspace(0, 1, 12)}, sizes, 4, seed=0)
    with pytest.warns(UserWarning, match="were larger than max_total_size") as caught:
        FastTrainer(model=_Model(), args=args, train_loader=loader).train()
    reports = [str(w.message) for w in caught if "larger than max_total_size" in str(w.message)]
    assert reports == [
        f"1 items were larger than max_total_size and were skipped in epoch {e}; their indices are in stats.skipped. "
        "The largest has size 100.0 and max_total_size is 4. To keep such items, pass oversize='own_batch' (each in "
        "a batch of its own), oversize='error' (stop at the first), or max_total_size >= 100.0."
        for e in (0, 1)
    ]


def test_docs_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(page_script("trainers/transformers.md"), "transformers.md", "exec"), {})
    out = capsys.readouterr().out
    # the shape buckets' section: what reaches model(**batch), and a compute_loss that takes it out
    assert "['attention_mask', 'input_ids', 'labels', 'sample_mask']" in out
    assert "48 real rows trained on" in out
    assert "got an unexpected keyword argument 'sample_mask'" in out


def test_a_limit_lowered_mid_epoch_is_refused_at_the_next_batch(tmp_path: Path) -> None:
    from transformers import TrainerCallback, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], num_train_epochs=2, save_strategy="no", disable_tqdm=True
    )
    sizes = torch.tensor([1, 2, 3, 4] * 6)
    loader = FastSizeAwareLoader({"index": torch.arange(24), "x": torch.linspace(0, 1, 24)}, sizes, 8, seed=0)
    trained: list[int] = []

    class Lower(TrainerCallback):  # as a memory monitor would, after the second step
        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            trained.append(state.global_step)  # type: ignore[attr-defined]
            if len(trained) == 2:
                loader.lower_limit(4)

    trainer = FastTrainer(model=_Model(), args=args, train_loader=loader, callbacks=[Lower()])
    # the lowered epoch has more batches than Trainer counted for it: refused at the next batch,
    # not after the epoch's last step (its items would be left untrained)
    with pytest.raises(RuntimeError, match=r"the training loader's limit was lowered in epoch 0 after 2 batches"):
        trainer.train()
    assert trained == [1, 2]
