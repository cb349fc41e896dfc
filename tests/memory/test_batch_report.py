"""Batch fit reports: every batch compared, those a model predicts nothing for included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.memory import BatchMemoryModel, fit_batch_memory, fit_report


def _no_fixed_cost_model() -> BatchMemoryModel:
    """A model with no fixed cost and 5 bytes per unit of feature: it predicts 0 for empty items."""
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
    model = fit_batch_memory(batches, [5.0 * sum(batch) for batch in batches], degree=1, held_out=0)
    assert model.fixed == 0 and model.predict([[0], [0, 0]]).tolist() == [0.0, 0.0]
    return model


@pytest.mark.filterwarnings("error")
def test_a_batch_predicted_nothing_that_used_memory_is_an_unbounded_under_prediction() -> None:
    model = _no_fixed_cost_model()
    report = fit_report(model, [[0]], [64])  # a batch of an empty item that used 64 bytes
    assert report.worst_under_prediction == math.inf and report.worst_under_prediction_bytes == 64
    assert report.mean_utilization == math.inf and report.min_utilization == math.inf
    assert report.worst_batch == 0 and report.worst_batch_items == 1 and report.calls_for_action
    assert report.advice == (
        "Batch 0 (1 item) used memory where the model predicts none (no fixed cost, nothing for its items), so no "
        "budget covers batches like it: measure more batches like it and fit on all the batches measured, so that "
        "the model charges for them (a lower budget does not help)."
    )


@pytest.mark.filterwarnings("error")
def test_the_unbounded_batch_is_reported_among_covered_ones() -> None:
    model = _no_fixed_cost_model()
    # batch 2 (two empty items, 200 bytes) is worse than batch 1 (one, 64 bytes); batch 0 is covered
    report = fit_report(model, [[10], [0], [0, 0], [20]], [50, 64, 200, 100])
    assert report.worst_batch == 2 and report.worst_batch_items == 2
    assert report.worst_under_prediction == math.inf and report.worst_under_prediction_bytes == 200
    assert report.min_utilization == pytest.approx(1.0) and report.mean_utilization == math.inf
    assert report.advice.startswith("Batch 2 (2 items) used memory where the model predicts none")


@pytest.mark.filterwarnings("error")
def test_a_batch_predicted_nothing_that_used_nothing_is_predicted_exactly() -> None:
    model = _no_fixed_cost_model()
    report = fit_report(model, [[0], [10]], [0, 50])
    assert report.worst_under_prediction == pytest.approx(0.0, abs=1e-6) and report.worst_under_prediction_bytes <= 0
    assert report.mean_utilization == pytest.approx(1.0) and report.min_utilization == pytest.approx(1.0)
    assert report.advice == (
        "The model covers every one of the 2 batches (they used 100% of its prediction on average); nothing to do."
    )


@pytest.mark.filterwarnings("error")
def test_model_advice_names_a_held_back_batch_the_first_fit_predicts_nothing_for() -> None:
    batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)] + [[0]]
    peaks = [5.0 * sum(batch) for batch in batches[:-1]] + [64.0]
    model = fit_batch_memory(batches, peaks, degree=1, held_out=0.2, seed=3)  # the batch of an empty item held back
    assert model.report is not None and model.report.worst_batch == 9
    assert model.report.worst_under_prediction == math.inf
    assert model.advice.startswith("Of the 2 batches held back from a first fit: Batch 9 (1 item) used memory where")
    # the model handed on is fitted on it too, and covers it
    assert model.predict([[0]])[0] >= 64 and model.fit.worst_under_prediction <= 0


def test_fit_report_refuses_a_negative_peak() -> None:
    # a peak is what a batch used above what was held before it: below 0, no ratio to it means anything
    with pytest.raises(ValueError, match=r"peaks must be >= 0, got -64\.0 at position 1: a peak is the memory"):
        fit_report(_no_fixed_cost_model(), [[10], [20]], [50, -64])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 0, 1, 7, 30]), min_size=1, max_size=4),
            st.sampled_from([0.0, 0.0, 1.0, 64.0, 150.0, 1e4]),
        ),
        min_size=1,
        max_size=8,
    )
)
@pytest.mark.filterwarnings("error")
def test_report_compares_every_batch_as_the_plain_loop_does(measured: list[tuple[list[int], float]]) -> None:
    # invariant: no batch is left out (no NaN anywhere); a batch predicted nothing that used
    # memory is under-predicted without bound, one predicted nothing that used nothing exactly
    model = _no_fixed_cost_model()
    batches, peaks = [batch for batch, _ in measured], [peak for _, peak in measured]
    report = fit_report(model, batches, peaks)
    relative, utilization = [], []
    for predicted, peak in zip(model.predict(batches).tolist(), peaks):
        if predicted > 0:
            relative.append((peak - predicted) / predicted)
            utilization.append(peak / predicted)
        else:
            relative.append(math.inf if peak > 0 else 0.0)
            utilization.append(math.inf if peak > 0 else 1.0)
    values = [report.mean_utilization, report.min_utilization, report.worst_under_prediction]
    assert not any(math.isnan(value) for value in [*values, report.worst_under_prediction_bytes])
    assert report.worst_under_prediction == max(relative)
    assert report.min_utilization == min(utilization)
    assert report.mean_utilization == pytest.approx(float(np.mean(utilization)))
    assert relative[report.worst_batch] == max(relative)
    assert report.calls_for_action == (max(relative) > 0 or float(np.mean(utilization)) < 0.85)
    assert "nan" not in report.advice
    assert report.advice.endswith("nothing to do.") == (not report.calls_for_action)
