from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import psutil
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.integrations.lightning import FastDataModule
from tests.docs_pages import page_script


class Crash(Exception):
    pass


class Recorder(pl.LightningModule):
    """Records which indices each step saw; the batch is a tensor of dataset indices."""

    def __init__(self, crash_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.crash_at_step = crash_at_step
        self.train_batches: list[tuple[int, list[int]]] = []
        self.eval_batches: dict[str, list[list[int]]] = {"val": [], "test": [], "predict": []}

    def forward(self, batch):
        return self.layer(batch.float()[:, None]).sum()

    def training_step(self, batch, batch_idx):
        if self.crash_at_step is not None and self.global_step == self.crash_at_step:
            raise Crash("a crash in the middle of an epoch")
        self.train_batches.append((self.current_epoch, batch.tolist()))
        return self(batch)

    def validation_step(self, batch, batch_idx):
        self.eval_batches["val"].append(batch.tolist())

    def test_step(self, batch, batch_idx):
        self.eval_batches["test"].append(batch.tolist())

    def predict_step(self, batch, batch_idx):
        self.eval_batches["predict"].append(batch.tolist())
        return batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def trainer(tmp_path, **options):
    defaults = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "use_distributed_sampler": False,
        "default_root_dir": tmp_path,
        "enable_checkpointing": False,
    }
    return pl.Trainer(**{**defaults, **options})


def epochs(model):
    out: dict[int, list[list[int]]] = {}
    for epoch, batch in model.train_batches:
        out.setdefault(epoch, []).append(batch)
    return out


def module(**options):
    datasets = {
        "train": torch.arange(60),
        "val": torch.arange(20),
        "test": torch.arange(30),
        "predict": torch.arange(10),
    }
    return FastDataModule(**datasets, seed=5, **options)


def flat(batches):
    return sorted(i for b in batches for i in b)


@pytest.mark.parametrize("kind", ["fixed", "size-aware"])
def test_fit_validate_test_predict(tmp_path, kind):
    if kind == "fixed":
        data = module(batch_size=8)
    else:
        sizes = {
            split: np.arange(n) % 7 + 1 for split, n in (("train", 60), ("val", 20), ("test", 30), ("predict", 10))
        }
        data = module(sizeof=sizes, max_total_size=20)
    model = Recorder()
    run = trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0, reload_dataloaders_every_n_epochs=1)
    run.fit(model, datamodule=data)
    by_epoch = epochs(model)
    assert flat(by_epoch[0]) == flat(by_epoch[1]) == list(range(60))  # every index once per epoch
    assert by_epoch[0] != by_epoch[1]  # the trainer set a new epoch
    assert flat(model.eval_batches["val"]) == sorted(list(range(20)) * 2)
    run.validate(model, datamodule=data)
    run.test(model, datamodule=data)
    predictions = run.predict(model, datamodule=data)
    assert flat(model.eval_batches["test"]) == list(range(30))
    assert flat(model.eval_batches["predict"]) == list(range(10))
    assert torch.cat(predictions).tolist() == list(range(10))


def test_size_aware_without_reloading_runs_every_epoch_to_its_end(tmp_path):
    sizes = {"train": np.arange(60) % 7 + 1}
    model = Recorder()
    with pytest.warns(UserWarning, match=r"pass Trainer\(reload_dataloaders_every_n_epochs=1\)"):
        trainer(tmp_path, max_epochs=3, limit_val_batches=0).fit(
            model, datamodule=module(sizeof=sizes, max_total_size=20)
        )
    assert all(flat(batches) == list(range(60)) for batches in epochs(model).values())
    assert len(epochs(model)) == 3


