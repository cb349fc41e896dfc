"""Batch memory models: a cost paid once per batch plus a cost per item, fitted on whole batches.

A training step's peak has a part paid once per batch (gradient buffers, workspace, the step's
fixed temporaries) and a part that grows with the items. ``fit_batch_memory`` fits

* ``peak(batch) = fixed + sum_i per_item(x_i)`` (``cost="sum"``: items joined or packed), or
* ``peak(batch) = fixed + len(batch) * per_item(max_i x_i)`` (``cost="padded"``: every feature
  padded to the batch's maximum, e.g. images to the largest height and the largest width),

from the measured peaks of batches of several shapes (single items are batches of one), with
non-negative coefficients over features scaled to ``[0, 1]``: ``per_item`` never decreases
when a feature grows and is never negative. The safety margin is relative to the prediction,
the smallest that covers every measured batch; batches held back from a first fit say how the
model does on batches it never saw, and each ``BatchFitReport`` says in one sentence whether to
act (``BatchFitReport.advice``). ``BatchMemoryModel.loader_options`` turns the model into
a ``FastSizeAwareLoader``'s budget. Any collector measures the peaks
(``measure_batches``: the CPU's or CUDA's, by ``device``). The fit's linear algebra is
``fastsab.memory.batch_design``'s, the reports ``fastsab.memory.batch_report``'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fastsab._checks import as_real_array, as_real_number, check_choice
from fastsab.memory.batch_design import design_row, exponents, nonnegative_least_squares, per_item_model
from fastsab.memory.batch_report import BatchFitReport, compare_peaks
from fastsab.memory.measure import collect_peak_alloc
from fastsab.memory.model import PolynomialRegression

__all__ = ["BatchFitReport", "BatchMemoryModel", "fit_batch_memory", "fit_report", "measure_batches"]

BatchCostMode = Literal["sum", "padded"]


@dataclass(frozen=True)
class BatchMemoryModel:
    """``peak(batch) = fixed + sum`` or ``fixed + len * per_item(max features)``, margin included.

    Attributes:
        fixed: The cost paid once per batch.
        per_item: The per-item cost as a function of an item's features (1-D for one feature,
            ``(n, d)`` for several): a fitted ``PolynomialRegression``.
        cost: ``"sum"`` or ``"padded"``.
        margin: The relative safety margin both parts include.
        fit: How the model does on the batches it was fitted on: every batch measured.
        report: How a model fitted without the batches held back did on them (``None`` if none
            were): an estimate of how this model does on batches it never saw.
    """

    fixed: float
    per_item: PolynomialRegression
    cost: BatchCostMode
    margin: float
    fit: BatchFitReport
    report: BatchFitReport | None = None

    @property
    def advice(self) -> str:
        """One sentence: whether to act on the fit, and what to do: ``report``'s where the
        batches held back call for it, else ``fit``'s."""
        report = self.report
        if report is not None and report.calls_for_action:
            return f"Of the {report.num_batches} batches held back from a first fit: {report.advice}"
        return self.fit.advice

    def predict(self, batches: Sequence[Any]) -> np.ndarray:
        """The predicted peak of each batch (each given as its items' features)."""
        rows = [_batch_rows(f"batches[{b}]", batch, self.per_item.num_features) for b, batch in enumerate(batches)]
        return np.array([self._predict_rows(rows_b) for rows_b in rows], dtype=np.float64)

    def _predict_rows(self, rows: np.ndarray) -> float:
        if self.cost == "padded":
            top = torch.from_numpy(_model_input(rows.max(axis=0, keepdims=True), self.per_item.num_features))
            return self.fixed + len(rows) * float(self.per_item(top)[0])
        return self.fixed + float(self.per_item(torch.from_numpy(_model_input(rows, self.per_item.num_features))).sum())

    def to_json(self) -> str:
        """The model as JSON: fixed cost, cost mode, margin, reports and the per-item model."""
        payload = {
            "fixed": self.fixed,
            "cost": self.cost,
            "margin": self.margin,
            "fit": dataclasses.asdict(self.fit),
            "report": None if self.report is None else dataclasses.asdict(self.report),
            "per_item": json.loads(self.per_item.to_json()),
        }
        return json.dumps(payload)

    @classmethod
    def from_json(cls, text: str) -> BatchMemoryModel:
        """A model from ``to_json``.

        Examples:
            >>> model = fit_batch_memory([[1], [2], [1, 1], [2, 2]], [12, 14, 14, 18], degree=1, held_out=0)
            >>> BatchMemoryModel.from_json(model.to_json()).predict([[3, 3]]).round().tolist()
            [22.0]
        """
        payload = json.loads(text)
        report = payload["report"]
        return cls(
            fixed=float(payload["fixed"]),
            per_item=PolynomialRegression.from_json(json.dumps(payload["per_item"])),
            cost=payload["cost"],
            margin=float(payload["margin"]),
            fit=BatchFitReport(**payload["fit"]),
            report=None if report is None else BatchFitReport(**report),
        )

    def loader_options(self, budget: float) -> dict[str, Any]:
        """Keywords of ``FastSizeAwareLoader`` for batches within ``budget``.

        Pass the items' features too: ``FastSizeAwareLoader(data, features=x, **options)``.

        Raises:
            TypeError: If ``budget`` is not a real number (a 0-d array or tensor is one).
            ValueError: If ``budget`` is not finite or not above the fixed cost, or the model
                charges nothing per item (a budget would bound no batch's items).
        """
        # NOTE: a numpy or 0-d tensor budget is taken as the Python number it holds
        budget = as_real_number("budget", budget)
        if not math.isfinite(budget):
            raise ValueError(f"budget must be a finite number, got {budget!r}.")
        if budget <= self.fixed:
            raise ValueError(f"budget must exceed the model's fixed cost per batch ({self.fixed:.0f}), got {budget!r}.")
        if _charges_nothing_per_item(self.per_item):
            raise ValueError(
                f"model charges nothing per item (its per_item predicts 0 for every item; {self.fixed:.0f} per batch), "
                f"so budget={budget!r} would not bound a batch's items: fit it with fit_batch_memory on peaks measured "
                "where the step runs."
            )
        options: dict[str, Any] = {
            "sizeof": self.per_item,
            "max_total_size": budget,
            "cost": self.cost,
            "fixed_cost": self.fixed,
        }
        if self.cost == "padded":
            options["padding"] = "features"
        return options


