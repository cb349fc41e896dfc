"""The adaptive forms: the decorators ``batch``, ``range`` and ``chunked``, ``explicit`` and
``execute``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

# NOTE: GlobalCache is used by the examples of the docstrings (their namespace is this module's)
from fastsab.adaptive.caches import GlobalCache, call_site, code_context  # noqa: F401
from fastsab.adaptive.retry import _Adaptive, _Batch, _Chunked, _decorate, _Range

# NOTE: the forms' signatures are alike by design (each names its size and options as its API
# does); what they share is done once, by the retry classes of retry.py


def batch(
    func: Callable[..., Any] | None = None,
    *,
    initial_batch_size: int,
    min_batch_size: int = 1,
    factor: float = 2,
    cache: Any = "default",
    context: Any = None,
) -> Any:
    """Decorate ``func(batch_size, *args, **kwargs)``; call it as ``func(*args, **kwargs)``.

    Runs with the cached (else the initial) batch size; on out-of-memory frees memory and
    retries with ``batch_size / factor``, down to ``min_batch_size``, then raises
    ``AdaptiveOOMError`` naming every size tried. Other errors propagate unchanged.

    A retry reruns ``func`` from the start: what a failed attempt changed before it ran out
    of memory (appended results, updated state) stays changed, so ``func`` should make its
    changes only once its work has succeeded.

    Generator functions and ``async`` functions are refused with a ``TypeError`` (and so is
    a call that returns a generator or a coroutine): their work runs only when the result
    is iterated or awaited, after the call has returned and outside the retry, and a rerun
    at a smaller size would repeat the items already yielded. Return a list instead, or
    stream the work chunk by chunk with ``range`` or ``chunked``, which retry only
    the chunk that ran out of memory.

    Args:
        func: The function (omit it to use ``@batch(...)`` with arguments).
        initial_batch_size: The size to try first.
        min_batch_size: The smallest size to try.
        factor: Shrink factor (a finite number > 1) after each out-of-memory error.
        cache: ``"default"`` (follows ``set_default_cache``, initially
            ``StackMemoryCache``), ``None`` (no cache), a ``BatchSizeCache`` or
            its class. Change it later with ``func.adaptive.cache = ...`` (``"default"``
            included). A cache instance may be shared: each function keeps its own sizes.
        context: A hashable key for the sizes instead of this function: every function
            decorated with an equal context (and cache class) starts where the last one ended.

    Raises:
        TypeError: If ``func`` is not callable, or is a generator or ``async`` function.
    """
    return _decorate(
        lambda f: _Batch(f, initial_batch_size, min_batch_size, factor, cache, form="adaptive.batch", context=context),
        func,
    )


def range_(
    func: Callable[..., Any] | None = None,
    *,
    initial_step: int,
    min_step: int = 1,
    factor: float = 2,
    cache: Any = "default",
    context: Any = None,
) -> Any:
    """Decorate ``func(start, end, *args)``; call it as ``func(range_start, range_end, *args)``.

    Calls ``func`` on consecutive chunks ``[start, end)`` of ``range_start..range_end``
    (integers, ``range_end >= range_start``) of ``step`` items; on out-of-memory shrinks the
    step and retries the failed chunk, so completed chunks are not repeated. A failed chunk
    is rerun from its start: ``func`` should write a chunk's results only once its work has
    succeeded. When a chunk shorter than the step (the last one) fails, the step shrinks until
    the chunk gets shorter. Generator and ``async`` functions are refused, and ``cache`` and
    ``context`` mean, as for ``batch``.
    """
    return _decorate(
        lambda f: _Range(f, initial_step, min_step, factor, cache, form="adaptive.range", context=context), func
    )


def chunked(
    func: Callable[..., Any] | None = None,
    *,
    initial_step: int,
    dim: int = 0,
    min_step: int = 1,
    factor: float = 2,
    cache: Any = "default",
    context: Any = None,
) -> Any:
    """Decorate ``func(chunk, start, end, *args)``; call it as ``func(tensor, *args)``.

    Passes views ``tensor.narrow(dim, start, end - start)`` of consecutive chunks, with
    their bounds, shrinking the step on out-of-memory as ``range`` does. ``dim`` may be
    negative, counted from the last dimension. Generator and ``async`` functions are
    refused, and ``cache`` and ``context`` mean, as for ``batch``.
    """

    def make(f: Callable[..., Any]) -> _Chunked:
        return _Chunked(f, initial_step, min_step, factor, cache, form="adaptive.chunked", context=context).along(dim)

    return _decorate(make, func)


_Form = TypeVar("_Form", bound=_Adaptive)


def _explicit(kind: type[_Form], name: str, func: Callable[..., Any], initial: int, cache: Any, context: Any) -> _Form:
    """The retrying run of ``func`` for the call form ``explicit.<name>``: the size halves down to 1, and is
    remembered per ``context``, by default per code of ``func`` (``code_context``).
    """
    # NOTE: only made here: the form itself calls it, so that a call-site cache sees the form's caller
    context = code_context(func) if context is None else context
    return kind(func, initial, 1, 2, cache, form=f"adaptive.explicit.{name}", context=context)


class explicit:
    """Call forms that take the function and the initial size as arguments (``factor`` 2, minimum 1).

    The sizes are remembered per ``adaptive_context``, by default the code of ``func`` (see
    ``code_context``): a lambda made anew on every iteration of a loop starts where the
    last one ended. ``adaptive_cache`` chooses the cache as ``cache`` does for ``batch``
    (``None``: start from the initial size every time). The ``adaptive_`` options are
    keyword-only and are not passed on to ``func``; every other argument is.

    Examples:
        >>> def step(batch_size, limit):
        ...     if batch_size > limit:
        ...         raise torch.OutOfMemoryError("CUDA out of memory (example)")
        ...     return batch_size
        >>> [explicit.batch(step, 64, limit, adaptive_cache=GlobalCache) for limit in (20, 100)]
        [16, 16]
        >>> explicit.batch(step, 64, 100, adaptive_cache=None)
        64
    """

    @staticmethod
    def batch(
        func: Callable[..., Any],
        initial_batch_size: int,
        /,
        *args: Any,
        adaptive_cache: Any = "default",
        adaptive_context: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``func(batch_size, *args, **kwargs)`` with adaptive batch size."""
        return _explicit(_Batch, "batch", func, initial_batch_size, adaptive_cache, adaptive_context)(*args, **kwargs)

    @staticmethod
    def range(
        func: Callable[..., Any],
        start: int,
        end: int,
        initial_step: int,
        /,
        *args: Any,
        adaptive_cache: Any = "default",
        adaptive_context: Any = None,
        **kwargs: Any,
    ) -> None:
        """``func(chunk_start, chunk_end, *args, **kwargs)`` over ``start..end``."""
        steps = _explicit(_Range, "range", func, initial_step, adaptive_cache, adaptive_context)
        steps(start, end, *args, **kwargs)

    @staticmethod
    def chunked(
        func: Callable[..., Any],
        tensor: torch.Tensor,
        initial_step: int,
        /,
        *args: Any,
        adaptive_dim: int = 0,
        adaptive_cache: Any = "default",
        adaptive_context: Any = None,
        **kwargs: Any,
    ) -> None:
        """``func(chunk, start, end, *args, **kwargs)`` over ``tensor`` along ``adaptive_dim``."""
        chunks = _explicit(_Chunked, "chunked", func, initial_step, adaptive_cache, adaptive_context)
        chunks.along(adaptive_dim)(tensor, *args, **kwargs)