def test_resume_from_end_of_epoch_checkpoint_keeps_the_order(tmp_path):
    whole = Recorder()
    trainer(tmp_path / "a", max_epochs=3).fit(whole, datamodule=module(batch_size=8))
    first = Recorder()
    run = trainer(tmp_path / "b", max_epochs=2)
    run.fit(first, datamodule=module(batch_size=8))
    run.save_checkpoint(tmp_path / "epoch2.ckpt")
    resumed = Recorder()
    trainer(tmp_path / "c", max_epochs=3).fit(
        resumed, datamodule=module(batch_size=8), ckpt_path=tmp_path / "epoch2.ckpt"
    )
    assert epochs(resumed) == {2: epochs(whole)[2]}


def test_resume_from_mid_epoch_checkpoint_trains_each_batch_once(tmp_path):
    whole = Recorder()
    trainer(tmp_path / "a", max_epochs=1).fit(whole, datamodule=module(batch_size=4))
    crashing = Recorder(crash_at_step=5)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    run = trainer(tmp_path / "b", max_epochs=1, enable_checkpointing=True, callbacks=[checkpoints])
    with pytest.raises(Crash):
        run.fit(crashing, datamodule=module(batch_size=4))
    assert len(crashing.train_batches) == 5
    saved = sorted((tmp_path / "ckpt").glob("*step=3.ckpt"))
    assert saved, sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    resumed = Recorder()
    trainer(tmp_path / "c", max_epochs=1).fit(resumed, datamodule=module(batch_size=4), ckpt_path=saved[0])
    before = [batch for _, batch in crashing.train_batches[:3]]  # the steps the checkpoint covers
    after = [batch for _, batch in resumed.train_batches]
    assert before + after == epochs(whole)[0]


def test_data_module_arguments():
    with pytest.raises(ValueError, match="give batch_size, or sizeof and max_total_size"):
        FastDataModule(train=torch.arange(3))
    with pytest.raises(ValueError, match="max_total_size is needed with sizeof"):
        FastDataModule(train=torch.arange(3), sizeof={"train": [1, 1, 1]})
    with pytest.raises(ValueError, match=r"sizeof names unknown splits \['training'\]"):
        FastDataModule(train=torch.arange(3), sizeof={"training": [1, 1, 1]}, max_total_size=2)
    with pytest.raises(ValueError, match="device is chosen by the Lightning trainer"):
        FastDataModule(train=torch.arange(3), batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="FastDataModule has no test dataset"):
        FastDataModule(train=torch.arange(3), batch_size=2).test_dataloader()


class _Texts:
    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, ids):
        return [
            {"input_ids": torch.ones(int(self.lengths[i]), dtype=torch.long), "index": torch.tensor(i)} for i in ids
        ]


def test_data_module_gives_every_split_the_shapes_of_one_table():
    from fastsab import PadCollator, ShapeBuckets

    rng = np.random.default_rng(3)
    train, val = rng.integers(1, 100, 300), rng.integers(1, 100, 70)
    table = ShapeBuckets([40, 80, 100], batch_sizes=[50, 25, 16])
    sizes = {"train": train, "val": val}
    with pytest.raises(ValueError, match="max_total_size is needed with sizeof, unless buckets= is a ShapeBuckets"):
        FastDataModule(train=_Texts(train), sizeof=sizes, buckets=ShapeBuckets([40, 80, 100]))
    module = FastDataModule(train=_Texts(train), val=_Texts(val), sizeof=sizes, buckets=table, collate_fn=PadCollator())
    for split, lengths in sizes.items():
        batches = list(getattr(module, f"{split}_dataloader")())
        # invariant: every batch has one of the table's shapes, and every item of the split comes once
        assert {tuple(b["input_ids"].shape) for b in batches} <= {(50, 40), (25, 80), (16, 100)}
        real = [i for b in batches for i in b["index"][b["sample_mask"]].tolist()]
        assert sorted(real) == list(range(len(lengths)))


