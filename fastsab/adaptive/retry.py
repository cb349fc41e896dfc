"""The retry machinery of the adaptive forms: shrink the size after out-of-memory errors, free memory."""

from __future__ import annotations

import functools
import gc
import inspect
import math
import pickle
import sys
import traceback
import types
from abc import ABC, abstractmethod
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

import torch

from fastsab._checks import check_positive_int
from fastsab.adaptive.caches import BatchSizeCache, _CacheSlot, _context_slot, _cuda_initialized
from fastsab.adaptive.oom import is_out_of_memory


class AdaptiveOOMError(RuntimeError):
    """Raised when a function ran out of memory at every size down to the minimum.

    Attributes:
        tried: The sizes tried, in order.
        last: The out-of-memory error of the last size tried.
    """

    def __init__(self, name: str, tried: list[int], minimum: int, last: BaseException) -> None:
        sizes = ", ".join(str(size) for size in tried)
        super().__init__(
            f"{name} ran out of memory at every size tried ({sizes}); the minimum is {minimum}. "
            f"Last error: {type(last).__name__}: {last}"
        )
        self.tried = tried
        self.last = last

    def __reduce__(self) -> tuple[Any, ...]:
        # NOTE: rebuilt from the message, not by __init__ (whose arguments are not kept), so that
        # the error crosses process boundaries (multiprocessing, DataLoader workers) intact
        state = {**self.__dict__, "last": _portable(getattr(self, "last", None))}
        return _restore_error, (type(self), str(self)), state


def _restore_error(cls: type[AdaptiveOOMError], message: str) -> AdaptiveOOMError:
    return cls.__new__(cls, message)


def _portable(error: BaseException | None) -> BaseException | None:
    """``error`` if it survives pickling, else a ``RuntimeError`` with its type and message."""
    # NOTE: an exception whose __init__ takes more than its message pickles but fails to unpickle
    # (its args are not its __init__'s), which would lose the whole AdaptiveOOMError on the other side
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def free_memory(error: BaseException | None = None) -> None:
    """Give memory back after an out-of-memory error.

    Clears the frames of ``error``'s traceback (their locals hold the failed attempt's
    tensors), collects garbage and empties the caches of the devices torch has
    initialized.
    """
    if error is not None and error.__traceback__ is not None:
        traceback.clear_frames(error.__traceback__)
    gc.collect()
    if _cuda_initialized():
        torch.cuda.empty_cache()
    for backend in ("mps", "xpu"):
        module = getattr(torch, backend, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            module.empty_cache()


def _check_factor(factor: Any) -> float:
    if isinstance(factor, bool) or not isinstance(factor, Real):
        raise TypeError(f"factor must be a number, got {factor!r} of type {type(factor).__name__}.")
    try:
        value = float(factor)
    except OverflowError:  # an integer beyond float range
        value = math.inf
    if not (value > 1 and math.isfinite(value)):
        raise ValueError(f"factor must be a finite number > 1, got {factor!r}.")
    return value


def _check_integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} of type {type(value).__name__}.")
    return int(value)


_BATCH_NAMES = ("initial_batch_size", "min_batch_size")
_STEP_NAMES = ("initial_step", "min_step")


def _smaller(size: int, factor: float, minimum: int) -> int:
    return max(minimum, min(size - 1, int(size / factor)))


# What runs after a call has returned, outside any retry: how each kind of function or result is named.
_LAZY_FUNCTIONS = (
    (inspect.isgeneratorfunction, "a generator function"),
    (inspect.isasyncgenfunction, "an async generator function"),
    (inspect.iscoroutinefunction, "a coroutine function (async def)"),
)
_LAZY_RESULTS = (
    (inspect.isgenerator, "a generator"),
    (inspect.isasyncgen, "an async generator"),
    (inspect.iscoroutine, "a coroutine"),
)
_LAZY_ADVICE = (
    "its work runs only when the caller iterates or awaits the result, after the call has returned and outside "
    "the retry, and rerunning it at a smaller size would repeat the items already yielded. Return a list (or "
    "another finished result) instead, or use adaptive.range or adaptive.chunked, which retry only the chunk "
    "that ran out of memory."
)


