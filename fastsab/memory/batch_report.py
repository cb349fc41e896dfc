"""How a batch memory model's predictions compare with measured peaks, and what to do about it.

``compare_peaks`` turns each batch's prediction and peak into a ``BatchFitReport``: every batch
counts, those the model predicts nothing for included (one that used memory is under-predicted
without bound, one that used none is predicted exactly). ``BatchFitReport.advice`` says in one
sentence whether to act. ``fastsab.memory.batch``'s ``fit_report`` is the public way in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LOW_UTILIZATION", "BatchFitReport", "compare_peaks"]

# NOTE: below 85%, a budget planned by the model is mostly its over-prediction, not a margin
#: Below this mean use of its predictions, a model's budget is mostly over-prediction.
LOW_UTILIZATION = 0.85


@dataclass(frozen=True)
class BatchFitReport:
    """How a batch memory model predicts measured peaks (bytes if peaks are bytes).

    A batch the model predicts nothing for counts like any other: if it used memory, its
    ``peak / prediction`` and ``(peak - prediction) / prediction`` are infinite (no budget
    covers it); if it used none, they are 1 and 0 (predicted exactly).

    Attributes:
        num_batches: Batches compared.
        margin: The model's relative safety margin (predictions include it).
        mean_utilization: Mean ``peak / prediction``: the share of a budget the batches the
            model plans use, expected (1.0 is a perfect fit; above 1 means over the budget).
        min_utilization: The smallest ``peak / prediction``.
        worst_under_prediction: The largest ``(peak - prediction) / prediction``: <= 0 means no
            batch used more than predicted; infinite where a batch predicted nothing used memory.
        worst_under_prediction_bytes: The largest ``peak - prediction``.
        worst_batch: The position of the batch with the largest ``(peak - prediction) / prediction``
            (among infinite ones, the largest ``peak - prediction``) among those compared (for
            ``BatchMemoryModel.report``, among all the batches measured).
        worst_batch_items: Its number of items.
    """

    num_batches: int
    margin: float
    mean_utilization: float
    min_utilization: float
    worst_under_prediction: float
    worst_under_prediction_bytes: float
    worst_batch: int = -1
    worst_batch_items: int = 0

    @property
    def calls_for_action(self) -> bool:
        """Whether ``advice`` suggests a change: a batch used more than predicted, or the
        batches used little of their predictions."""
        return self.worst_under_prediction > 0 or self.mean_utilization < LOW_UTILIZATION

    @property
    def advice(self) -> str:
        """One sentence: whether to act on this report, and what to do.

        Examples:
            >>> report = compare_peaks(np.array([0.0, 50.0]), np.array([64.0, 50.0]), [1, 1], margin=0.0)
            >>> report.advice[:74]
            'Batch 0 (1 item) used memory where the model predicts none (no fixed cost,'
        """
        use = self.mean_utilization
        items = f"{self.worst_batch_items} item{'' if self.worst_batch_items == 1 else 's'}"
        batch = f"Batch {self.worst_batch} ({items})"
        if math.isinf(self.worst_under_prediction):
            return (
                f"{batch} used memory where the model predicts none (no fixed cost, nothing for its items), so no "
                "budget covers batches like it: measure more batches like it and fit on all the batches measured, "
                "so that the model charges for them (a lower budget does not help)."
            )
        if self.worst_under_prediction > 0:
            over = 1 + self.worst_under_prediction
            return (
                f"{batch} used {self.worst_under_prediction:.1%} more than the model predicts, so batches like it "
                "can exceed the budget: measure more batches like it and fit on all the batches measured, or plan "
                f"under a budget {1 - 1 / over:.1%} lower (model.loader_options(budget / {over:.3g}))."
            )
        covered, they = f"The model covers every one of the {self.num_batches} batches", "they"
        if self.num_batches == 1:
            covered, they = "The model covers the one batch", "it"
        if use < LOW_UTILIZATION:
            return (
                f"{covered}, but {they} used {use:.0%} of its prediction on average, so planned batches would fill "
                f"about {use:.0%} of the budget: to fill more, fit it on batches like the planned ones "
                "(calibration_batches) or try another degree or cost."
            )
        return f"{covered} ({they} used {use:.0%} of its prediction on average); nothing to do."


def compare_peaks(predicted: np.ndarray, peaks: np.ndarray, items: Sequence[int], margin: float) -> BatchFitReport:
    """The report of batches predicted ``predicted`` that used ``peaks`` (>= 0), of ``items`` items each.

    Examples:
        >>> report = compare_peaks(np.array([100.0, 0.0]), np.array([50.0, 0.0]), [3, 1], margin=0.0)
        >>> report.mean_utilization, report.min_utilization, report.worst_under_prediction
        (0.75, 0.5, 0.0)
    """
    excess = peaks - predicted
    predicts = predicted > 0
    # NOTE: a batch predicted nothing is no batch to leave out: one that used memory is under-predicted
    # without bound (no budget covers it), one that used none is predicted exactly
    unbounded = ~predicts & (excess > 0)
    divisor = np.where(predicts, predicted, 1.0)
    relative = np.where(predicts, excess / divisor, np.where(unbounded, math.inf, 0.0))
    utilization = np.where(predicts, peaks / divisor, np.where(unbounded, math.inf, 1.0))
    # NOTE: among batches under-predicted without bound, the one short of the most bytes
    worst = int(np.argmax(np.where(unbounded, excess, -math.inf))) if unbounded.any() else int(np.argmax(relative))
    return BatchFitReport(
        num_batches=len(peaks),
        margin=margin,
        mean_utilization=float(np.mean(utilization)),
        min_utilization=float(np.min(utilization)),
        worst_under_prediction=float(relative[worst]),
        worst_under_prediction_bytes=float(excess.max()),
        worst_batch=worst,
        worst_batch_items=int(items[worst]),
    )