def test_data_module_refuses_a_dataloader_keyword_when_made():
    # refused at construction, not later when the trainer asks for a loader
    with pytest.raises(TypeError, match=r"FastLoader does not take DataLoader's keyword timeout \(got timeout=5\)"):
        FastDataModule(train=torch.arange(3), batch_size=2, timeout=5)
    sized = {"sizeof": {"train": [1, 1, 1]}, "max_total_size": 2}
    with pytest.raises(TypeError, match=r"FastSizeAwareLoader does not take DataLoader's keyword drop_last"):
        FastDataModule(train=torch.arange(3), drop_last=True, **sized)
    module = FastDataModule(train=torch.arange(3), batch_size=2, drop_last=True, prefetch=1)
    assert [batch.tolist() for batch in module.train_dataloader()] != []
    module = FastDataModule(train=torch.arange(3), batch_size=2, timeout=0, shuffle=False)  # DataLoader's default
    assert [batch.tolist() for batch in module.train_dataloader()] == [[0, 1], [2]]


def ddp_worker(tmp_path, *mode):
    """The standard output of ``lightning_ddp_worker.py`` (two gloo processes), which must succeed."""
    script = Path(__file__).with_name("lightning_ddp_worker.py")
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path), *mode],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=script.parents[2],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_two_process_ddp_with_lightning(tmp_path):
    out = ddp_worker(tmp_path)
    assert "DDP OK" in out, out[-2000:]


def training(module):
    """``module`` as a trainer in its training loop sees it (no trainer attached)."""
    attributes = {"training": True, "reload_dataloaders_every_n_epochs": 0, "global_rank": 0, "world_size": 1}
    module.trainer = type("Trainer", (), attributes)()
    return module


def consume(module, batches, count):
    """The training loop consumes ``count`` batches of ``batches`` (fetching one ahead, as Lightning does)."""
    taken = [next(batches)]
    for _ in range(count):
        taken.append(next(batches))
        module.on_before_batch_transfer(taken.pop(0), 0)


def test_data_module_state_counts_consumed_batches_not_those_fetched_ahead():
    module = training(FastDataModule(train=torch.arange(40), batch_size=4, seed=3))
    consume(module, iter(module.train_dataloader()), 3)
    assert module._loaders["train"].loader.state_dict()["steps"] == 4  # handed out
    assert module.state_dict()["train"]["steps"] == 3


def test_a_state_loaded_into_a_data_module_mid_epoch_is_saved_again_unchanged():
    # the count of the epoch iterated before the load is not the position of the loaded state
    ahead = training(FastDataModule(train=torch.arange(40), batch_size=4, seed=3))
    consume(ahead, iter(ahead.train_dataloader()), 5)
    saved = ahead.state_dict()
    module = training(FastDataModule(train=torch.arange(40), batch_size=4, seed=3))
    consume(module, iter(module.train_dataloader()), 3)
    module.load_state_dict(saved)
    assert module.state_dict() == saved
    rest = [batch.tolist() for batch in module.train_dataloader()]
    assert len(rest) == 10 - 5


def test_a_batch_to_retry_is_not_saved_as_consumed():
    module = training(FastDataModule(train=torch.arange(40), batch_size=4, shuffle=False))
    batches = iter(module.train_dataloader())
    seen = []
    for _ in range(3):
        batch = next(batches)
        module.on_before_batch_transfer(batch, 0)
        seen.append(batch.tolist())
    module._loaders["train"].loader.retry_last_batch(2)  # the third batch failed: it runs again in parts
    state = module.state_dict()
    assert state["train"]["steps"] == 2 and state["train"]["lowered"] == [[2, 2]]
    resumed = FastDataModule(train=torch.arange(40), batch_size=4, shuffle=False)
    resumed.load_state_dict(state)
    rest = [batch.tolist() for batch in resumed.train_dataloader()]
    assert rest[:2] == [[8, 9], [10, 11]]
    assert [i for batch in seen[:2] + rest for i in batch] == list(range(40))


