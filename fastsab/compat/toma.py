"""toma 1.1's API on :mod:`fastsab.adaptive`: change the import, keep the code.

``from toma import toma, explicit, simple`` becomes ``from fastsab.compat.toma import toma,
explicit, simple``; the parameter names (``initial_batchsize``, ``cache_type``,
``toma_initial_batchsize``, ``toma_context``, ...) and the cache types
(:data:`StacktraceMemoryBatchsizeCache` (the default), :data:`GlobalBatchsizeCache`,
:data:`NoBatchsizeCache`) are toma's. The sizes tried are toma's, and so is the error when
even a size of 1 runs out of memory: the last out-of-memory error itself (caused by an
:class:`~fastsab.adaptive.AdaptiveOOMError` that lists every size tried).

Where this module differs from toma 1.1 (README, "Coming from bionemo / toma"):

- Out-of-memory errors are those of :func:`fastsab.oom.is_out_of_memory` (every backend,
  ``torch.OutOfMemoryError``, ``MemoryError``); cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED``,
  which a smaller batch does not cure, is not one.
- When the last, shorter chunk of a range fails, the step shrinks until the chunk gets
  shorter, instead of rerunning the same chunk at every step above its length.
- Without a context, sizes are remembered per code of the function
  (:func:`fastsab.adaptive.code_context`), so a lambda made anew in a loop reuses them (a
  callable object, such as a model, and a bound method: per object, without keeping it alive).
- ``toma.chunked(dimension=...)`` chunks along ``dimension`` and ``explicit.chunked`` passes
  extra arguments on; ``toma.batch(context=...)`` without a function keeps the context.
- Sizes, steps and cache types are checked: a size that is not a positive integer, or a
  cache type that is not a cache class, raises ``TypeError``/``ValueError`` naming it.

Examples:
    >>> import torch
    >>> from fastsab.compat.toma import GlobalBatchsizeCache, toma
    >>> tried = []
    >>> for run_again in (False, True):
    ...     @toma.execute.batch(64, cache_type=GlobalBatchsizeCache)
    ...     def result(batchsize):
    ...         tried.append(batchsize)
    ...         if batchsize > 20:
    ...             raise torch.OutOfMemoryError("CUDA out of memory (example)")
    ...         return batchsize
    >>> tried  # the second run starts where the first one ended
    [64, 32, 16, 16]
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from numbers import Integral
from typing import Any

import torch

from fastsab import adaptive
from fastsab._checks import check_positive_int
from fastsab.adaptive import AdaptiveOOMError, BatchSizeCache, GlobalCache, NoCache, StackMemoryCache
from fastsab.adaptive.retry import _LAZY_ADVICE, _lazy_kind
from fastsab.oom import is_out_of_memory

__all__ = [
    "DEFAULT_CACHE_TYPE",
    "GlobalBatchsizeCache",
    "NoBatchsizeCache",
    "StacktraceMemoryBatchsizeCache",
    "explicit",
    "should_reduce_batch_size",
    "simple",
    "toma",
]

#: Start from the initial size every time.
NoBatchsizeCache = NoCache
#: One size per context (by default, per function).
GlobalBatchsizeCache = GlobalCache
#: One size per context, call site and available-memory bucket.
StacktraceMemoryBatchsizeCache = StackMemoryCache
DEFAULT_CACHE_TYPE = StackMemoryCache


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` is an out-of-memory error (:func:`fastsab.oom.is_out_of_memory`)."""
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


def _check_function(form: str, size_name: str, func: Any) -> Callable[..., Any]:
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


def _first(given: Any, default: Any) -> Any:
    return default if given is None else given


def _as_toma_error(call: Callable[[], Any]) -> Any:
    """``call()``, raising the last out-of-memory error itself when even size 1 failed, as toma does."""
    try:
        return call()
    except AdaptiveOOMError as error:
        raise error.last from error


class explicit:
    """Call forms; sizes are remembered per ``toma_context`` (default: the function's code)."""

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
        initial = _size(initial_batchsize, "initial_batchsize")
        cache = _cache_type("toma_cache_type", toma_cache_type)
        return _as_toma_error(
            lambda: adaptive.explicit.batch(
                func, initial, *args, adaptive_cache=cache, adaptive_context=toma_context, **kwargs
            )
        )

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
        initial = _size(initial_step, "initial_step")
        cache = _cache_type("toma_cache_type", toma_cache_type)
        _as_toma_error(
            lambda: adaptive.explicit.range(
                func, start, end, initial, *args, adaptive_cache=cache, adaptive_context=toma_context, **kwargs
            )
        )

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
    initial = _size(initial_step, "initial_step")
    cache = _cache_type("toma_cache_type", cache_type)
    _as_toma_error(
        lambda: adaptive.explicit.chunked(
            func, tensor, initial, *args, adaptive_dim=dim, adaptive_cache=cache, adaptive_context=context, **kwargs
        )
    )


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