def measure_batches(
    work: Callable[[Any], Any],
    batches: Sequence[Any],
    device: torch.device | str = "cpu",
    cleanup: Callable[[], None] | None = None,
    *,
    progress: bool = False,
) -> list[int]:
    """The peak of ``work(batch)`` for each batch, by the collector of ``device``.

    The peaks are increments over the memory held before each batch
    (``collect_peak_alloc`` with ``baseline="subtract"``; on a CUDA device,
    ``collect_cuda_peak_alloc``). A batch that runs out of memory fails.

    Raises:
        RuntimeError: If a batch ran out of memory.
    """
    measured = collect_peak_alloc(batches, work, device, cleanup, baseline="subtract", progress=progress)
    if measured.skipped:
        raise RuntimeError(f"batches {measured.skipped} ran out of memory while measuring; measure smaller ones.")
    return [int(peak) for peak in measured.peaks]


def fit_batch_memory(
    batches: Sequence[Any],
    peaks: Sequence[float],
    *,
    cost: BatchCostMode = "sum",
    degree: int = 2,
    held_out: float = 0.25,
    seed: int = 0,
) -> BatchMemoryModel:
    """Fit ``fixed + per_item`` to measured batch peaks, with a relative safety margin.

    Args:
        batches: Each batch's items' features: a 1-D sequence (one feature per item) or an
            ``(items, d)`` array per batch. Use batches of several lengths (a batch of one
            item is a measurement of a single item): the fixed part and the per-item
            constant are told apart by the lengths.
        peaks: The measured peak of each batch.
        cost: ``"sum"`` (items joined: ``fixed + sum_i per_item(x_i)``) or ``"padded"`` (every
            feature padded to the batch's maximum: ``fixed + len * per_item(max x)``).
        degree: Total degree of ``per_item`` in the features.
        held_out: The share of batches held back from a first fit and compared with its
            predictions (``BatchMemoryModel.report``: the error to expect on batches never
            measured); the model returned is then fitted on every batch.
        seed: Seeds which batches are held back.

    Returns:
        A ``BatchMemoryModel`` fitted on every batch: its margin is the smallest relative
        one under which no measured batch is under-predicted.

    Raises:
        TypeError: If a batch or a peak is not real-valued.
        ValueError: If the numbers of batches and peaks differ, too few batches are left to fit
            the coefficients, features or peaks are negative, the peaks are all 0 (the collector
            did not see the step) or do not grow with the items (the fit charges nothing per
            item), or an option is out of range.

    Examples:
        >>> batches = [[n] * b for n in (10, 20, 40) for b in (1, 2, 4)]
        >>> peaks = [1000 + sum(5.0 * n for n in batch) for batch in batches]
        >>> model = fit_batch_memory(batches, peaks, degree=1, held_out=0)
        >>> round(model.fixed), [round(p) for p in model.predict([[30, 30]])]
        (1000, [1300])
    """
    cost = check_choice("cost", cost, ("sum", "padded"))  # type: ignore[assignment]
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
        raise ValueError(f"degree must be a non-negative integer, got {degree!r}.")
    if isinstance(held_out, bool) or not isinstance(held_out, (int, float)) or not 0 <= held_out < 1:
        raise ValueError(f"held_out must be a number in [0, 1), got {held_out!r}.")
    targets = _checked_peaks(peaks)
    if len(targets) != len(batches):
        raise ValueError(f"batches and peaks must have the same length, got {len(batches)} and {len(targets)}.")
    if len(targets) and not targets.any():
        raise ValueError(
            f"peaks must not all be 0, got {len(targets)} peaks of 0: the collector saw no memory used by any batch, "
            "as it does for a step that runs on another device than the one measured (the CPU profiler for a step "
            "on a GPU) or allocates outside torch; measure on the device where the step runs "
            "(measure_batches(work, batches, device='cuda')) or check the collector."
        )
    d = _num_features(batches)
    rows = [_batch_rows(f"batches[{b}]", batch, d) for b, batch in enumerate(batches)]
    powers = exponents(degree, d)
    order = np.random.default_rng(seed).permutation(len(rows))
    num_held = int(len(rows) * held_out)
    held, fitted = order[:num_held], np.sort(order[num_held:])
    if len(fitted) < len(powers) + 1:
        raise ValueError(
            f"fitting {len(powers) + 1} coefficients needs at least that many batches to fit, "
            f"got {len(fitted)} (of {len(rows)}, {num_held} held back)."
        )
    report = None
    if len(held):
        partial = _fit(rows, targets, fitted, powers, cost, degree)
        report = fit_report(partial, [rows[b] for b in held], targets[held])
        report = dataclasses.replace(report, worst_batch=int(held[report.worst_batch]))
    # NOTE: the model handed on is fitted on every batch measured, held-back ones included: the
    # held-back check estimates its error on unseen batches, and no measured batch is left above it
    model = _fit(rows, targets, np.arange(len(rows)), powers, cost, degree)
    if _charges_nothing_per_item(model.per_item):
        low, high = float(targets.min()), float(targets.max())
        seen = f"all {len(targets)} equal to {low!r}" if low == high else f"from {low!r} to {high!r}"
        raise ValueError(
            f"peaks must grow with the batches' items, got peaks {seen}, which the fit explains by a cost per batch "
            f"({model.fixed:.0f}) and nothing per item, so a budget would not bound a batch's items: peaks that do "
            "not grow are what a collector reports when it sees the memory held around the step rather than the "
            "step's own (the same peak for every batch); measure each batch's increment on the device where the step "
            "runs (measure_batches), over batches of several numbers and sizes of items."
        )
    return dataclasses.replace(model, report=report)


