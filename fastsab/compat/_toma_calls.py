"""toma 1.1's call forms ``explicit`` and ``simple``, its cache types, and the checks its forms share.

Part of ``fastsab.compat.toma``, which re-exports every public name of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral
from typing import Any, TypeVar

import torch

from fastsab import adaptive
from fastsab._checks import check_positive_int
from fastsab.adaptive import AdaptiveOOMError, BatchSizeCache, GlobalCache, NoCache, StackMemoryCache
from fastsab.adaptive.oom import is_out_of_memory
from fastsab.adaptive.retry import _LAZY_ADVICE, _lazy_kind

_T = TypeVar("_T")

#: Start from the initial size every time.
NoBatchsizeCache = NoCache
#: One size per context (by default, per function).
GlobalBatchsizeCache = GlobalCache
#: One size per context, call site and available-memory bucket.
StacktraceMemoryBatchsizeCache = StackMemoryCache
DEFAULT_CACHE_TYPE = StackMemoryCache


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` is an out-of-memory error (``fastsab.adaptive.oom.is_out_of_memory``)."""
    return is_out_of_memory(exception)


def _size(value: Any, *names: str) -> int:
    """The first of toma's fallbacks that is given (``toma_initial_step or initial_step``), checked."""
    return check_positive_int(" or ".join(names), value)


def _cache_type(name: str, value: Any) -> type[BatchSizeCache]:
    if not (isinstance(value, type) and issubclass(value, BatchSizeCache)):
        raise TypeError(
            f"{name} must be a cache class (StacktraceMemoryBatchsizeCache, GlobalBatchsizeCache, "
            f"NoBatchsizeCache), got {value!r}."
        )
    return value


def _check_function(form: str, size_name: str, func: object) -> Callable[..., Any]:
    """``func``, the function to decorate; a size given in its place (``@toma.batch(64)``) is named."""
    if not callable(func):
        raise TypeError(
            f"{form} takes its options by keyword ({size_name}={func!r}); func must be a function, "
            f"got {func!r} of type {type(func).__name__}."
        )
    kind = _lazy_kind(func)
    if kind is not None:  # NOTE: refused when decorated, as by fastsab.adaptive's decorators, not at the first call
        name = getattr(func, "__qualname__", None) or repr(func)
        raise TypeError(f"{name} is {kind}; {form} cannot retry it: {_LAZY_ADVICE}")
    return func


def _first(given: _T | None, default: _T) -> _T:
    """``given``, unless it is ``None``: toma's ``toma_*`` call options override the decorator's."""
    return default if given is None else given


#: The name toma gives the size of each form of ``fastsab.adaptive.explicit``.
_SIZE_NAMES = {"batch": "initial_batchsize", "range": "initial_step", "chunked": "initial_step"}


def _forward(
    name: str,
    leading: tuple[Any, ...],
    size: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    cache_type: object,
    context: Any,
    dim: int | None = None,
) -> Any:
    """The form ``name`` of ``fastsab.adaptive.explicit`` with toma's checks and toma's error.

    Calls ``form(*leading, size, *args, adaptive_cache=..., adaptive_context=context, **kwargs)``
    (and ``adaptive_dim=dim`` if given) once ``size`` and ``cache_type`` are checked; when
    even size 1 failed, raises the last out-of-memory error itself, as toma does.
    """
    form = getattr(adaptive.explicit, name)
    initial = _size(size, _SIZE_NAMES[name])
    cache = _cache_type("toma_cache_type", cache_type)
    options = {} if dim is None else {"adaptive_dim": dim}
    try:
        return form(*leading, initial, *args, adaptive_cache=cache, adaptive_context=context, **options, **kwargs)
    except AdaptiveOOMError as error:
        raise error.last from error


class explicit:
    """Call forms; sizes are remembered per ``toma_context`` (default: the function's code)."""

    # NOTE: toma's signatures, parameter for parameter, so alike in shape to fastsab.adaptive.explicit's;
    # every form hands its call to _forward

    @staticmethod
    def batch(
        func: Callable[..., Any],
        initial_batchsize: int,
        *args: Any,
        toma_context: Any = None,
        toma_cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        **kwargs: Any,
    ) -> Any:
        """``func(batchsize, *args, **kwargs)``, halving ``batchsize`` on out-of-memory."""
        return _forward("batch", (func,), initial_batchsize, args, kwargs, toma_cache_type, toma_context)

    @staticmethod
    def range(
        func: Callable[..., Any],
        start: int,
        end: int,
        initial_step: int,
        *args: Any,
        toma_context: Any = None,
        toma_cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        **kwargs: Any,
    ) -> None:
        """``func(chunk_start, chunk_end, *args, **kwargs)`` over ``start..end``, halving the step on out-of-memory."""
        _forward("range", (func, start, end), initial_step, args, kwargs, toma_cache_type, toma_context)

    @staticmethod
    def chunked(
        func: Callable[..., Any],
        tensor: torch.Tensor,
        initial_step: int,
        *args: Any,
        toma_dimension: int | None = None,
        toma_context: Any = None,
        toma_cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        **kwargs: Any,
    ) -> None:
        """``func(chunk, chunk_start, chunk_end, *args, **kwargs)`` over ``tensor`` along ``toma_dimension``."""
        dim = _dimension("toma_dimension", toma_dimension, tensor)
        _chunked(func, tensor, initial_step, args, kwargs, dim=dim, context=toma_context, cache_type=toma_cache_type)


def _dimension(name: str, value: Any, tensor: Any) -> int:
    """The dimension to chunk along (``None``: 0), checked against ``tensor`` under the name the call gave it."""
    given = _first(value, 0)
    if isinstance(given, bool) or not isinstance(given, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}.")
    dim = int(given)
    if isinstance(tensor, torch.Tensor) and not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"{name}={value!r} is out of range for a tensor of shape {tuple(tensor.shape)}.")
    return dim


def _chunked(
    func: Callable[..., Any],
    tensor: torch.Tensor,
    initial_step: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    dim: int,
    context: Any,
    cache_type: Any,
) -> None:
    """``func(chunk, chunk_start, chunk_end, *args, **kwargs)`` over ``tensor`` along ``dim``, as toma chunks."""
    _forward("chunked", (func, tensor), initial_step, args, kwargs, cache_type, context, dim)


class simple:
    """The forms without a cache: every call starts from the initial size."""

    @staticmethod
    def batch(func: Callable[..., Any], initial_batchsize: int, *args: Any, **kwargs: Any) -> Any:
        """``func(batchsize, *args, **kwargs)``, halving ``batchsize`` on out-of-memory."""
        return explicit.batch(func, initial_batchsize, *args, toma_cache_type=NoBatchsizeCache, **kwargs)

    @staticmethod
    def range(func: Callable[..., Any], start: int, end: int, initial_step: int, *args: Any, **kwargs: Any) -> None:
        """``func(chunk_start, chunk_end, *args, **kwargs)`` over ``start..end``."""
        explicit.range(func, start, end, initial_step, *args, toma_cache_type=NoBatchsizeCache, **kwargs)

    @staticmethod
    def chunked(func: Callable[..., Any], tensor: torch.Tensor, initial_step: int, dimension: int = 0) -> None:
        """``func(chunk, chunk_start, chunk_end)`` over ``tensor`` along ``dimension``."""
        dim = _dimension("dimension", dimension, tensor)
        _chunked(func, tensor, initial_step, (), {}, dim=dim, context=None, cache_type=NoBatchsizeCache)
