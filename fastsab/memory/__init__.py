"""Memory: measure peaks per item, fit a model, turn it into batch costs and budgets."""

from fastsab.memory.measure import Measurements, collect_cuda_peak_alloc, collect_peak_alloc, profile_peak_bytes
from fastsab.memory.model import FitReport, PolynomialRegression

__all__ = [
    "FitReport",
    "Measurements",
    "PolynomialRegression",
    "collect_cuda_peak_alloc",
    "collect_peak_alloc",
    "profile_peak_bytes",
]
