"""Batch memory models: fitted on whole batches, a fixed part once per batch, relative margins."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader
from fastsab.memory import BatchMemoryModel, calibration_batches, fit_batch_memory, fit_report, measure_batches
from tests.memory.test_measure import FakeCudaAllocator, MiB


def _sum_batches(seed: int = 0, count: int = 40) -> tuple[list[np.ndarray], list[float]]:
    """Graphs joined into one: peak = 5000 + sum(3 * nodes + 2 * edges + 0.01 * nodes**2), plus noise."""
    rng = np.random.default_rng(seed)
    batches, peaks = [], []
    for _ in range(count):
        nodes = rng.integers(10, 300, size=rng.integers(1, 9))
        rows = np.stack([nodes, nodes * rng.integers(2, 8, size=len(nodes))], axis=1)
        exact = 5000 + float((3 * rows[:, 0] + 2 * rows[:, 1] + 0.01 * rows[:, 0] ** 2).sum())
        batches.append(rows)
        peaks.append(exact * (1 + 0.03 * rng.random()))
    return batches, peaks


def _padded_batches(seed: int = 0, count: int = 40) -> tuple[list[np.ndarray], list[float]]:
    """Images padded to the batch's largest height and width: peak = 8000 + len * 12 * H * W."""
    rng = np.random.default_rng(seed)
    batches, peaks = [], []
    for _ in range(count):
        rows = rng.integers(8, 64, size=(rng.integers(1, 8), 2))
        top = rows.max(axis=0)
        batches.append(rows)
        peaks.append(8000 + len(rows) * 12.0 * top[0] * top[1])
    return batches, peaks


def test_fixed_part_is_told_apart_from_the_per_item_part() -> None:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    model = fit_batch_memory(batches, [1000 + 5.0 * sum(batch) for batch in batches], degree=1, held_out=0)
    assert model.fixed == pytest.approx(1000, rel=1e-6)
    assert float(model.per_item(torch.tensor([10.0]))) == pytest.approx(50, rel=1e-6)
    assert model.margin < 1e-6


def test_padded_fit_pads_every_feature() -> None:
    batches, peaks = _padded_batches()
    model = fit_batch_memory(batches, peaks, cost="padded", degree=2)
    assert model.fixed == pytest.approx(8000, rel=1e-3)
    assert model.report is not None and model.report.worst_under_prediction <= 1e-6
    assert model.report.mean_utilization == pytest.approx(1.0, abs=1e-3)
    # a batch of a tall and a wide image costs its padded square
    assert model.predict([[[8, 60], [60, 8]]])[0] == pytest.approx(8000 + 2 * 12 * 60 * 60, rel=1e-3)


def test_margin_is_relative_and_covers_every_fitted_batch() -> None:
    batches, peaks = _sum_batches()
    model = fit_batch_memory(batches, peaks, degree=2)
    assert 0 < model.margin < 0.05
    assert model.fit.worst_under_prediction <= 0 and model.fit.worst_under_prediction_bytes <= 0
    assert model.fit.mean_utilization > 0.95
    assert model.report is not None and model.report.num_batches == 10
    # the per-item part never decreases with a feature (non-negative coefficients over features >= 0)
    assert (model.per_item.coefficients >= 0).all()


def test_fit_report_on_other_batches() -> None:
    batches, peaks = _sum_batches(seed=1)
    model = fit_batch_memory(batches, peaks, held_out=0)
    report = fit_report(model, batches[:5], np.array(peaks[:5]) * 2)
    assert report.num_batches == 5 and report.worst_under_prediction > 0.5 and report.mean_utilization > 1.5


def test_loader_options_keep_every_batch_within_the_budget() -> None:
    batches, peaks = _padded_batches(seed=2)
    model = fit_batch_memory(batches, peaks, cost="padded")
    features = np.random.default_rng(3).integers(8, 64, size=(300, 2))
    budget = 200_000.0
    options = model.loader_options(budget)
    assert options["fixed_cost"] == model.fixed and options["padding"] == "features"
    loader = FastSizeAwareLoader(torch.arange(300), features=features, **options)
    planned = [batch.numpy() for batch in loader]
    assert sorted(np.concatenate(planned).tolist()) == list(range(300))
    predicted = model.predict([features[batch] for batch in planned])
    assert (predicted <= budget).all() and predicted.mean() > 0.7 * budget


