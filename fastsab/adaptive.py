"""Out-of-memory adaptive execution: retry with smaller batches, remember what worked.

The decorators :func:`batch`, :func:`range` and :func:`chunked` run a function with a batch
size (or a step) and, when it runs out of memory (any device, see :mod:`fastsab.oom`),
free what can be freed, shrink the size by ``factor`` and try again, down to a minimum.
The size that worked is remembered by a cache, keyed by default by the call site and the
available memory, so the next call starts there.

Examples:
    >>> @batch(initial_batch_size=64, cache=None)
    ... def step(batch_size, limit):
    ...     if batch_size > limit:
    ...         raise torch.OutOfMemoryError(f"CUDA out of memory ({batch_size})")
    ...     return batch_size
    >>> step(20)  # 64 and 32 ran out of memory; 16 fit
    16
    >>> explicit.batch(step.__wrapped__, 8, 100)  # the call form, no decorator
    8
"""

from __future__ import annotations

import functools
import gc
import inspect
import math
import os
import pickle
import sys
import threading
import traceback
import types
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, TypeVar

import torch

from fastsab._checks import check_positive_int
from fastsab.oom import is_out_of_memory

__all__ = [
    "AdaptiveOOMError",
    "BatchSizeCache",
    "GlobalCache",
    "NoCache",
    "StackMemoryCache",
    "batch",
    "call_site",
    "chunked",
    "code_context",
    "execute",
    "explicit",
    "free_memory",
    "range",
    "run",
    "set_cpu_memory_limit",
    "set_default_cache",
]

