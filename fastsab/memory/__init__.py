"""Memory: measure peaks per item, fit a model, turn it into batch costs and budgets."""

from fastsab.memory.fit import MemoryFit, fit_memory_model, module_work
from fastsab.memory.measure import Measurements, collect_cuda_peak_alloc, collect_peak_alloc, profile_peak_bytes
from fastsab.memory.model import FitReport, PolynomialRegression

__all__ = [
    "FitReport",
    "Measurements",
    "MemoryFit",
    "PolynomialRegression",
    "collect_cuda_peak_alloc",
    "collect_peak_alloc",
    "fit_memory_model",
    "module_work",
    "profile_peak_bytes",
]
