"""The linear algebra of a batch memory fit: design rows of ``fixed + per_item``, a non-negative solve.

A batch's row is ``[1, sum_i monomials(x_i)]`` (``cost="sum"``) or ``[1, len * monomials(max x)]``
(``cost="padded"``) over features scaled to ``[0, 1]``; the coefficients are solved for with
non-negative least squares, and the per-item part becomes a ``PolynomialRegression``.
"""

from __future__ import annotations

import numpy as np
import torch

from fastsab.memory.model import PolynomialRegression

__all__ = ["design_row", "exponents", "nonnegative_least_squares", "per_item_model"]


def exponents(degree: int, d: int) -> np.ndarray:
    """The monomials' exponents in ``PolynomialRegression``'s order."""
    return np.array(PolynomialRegression(degree, d).exponents.tolist(), dtype=np.int64).reshape(-1, d)


def design_row(scaled: np.ndarray, powers: np.ndarray, cost: str) -> np.ndarray:
    """``[1, sum_i monomials(x_i)]`` or ``[1, len * monomials(max x)]`` for one batch."""
    if cost == "padded":
        top = scaled.max(axis=0)
        terms = len(scaled) * np.prod(top[None, :] ** powers, axis=1)
    else:
        terms = np.prod(scaled[:, None, :] ** powers[None, :, :], axis=2).sum(axis=0)
    return np.concatenate([[1.0], terms])


def per_item_model(degree: int, d: int, coefficients: np.ndarray, scale: np.ndarray) -> PolynomialRegression:
    """A ``PolynomialRegression`` of ``coefficients`` over features divided by ``scale``."""
    model = PolynomialRegression(degree, d)
    model.coefficients.copy_(torch.from_numpy(coefficients))
    model.x_center.zero_()
    model.x_scale.copy_(torch.from_numpy(scale))
    model.y_scale.fill_(1.0)
    model.fitted.fill_(True)
    return model


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin ||a x - b||`` over ``x >= 0`` (Lawson and Hanson's active set method)."""
    # NOTE: columns and target are scaled to unit size first: byte-sized peaks and monomials
    # of features in [0, 1] differ by many orders of magnitude
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scale_b = float(np.abs(b).max()) or 1.0
    a, b = a / norms, b / scale_b
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 1e-12 * max(a.shape) * float(np.abs(a).max() or 1.0)
    for _ in range(3 * n + 10):
        gradient = a.T @ (b - a @ x)
        free = ~passive & (gradient > tolerance)
        if not free.any():
            break
        passive[np.argmax(np.where(free, gradient, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            alpha = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + alpha * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    solution: np.ndarray = x / norms * scale_b
    return solution