def _fit(
    rows: list[np.ndarray],
    targets: np.ndarray,
    fitted: np.ndarray,
    powers: np.ndarray,
    cost: BatchCostMode,
    degree: int,
) -> BatchMemoryModel:
    """The model fitted on the batches ``fitted``, with the smallest margin that covers each of them."""
    d = powers.shape[1]
    scale = np.max(np.concatenate([rows[b] for b in fitted]), axis=0).astype(np.float64)
    scale[scale <= 0] = 1.0
    design = np.array([design_row(rows[b] / scale, powers, cost) for b in fitted])
    solution = nonnegative_least_squares(design, targets[fitted])
    fixed, coefficients = float(solution[0]), solution[1:]
    per_item = per_item_model(degree, d, coefficients, scale)
    plain = BatchMemoryModel(fixed, per_item, cost, 0.0, _EMPTY_REPORT)
    predicted = plain.predict([rows[b] for b in fitted])
    ratio = targets[fitted] / np.where(predicted > 0, predicted, np.inf)
    # NOTE: 1e-9 more, so that the rounding of (1 + margin) * prediction leaves no batch above it
    margin = max(0.0, float(ratio.max()) - 1.0 + 1e-9) if len(ratio) else 0.0
    if (predicted <= 0).any() and (targets[fitted][predicted <= 0] > 0).any():
        raise ValueError("the fit predicts nothing for batches that used memory; measure more batch shapes.")
    per_item.safety_margin.fill_(margin)
    model = BatchMemoryModel(fixed * (1 + margin), per_item, cost, margin, _EMPTY_REPORT)
    fit = fit_report(model, [rows[b] for b in fitted], targets[fitted])
    return dataclasses.replace(model, fit=fit)


