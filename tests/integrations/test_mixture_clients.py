"""A ``Mixture`` in the trainers' own loops: fits stopped, resumed and compared sample by sample.

Every batch holds the values of its items, which name them: ``web``'s item ``i`` is ``i``, ``code``'s
is ``1000 + i``; each step's batch is compared as ``(source, index)`` pairs with the uninterrupted
run's and with what the loader alone gives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader, Mixture
from fastsab.integrations.lightning import FastDataModule
from tests.integrations.test_lightning import (
    BareRecorder,
    Recorder,
    crash_after_checkpoint,
    epochs_of,
    interrupted_and_resumed,
    trainer,
)

CODE = 1000  # code's item i is the value CODE + i
SIZES = {"web": np.arange(40) % 7 + 1, "code": np.arange(12) % 5 + 3}  # budget 20


def mixture(stop: object = "last", web: int = 40, code: int = 12, weights: object = None) -> Mixture:
    """``web`` and ``code`` items; with ``stop="last"`` code (the smaller) is upsampled in every epoch."""
    return Mixture(
        {"web": torch.arange(web), "code": torch.arange(CODE, CODE + code)},
        weights=weights or {"web": 0.6, "code": 0.4},
        stop=stop,
    )


def located(values: list[int]) -> list[tuple[str, int]]:
    """The ``(source, index)`` of each value of a batch."""
    return [("code", value - CODE) if value >= CODE else ("web", value) for value in values]


def steps(batches: list[tuple[int, list[int]]]) -> list[tuple[int, list[tuple[str, int]]]]:
    """Per step: the epoch, and the batch's ``(source, index)`` pairs."""
    return [(epoch, located(batch)) for epoch, batch in batches]


def alone(loader: FastLoader | FastSizeAwareLoader, epochs: int) -> list[list[list[int]]]:
    """The batches of ``epochs`` epochs of ``loader`` iterated on its own."""
    return [[batch.tolist() for batch in loader] for _ in range(epochs)]


def sized_module(stop: str) -> FastDataModule:
    return FastDataModule(train=mixture(stop), sizeof={"train": SIZES}, max_total_size=20, seed=5)


# -- Lightning ----------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:the training loader's epochs differ")
@pytest.mark.parametrize(
    ("stop", "reload", "step"),
    [
        ("last", 1, 20),  # mid epoch 1 (epochs of 15, 14 and 15 steps)
        ("last", 1, 15),  # epoch 0's last step: epoch 1 is shorter
        ("last", 1, 29),  # epoch 1's last step: epoch 2 is longer
        ("last", 0, 20),
        ("last", 0, 29),
        ("first", 1, 12),  # epochs of 9, 8 and 8 steps: mid epoch 1
    ],
)
def test_a_data_module_fit_over_a_mixture_resumed_from_a_step_checkpoint_runs_the_uninterrupted_steps(
    tmp_path, stop, reload, step
):
    options = {"max_epochs": 3, "limit_val_batches": 0, "reload_dataloaders_every_n_epochs": reload}
    whole = Recorder()
    trainer(tmp_path / "whole", **options).fit(whole, datamodule=sized_module(stop))
    expected = alone(FastSizeAwareLoader(mixture(stop), SIZES, 20, seed=5), 3)
    # invariant: the uninterrupted fit trains the loader's own epochs, each whole
    assert epochs_of(whole.train_batches) == expected
    assert [len(batches) for batches in expected] == {"last": [15, 14, 15], "first": [9, 8, 8]}[stop]
    if stop == "last":  # code's 12 items come more than once in every epoch: upsampled
        for batches in expected:
            assert sum(source == "code" for batch in batches for source, _ in located(batch)) > 12
    crashing, saved = crash_after_checkpoint(tmp_path, step, lambda: sized_module(stop), options)
    resumed = Recorder()
    trainer(tmp_path / "resumed", **options).fit(resumed, datamodule=sized_module(stop), ckpt_path=saved)
    # invariant: stopped + resumed in a new Trainer == uninterrupted, step by step, (source, index) by pair
    assert steps(crashing.train_batches[:step] + resumed.train_batches) == steps(whole.train_batches)


@pytest.mark.filterwarnings("ignore:FastSizeAwareLoader reports no length")
@pytest.mark.parametrize(("reload", "crash_at_step"), [(0, 22), (1, 22), (0, 16), (1, 32)])
def test_a_bare_mixture_loader_resumed_from_lightnings_checkpoint_runs_the_uninterrupted_steps(
    tmp_path, reload, crash_at_step
):
    # saved every 5 steps: at step 20 (mid epoch 1), 15 (epoch 0's last) or 30 (epoch 2's first)
    def make() -> FastSizeAwareLoader:
        return FastSizeAwareLoader(mixture(), SIZES, 20, seed=5)

    whole, resumed = interrupted_and_resumed(
        tmp_path, make, crash_at_step=crash_at_step, every=5, reload_dataloaders_every_n_epochs=reload
    )
    assert epochs_of(whole) == alone(make(), 3)
    assert steps(resumed) == steps(whole)


def by_items() -> Mixture:
    """A mixture whose epochs differ in items: 6, 7 and 6 batches of 4."""
    return mixture(web=17, code=7, weights={"web": 0.7, "code": 0.3})


@pytest.mark.filterwarnings("ignore:the training loader's epochs differ", "ignore:FastLoader reports no length")
@pytest.mark.parametrize("reload", [0, 1])
@pytest.mark.parametrize("bare", [False, True])
def test_a_fast_loader_over_a_mixture_runs_each_epoch_to_its_end_under_lightning(tmp_path, reload, bare):
    # invariant: without a reload every epoch, Lightning would stop a longer epoch after the length it
    # read first: a mixture's epochs differ in length also when batches count items
    expected = alone(FastLoader(by_items(), 4, seed=0), 3)
    assert [len(batches) for batches in expected] == [6, 7, 11]
    options = {"max_epochs": 3, "limit_val_batches": 0, "reload_dataloaders_every_n_epochs": reload}
    if bare:
        model = BareRecorder(lambda: FastLoader(by_items(), 4, seed=0))
        trainer(tmp_path, **options).fit(model)
    else:
        model = Recorder()
        trainer(tmp_path, **options).fit(model, datamodule=FastDataModule(train=by_items(), batch_size=4, seed=0))
    assert epochs_of(model.train_batches) == expected


@pytest.mark.filterwarnings("error:the training loader's epochs differ")
def test_a_mixture_whose_epochs_end_at_a_number_of_items_keeps_its_length_under_lightning(tmp_path):
    loader = FastLoader(mixture(stop={"items": 22}), 4, seed=0)
    assert loader.equal_epochs and not FastLoader(by_items(), 4).equal_epochs
    model = Recorder()
    data = FastDataModule(train=mixture(stop={"items": 22}), batch_size=4, seed=0)
    trainer(tmp_path, max_epochs=3, limit_val_batches=0).fit(model, datamodule=data)
    assert epochs_of(model.train_batches) == alone(loader, 3)
    assert len(data.train_dataloader()) == 6  # a length Lightning keeps for every epoch