class execute:
    """Decorators that run the decorated function at once (for blocks of code).

    The sizes are remembered per call site of ``execute.*`` (the line and its callers), or
    per ``context`` if given: a block that runs again, e.g. on every iteration of a loop,
    starts at the size that worked the last time. The other options are those of
    ``batch``, ``range`` and ``chunked``.

    Examples:
        >>> tried = []
        >>> for run_again in (False, True):
        ...     @execute.batch(initial_batch_size=64, cache=GlobalCache)
        ...     def result(batch_size):
        ...         tried.append(batch_size)
        ...         if batch_size > 20:
        ...             raise torch.OutOfMemoryError("CUDA out of memory (example)")
        ...         return batch_size * 2
        >>> result, tried  # the second run starts at 16
        (32, [64, 32, 16, 16])
    """

    @staticmethod
    def batch(*, initial_batch_size: int, context: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        context = call_site(sys._getframe(1)) if context is None else context
        return lambda func: batch(func, initial_batch_size=initial_batch_size, context=context, **options)()

    @staticmethod
    def range(
        start: int, end: int, *, initial_step: int, context: Any = None, **options: Any
    ) -> Callable[[Callable[..., Any]], Any]:
        context = call_site(sys._getframe(1)) if context is None else context
        return lambda func: range_(func, initial_step=initial_step, context=context, **options)(start, end)

    @staticmethod
    def chunked(
        tensor: torch.Tensor, *, initial_step: int, context: Any = None, **options: Any
    ) -> Callable[[Callable[..., Any]], Any]:
        context = call_site(sys._getframe(1)) if context is None else context
        return lambda func: chunked(func, initial_step=initial_step, context=context, **options)(tensor)