def fit_report(model: BatchMemoryModel, batches: Sequence[Any], peaks: Any) -> BatchFitReport:
    """How ``model`` predicts the measured ``peaks`` of ``batches`` (e.g. batches held back from the fit).

    Every batch is compared: one the model predicts nothing for that used memory is an infinite
    under-prediction (``BatchFitReport``).

    Raises:
        ValueError: If there are no batches, the numbers of batches and peaks differ, or a peak
            is negative.

    Examples:
        >>> model = fit_batch_memory([[1], [2], [1, 1], [2, 2]], [12, 14, 14, 18], degree=1, held_out=0)
        >>> report = fit_report(model, [[2, 2, 2]], [22])
        >>> round(report.mean_utilization, 3), report.worst_under_prediction <= 0
        (1.0, True)
    """
    targets = _checked_peaks(peaks)
    if not len(targets) or len(targets) != len(batches):
        raise ValueError(
            f"fit_report needs as many peaks as batches (at least one), got {len(batches)} and {len(targets)}."
        )
    return compare_peaks(model.predict(batches), targets, [len(batch) for batch in batches], model.margin)


_EMPTY_REPORT = BatchFitReport(0, 0.0, math.nan, math.nan, math.nan, math.nan)


def _checked_peaks(peaks: Any) -> np.ndarray:
    """Measured peaks as a checked 1-D float64 array: real, finite and >= 0."""
    targets = np.asarray(as_real_array("peaks", peaks, ndim=(1,)), dtype=np.float64)
    if (targets < 0).any():
        position = int(np.argmin(targets))
        raise ValueError(
            f"peaks must be >= 0, got {float(targets[position])!r} at position {position}: a peak is the memory a "
            "batch used above what was held before it (measure_batches); check how it was measured."
        )
    return targets


def _charges_nothing_per_item(per_item: PolynomialRegression) -> bool:
    """Whether ``per_item`` predicts 0 for every item."""
    # NOTE: the monomials are independent, so the polynomial is 0 everywhere exactly when
    # every coefficient and the offset are
    return not bool((per_item.coefficients * per_item.y_scale).any()) and not bool(per_item.offset)


def _num_features(batches: Sequence[Any]) -> int:
    for batch in batches:
        shape = np.shape(batch)
        if len(shape) == 2:
            return int(shape[1])
        if len(shape) == 1 and shape[0]:
            return 1
    return 1


def _batch_rows(name: str, batch: Any, d: int) -> np.ndarray:
    """One batch's features as a checked ``(items, d)`` float64 array."""
    rows = as_real_array(name, batch.cpu() if isinstance(batch, torch.Tensor) else batch, ndim=(1, 2))
    if not len(rows):
        raise ValueError(f"{name} must hold at least one item, got an empty batch.")
    rows = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    if rows.shape[1] != d:
        raise ValueError(f"{name} must have {d} feature(s) per item, got shape {tuple(rows.shape)}.")
    if (rows < 0).any():
        raise ValueError(f"{name} must hold features >= 0, got {float(rows.min())!r}.")
    return rows


def _model_input(rows: np.ndarray, d: int) -> np.ndarray:
    return rows[:, 0] if d == 1 else rows
