"""Memory: measure peaks per item, fit a model, turn it into batch costs and budgets."""

from fastsab.memory.batch import BatchFitReport, BatchMemoryModel, fit_batch_memory, fit_report, measure_batches
from fastsab.memory.bucket_sizes import max_batch_sizes, padded_batch
from fastsab.memory.calibration import CalibrationBatches, calibration_batches
from fastsab.memory.fit import MemoryFit, fit_memory_model, module_work
from fastsab.memory.measure import Measurements, collect_cuda_peak_alloc, collect_peak_alloc, profile_peak_bytes
from fastsab.memory.model import FitReport, PolynomialRegression
from fastsab.memory.plan import GiB, KiB, MemoryPlan, MiB, plan_memory, sample_nbytes

__all__ = [
    "BatchFitReport",
    "BatchMemoryModel",
    "CalibrationBatches",
    "FitReport",
    "GiB",
    "KiB",
    "Measurements",
    "MemoryFit",
    "MemoryPlan",
    "MiB",
    "PolynomialRegression",
    "calibration_batches",
    "collect_cuda_peak_alloc",
    "collect_peak_alloc",
    "fit_batch_memory",
    "fit_memory_model",
    "fit_report",
    "max_batch_sizes",
    "measure_batches",
    "module_work",
    "padded_batch",
    "plan_memory",
    "profile_peak_bytes",
    "sample_nbytes",
]