def test_caps_of_another_number_than_the_cost_columns_are_refused_at_construction():
    sizes = {"train": np.ones((3, 2), dtype=np.int64)}
    with pytest.raises(ValueError, match=r"max_total_size has 3 caps but costs has 2 columns"):
        FastDataModule(train=torch.arange(3), sizeof=sizes, max_total_size=[4, 4, 4])
    assert FastDataModule(train=torch.arange(3), sizeof=sizes, max_total_size=4).max_total_size == 4


# -- bare loaders returned from train_dataloader(), under Lightning's own checkpointing --------------

SIZES = np.arange(60) % 7 + 1  # 60 items, budget 20: epochs of 13 or 14 batches, by seed


def size_aware(seed):
    return lambda: FastSizeAwareLoader(torch.arange(60), SIZES, 20, seed=seed)


def fixed():
    return FastLoader(torch.arange(60), 8, seed=5)


def epoch_lengths(make, epochs):
    loader = make()
    lengths = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        lengths.append(len(loader))
    return lengths


class BareRecorder(Recorder):
    """A module whose ``train_dataloader()`` builds a bare fastsab loader, for the trainer's epoch or not."""

    def __init__(self, make, crash_at_step=None, for_the_epoch=True):
        super().__init__(crash_at_step)
        self.make, self.for_the_epoch = make, for_the_epoch

    def train_dataloader(self):
        loader = self.make()
        if self.for_the_epoch:
            loader.set_epoch(self.trainer.current_epoch)
        return loader


def interrupted_and_resumed(tmp_path, make, crash_at_step, every, for_the_epoch=True, **options):
    """Per-step batches of an uninterrupted run, and of a run crashed, then resumed from its last checkpoint."""
    options = {"max_epochs": 3, "limit_val_batches": 0, **options}
    whole = BareRecorder(make, for_the_epoch=for_the_epoch)
    trainer(tmp_path / "whole", **options).fit(whole)
    crashing = BareRecorder(make, crash_at_step, for_the_epoch=for_the_epoch)
    saving = every if isinstance(every, dict) else {"every_n_train_steps": every}
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, **saving)
    run = trainer(tmp_path / "crash", enable_checkpointing=True, callbacks=[checkpoints], **options)
    with pytest.raises(Crash):
        run.fit(crashing)
    saved = max((tmp_path / "ckpt").glob("*.ckpt"), key=lambda path: int(path.stem.split("step=")[1]))
    step = int(saved.stem.split("step=")[1])
    resumed = BareRecorder(make, for_the_epoch=for_the_epoch)
    trainer(tmp_path / "resumed", **options).fit(resumed, ckpt_path=saved)
    return whole.train_batches, crashing.train_batches[:step] + resumed.train_batches


def test_bare_fast_loader_resumes_every_epoch_exactly(tmp_path):
    whole, resumed = interrupted_and_resumed(tmp_path, fixed, crash_at_step=12, every=5)
    assert len(whole) == 3 * 8
    assert resumed == whole  # the epoch interrupted at step 10 (of 8 per epoch), and the next, step by step


@pytest.mark.parametrize(
    ("seed", "reload", "for_the_epoch"),
    [
        (10, 0, True),  # 14, 13, 13 batches: shorter epochs end early, which Lightning handles
        (10, 1, False),  # a new loader each epoch, made at epoch 0: Lightning sets its epoch
        (5, 1, True),  # 13, 14, 13 batches: Lightning counts each epoch's length, as it reloads the loader
    ],
)
def test_bare_size_aware_loader_resumes_epochs_of_different_lengths(tmp_path, seed, reload, for_the_epoch):
    lengths = epoch_lengths(size_aware(seed), 3)
    assert lengths == {10: [14, 13, 13], 5: [13, 14, 13]}[seed]
    whole, resumed = interrupted_and_resumed(
        tmp_path,
        size_aware(seed),
        crash_at_step=22,
        every=4,
        for_the_epoch=for_the_epoch,
        reload_dataloaders_every_n_epochs=reload,
    )
    assert [len(batches) for batches in epochs_of(whole)] == lengths
    assert len({tuple(map(tuple, batches)) for batches in epochs_of(whole)}) == 3  # a new order each epoch
    assert resumed == whole  # resumed at step 20, in epoch 1


