"""toma 1.1's API on ``fastsab.adaptive``: change the import, keep the code.

``from toma import toma, explicit, simple`` becomes ``from fastsab.compat.toma import toma,
explicit, simple``; the parameter names (``initial_batchsize``, ``cache_type``,
``toma_initial_batchsize``, ``toma_context``, ...) and the cache types
(``StacktraceMemoryBatchsizeCache`` (the default), ``GlobalBatchsizeCache``,
``NoBatchsizeCache``) are toma's. The sizes tried are toma's, and so is the error when
even a size of 1 runs out of memory: the last out-of-memory error itself (caused by an
``AdaptiveOOMError`` that lists every size tried).

Where this module differs from toma 1.1 (docs/coming-from/toma.md):

- Out-of-memory errors are those of ``fastsab.adaptive.oom.is_out_of_memory`` (every backend,
  ``torch.OutOfMemoryError``, ``MemoryError``); cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED``,
  which a smaller batch does not cure, is not one.
- When the last, shorter chunk of a range fails, the step shrinks until the chunk gets
  shorter, instead of rerunning the same chunk at every step above its length.
- Without a context, sizes are remembered per code of the function
  (``fastsab.adaptive.code_context``), so a lambda made anew in a loop reuses them (a
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
from typing import Any

import torch

from fastsab import adaptive
from fastsab.adaptive import BatchSizeCache
from fastsab.compat._toma_calls import (
    _SIZE_NAMES,
    DEFAULT_CACHE_TYPE,
    GlobalBatchsizeCache,
    NoBatchsizeCache,
    StacktraceMemoryBatchsizeCache,
    _cache_type,
    _check_function,
    _chunked,
    _dimension,
    _first,
    _size,
    explicit,
    should_reduce_batch_size,
    simple,
)

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


def _decorated(
    form: str,
    func: Callable[..., Any] | None,
    options: dict[str, Any],
    wrap: Callable[[Callable[..., Any], type[BatchSizeCache]], Callable[..., Any]],
) -> Any:
    """``func`` decorated by ``toma.<form>(**options)``: ``wrap(func, cache type)``, named as ``func``.

    Without ``func`` (``@toma.batch(initial_batchsize=64)``), the decorator that takes it. The
    cache type and then the function are checked when decorating, as toma's forms name them.
    """
    if func is None:
        return functools.partial(getattr(toma, form), **options)
    cache = _cache_type("cache_type", options["cache_type"])
    function = _check_function(f"toma.{form}", _SIZE_NAMES[form], func)
    return functools.wraps(function)(wrap(function, cache))


class toma:
    """Decorators (``@toma.batch(initial_batchsize=...)``) and run-at-once blocks (``toma.execute``)."""

    # NOTE: the decorators are alike in shape because toma's are: each keeps toma's own parameter
    # names and overrides; what they share is done once, by _decorated and _toma_calls._forward

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

        def wrap(function: Callable[..., Any], cache: type[BatchSizeCache]) -> Callable[..., Any]:
            def wrapped(
                *args: Any, toma_initial_batchsize: int | None = None, toma_context: Any = None, **kwargs: Any
            ) -> Any:
                initial = _size(
                    _first(toma_initial_batchsize, initial_batchsize), "toma_initial_batchsize", "initial_batchsize"
                )
                context_ = _first(toma_context, context)
                return explicit.batch(function, initial, *args, toma_context=context_, toma_cache_type=cache, **kwargs)

            return wrapped

        options = {"initial_batchsize": initial_batchsize, "cache_type": cache_type, "context": context}
        return _decorated("batch", func, options, wrap)

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

        def wrap(function: Callable[..., Any], cache: type[BatchSizeCache]) -> Callable[..., Any]:
            def wrapped(
                start: int,
                end: int,
                *args: Any,
                toma_initial_step: int | None = None,
                toma_context: Any = None,
                **kwargs: Any,
            ) -> None:
                initial = _size(_first(toma_initial_step, initial_step), "toma_initial_step", "initial_step")
                context_ = _first(toma_context, context)
                explicit.range(
                    function, start, end, initial, *args, toma_context=context_, toma_cache_type=cache, **kwargs
                )

            return wrapped

        options = {"initial_step": initial_step, "cache_type": cache_type, "context": context}
        return _decorated("range", func, options, wrap)

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

        def wrap(function: Callable[..., Any], cache: type[BatchSizeCache]) -> Callable[..., Any]:
            def wrapped(
                tensor: torch.Tensor,
                *args: Any,
                toma_initial_step: int | None = None,
                toma_dimension: int | None = None,
                toma_context: Any = None,
                **kwargs: Any,
            ) -> None:
                initial = _size(_first(toma_initial_step, initial_step), "toma_initial_step", "initial_step")
                dim = _dimension("toma_dimension or dimension", _first(toma_dimension, dimension), tensor)
                context_ = _first(toma_context, context)
                _chunked(function, tensor, initial, args, kwargs, dim=dim, context=context_, cache_type=cache)

            return wrapped

        options = {"initial_step": initial_step, "dimension": dimension, "cache_type": cache_type, "context": context}
        return _decorated("chunked", func, options, wrap)

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