class toma:
    """Decorators (``@toma.batch(initial_batchsize=...)``) and run-at-once blocks (``toma.execute``)."""

    @staticmethod
    def batch(
        func: Callable[..., Any] | None = None,
        *,
        initial_batchsize: int | None = None,
        cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        context: Any = None,
    ) -> Any:
        """Decorate ``func(batchsize, *args)``; call it as ``func(*args)``.

        The call also takes ``toma_initial_batchsize=`` and ``toma_context=``, which override the decorator's.
        """
        if func is None:
            return functools.partial(
                toma.batch, initial_batchsize=initial_batchsize, cache_type=cache_type, context=context
            )
        cache = _cache_type("cache_type", cache_type)
        function = _check_function("toma.batch", "initial_batchsize", func)

        @functools.wraps(function)
        def wrapped(
            *args: Any, toma_initial_batchsize: int | None = None, toma_context: Any = None, **kwargs: Any
        ) -> Any:
            initial = _first(toma_initial_batchsize, initial_batchsize)
            _size(initial, "toma_initial_batchsize", "initial_batchsize")
            context_ = _first(toma_context, context)
            return explicit.batch(function, initial, *args, toma_context=context_, toma_cache_type=cache, **kwargs)

        return wrapped

    @staticmethod
    def range(
        func: Callable[..., Any] | None = None,
        *,
        initial_step: int | None = None,
        cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        context: Any = None,
    ) -> Any:
        """Decorate ``func(start, end, *args)``; call it as ``func(range_start, range_end, *args)``.

        The call also takes ``toma_initial_step=`` and ``toma_context=``, which override the decorator's.
        """
        if func is None:
            return functools.partial(toma.range, initial_step=initial_step, cache_type=cache_type, context=context)
        cache = _cache_type("cache_type", cache_type)
        function = _check_function("toma.range", "initial_step", func)

        @functools.wraps(function)
        def wrapped(
            start: int,
            end: int,
            *args: Any,
            toma_initial_step: int | None = None,
            toma_context: Any = None,
            **kwargs: Any,
        ) -> None:
            initial = _first(toma_initial_step, initial_step)
            _size(initial, "toma_initial_step", "initial_step")
            context_ = _first(toma_context, context)
            explicit.range(function, start, end, initial, *args, toma_context=context_, toma_cache_type=cache, **kwargs)

        return wrapped

    @staticmethod
    def chunked(
        func: Callable[..., Any] | None = None,
        *,
        initial_step: int | None = None,
        dimension: int | None = None,
        cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
        context: Any = None,
    ) -> Any:
        """Decorate ``func(chunk, start, end, *args)``; call it as ``func(tensor, *args)``.

        The call also takes ``toma_initial_step=``, ``toma_dimension=`` and ``toma_context=``, which override
        the decorator's.
        """
        if func is None:
            return functools.partial(
                toma.chunked, initial_step=initial_step, dimension=dimension, cache_type=cache_type, context=context
            )
        cache = _cache_type("cache_type", cache_type)
        function = _check_function("toma.chunked", "initial_step", func)

        @functools.wraps(function)
        def wrapped(
            tensor: torch.Tensor,
            *args: Any,
            toma_initial_step: int | None = None,
            toma_dimension: int | None = None,
            toma_context: Any = None,
            **kwargs: Any,
        ) -> None:
            initial = _first(toma_initial_step, initial_step)
            _size(initial, "toma_initial_step", "initial_step")
            given = _first(toma_dimension, dimension)
            dim = _dimension("toma_dimension or dimension", given, tensor)
            _chunked(
                function,
                tensor,
                initial,
                args,
                kwargs,
                dim=dim,
                context=_first(toma_context, context),
                cache_type=cache,
            )

        return wrapped

    class execute:
        """Run the decorated block at once; sizes are remembered per call site (or ``context``)."""

        @staticmethod
        def batch(
            initial_batchsize: int, cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE, context: Any = None
        ) -> Callable[[Callable[..., Any]], Any]:
            """``@toma.execute.batch(64)`` over ``def block(batchsize): ...``: the name is bound to its result."""
            context = adaptive.call_site(sys._getframe(1)) if context is None else context
            return lambda func: explicit.batch(
                func, initial_batchsize, toma_cache_type=cache_type, toma_context=context
            )

        @staticmethod
        def range(
            start: int,
            end: int,
            initial_step: int,
            cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
            context: Any = None,
        ) -> Callable[[Callable[..., Any]], None]:
            """``@toma.execute.range(0, n, 64)`` over ``def block(start, end): ...``."""
            context = adaptive.call_site(sys._getframe(1)) if context is None else context
            return lambda func: explicit.range(
                func, start, end, initial_step, toma_cache_type=cache_type, toma_context=context
            )

        @staticmethod
        def chunked(
            tensor: torch.Tensor,
            initial_step: int,
            dimension: int | None = None,
            cache_type: type[BatchSizeCache] = DEFAULT_CACHE_TYPE,
            context: Any = None,
        ) -> Callable[[Callable[..., Any]], None]:
            """``@toma.execute.chunked(tensor, 64)`` over ``def block(chunk, start, end): ...``."""
            context = adaptive.call_site(sys._getframe(1)) if context is None else context
            return lambda func: _chunked(
                func,
                tensor,
                initial_step,
                (),
                {},
                dim=_dimension("dimension", dimension, tensor),
                context=context,
                cache_type=cache_type,
            )