def test_measure_batches_on_the_cpu() -> None:
    def work(batch: list[int]) -> None:
        torch.zeros(sum(batch), 256, dtype=torch.float32).add_(1)  # 1 KiB per unit of feature

    batches = [[n] * b for n in (64, 128, 256) for b in (1, 2, 3)]
    peaks = measure_batches(work, batches)
    # (a few bytes of bookkeeping besides the tensor)
    assert all(0 <= peak - 1024 * sum(batch) <= 64 for peak, batch in zip(peaks, batches))
    model = fit_batch_memory(batches, peaks, degree=1, held_out=0)
    assert model.predict([[100, 100]])[0] == pytest.approx(200 * 1024, rel=1e-3)


def test_measure_batches_with_the_cuda_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCudaAllocator(capacity=100 * MiB)
    for name in ("reset_peak_memory_stats", "memory_allocated", "memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    weights = fake.alloc(10 * MiB)  # held before every batch: not part of any batch's peak
    workspace = MiB  # a step's fixed temporaries

    def work(batch: list[int]) -> None:
        fixed = fake.alloc(workspace)
        activations = [fake.alloc(n * 1024) for n in batch]
        del fixed, activations

    batches = [[n] * b for n in (100, 200, 400) for b in (1, 2, 4)]
    peaks = measure_batches(work, batches, device="cuda")
    assert peaks == [workspace + 1024 * sum(batch) for batch in batches]
    model = fit_batch_memory(batches, peaks, degree=1, held_out=0)
    assert model.fixed == pytest.approx(workspace, rel=1e-6)
    assert fake.allocated == weights.nbytes
    with pytest.raises(RuntimeError, match=r"batches \[0\] ran out of memory while measuring"):
        measure_batches(lambda batch: fake.alloc(200 * MiB), [[1]], device="cuda")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"peaks": [1.0]}, ValueError, r"batches and peaks must have the same length, got 9 and 1\."),
        ({"held_out": 1.0}, ValueError, r"held_out must be a number in \[0, 1\), got 1\.0\."),
        ({"cost": "max"}, ValueError, r"cost must be one of 'sum', 'padded', got 'max'\."),
        ({"degree": -1}, ValueError, r"degree must be a non-negative integer, got -1\."),
        ({"peaks": [1.0] * 8 + [-1.0]}, ValueError, r"peaks must be >= 0, got -1\.0 at position 8: a peak is "),
        ({"batches": [[1]] * 8 + [[]]}, ValueError, r"batches\[8\] must hold at least one item, got an empty batch\."),
        ({"batches": [[1]] * 8 + [["a"]]}, TypeError, r"batches\[8\]"),
        ({"degree": 7}, ValueError, r"fitting 9 coefficients needs at least that many batches to fit, got 8"),
    ],
)
def test_fit_refuses_bad_input(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments: dict[str, Any] = {"batches": [[n] * b for n in (1, 2, 3) for b in (1, 2, 3)], "peaks": [1.0] * 9}
    arguments.update(held_out=0.2)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        fit_batch_memory(arguments.pop("batches"), arguments.pop("peaks"), **arguments)


def test_loader_options_refuse_a_budget_below_the_fixed_cost() -> None:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    model = fit_batch_memory(batches, [1000 + 5.0 * sum(batch) for batch in batches], degree=1, held_out=0)
    with pytest.raises(ValueError, match=r"budget must exceed the model's fixed cost per batch \(1000\), got 500\."):
        model.loader_options(500)
    with pytest.raises(ValueError, match=r"budget must be a finite number, got inf\."):
        model.loader_options(float("inf"))


@pytest.mark.parametrize("budget", [np.int64(2000), np.float32(2000), torch.tensor(2000), np.array(2000.0)])
def test_loader_options_take_a_numpy_or_torch_budget(budget: object) -> None:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    model = fit_batch_memory(batches, [1000 + 5.0 * sum(batch) for batch in batches], degree=1, held_out=0)
    options = model.loader_options(budget)  # type: ignore[arg-type]
    assert options["max_total_size"] == 2000 and type(options["max_total_size"]) in (int, float)
    assert options == model.loader_options(2000)


def test_loader_options_refuse_a_budget_that_is_no_number() -> None:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    model = fit_batch_memory(batches, [1000 + 5.0 * sum(batch) for batch in batches], degree=1, held_out=0)
    with pytest.raises(TypeError, match=r"budget must be a real number, got '2000' of type str\."):
        model.loader_options("2000")  # type: ignore[arg-type]


@pytest.mark.parametrize("cost", ["sum", "padded"])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_loader_takes_the_n_by_1_features_the_model_was_fitted_on(cost: str, as_tensor: bool) -> None:
    rng = np.random.default_rng(4)
    batches = [rng.integers(10, 100, size=(k, 1)) for k in (1, 2, 3, 4, 5, 6, 7, 8) * 2]
    peaks = [1000 + 5.0 * (len(b) * b.max() if cost == "padded" else b.sum()) for b in batches]
    model = fit_batch_memory(batches, peaks, cost=cost, degree=1)  # type: ignore[arg-type]
    column = rng.integers(10, 100, size=(200, 1))
    rows = torch.from_numpy(column) if as_tensor else column
    options = model.loader_options(4000)
    planned = [b.tolist() for b in FastSizeAwareLoader(torch.arange(200), features=rows, **options)]
    flat = [b.tolist() for b in FastSizeAwareLoader(torch.arange(200), features=column[:, 0], **options)]
    # the (n, 1) rows plan exactly the batches of the same features given 1-D
    assert planned == flat
    assert sorted(i for batch in planned for i in batch) == list(range(200))
    assert (model.predict([column[batch] for batch in planned]) <= 4000).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_low_precision_features_and_peaks_fit_as_float32_ones(dtype: torch.dtype, cost: str) -> None:
    batches, peaks = _padded_batches(seed=5)
    # peaks in KiB (multiples of 8 below 2048: exact in both dtypes), features below 256 (exact too)
    kib = [float(8 * round(p / 8192)) for p in peaks]
    reference = fit_batch_memory(
        [torch.tensor(b, dtype=torch.float32) for b in batches], torch.tensor(kib), cost=cost, degree=2
    )  # type: ignore[arg-type]
    model = fit_batch_memory(
        [torch.tensor(b, dtype=dtype) for b in batches], torch.tensor(kib, dtype=dtype), cost=cost, degree=2
    )  # type: ignore[arg-type]
    assert model.to_json() == reference.to_json()
    features = torch.tensor(np.random.default_rng(6).integers(8, 64, size=(100, 2)), dtype=dtype)
    options = model.loader_options(200)
    planned = [b.tolist() for b in FastSizeAwareLoader(torch.arange(100), features=features, **options)]
    assert planned == [b.tolist() for b in FastSizeAwareLoader(torch.arange(100), features=features.float(), **options)]
    measured = measure_batches(lambda rows: torch.zeros(int(rows.sum()), 256), [features[b] for b in planned[:3]])
    assert measured == [1024 * int(features[b].sum()) for b in planned[:3]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_model_handed_to_the_loader_covers_every_measured_batch(seed: int) -> None:
    batches, peaks = _sum_batches(seed=seed)
    model = fit_batch_memory(batches, peaks)  # a quarter held back to estimate the fit's error
    # the held-back batches are measured too: the model covers them as well as the fitted ones
    assert (model.predict(batches) >= np.array(peaks)).all()
    assert model.fit.num_batches == 40 and model.fit.worst_under_prediction <= 0
    assert model.report is not None and model.report.num_batches == 10
    # what the loader charges a measured batch is what the model predicts for it
    options = model.loader_options(1e9)
    charged = [options["fixed_cost"] + float(options["sizeof"](torch.from_numpy(b).double()).sum()) for b in batches]
    assert np.allclose(charged, model.predict(batches), rtol=1e-12)


def _exact_model() -> tuple[Any, list[list[int]], list[float]]:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    peaks = [1000 + 5.0 * sum(batch) for batch in batches]
    return fit_batch_memory(batches, peaks, degree=1, held_out=0), batches, peaks


def test_report_says_there_is_nothing_to_do_when_every_batch_is_covered() -> None:
    model, batches, peaks = _exact_model()
    assert fit_report(model, batches, peaks).advice == (
        "The model covers every one of the 9 batches (they used 100% of its prediction on average); nothing to do."
    )
    assert model.advice == model.fit.advice
    # a model whose held-back batches call for no action speaks of every batch measured
    batches, peaks = _sum_batches()
    held = fit_batch_memory(batches, peaks)
    assert held.report is not None and not held.report.calls_for_action
    assert held.advice == held.fit.advice and held.advice.startswith("The model covers every one of the 40 batches")


def test_model_advice_is_the_held_back_batches_where_they_call_for_action() -> None:
    batches, peaks = _sum_batches(seed=3)  # a held-back batch is under-predicted by the fit without it
    model = fit_batch_memory(batches, peaks)
    assert model.report is not None and model.report.calls_for_action
    held_back = model.report.num_batches
    assert model.advice == f"Of the {held_back} batches held back from a first fit: {model.report.advice}"
    worst = model.report.worst_batch  # its position among every batch measured
    items = len(batches[worst])
    assert model.report.advice.startswith(f"Batch {worst} ({items} item{'' if items == 1 else 's'}) used 0.8% more")


def test_report_names_the_under_predicted_batch_and_what_to_do() -> None:
    model, batches, peaks = _exact_model()
    peaks = list(peaks)
    peaks[4] *= 1.12  # batch 4: two items of 20
    report = fit_report(model, batches, peaks)
    assert report.worst_batch == 4 and report.worst_batch_items == 2
    assert report.advice == (
        "Batch 4 (2 items) used 12.0% more than the model predicts, so batches like it can exceed the budget: "
        "measure more batches like it and fit on all the batches measured, or plan under a budget 10.7% lower "
        "(model.loader_options(budget / 1.12))."
    )


def test_report_of_a_badly_fitted_model_says_to_act() -> None:
    # mean use above 1 with a batch far above its prediction: the alarming report users saw
    model, batches, peaks = _exact_model()
    report = fit_report(model, batches[:3], [peaks[0] * 1.645, peaks[1], peaks[2] * 0.97])
    assert report.mean_utilization > 1.09 and report.worst_under_prediction == pytest.approx(0.645)
    assert report.advice.startswith("Batch 0 (1 item) used 64.5% more than the model predicts")


def test_report_says_when_batches_would_fill_little_of_the_budget() -> None:
    model, batches, peaks = _exact_model()
    report = fit_report(model, batches, [p / 2 for p in peaks])
    assert report.advice == (
        "The model covers every one of the 9 batches, but they used 50% of its prediction on average, so planned "
        "batches would fill about 50% of the budget: to fill more, fit it on batches like the planned ones "
        "(calibration_batches) or try another degree or cost."
    )


_SHAPES = [[n] * b for n in (1, 2, 3) for b in (1, 2, 3)]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("cost", ["sum", "padded"])
@pytest.mark.parametrize("held_out", [0, 0.25])
def test_fit_refuses_peaks_that_are_all_zero(cost: str, held_out: float) -> None:
    # a step the collector does not see (on another device than the one measured) peaks at 0
    with pytest.raises(
        ValueError,
        match=r"peaks must not all be 0, got 9 peaks of 0: the collector saw no memory used by any batch, as it "
        r"does for a step that runs on another device than the one measured \(the CPU profiler for a step on a "
        r"GPU\) or allocates outside torch; measure on the device where the step runs \(measure_batches\(work, "
        r"batches, device='cuda'\)\) or check the collector\.",
    ):
        fit_batch_memory(_SHAPES, [0] * 9, cost=cost, held_out=held_out)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    ("peaks", "seen"),
    [
        ([4096.0] * 9, r"all 9 equal to 4096\.0"),  # the memory held around the step, not the step's
        ([300.0 - 10 * sum(shape) for shape in _SHAPES], r"from 210\.0 to 290\.0"),  # falling as batches grow
        ([5000.0] + [0.0] * 8, r"from 0\.0 to 5000\.0"),  # one batch of one item used memory, no other did
    ],
)
def test_fit_refuses_peaks_that_do_not_grow_with_the_items(peaks: list[float], seen: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"peaks must grow with the batches' items, got peaks {seen}, which the fit explains by a cost per "
        r"batch \(\d+\) and nothing per item, so a budget would not bound a batch's items: ",
    ):
        fit_batch_memory(_SHAPES, peaks, degree=1, held_out=0)


@pytest.mark.filterwarnings("error")
def test_a_single_nonzero_peak_that_grows_with_the_items_is_fitted_and_the_advice_says_to_act() -> None:
    # zeros with one batch of many large items above them: the fit charges per item and covers
    # that batch, and the batches that used nothing say how little of the budget would be used
    peaks = [0.0] * 8 + [5000.0]
    model = fit_batch_memory(_SHAPES, peaks, degree=2, held_out=0)
    assert float(model.per_item(torch.tensor([3.0]))) > 0 and model.predict([[3, 3, 3]])[0] >= 5000
    assert model.fit.calls_for_action and model.advice.startswith("The model covers every one of the 9 batches, but")


def _item_free(model: BatchMemoryModel) -> BatchMemoryModel:
    """``model`` charging nothing per item (as one saved from a fit of peaks that did not grow)."""
    free = BatchMemoryModel.from_json(model.to_json())
    free.per_item.coefficients.zero_()
    return dataclasses.replace(free, fixed=1000.0)


def test_loader_options_refuse_a_model_that_charges_nothing_per_item() -> None:
    model, _, _ = _exact_model()
    free = _item_free(model)
    message = (
        r"model charges nothing per item \(its per_item predicts 0 for every item; 1000 per batch\), so "
        r"budget=2000 would not bound a batch's items: fit it with fit_batch_memory on peaks measured where the "
        r"step runs\."
    )
    with pytest.raises(ValueError, match=message):
        free.loader_options(2000)
    # and so do calibration batches planned by it
    with pytest.raises(ValueError, match=message):
        calibration_batches(np.arange(1, 50), 2000, free)
    # an offset alone is a cost per item
    free.per_item.offset.fill_(1.0)
    assert free.loader_options(2000)["fixed_cost"] == 1000.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.0, 1.0, 64.0, 4096.0, 1e6]), min_size=9, max_size=9),
    st.sampled_from(["sum", "padded"]),
    st.sampled_from([0, 0.25]),
)
@pytest.mark.filterwarnings("error")
def test_a_fitted_model_charges_for_items_and_covers_every_batch(
    peaks: list[float], cost: str, held_out: float
) -> None:
    # invariant: a fit either refuses the peaks with a ValueError or hands on a model that charges
    # for items, covers every measured batch and reports no NaN
    try:
        model = fit_batch_memory(_SHAPES, peaks, cost=cost, degree=1, held_out=held_out)  # type: ignore[arg-type]
    except ValueError as error:
        assert str(error).startswith(("peaks must not all be 0", "peaks must grow with", "the fit predicts nothing"))
        return
    assert float(model.per_item(torch.tensor([1.0]))) > 0
    assert (model.predict(_SHAPES) >= np.array(peaks)).all()
    for report in (model.fit, model.report):
        if report is not None:
            numbers = dataclasses.astuple(report)
            assert not any(isinstance(value, float) and np.isnan(value) for value in numbers)
    assert "nan" not in model.advice
    assert model.loader_options(2e6)["sizeof"] is model.per_item