def _lazy_kind(func: Callable[..., Any]) -> str | None:
    """How ``func`` is named if it is a generator or async function (or a callable object whose call is one)."""
    targets = [func]
    if not (inspect.isroutine(func) or isinstance(func, (type, functools.partial))):
        targets.append(type(func).__call__)  # a callable object: what its call runs
    for target in targets:
        for test, kind in _LAZY_FUNCTIONS:
            if test(target):
                return kind
    return None


# NOTE: the types that _LAZY_RESULTS tests, in one isinstance: a finished result (nearly every call) costs one check
_LAZY_TYPES = (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)


def _check_finished(name: str, form: str, value: Any) -> None:
    """Raise if a call returned lazy work (a generator or coroutine) instead of its result; close that work."""
    if not isinstance(value, _LAZY_TYPES):
        return
    for test, kind in _LAZY_RESULTS:
        if test(value):
            close = getattr(value, "close", None)  # a generator or coroutine; an async generator cannot be closed here
            if close is not None:
                close()
            raise TypeError(f"{name} returned {kind}; {form} cannot retry it: {_LAZY_ADVICE}")


class _Adaptive(ABC):
    """Shared machinery of the decorated forms: options, cache and the shrink loop.

    Args:
        func: The function to run.
        initial: The size to try first.
        minimum: The smallest size to try.
        factor: Shrink factor (> 1) after each out-of-memory error.
        cache: See ``batch``.
        form: The public name of the form, for messages (``"adaptive.batch"``).
        context: What the sizes are remembered for (hashable): every call made with an equal
            context shares them. ``None``: this object's calls only.
    """

    #: The names of the ``initial`` and ``minimum`` arguments, for messages.
    names: tuple[str, str]

    @abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the decorated function, adapting its size."""

    def __init__(
        self,
        func: Callable[..., Any],
        initial: int,
        minimum: int,
        factor: float,
        cache: Any,
        *,
        form: str,
        context: Any = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"func must be callable, got {func!r} of type {type(func).__name__}.")
        self.func = func
        self.form = form
        self.name = getattr(func, "__qualname__", None) or repr(func)
        kind = _lazy_kind(func)
        if kind is not None:
            raise TypeError(f"{self.name} is {kind}; {form} cannot retry it: {_LAZY_ADVICE}")
        names = self.names
        self.initial = check_positive_int(names[0], initial)
        self.minimum = check_positive_int(names[1], minimum)
        if self.minimum > self.initial:
            raise ValueError(f"{names[1]} ({self.minimum}) must not exceed {names[0]} ({self.initial}).")
        self.factor = _check_factor(factor)
        # NOTE: the context's own token in every key: a cache instance shared by several functions
        # (or a default factory that returns one) must not start one function at another's size
        if context is None:
            self.slot, self._token = _CacheSlot(cache), object()
        else:
            self.slot, self._token = _context_slot(context, cache), ("context", context)

    @property
    def cache(self) -> BatchSizeCache:
        return self.slot.get()

    @cache.setter
    def cache(self, cache: Any) -> None:
        self.slot.set(cache)

    def key(self, cache: BatchSizeCache, frame: Any) -> Any:
        """This function's key in ``cache`` for a call from ``frame``."""
        return self._token, cache.key(frame)

    def cached_size(self, cache: BatchSizeCache, key: Any, default: int) -> int:
        """The size ``cache`` remembers for ``key`` (else ``default``), within this function's bounds."""
        size = cache.get(key, default)
        if type(size) is not int:  # NOTE: a plain int (every cache of this package) skips the checks below
            if isinstance(size, bool) or not isinstance(size, Integral):
                raise TypeError(
                    f"{type(cache).__name__}.get returned {size!r} of type {type(size).__name__}; "
                    "a cache must return an integer size."
                )
            size = int(size)
        # NOTE: a custom cache may answer anything; never run above the initial or below the minimum size
        return min(self.initial, max(self.minimum, size))

    def attempt(
        self, size: int, tried: list[int], run: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> tuple[bool, Any]:
        """Run ``run(*args, **kwargs)`` once at ``size``; on out-of-memory free memory and return ``(False, None)``."""
        tried.append(size)
        try:
            value = run(*args, **kwargs)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            self.recover(error, size, tried)
            return False, None
        _check_finished(self.name, self.form, value)
        return True, value

    def recover(self, error: BaseException, size: int, tried: list[int]) -> None:
        """Free memory after ``error``, an out-of-memory error at ``size``; raise if ``size`` is the minimum."""
        free_memory(error)
        if size <= self.minimum:
            raise AdaptiveOOMError(self.name, tried, self.minimum, error) from None


class _Batch(_Adaptive):
    names = _BATCH_NAMES

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache = self.slot.get()
        key = self._token, cache.key(sys._getframe(1))  # NOTE: self.key(cache, ...), a call less
        size = self.cached_size(cache, key, self.initial)
        tried: list[int] = []
        # NOTE: attempt's steps written out: this loop runs on every call, and a call less counts on a short function
        while True:
            tried.append(size)
            try:
                value = self.func(size, *args, **kwargs)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                self.recover(error, size, tried)
                size = _smaller(size, self.factor, self.minimum)
                cache.shrunk(key, size)
                continue
            _check_finished(self.name, self.form, value)
            cache.success(key, size, self.initial, self.factor)
            return value


class _Range(_Adaptive):
    names = _STEP_NAMES

    def __call__(self, start: int, end: int, /, *args: Any, **kwargs: Any) -> None:
        start, end = _check_integer("start", start), _check_integer("end", end)
        if end < start:
            raise ValueError(f"end must not be below start, got start={start!r} and end={end!r}.")
        self.steps(sys._getframe(1), start, end, lambda first, stop: self.func(first, stop, *args, **kwargs))

    def steps(self, frame: Any, start: int, end: int, run: Callable[[int, int], Any]) -> None:
        """Call ``run(first, stop)`` on consecutive chunks of ``start..end``, shrinking the failed one."""
        cache = self.cache
        key = self.key(cache, frame)
        step = self.cached_size(cache, key, self.initial)
        position = start
        tried: list[int] = []
        while position < end:
            stop = min(position + step, end)
            length = stop - position
            ok, _ = self.attempt(length, tried, run, position, stop)
            if not ok:
                # NOTE: shrunk until the failed chunk itself gets shorter: a short last chunk is not
                # rerun unchanged at every step above its length
                step = _smaller(step, self.factor, self.minimum)
                while step >= length and step > self.minimum:
                    step = _smaller(step, self.factor, self.minimum)
                cache.shrunk(key, step)
                continue  # retry the failed chunk with the smaller step
            tried.clear()
            cache.success(key, step, self.initial, self.factor)
            step = self.cached_size(cache, key, step)  # the same step, or a grown one (grow_after)
            position = stop


class _Chunked(_Range):
    #: The dimension chunked along (see ``along``).
    dim = 0

    def along(self, dim: int) -> _Chunked:
        """This form, chunking along ``dim`` (an integer, checked against each tensor when called)."""
        self.dim = _check_integer("dim", dim)
        return self

    def __call__(self, tensor: torch.Tensor, /, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"the first argument must be a tensor to chunk, got {type(tensor).__name__}.")
        dim = self.dim
        if not -tensor.dim() <= dim < tensor.dim():
            raise ValueError(f"dim={dim!r} is out of range for a tensor of shape {tuple(tensor.shape)}.")

        def run(start: int, end: int) -> Any:
            return self.func(tensor.narrow(dim, start, end - start), start, end, *args, **kwargs)

        self.steps(sys._getframe(1), 0, tensor.shape[dim], run)


def _decorate(make: Callable[[Callable[..., Any]], _Adaptive], func: Callable[..., Any] | None) -> Any:
    def wrap(function: Callable[..., Any]) -> Any:
        adaptive = make(function)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return adaptive(*args, **kwargs)

        wrapper.adaptive = adaptive  # type: ignore[attr-defined]
        return wrapper

    return wrap if func is None else wrap(func)