F = TypeVar("F", bound=Callable[..., Any])


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
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    for backend in ("mps", "xpu"):
        module = getattr(torch, backend, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            module.empty_cache()


# -- caches ---------------------------------------------------------------------------------


@dataclass
class _Entry:
    size: int
    successes: int = 0


class BatchSizeCache:
    """Remembers the last size that worked, per key. Subclasses choose the key.

    Args:
        grow_after: After this many successes in a row below the initial size, try the
            next larger size again (up to the initial one). ``None`` never grows.
    """

    def __init__(self, grow_after: int | None = None) -> None:
        self.grow_after = None if grow_after is None else check_positive_int("grow_after", grow_after)
        self._entries: dict[Any, _Entry] = {}
        self._lock = threading.Lock()

    def key(self, frame: Any) -> Any:
        """The key of a call whose caller's frame is ``frame``."""
        return None

    def get(self, key: Any, initial: int) -> int:
        """The size to start with."""
        entry = self._entries.get(key)
        return initial if entry is None else entry.size

    def shrunk(self, key: Any, size: int) -> None:
        """Record that a call ran out of memory and goes on at ``size`` (the next call starts there)."""
        with self._lock:
            self._entries[key] = _Entry(size)

    def success(self, key: Any, size: int, initial: int, factor: float) -> None:
        """Record that ``size`` worked: a success at the remembered size (grown back after ``grow_after``).

        Only out-of-memory errors lower the remembered size (:meth:`shrunk`): a call that asked
        for less than it (a smaller initial size) changes nothing, and a size that worked with
        nothing remembered (no call ran out of memory) is the initial size, which needs no entry.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.size != size:
                return
            entry.successes += 1
            if self.grow_after is not None and size < initial and entry.successes >= self.grow_after:
                entry.size, entry.successes = min(initial, max(size + 1, int(size * factor))), 0

    def clear(self) -> None:
        """Forget every remembered size."""
        with self._lock:
            self._entries.clear()


class NoCache(BatchSizeCache):
    """Always start from the initial size."""

    def get(self, key: Any, initial: int) -> int:
        return initial

    def shrunk(self, key: Any, size: int) -> None:
        return None

    def success(self, key: Any, size: int, initial: int, factor: float) -> None:
        return None


class GlobalCache(BatchSizeCache):
    """One size per decorated function, wherever it is called from."""


class StackMemoryCache(BatchSizeCache):
    """One size per call site (the caller's stack) and available memory bucket (default).

    The available memory is that of the current CUDA device when CUDA is initialized,
    else the host's ``MemAvailable``, counted in buckets of ``bucket_bytes``.
    """

    def __init__(self, grow_after: int | None = None, *, depth: int = 16, bucket_bytes: int = 2**28) -> None:
        super().__init__(grow_after)
        self.depth = check_positive_int("depth", depth)
        self.bucket_bytes = check_positive_int("bucket_bytes", bucket_bytes)

    def key(self, frame: Any) -> Any:
        return call_site(frame, self.depth), available_memory() // self.bucket_bytes


def call_site(frame: Any, depth: int = 16) -> tuple[tuple[str, int], ...]:
    """``(file, line)`` of ``frame`` and of up to ``depth - 1`` of its callers: where a call comes from."""
    sites: list[tuple[str, int]] = []
    while frame is not None and len(sites) < depth:
        sites.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(sites)


def available_memory() -> int:
    """Free bytes of the current CUDA device if CUDA is initialized, else of the host."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


_default_cache: Callable[[], BatchSizeCache] = StackMemoryCache


def set_default_cache(cache: type[BatchSizeCache] | Callable[[], BatchSizeCache]) -> None:
    """Choose the cache of every decorated function created with ``cache="default"``.

    Takes effect at once, also for functions decorated before (each decorated function
    makes its default cache on first use after a change).

    Args:
        cache: A :class:`BatchSizeCache` subclass, or a function without arguments that
            returns a :class:`BatchSizeCache` (checked when it is used).

    Examples:
        >>> set_default_cache(GlobalCache)
        >>> set_default_cache(StackMemoryCache)
    """
    global _default_cache
    if (isinstance(cache, type) and not issubclass(cache, BatchSizeCache)) or not callable(cache):
        raise TypeError(f"cache must be a BatchSizeCache class or factory, got {cache!r}.")
    _default_cache = cache


class _CacheSlot:
    """The cache of one decorated function: fixed, or following the default."""

    def __init__(self, cache: Any) -> None:
        self._fixed: BatchSizeCache | None = None  # None: follow the default
        self._default_factory: Any = None
        self._default: BatchSizeCache | None = None
        self.set(cache)

    def set(self, cache: Any) -> None:
        # NOTE: isinstance first: ``==`` on an array or a tensor answers elementwise
        if isinstance(cache, str) and cache == "default":
            self._fixed = None
            return
        if cache is None:
            cache = NoCache()
        elif isinstance(cache, type) and issubclass(cache, BatchSizeCache):
            cache = cache()
        if not isinstance(cache, BatchSizeCache):
            raise TypeError(f"cache must be 'default', None, a BatchSizeCache or its class, got {cache!r}.")
        self._fixed = cache

    def get(self) -> BatchSizeCache:
        if self._fixed is not None:
            return self._fixed
        if self._default is None or self._default_factory is not _default_cache:
            factory = _default_cache
            made = factory()
            if not isinstance(made, BatchSizeCache):
                raise TypeError(f"the default cache factory {factory!r} made {made!r}, not a BatchSizeCache.")
            self._default_factory, self._default = factory, made
        return self._default


def _follows_registry(cache: Any) -> bool:
    """Whether ``cache`` names a cache to make (``"default"`` or a class) rather than a given one."""
    if isinstance(cache, str):
        return cache == "default"
    return isinstance(cache, type) and issubclass(cache, BatchSizeCache)


# NOTE: bounded: a program that makes contexts without end (new call sites, new functions) does not
# grow this without end; the least recently used context starts from its initial size again
_CONTEXT_CAPACITY = 2**14
_context_slots: OrderedDict[Any, _CacheSlot] = OrderedDict()
_context_lock = threading.Lock()


def _context_slot(context: Any, cache: Any) -> _CacheSlot:
    """The cache slot of every call made with ``context`` and ``cache`` (a cache class is made once per context)."""
    try:
        hash(context)
    except TypeError:
        raise TypeError(f"context must be hashable, got {context!r} of type {type(context).__name__}.") from None
    if not _follows_registry(cache):
        return _CacheSlot(cache)  # no cache, or a given instance (itself shared); anything else is refused
    key = (context, cache)
    with _context_lock:
        slot = _context_slots.get(key)
        if slot is None:
            slot = _context_slots[key] = _CacheSlot(cache)
            if len(_context_slots) > _CONTEXT_CAPACITY:
                _context_slots.popitem(last=False)
        else:
            _context_slots.move_to_end(key)
    return slot


def code_context(func: Callable[..., Any]) -> Any:
    """The default context of a function's calls: the code it runs, not the function object.

    A lambda made anew on each iteration of a loop and a ``functools.partial`` keep their
    context (the file and the code of the function), so their sizes are remembered; and no
    function object (nor the tensors its closure holds) is kept alive by the cache. A callable
    object (a model) and a bound method (made anew at each attribute access) are remembered
    per object, by a weak reference: two models of one class keep their sizes apart, and
    neither is kept alive.
    """
    while isinstance(func, functools.partial):
        func = func.func
    if isinstance(func, types.MethodType):
        return _code_of(func.__func__), _identity(func.__self__)
    code = getattr(func, "__code__", None)
    if isinstance(code, types.CodeType):
        # NOTE: the file too: Python's equality of code objects ignores it, and the same function at the
        # same line of two files (copies of a script) is not the same work
        return code.co_filename, code
    if isinstance(func, (type, types.BuiltinFunctionType)):
        self = getattr(func, "__self__", None)
        if self is None or isinstance(self, types.ModuleType):
            return func
        return func.__qualname__, _identity(self)  # a builtin method of an object: not the object itself
    return _identity(func)  # a callable object


def _code_of(func: Any) -> Any:
    code = getattr(func, "__code__", None)
    return (code.co_filename, code) if isinstance(code, types.CodeType) else func


def _identity(obj: Any) -> Any:
    """A hashable key for ``obj`` that does not keep it alive: a weak reference, else its class."""
    try:
        hash(obj)
        return weakref.ref(obj)
    except TypeError:  # unhashable, or no weak references: every object of the class shares
        return type(obj)


# -- the retry loops --------------------------------------------------------------------------


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


def _check_finished(name: str, form: str, value: Any) -> None:
    """Raise if a call returned lazy work (a generator or coroutine) instead of its result; close that work."""
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
        cache: See :func:`batch`.
        form: The public name of the form, for messages (``"adaptive.batch"``).
        names: The names of the ``initial`` and ``minimum`` arguments, for messages.
        context: What the sizes are remembered for (hashable): every call made with an equal
            context shares them. ``None``: this object's calls only.
    """

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
        names: tuple[str, str],
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
        if isinstance(size, bool) or not isinstance(size, Integral):
            raise TypeError(
                f"{type(cache).__name__}.get returned {size!r} of type {type(size).__name__}; "
                "a cache must return an integer size."
            )
        # NOTE: a custom cache may answer anything; never run above the initial or below the minimum size
        return min(self.initial, max(self.minimum, int(size)))

    def attempt(self, size: int, tried: list[int], run: Callable[[], Any]) -> tuple[bool, Any]:
        """Run once at ``size``; on out-of-memory free memory and return ``(False, None)``."""
        tried.append(size)
        try:
            value = run()
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            free_memory(error)
            if size <= self.minimum:
                raise AdaptiveOOMError(self.name, tried, self.minimum, error) from None
            return False, None
        _check_finished(self.name, self.form, value)
        return True, value


class _Batch(_Adaptive):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cache = self.cache
        key = self.key(cache, sys._getframe(1))
        size = self.cached_size(cache, key, self.initial)
        tried: list[int] = []
        while True:
            ok, value = self.attempt(size, tried, functools.partial(self.func, size, *args, **kwargs))
            if ok:
                cache.success(key, size, self.initial, self.factor)
                return value
            size = _smaller(size, self.factor, self.minimum)
            cache.shrunk(key, size)


class _Range(_Adaptive):
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
            ok, _ = self.attempt(length, tried, functools.partial(run, position, stop))
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
    def __init__(
        self,
        func: Callable[..., Any],
        initial: int,
        minimum: int,
        factor: float,
        cache: Any,
        dim: int,
        form: str = "adaptive.chunked",
        context: Any = None,
    ) -> None:
        super().__init__(func, initial, minimum, factor, cache, form=form, names=_STEP_NAMES, context=context)
        self.dim = _check_integer("dim", dim)

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
    :class:`AdaptiveOOMError` naming every size tried. Other errors propagate unchanged.

    A retry reruns ``func`` from the start: what a failed attempt changed before it ran out
    of memory (appended results, updated state) stays changed, so ``func`` should make its
    changes only once its work has succeeded.

    Generator functions and ``async`` functions are refused with a ``TypeError`` (and so is
    a call that returns a generator or a coroutine): their work runs only when the result
    is iterated or awaited, after the call has returned and outside the retry, and a rerun
    at a smaller size would repeat the items already yielded. Return a list instead, or
    stream the work chunk by chunk with :func:`range` or :func:`chunked`, which retry only
    the chunk that ran out of memory.

    Args:
        func: The function (omit it to use ``@batch(...)`` with arguments).
        initial_batch_size: The size to try first.
        min_batch_size: The smallest size to try.
        factor: Shrink factor (a finite number > 1) after each out-of-memory error.
        cache: ``"default"`` (follows :func:`set_default_cache`, initially
            :class:`StackMemoryCache`), ``None`` (no cache), a :class:`BatchSizeCache` or
            its class. Change it later with ``func.adaptive.cache = ...`` (``"default"``
            included). A cache instance may be shared: each function keeps its own sizes.
        context: A hashable key for the sizes instead of this function: every function
            decorated with an equal context (and cache class) starts where the last one ended.

    Raises:
        TypeError: If ``func`` is not callable, or is a generator or ``async`` function.
    """
    return _decorate(
        lambda f: _Batch(
            f,
            initial_batch_size,
            min_batch_size,
            factor,
            cache,
            form="adaptive.batch",
            names=_BATCH_NAMES,
            context=context,
        ),
        func,
    )


def range(
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
    ``context`` mean, as for :func:`batch`.
    """
    return _decorate(
        lambda f: _Range(
            f, initial_step, min_step, factor, cache, form="adaptive.range", names=_STEP_NAMES, context=context
        ),
        func,
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
    their bounds, shrinking the step on out-of-memory as :func:`range` does. ``dim`` may be
    negative, counted from the last dimension. Generator and ``async`` functions are
    refused, and ``cache`` and ``context`` mean, as for :func:`batch`.
    """
    return _decorate(lambda f: _Chunked(f, initial_step, min_step, factor, cache, dim, context=context), func)


class explicit:
    """Call forms that take the function and the initial size as arguments (``factor`` 2, minimum 1).

    The sizes are remembered per ``adaptive_context``, by default the code of ``func`` (see
    :func:`code_context`): a lambda made anew on every iteration of a loop starts where the
    last one ended. ``adaptive_cache`` chooses the cache as ``cache`` does for :func:`batch`
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
        context = code_context(func) if adaptive_context is None else adaptive_context
        form = "adaptive.explicit.batch"
        adaptive = _Batch(
            func, initial_batch_size, 1, 2, adaptive_cache, form=form, names=_BATCH_NAMES, context=context
        )
        return adaptive(*args, **kwargs)

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
        context = code_context(func) if adaptive_context is None else adaptive_context
        form = "adaptive.explicit.range"
        _Range(func, initial_step, 1, 2, adaptive_cache, form=form, names=_STEP_NAMES, context=context)(
            start, end, *args, **kwargs
        )

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
        context = code_context(func) if adaptive_context is None else adaptive_context
        form = "adaptive.explicit.chunked"
        _Chunked(func, initial_step, 1, 2, adaptive_cache, adaptive_dim, form=form, context=context)(
            tensor, *args, **kwargs
        )


class execute:
    """Decorators that run the decorated function at once (for blocks of code).

    The sizes are remembered per call site of ``execute.*`` (the line and its callers), or
    per ``context`` if given: a block that runs again, e.g. on every iteration of a loop,
    starts at the size that worked the last time. The other options are those of
    :func:`batch`, :func:`range` and :func:`chunked`.

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
        return lambda func: range(func, initial_step=initial_step, context=context, **options)(start, end)

    @staticmethod
    def chunked(
        tensor: torch.Tensor, *, initial_step: int, context: Any = None, **options: Any
    ) -> Callable[[Callable[..., Any]], Any]:
        context = call_site(sys._getframe(1)) if context is None else context
        return lambda func: chunked(func, initial_step=initial_step, context=context, **options)(tensor)


# -- loaders that survive out-of-memory errors -----------------------------------------------


def run(loader: Any, step: Callable[[Any], Any], *, factor: float = 2) -> Iterator[Any]:
    """Call ``step(batch)`` on every batch of the loader's next epoch, surviving OOM.

    When ``step`` runs out of memory on a batch, memory is freed and the loader plans that
    batch again, with the rest of the epoch, under a limit ``factor`` times below the
    batch's cost (its size for :class:`~fastsab.FastLoader`): the batch's parts come next
    (split again if they fail too) and the lower limit holds for the rest of the epoch
    (``loader.stats.limit_changes``, :meth:`~fastsab.FastLoader.retry_last_batch`). Every
    sample is processed exactly once, and a state saved between results resumes exactly; a
    single sample that does not fit raises :class:`AdaptiveOOMError`.

    Under data parallelism (``world_size > 1``) the limit is kept, so that every rank still
    runs the same number of loader steps: a failing batch is split and its parts run within
    the step (accumulate the parts' gradients; save states between steps). So is a batch
    that costs nothing, which no smaller limit splits: it is halved by count, and a state
    saved between its parts' results resumes after the whole batch.

    Args:
        loader: A :class:`~fastsab.FastLoader` or :class:`~fastsab.FastSizeAwareLoader`.
        step: The work on one batch, e.g. a training step; its results are yielded.
        factor: How much smaller the limit gets after each out-of-memory error (> 1).

    Yields:
        What ``step`` returns, batch after batch (split batches give one result per part).

    Examples:
        >>> from fastsab import FastLoader
        >>> def step(batch):
        ...     if len(batch) > 3:
        ...         raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        ...     return batch.tolist()
        >>> loader = FastLoader(torch.arange(10), batch_size=8, shuffle=False)
        >>> list(run(loader, step))  # 8 fails, then 4: the rest of the epoch uses batches of 2
        [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        >>> loader.stats.limit_changes, loader.stats.num_splits
        ([(0, 8, 4), (0, 4, 2)], 2)
    """
    factor = _check_factor(factor)
    for indices, first in loader.iter_with_indices():
        pending: list[tuple[Any, Any]] = [(indices, first)]
        del first
        while pending:
            ids, batch = pending.pop()
            if batch is None:
                batch = loader.fetch(ids)
            try:
                result = step(batch)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                del batch
                free_memory(error)
                if len(ids) == 1:
                    raise AdaptiveOOMError(f"step on the sample {int(ids[0])}", [1], 1, error) from None
                limit = loader.smaller_limit(ids, factor)
                parts = loader.split_indices(ids, limit)
                loader.stats.num_splits += 1
                if loader.world_size == 1 and len(parts) > 1 and ids is indices:
                    # NOTE: the loader plans the batch again under the smaller limit, so its
                    # parts come next as the loader's own batches and a state taken between
                    # them resumes exactly
                    loader.retry_last_batch(limit)
                    break
                # NOTE: under data parallelism the limit stays (a rank that planned more steps
                # than the others would hang the job), and a batch the limit cannot split
                # (it costs nothing) is halved by count: its parts run within the loader's step
                if len(parts) == 1:
                    parts = [ids[: len(ids) // 2], ids[len(ids) // 2 :]]
                pending.extend((part, None) for part in reversed(parts))
                continue
            del batch
            yield result


def set_cpu_memory_limit(gib: float) -> float:
    """Limit this process's address space to ``gib`` GiB (``RLIMIT_AS``); return the old limit.

    Allocations beyond it fail with an out-of-memory error instead of swapping. Unix only.
    ``math.inf`` lifts the limit (as far as the hard limit allows). The old limit is returned
    in GiB, ``math.inf`` if there was none, so that ``set_cpu_memory_limit(old)`` restores it:

    ``old = set_cpu_memory_limit(8); ...; set_cpu_memory_limit(old)``

    Args:
        gib: The limit in GiB (1 GiB = 2**30 bytes), or ``math.inf`` for no limit.

    Returns:
        The previous (soft) limit in GiB, ``math.inf`` if there was none.

    Raises:
        TypeError: If ``gib`` is not a number.
        ValueError: If ``gib`` is not positive (or NaN), is below one byte or too large for
            the system, or is above the hard limit (which an unprivileged process cannot raise).
        RuntimeError: Where the ``resource`` module (``setrlimit``) is unavailable.
    """
    try:
        import resource
    except ImportError as err:  # pragma: no cover - Windows
        raise RuntimeError("set_cpu_memory_limit needs resource.setrlimit, which this platform lacks.") from err
    limit = _limit_bytes(gib, resource.RLIM_INFINITY)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and (limit == resource.RLIM_INFINITY or limit > hard):
        raise ValueError(
            f"gib={gib!r} is above the hard limit of {hard / 2**30:.2f} GiB, which this process cannot raise."
        )
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    # NOTE: soft / 2**30 * 2**30 gives soft back exactly for every limit below 2**53 bytes (8 PiB)
    return math.inf if soft == resource.RLIM_INFINITY else soft / 2**30


def _limit_bytes(gib: Any, unlimited: int) -> int:
    """``gib`` GiB in bytes for ``setrlimit``; ``unlimited`` for ``math.inf``."""
    if isinstance(gib, bool) or not isinstance(gib, Real):
        raise TypeError(f"gib must be a number, got {gib!r} of type {type(gib).__name__}.")
    try:
        value = float(gib)
    except OverflowError:  # an integer beyond float range
        raise ValueError(f"gib={gib!r} is too large for an address-space limit; pass math.inf for no limit.") from None
    if not value > 0:
        raise ValueError(f"gib must be a positive number or math.inf (no limit), got {gib!r}.")
    if math.isinf(value):
        return unlimited
    limit = int(value * 2**30)
    if limit < 1:
        raise ValueError(f"gib={gib!r} is less than one byte.")
    # NOTE: setrlimit takes a signed 64-bit number here (the unsigned 2**64 - 1 is RLIM_INFINITY)
    if limit >= 2**63 - 1:
        raise ValueError(f"gib={gib!r} is too large for an address-space limit; pass math.inf for no limit.")
    return limit
