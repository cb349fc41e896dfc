"""Polynomial memory models: from measured peaks to a per-item cost.

``PolynomialRegression`` fits ``peak ~ polynomial(feature)`` by least squares and
predicts for a whole tensor of features in one vectorized call, so a loader can turn
per-item features (sequence lengths, node and edge counts) into costs a shuffle group at
a time. An optional upper bound shifts the fit so that it does not under-predict the
measured peaks, which is what a memory budget needs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

import torch

from fastsab._checks import as_real_array

__all__ = ["FitReport", "PolynomialRegression"]


@dataclass(frozen=True)
class FitReport:
    """How a fit matches the data it was fitted on (bytes if peaks are bytes).

    Attributes:
        num_points: Number of (feature, peak) points.
        rmse: Root mean square error of the least-squares polynomial.
        max_under_prediction: Largest ``peak - prediction`` of the least-squares polynomial
            (how far it falls short at worst; <= 0 means it never under-predicts).
        offset: Constant added to the polynomial by the upper bound.
        max_under_prediction_final: The same after the offset and safety margin: <= 0
            means the model upper-bounds every fitted peak.
    """

    num_points: int
    rmse: float
    max_under_prediction: float
    offset: float
    max_under_prediction_final: float


class PolynomialRegression(torch.nn.Module):
    """A polynomial of one or several features, fitted by scaled least squares.

    With one feature, ``forward`` evaluates the polynomial by Horner's rule on a 1-D
    tensor. With ``num_features=d > 1``, it is a polynomial in ``d`` variables of total
    degree ``<= degree`` (e.g. nodes and edges of a graph), evaluated on an ``(n, d)``
    tensor. Features are scaled to ``[-1, 1]`` and targets by their largest magnitude
    before solving (``torch.linalg.lstsq``), so degree 3 on byte-sized peaks stays well
    conditioned. All state (coefficients, scaling, offset) lives in buffers, so
    ``state_dict`` / ``load_state_dict`` round-trip a fitted model.

    Args:
        degree: Degree of the polynomial, a non-negative integer.
        num_features: Number of input features ``d`` (default 1).

    Raises:
        ValueError: If ``degree`` is not a non-negative integer or ``num_features`` is not
            a positive integer.

    Examples:
        >>> model = PolynomialRegression(2)
        >>> x = torch.linspace(0, 10, 11, dtype=torch.float64)
        >>> report = model.fit(x, 3 * x**2 + 2 * x + 1)
        >>> model(torch.tensor([20.0], dtype=torch.float64)).round().tolist()
        [1241.0]
        >>> report.num_points, report.max_under_prediction < 1e-6
        (11, True)
    """

    degree: int
    num_features: int
    coefficients: torch.Tensor
    exponents: torch.Tensor
    x_center: torch.Tensor
    x_scale: torch.Tensor
    y_scale: torch.Tensor
    offset: torch.Tensor
    safety_margin: torch.Tensor
    fitted: torch.Tensor

    def __init__(self, degree: int, num_features: int = 1) -> None:
        super().__init__()
        if isinstance(degree, bool) or not isinstance(degree, Integral) or degree < 0:
            raise ValueError(f"degree must be a non-negative integer, got {degree!r}.")
        if isinstance(num_features, bool) or not isinstance(num_features, Integral) or num_features < 1:
            raise ValueError(f"num_features must be a positive integer, got {num_features!r}.")
        self.degree = int(degree)
        self.num_features = int(num_features)
        terms = [
            powers
            for total in range(self.degree + 1)
            for powers in itertools.product(range(total + 1), repeat=self.num_features)
            if sum(powers) == total
        ]
        f64 = torch.float64
        self.register_buffer("exponents", torch.tensor(terms, dtype=torch.int64).reshape(len(terms), self.num_features))
        self.register_buffer("coefficients", torch.zeros(len(terms), dtype=f64))
        self.register_buffer("x_center", torch.zeros(self.num_features, dtype=f64))
        self.register_buffer("x_scale", torch.ones(self.num_features, dtype=f64))
        self.register_buffer("y_scale", torch.ones((), dtype=f64))
        self.register_buffer("offset", torch.zeros((), dtype=f64))
        self.register_buffer("safety_margin", torch.zeros((), dtype=f64))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @property
    def num_terms(self) -> int:
        """Number of monomials (coefficients) of the polynomial."""
        return len(self.exponents)

    def _features(self, name: str, x: Any) -> torch.Tensor:
        """``x`` as an ``(n, num_features)`` float64 tensor on the model's device, checked."""
        return self._values(name, x, 1 if self.num_features == 1 else 2).reshape(-1, self.num_features)

    def _values(self, name: str, x: Any, ndim: int) -> torch.Tensor:
        # NOTE: integer features (lengths, counts) are exact in float64 up to 2**53
        values = torch.as_tensor(
            as_real_array(name, x, ndim=(ndim,)), dtype=torch.float64, device=self.coefficients.device
        )
        if ndim == 2 and values.shape[1] != self.num_features:
            raise ValueError(f"{name} must have {self.num_features} columns, got shape {tuple(values.shape)}.")
        return values

    def _design(self, scaled: torch.Tensor) -> torch.Tensor:
        """The monomials of the scaled features, shape ``(n, num_terms)``."""
        powers = scaled[:, None, :] ** self.exponents[None, :, :].to(scaled.dtype)
        design = powers[:, :, 0]
        for column in range(1, self.num_features):  # elementwise products, in one order for every point
            design = design * powers[:, :, column]
        return design

    def _polynomial(self, scaled: torch.Tensor) -> torch.Tensor:
        if self.num_features == 1:
            t = scaled[:, 0]
            result = torch.full_like(t, float(self.coefficients[-1]))
            for coefficient in self.coefficients.flip(0)[1:]:
                result = result * t + coefficient  # Horner's rule
            return result * self.y_scale
        # NOTE: term by term, elementwise: each point's value does not depend on the other points
        # (a matrix product may sum in another order for another number of rows), so a batch's
        # padded cost at its per-feature maxima is the same however many rows are evaluated at once
        design = self._design(scaled)
        result = torch.zeros(len(scaled), dtype=scaled.dtype, device=scaled.device)
        for term, coefficient in enumerate(self.coefficients.tolist()):
            result = result + coefficient * design[:, term]
        return result * self.y_scale

    def forward(self, x: Any) -> torch.Tensor:
        """Predict for every point of ``x`` (1-D, or ``(n, num_features)``), vectorized.

        ``x`` is any real-valued tensor, numpy array or sequence (integers too; booleans are
        refused), converted to float64 once per call. The prediction has the dtype of a
        floating point tensor ``x`` (rounded up to it, never down), and is float64 otherwise.

        Raises:
            TypeError: If ``x`` does not hold integers or floats.
            ValueError: If ``x`` has the wrong rank or number of columns, or is not finite.
            RuntimeError: If the model was neither fitted nor loaded.

        Examples:
            >>> import numpy as np
            >>> model = PolynomialRegression(1)
            >>> _ = model.fit([0, 10], [100, 1100])
            >>> model([3, 5]).round().tolist(), model(np.array([3])).dtype, model(torch.tensor([3.0])).dtype
            ([400.0, 600.0], torch.float64, torch.float32)
        """
        features = self._features("x", x)
        if not bool(self.fitted):
            raise RuntimeError("PolynomialRegression is not fitted: call fit(x, y) or load_state_dict first.")
        scaled = (features - self.x_center) / self.x_scale
        out = (self._polynomial(scaled) + self.offset) * (1 + self.safety_margin)
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()) or x.dtype == out.dtype:
            return out
        # NOTE: rounded up, not to the nearest: a cost in a narrower dtype (bfloat16 keeps 8
        # bits) never falls below the model's, so a budget planned from it still holds. A value
        # below by float64 rounding alone (1e-9 relative) is taken as exact: 8 stays 8
        low = out.to(x.dtype)
        below = low.to(out.dtype) < out - 1e-9 * out.abs()
        return torch.where(below, torch.nextafter(low, torch.full_like(low, math.inf)), low)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> PolynomialRegression:
        # NOTE: a model run in half or bfloat16 (.to(dtype), or a network converted as a whole)
        # moves to the device but keeps its float64 state: rounding the coefficients would make
        # it under-predict the peaks it was fitted to bound
        def move(tensor: torch.Tensor) -> torch.Tensor:
            moved = fn(tensor)
            return moved if moved.dtype == tensor.dtype else tensor.to(moved.device)

        super()._apply(move, recurse)  # type: ignore[no-untyped-call]
        return self

    def fit(
        self,
        x: Any,
        y: Any,
        *,
        upper_quantile: float | None = None,
        safety_margin: float = 0.0,
    ) -> FitReport:
        """Fit the polynomial to the points ``(x, y)`` by least squares.

        Args:
            x: Features: 1-D, or ``(n, num_features)``; a real-valued tensor, numpy array
                or sequence (as for ``forward``).
            y: Targets (e.g. peak bytes): 1-D, real-valued, one per point.
            upper_quantile: If given (in ``(0, 1]``), add the smallest constant for which
                that quantile of the fitting points is not under-predicted; ``1.0`` makes
                the model an upper bound of every measured peak.
            safety_margin: Relative headroom multiplied on top, e.g. ``0.05`` for 5%.

        Returns:
            A ``FitReport``, including the largest under-prediction before and after
            the upper bound.

        Raises:
            TypeError: If ``x`` or ``y`` does not hold integers or floats.
            ValueError: If either has the wrong rank or is not finite, their lengths differ,
                there are fewer points than coefficients, or ``upper_quantile`` /
                ``safety_margin`` is out of range.
        """
        features = self._features("x", x)
        targets = self._values("y", y, 1)
        if len(features) != len(targets):
            raise ValueError(f"x and y must have the same number of points, got {len(features)} and {len(targets)}.")
        if len(targets) < self.num_terms:
            raise ValueError(
                f"fitting {self.num_terms} coefficients (degree {self.degree}) needs at least "
                f"{self.num_terms} points, got {len(targets)}."
            )
        if upper_quantile is not None and not (0 < upper_quantile <= 1):
            raise ValueError(f"upper_quantile must be in (0, 1], got {upper_quantile!r}.")
        if not (isinstance(safety_margin, (int, float)) and math.isfinite(safety_margin) and safety_margin >= 0):
            raise ValueError(f"safety_margin must be a finite number >= 0, got {safety_margin!r}.")

        low, high = features.min(dim=0).values, features.max(dim=0).values
        half_range = (high - low) / 2
        self.x_center.copy_((high + low) / 2)
        self.x_scale.copy_(torch.where(half_range > 0, half_range, torch.ones_like(half_range)))
        y_max = float(targets.abs().max())
        self.y_scale.fill_(y_max if y_max > 0 else 1.0)
        scaled = (features - self.x_center) / self.x_scale
        design = self._design(scaled)
        solution = torch.linalg.lstsq(design, targets / self.y_scale, driver="gelsd").solution
        self.coefficients.copy_(solution)
        self.offset.zero_()
        self.safety_margin.zero_()
        self.fitted.fill_(True)

        residual = targets - self._polynomial(scaled)
        if upper_quantile is not None:
            self.offset.fill_(max(0.0, float(torch.quantile(residual, upper_quantile))))
        self.safety_margin.fill_(float(safety_margin))
        final = targets - self(x).to(torch.float64)
        return FitReport(
            num_points=len(targets),
            rmse=float(residual.pow(2).mean().sqrt()),
            max_under_prediction=float(residual.max()),
            offset=float(self.offset),
            max_under_prediction_final=float(final.max()),
        )

    def extra_repr(self) -> str:
        return f"degree={self.degree}, num_features={self.num_features}, fitted={bool(self.fitted)}"

    # -- saving ---------------------------------------------------------------------------

    def to_json(self) -> str:
        """The fitted model as JSON (degree, features and every buffer)."""
        state = {name: buffer.tolist() for name, buffer in self.state_dict().items()}
        return json.dumps({"degree": self.degree, "num_features": self.num_features, "state": state})

    @classmethod
    def from_json(cls, text: str) -> PolynomialRegression:
        """A model from ``to_json``.

        Examples:
            >>> model = PolynomialRegression(1)
            >>> _ = model.fit(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 3.0]))
            >>> PolynomialRegression.from_json(model.to_json())(torch.tensor([2.0])).tolist()
            [5.0]
        """
        payload = json.loads(text)
        model = cls(payload["degree"], payload["num_features"])
        reference = model.state_dict()
        state = {name: torch.tensor(value, dtype=reference[name].dtype) for name, value in payload["state"].items()}
        model.load_state_dict(state)
        return model

    def save(self, path: str | Path) -> None:
        """Write the model to ``path``: JSON for ``*.json``, else ``torch.save`` of the state."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(self.to_json())
        else:
            torch.save({"degree": self.degree, "num_features": self.num_features, "state": self.state_dict()}, path)

    @classmethod
    def load(cls, path: str | Path) -> PolynomialRegression:
        """Read a model written by ``save`` (tensors only: ``weights_only=True``)."""
        path = Path(path)
        if path.suffix == ".json":
            return cls.from_json(path.read_text())
        payload = torch.load(path, weights_only=True)
        model = cls(payload["degree"], payload["num_features"])
        model.load_state_dict(payload["state"])
        return model