def epochs_of(batches):
    out: dict[int, list[list[int]]] = {}
    for epoch, batch in batches:
        out.setdefault(epoch, []).append(batch)
    return [out[epoch] for epoch in sorted(out)]


def loader_epochs(make, count):
    """The batches of ``count`` epochs of one loader iterated on its own."""
    loader = make()
    return [[batch.tolist() for batch in loader] for _ in range(count)]


@pytest.mark.parametrize("reload", [0, 2])
def test_a_bare_size_aware_loader_lightning_does_not_reload_every_epoch_runs_each_epoch_to_its_end(tmp_path, reload):
    # invariant: every epoch whole, also one longer than the length Lightning read (13, 14, 13, 14 batches)
    expected = loader_epochs(size_aware(5), 4)
    assert [len(batches) for batches in expected] == [13, 14, 13, 14]
    model = BareRecorder(size_aware(5))
    run = trainer(tmp_path, max_epochs=4, limit_val_batches=0, reload_dataloaders_every_n_epochs=reload)
    with pytest.warns(UserWarning, match=r"reports no length .*reload_dataloaders_every_n_epochs=1"):
        run.fit(model)
    assert epochs_of(model.train_batches) == expected


@pytest.mark.filterwarnings("ignore:FastSizeAwareLoader reports no length")
@pytest.mark.parametrize(
    ("every", "crash_at_step", "for_the_epoch"),
    [
        (4, 22, True),  # saved at step 20: mid epoch 1, which is longer than epoch 0
        (4, 22, False),  # the same, the loader left at epoch 0 when built: the state names epoch 1
        (13, 15, True),  # saved after epoch 0's last step
        (14, 16, True),  # saved after epoch 1's first step
        (27, 29, True),  # saved after epoch 1's last step (its 14th)
        ({"every_n_epochs": 1}, 15, True),  # saved at epoch 0's end: Lightning loads no state into the loader
        ({"every_n_epochs": 1}, 15, False),
    ],
)
def test_a_bare_size_aware_loader_lightning_does_not_reload_resumes_the_uninterrupted_steps(
    tmp_path, every, crash_at_step, for_the_epoch
):
    whole, resumed = interrupted_and_resumed(
        tmp_path, size_aware(5), crash_at_step=crash_at_step, every=every, for_the_epoch=for_the_epoch
    )
    assert [len(batches) for batches in epochs_of(whole)] == [13, 14, 13]
    assert resumed == whole


def test_a_resume_from_an_epochs_last_step_into_a_longer_reloaded_epoch_is_refused(tmp_path):
    # invariant: no batch is lost silently: resumed from a checkpoint after epoch 0's last step,
    # Lightning counts those 13 steps into epoch 1 of the loader it reloads, and would run 1 of its 14
    assert epoch_lengths(size_aware(5), 2) == [13, 14]
    options = {"max_epochs": 3, "limit_val_batches": 0, "reload_dataloaders_every_n_epochs": 1}
    crashing = BareRecorder(size_aware(5), crash_at_step=15)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=13, save_top_k=-1)
    with pytest.raises(Crash):
        trainer(tmp_path / "crash", enable_checkpointing=True, callbacks=[checkpoints], **options).fit(crashing)
    (saved,) = (tmp_path / "ckpt").glob("*step=13.ckpt")
    resumed = BareRecorder(size_aware(5))
    with pytest.raises(
        ValueError,
        match=r"epoch 1 has 14 steps, but the trainer resumed from a state saved after the last of epoch 0's 13 steps .*FastDataModule",
    ):
        trainer(tmp_path / "resumed", **options).fit(resumed, ckpt_path=saved)
    assert resumed.train_batches == []  # refused before any batch of epoch 1 ran


