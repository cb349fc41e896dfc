"""Cost sources: any accepted ``sizeof`` turned into costs.

``make_cost_source`` accepts an array of sizes, a callable of an index array or of one
index, or a callable over per-item ``features``; the planners evaluate the result one chunk
at a time. An array of sizes is checked once; a callable's costs are checked on every chunk.
The bionemo paths take sizes one item at a time (``fastsab.plan.item_sizes``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from fastsab._arrays import as_numpy, native_order, tensor_rows
from fastsab._checks import as_numeric_array, as_python_number, as_real_array, user_stacklevel

__all__ = [
    "CostSource",
    "FeatureRows",
    "feature_rows",
    "make_cost_source",
    "pad_multiple",
    "padded_length",
    "size_array",
]

#: How many evenly spread items a computed cost source's fingerprint samples.
FINGERPRINT_SAMPLE = 4096

_Length = TypeVar("_Length", int, float, np.ndarray)


def padded_length(length: _Length, multiple: int | None, buckets: Sequence[int] | None = None) -> _Length:
    """The length a sequence of ``length`` is padded to: rounded up to a multiple, then to a bucket's length.

    The one rule of padded length: ``PadCollator`` pads a batch to the padded length of its
    longest sequence, a padded budget with ``pad_to_multiple_of`` charges each item its padded
    length (``PaddedLengths``), and shape buckets (``fastsab.plan.shape_buckets``) pad a batch
    to the first bucket length that holds it, which their budget charges. Rounding up is
    monotone, so the longest padded length of a batch is the padded length of its longest
    item: a batch charged ``len * max(padded lengths)`` is charged its padded ``(B, L)`` tensor.

    Args:
        length: A length, or an array of them.
        multiple: Round up to a multiple of this; ``None`` leaves lengths as they are.
        buckets: Increasing bucket lengths: a (rounded) length becomes the first of them that
            is at least as long; one longer than all stays as it is (an oversize item's own
            batch). ``None``: no buckets.

    Examples:
        >>> padded_length(np.array([0, 1, 8, 9]), 8).tolist(), padded_length(13, None)
        ([0, 8, 8, 16], 13)
        >>> padded_length(np.array([1, 64, 65, 600]), None, [64, 256]).tolist()
        [64, 64, 256, 600]
    """
    rounded = length if multiple is None else -(-length // multiple) * multiple
    if buckets is None:
        return rounded
    ladder = np.asarray(buckets)
    at = np.searchsorted(ladder, rounded, side="left")
    padded = np.where(at < len(ladder), ladder[np.minimum(at, len(ladder) - 1)], rounded)
    return padded if isinstance(rounded, np.ndarray) else type(rounded)(padded)


def pad_multiple(collator: object) -> int | None:
    """The multiple ``collator`` rounds a batch's padded length up to: its ``pad_to_multiple_of``, if above 1.

    ``PadCollator`` has one, and so have transformers' padding collators; a multiple of 1 rounds
    nothing, and a collator without one gives ``None``.

    Examples:
        >>> from types import SimpleNamespace
        >>> pad_multiple(SimpleNamespace(pad_to_multiple_of=np.int64(8))), pad_multiple(print)
        (8, None)
        >>> pad_multiple(SimpleNamespace(pad_to_multiple_of=1)) is None
        True
    """
    multiple = getattr(collator, "pad_to_multiple_of", None)
    # NOTE: any integer (a multiple read from a configuration may be a numpy one), not a bool
    if not isinstance(multiple, (int, np.integer)) or isinstance(multiple, bool) or multiple <= 1:
        return None
    return int(multiple)


class CostSource(Protocol):
    """Per-item costs of dataset indices, and the bytes that identify them."""

    def __call__(self, ids: np.ndarray) -> np.ndarray: ...

    def fingerprint(self, n: int) -> bytes | memoryview:
        """Bytes that change when the costs of ``range(n)`` change."""
        ...


def make_cost_source(sizeof: Any, n: int, features: Any = None) -> CostSource:
    """Turn a loader's ``sizeof`` into a function ``indices -> costs`` evaluated per chunk.

    Accepted forms: a 1-D (or ``(n, k)``) array, tensor or sequence of per-item sizes; a
    callable applied to ``features[indices]`` when ``features`` is given (e.g. a fitted
    memory model over per-item lengths, evaluated in one call per chunk; ``features`` is a
    1-D or ``(n, d)`` real-valued tensor, array or sequence, converted once: integers to
    int64, floats to float64 for a memory model (one with ``num_features``) and to their own
    floating dtype for another callable; a tensor stays a tensor on its device, anything else
    becomes a numpy array;
    booleans, complex, strings, objects, NaN and infinity are refused); a vectorized
    callable taking an index array; a per-item callable (accepted, warned about as slow).
    The result pickles whenever ``sizeof`` does.

    Examples:
        >>> costs = make_cost_source(np.array([4, 5, 6]), 3)
        >>> costs(np.array([2, 0])).tolist()
        [6, 4]
        >>> make_cost_source(lambda lengths: 2 * lengths, 3, features=torch.tensor([1.0, 2.0, 3.0]))(np.array([1]))
        array([4.])
    """
    sizes = size_array(sizeof, ndim=(1, 2))
    if sizes is not None:
        if features is not None:
            raise ValueError("features is only used with a callable sizeof; sizeof is already an array of sizes.")
        if len(sizes) != n:
            raise ValueError(f"sizeof has {len(sizes)} sizes but the dataset has {n} items.")
        return _ArrayCosts(sizes)
    if not callable(sizeof):
        raise TypeError(
            f"sizeof must be an array, tensor or sequence of sizes, or a callable, got {type(sizeof).__name__}."
        )
    if features is not None:
        return _FeatureCosts(sizeof, _checked_features(features, n, sizeof))
    probe = np.arange(min(n, 2), dtype=np.int64)
    if n and _is_vectorized(sizeof, probe):
        return _IndexCosts(sizeof, per_item=False)
    warnings.warn(
        "sizeof is called once per item, which is slow: pass an array of sizes, a vectorized callable "
        "taking an index array, or a memory model with features=.",
        stacklevel=user_stacklevel(),
    )
    return _IndexCosts(sizeof, per_item=True)


def size_array(sizeof: object, *, ndim: tuple[int, ...] = (1,)) -> np.ndarray | None:
    """``sizeof`` as a checked array of sizes if it is an array, tensor or sequence (not a string), else ``None``."""
    if isinstance(sizeof, (np.ndarray, torch.Tensor)) or (
        isinstance(sizeof, Sequence) and not isinstance(sizeof, (str, bytes))
    ):
        return as_numeric_array("sizeof", sizeof, ndim=ndim)
    return None


class _CostSource:
    """A cost source whose costs are computed: its fingerprint samples evenly spread items."""

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fingerprint(self, n: int) -> bytes | memoryview:
        # NOTE: a callable's sizes are not all computed just to fingerprint them
        if not n:
            return b""
        sample = np.unique(np.linspace(0, n - 1, min(n, FINGERPRINT_SAMPLE)).astype(np.int64))
        return np.ascontiguousarray(self(sample)).tobytes()


class _ArrayCosts(_CostSource):
    """Costs looked up in a validated array of per-item sizes."""

    def __init__(self, sizes: np.ndarray) -> None:
        self.sizes = sizes

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        # NOTE: take, not sizes[ids]: the same rows, a fifth faster for one column and about 10x
        # faster for (n, k) sizes, whose rows fancy indexing copies one at a time
        costs: np.ndarray = self.sizes.take(ids, axis=0)
        return costs

    def fingerprint(self, n: int) -> bytes | memoryview:
        # NOTE: a view of the sizes' bytes, not a copy: a state of 10**9 items would copy 8 GB
        sizes = np.ascontiguousarray(self.sizes)
        return sizes.data.cast("B") if sizes.size else b""


def _checked_features(features: Any, n: int, sizeof: Any) -> np.ndarray | torch.Tensor:
    """``features`` checked against ``n`` and converted once: integers to int64, floats to float64 for a
    memory model and to their own floating dtype for another callable (a tensor stays a tensor)."""
    # NOTE: booleans are refused (as for sizes): a mask passed as features is more likely a
    # mistake than a 0/1 feature, and converting one is a single call.
    values = as_real_array("features", features, ndim=(1, 2))
    if len(values) != n:
        raise ValueError(f"features has {len(values)} rows but the dataset has {n} items.")
    columns = getattr(sizeof, "num_features", None)  # a PolynomialRegression's number of inputs
    if not isinstance(columns, int) or isinstance(columns, bool):
        return _own_float_dtype(values, features)
    if columns == 1 and values.ndim == 2 and values.shape[1] == 1:
        # NOTE: (n, 1) rows are one feature per item, as a batch memory model is fitted on them
        values = values[:, 0]
    if n:  # (an empty list has no columns)
        shape = tuple(values.shape)
        if (columns == 1 and len(shape) != 1) or (columns > 1 and shape[1:] != (columns,)):
            wanted = "1-D or of shape (n, 1)" if columns == 1 else f"of shape (n, {columns})"
            raise ValueError(f"features must be {wanted} for a model with num_features={columns}, got shape {shape}.")
    return values


def _own_float_dtype(values: np.ndarray | torch.Tensor, features: Any) -> np.ndarray | torch.Tensor:
    """Checked float features back in the floating dtype they were given in (ints stay int64)."""
    # NOTE: a callable of the user's own (a float32 module) needs the dtype it was given; the
    # memory model computes in float64 whatever it gets, so its features are float64.
    if isinstance(values, torch.Tensor):
        if isinstance(features, torch.Tensor) and features.is_floating_point():
            return values.to(features.dtype)
        return values
    if isinstance(features, np.ndarray) and np.issubdtype(features.dtype, np.floating):
        return values.astype(features.dtype, copy=False)
    return values


class _FeatureCosts(_CostSource):
    """Costs from ``fn(features[ids])``: one call per chunk, without autograd."""

    def __init__(self, fn: Callable[[Any], Any], features: np.ndarray | torch.Tensor) -> None:
        self.fn = fn
        self.features = features

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        features = self.features
        rows: np.ndarray | torch.Tensor
        if isinstance(features, torch.Tensor):
            rows = tensor_rows(features, torch.from_numpy(np.asarray(ids, dtype=np.int64)))
        else:
            rows = features.take(ids, axis=0)
        with torch.no_grad():
            try:
                costs = self.fn(rows)
            except (TypeError, ValueError) as err:
                if type(err) not in (TypeError, ValueError):
                    raise
                # NOTE: a memory model names its own argument (x); say which loader input it is
                raise type(err)(
                    f"sizeof failed on features[indices] (shape {tuple(rows.shape)}, dtype {rows.dtype}): {err}"
                ) from err
        return _check_costs(costs, ids)


class FeatureRows(_CostSource):
    """The per-item features of a ``sizeof`` with ``features``, as rows, and the costs of any rows.

    Calling it gives ``features[ids]`` as an ``(len(ids), d)`` numpy array (the "costs" a
    rule that pads features splits); ``item_costs`` gives the checked costs of rows (e.g.
    of a batch's per-feature maxima), calling ``sizeof`` on them as on the features.
    """

    def __init__(self, costs: _FeatureCosts) -> None:
        self.costs = costs
        features = costs.features
        values = as_numpy("features", features)
        self.one_dimensional = values.ndim == 1
        # NOTE: the width from the shape, not -1: an empty dataset has no rows to infer it from
        self.rows = values.reshape(len(values), int(np.prod(values.shape[1:], dtype=np.int64)))

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        rows: np.ndarray = self.rows.take(ids, axis=0)  # (take: as _ArrayCosts)
        return rows

    def item_costs(self, rows: np.ndarray) -> np.ndarray:
        """The checked costs ``sizeof`` gives ``rows`` of features (shaped as the features were)."""
        values: Any = rows[:, 0] if self.one_dimensional else rows
        features = self.costs.features
        if isinstance(features, torch.Tensor):
            # NOTE: back in the features' own dtype (bfloat16 rows are held as float32, exactly)
            values = torch.from_numpy(np.ascontiguousarray(values)).to(device=features.device, dtype=features.dtype)
        with torch.no_grad():
            costs = self.costs.fn(values)
        return _check_costs(costs, np.arange(len(rows)))

    def fingerprint(self, n: int) -> bytes | memoryview:
        # NOTE: the batches depend on sizeof beyond the items' own costs (at per-feature maxima):
        # the features are part of what identifies them, as numbers: in native byte order, so
        # that a big-endian file's features identify the batches their native copy makes
        return bytes(self.costs.fingerprint(n)) + native_order(np.ascontiguousarray(self.rows)).tobytes()


class PaddedLengths:
    """The costs of ``source``, per-item lengths, charged as their ``padded_length`` to ``multiple``."""

    def __init__(self, source: CostSource, multiple: int) -> None:
        self.source, self.multiple = source, multiple

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return padded_length(self.source(ids), self.multiple)

    def fingerprint(self, n: int) -> bytes | memoryview:
        # NOTE: the multiple is one of the plan's options, fingerprinted with them
        return self.source.fingerprint(n)


def feature_rows(source: CostSource) -> FeatureRows:
    """``source`` (from a callable ``sizeof`` with ``features``) as its ``FeatureRows``.

    Raises:
        ValueError: If ``source`` was not made from a callable and ``features``.
    """
    if not isinstance(source, _FeatureCosts):
        raise ValueError(
            "padding='features' pads the features of a callable sizeof (e.g. a memory model), "
            "so it needs sizeof to be a callable and features= to be given."
        )
    return FeatureRows(source)


class _IndexCosts(_CostSource):
    """Costs from ``fn(ids)`` (vectorized) or ``[fn(i) for i in ids]`` (per item)."""

    def __init__(self, fn: Callable[[Any], Any], *, per_item: bool) -> None:
        self.fn = fn
        self.per_item = per_item

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self.per_item:
            return _check_costs([as_python_number(self._item_cost(i)) for i in ids.tolist()], ids)
        return _check_costs(self.fn(ids), ids)

    def _item_cost(self, index: int) -> Any:
        try:
            return self.fn(index)
        except (TypeError, AttributeError) as err:
            # NOTE: the signs of a function of a sample (len, x.shape, x["key"]) given an int
            raise TypeError(
                f"sizeof is called with a dataset index (got {index!r}), not a sample, and sizeof={self.fn!r} failed "
                f"on it ({type(err).__name__}: {err}). Pass the sizes as an array (one per item), or a function of "
                "the index such as sizeof=lambda i: len(dataset[i])."
            ) from err


def _is_vectorized(sizeof: Callable[[Any], Any], probe: np.ndarray) -> bool:
    """Whether ``sizeof`` takes an index array: it returns an array for ``probe``.

    Raises:
        ValueError: If that array does not hold one size (or row of sizes) per index.
    """
    try:
        out = sizeof(probe)
    except Exception:  # a per-item callable may fail in any way on an array; it is then called per item
        return False
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) not in (1, 2):
        return False
    # NOTE: an array of sizes for an array of indices is a vectorized callable's answer; of
    # the wrong length it is an error, not the sign of a per-item callable
    _check_costs(out, probe)
    return True


def _check_costs(values: Any, ids: np.ndarray) -> np.ndarray:
    """Validate the sizes computed for a chunk, naming the dataset index of a bad one."""
    raw = as_numpy("sizeof values", values)
    if raw.ndim not in (1, 2) or len(raw) != len(ids):
        got = f"{len(raw)} sizes (shape {tuple(raw.shape)})" if raw.ndim else f"shape {tuple(raw.shape)}"
        raise ValueError(
            f"sizeof returned {got} for {len(ids)} indices; expected one size (or row of sizes) per index."
        )
    try:
        return as_numeric_array("sizeof values", raw, ndim=(1, 2))
    except ValueError:
        if raw.dtype.kind not in "fiu":
            raise
        rows = raw.reshape(len(raw), -1)
        bad = np.flatnonzero(~(np.isfinite(rows) & (rows >= 0)).all(axis=1))
        if not len(bad):
            raise
        value = rows[bad[0]].tolist()
        raise ValueError(
            f"sizeof gave {value[0] if len(value) == 1 else value!r} for dataset index {ids[bad[0]]}; "
            "sizes must be finite and non-negative."
        ) from None