def test_a_loader_built_anew_each_epoch_gets_the_epoch_from_lightning(tmp_path):
    kept = BareRecorder(fixed)  # one loader: its epoch advances as it is iterated
    trainer(tmp_path / "kept", max_epochs=3, limit_val_batches=0).fit(kept)
    reloaded = BareRecorder(fixed, for_the_epoch=False)  # a new loader each epoch, at epoch 0 when made
    trainer(tmp_path / "reloaded", max_epochs=3, limit_val_batches=0, reload_dataloaders_every_n_epochs=1).fit(reloaded)
    assert reloaded.train_batches == kept.train_batches
    assert epochs_of(kept.train_batches)[0] != epochs_of(kept.train_batches)[1]


def test_the_sampler_does_not_make_the_loader_look_like_a_dataloader():
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled, has_iterable_dataset

    loader = fixed()
    assert not isinstance(loader.sampler, torch.utils.data.Sampler)
    assert not _is_dataloader_shuffled(loader) and not has_iterable_dataset(loader)
    loader.sampler.set_epoch(3)
    assert loader.epoch == 3


class Items(torch.utils.data.Dataset):
    """Read item by item (not gathered), so the loader fetches in its worker processes."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.tensor(index)


class CountsWorkers(Recorder):
    def training_step(self, batch, batch_idx):
        self.workers_seen = len(psutil.Process().children(recursive=True))
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
def test_data_module_shuts_its_worker_processes_down_after_fit(tmp_path):
    # NOTE: processes started before (multiprocessing's resource tracker, started once per run by
    # an earlier test's workers) are not this fit's
    before = set(psutil.Process().children(recursive=True))
    data = FastDataModule(train=Items(), val=Items(), batch_size=8, num_workers=2, persistent_workers=True)
    model = CountsWorkers()
    trainer(tmp_path, max_epochs=2).fit(model, datamodule=data)
    assert model.workers_seen >= len(before) + 2  # the training loader's workers, while it ran
    assert flat(epochs(model)[1]) == list(range(40))
    # NOTE: a worker slower than DataLoader's join (5 s, on a loaded machine) is terminated, and may
    # be reaped a moment later; a worker left running would still be alive after the wait
    started = [process for process in psutil.Process().children(recursive=True) if process not in before]
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == []


@pytest.mark.slow
def test_the_lightning_docs_page_runs_and_shows_what_it_promises(tmp_path):
    script = tmp_path / "page.py"
    script.write_text(page_script("trainers/lightning.md"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reports no length to this Lightning trainer" in out.stdout
    assert out.stdout.count("[13, 14, 13]") == 2


@pytest.mark.slow
def test_bare_size_aware_loader_under_two_process_ddp_resumes_every_rank_exactly(tmp_path):
    # epochs of 14, 13 and 13 steps per rank, crashed at step 22 and resumed from step 20
    out = ddp_worker(tmp_path, "bare")
    assert "BARE DDP OK" in out, out[-2000:]


@pytest.mark.slow
def test_data_module_resumed_on_fewer_devices_trains_each_sample_of_the_epoch_once(tmp_path):
    # 2 processes crash at step 10 of epoch 0; 1 process resumes from step 8: it counts the
    # 8 steps run and runs the rest of the epoch, then epoch 1 as one process runs it
    out = ddp_worker(tmp_path, "resized")
    assert "RESIZED OK" in out, out[-2000:]


@pytest.mark.parametrize("step", [13, 20])  # epoch 0's last step (of 13; epoch 1 has 14), and mid-epoch 1
def test_data_module_resumed_from_a_step_checkpoint_with_reloading_runs_the_uninterrupted_steps(tmp_path, step):
    def data():
        return FastDataModule(train=torch.arange(60), sizeof={"train": SIZES}, max_total_size=20, seed=5)

    options = {"max_epochs": 3, "limit_val_batches": 0, "reload_dataloaders_every_n_epochs": 1}
    whole = Recorder()
    trainer(tmp_path / "whole", **options).fit(whole, datamodule=data())
    assert [len(batches) for batches in epochs_of(whole.train_batches)] == [13, 14, 13]
    crashing, saved = crash_after_checkpoint(tmp_path, step, data, options)
    resumed = Recorder()
    trainer(tmp_path / "resumed", **options).fit(resumed, datamodule=data(), ckpt_path=saved)
    assert crashing.train_batches[:step] + resumed.train_batches == whole.train_batches


def crash_after_checkpoint(tmp_path, step, data, options):
    """A fit of ``data()`` that saves a checkpoint at ``step`` and crashes at the next: its recorder, the checkpoint."""
    crashing = Recorder(crash_at_step=step + 1)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=step, save_top_k=-1)
    with pytest.raises(Crash):
        trainer(tmp_path / "crash", enable_checkpointing=True, callbacks=[checkpoints], **options).fit(
            crashing, datamodule=data()
        )
    (saved,) = (tmp_path / "ckpt").glob(f"*step={step}.ckpt")
    return crashing, saved


@pytest.mark.parametrize("every", [{"every_n_train_steps": 13}, {"every_n_epochs": 1}])
def test_data_module_without_reloading_resumed_at_the_end_of_the_first_epoch_goes_on_with_the_next(tmp_path, every):
    # without a length, Lightning fetches epoch 0's first batch before it sets epoch 0
    def data():
        return FastDataModule(train=torch.arange(60), sizeof={"train": SIZES}, max_total_size=20, seed=5)

    options = {"max_epochs": 3, "limit_val_batches": 0}
    whole = Recorder()
    trainer(tmp_path / "whole", **options).fit(whole, datamodule=data())
    crashing = Recorder(crash_at_step=14)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, **every)
    with pytest.raises(Crash):
        trainer(tmp_path / "crash", enable_checkpointing=True, callbacks=[checkpoints], **options).fit(
            crashing, datamodule=data()
        )
    (saved,) = (tmp_path / "ckpt").glob("*step=13.ckpt")
    resumed = Recorder()
    trainer(tmp_path / "resumed", **options).fit(resumed, datamodule=data(), ckpt_path=saved)
    assert crashing.train_batches[:13] + resumed.train_batches == whole.train_batches


@pytest.mark.parametrize("reload", [0, 1])
def test_bare_bucket_loader_resumes_every_epoch_exactly(tmp_path, reload):
    def buckets():
        return FastSizeAwareLoader(torch.arange(60), SIZES, 20, buckets=[3, 7], partial="keep", seed=4)

    whole, resumed = interrupted_and_resumed(
        tmp_path, buckets, crash_at_step=30, every=7, reload_dataloaders_every_n_epochs=reload
    )
    # invariant: each epoch's batches hold every item once in at most 2 bucket shapes (and 2 kept last batches)
    for batches in epochs_of(whole):
        assert sorted(i for batch in batches for i in batch) == list(range(60))
        assert all(max(SIZES[batch]) <= (3 if len(batch) > 2 else 7) for batch in batches)
    assert resumed == whole  # 22 steps an epoch: resumed at step 28, in the second epoch, step by step


@pytest.mark.filterwarnings("ignore:FastSizeAwareLoader reports no length")
@pytest.mark.parametrize("option", [{"limit_train_batches": 0.5}, {"val_check_interval": 0.5}])
def test_a_bare_size_aware_loader_without_reloading_refuses_a_fraction_of_an_epoch_before_any_step(tmp_path, option):
    # a fraction of a length the loader does not report: refused with the remedy, not as an IterableDataset's
    model = BareRecorder(size_aware(10))
    run = trainer(tmp_path, max_epochs=2, limit_val_batches=0, **option)
    name, value = next(iter(option.items()))
    with pytest.raises(ValueError, match=rf"Trainer\({name}={value}\) .*reload_dataloaders_every_n_epochs=1"):
        run.fit(model)
    assert model.train_batches == []
