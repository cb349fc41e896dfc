"""Caches of the sizes that worked: per function, call site and available memory, or per context."""

from __future__ import annotations

import functools
import os
import threading
import time
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fastsab._checks import check_positive_int


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

        Only out-of-memory errors lower the remembered size (``shrunk``): a call that asked
        for less than it (a smaller initial size) changes nothing, and a size that worked with
        nothing remembered (no call ran out of memory) is the initial size, which needs no entry.
        """
        # NOTE: looked up first without the lock: a call with nothing to record (no size remembered, or
        # another one) returns as if it had run just before the call that remembers a size
        entry = self._entries.get(key)
        if entry is None or entry.size != size:
            return
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
        return _site(frame, self.depth), available_memory() // self.bucket_bytes


def call_site(frame: Any, depth: int = 16) -> tuple[tuple[str, int], ...]:
    """``(file, line)`` of ``frame`` and of up to ``depth - 1`` of its callers: where a call comes from."""
    sites: list[tuple[str, int]] = []
    while frame is not None and len(sites) < depth:
        sites.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(sites)


# NOTE: a call's site is worked out from its stack on every call through a StackMemoryCache. Reading each
# frame's line costs (Python computes f_lineno from the code's line table on each access), so a call reads
# only the identity of each frame's code and the offset of its current instruction (f_lasti, a plain int),
# and looks up the site these stand for, worked out by call_site once per distinct stack: the same file and
# lines give the same site as before, from whichever code object. Each remembered stack holds its code
# objects, so none of its ids can be taken by another code object while it is remembered.
_SITES_CAPACITY = 2**14
_sites: dict[tuple[int, ...], tuple[str, tuple[types.CodeType, ...]]] = {}


def _site(frame: Any, depth: int) -> str:
    """The call site of ``frame`` and up to ``depth - 1`` of its callers (``call_site``), as a string.

    Equal strings for equal call sites; a string keeps its hash, so a cache's key is cheap to hash. The
    stack is read as ``id(f_code), f_lasti`` of each frame, in one flat tuple.
    """
    key: tuple[int, ...] = ()
    current, left = frame, depth
    # NOTE: eight frames a step, read into one tuple: a fifth less time than a frame a step on a deep stack
    while left >= 8 and current is not None:
        f1 = current.f_back
        if f1 is None:
            break
        f2 = f1.f_back
        if f2 is None:
            break
        f3 = f2.f_back
        if f3 is None:
            break
        f4 = f3.f_back
        if f4 is None:
            break
        f5 = f4.f_back
        if f5 is None:
            break
        f6 = f5.f_back
        if f6 is None:
            break
        f7 = f6.f_back
        if f7 is None:
            break
        key += (
            id(current.f_code), current.f_lasti, id(f1.f_code), f1.f_lasti, id(f2.f_code), f2.f_lasti,
            id(f3.f_code), f3.f_lasti, id(f4.f_code), f4.f_lasti, id(f5.f_code), f5.f_lasti,
            id(f6.f_code), f6.f_lasti, id(f7.f_code), f7.f_lasti,
        )  # fmt: skip
        current, left = f7.f_back, left - 8
    while left and current is not None:
        key += (id(current.f_code), current.f_lasti)
        current, left = current.f_back, left - 1
    known = _sites.get(key)
    if known is not None:
        return known[0]
    return _remember_site(key, frame, depth)


def _remember_site(key: tuple[int, ...], frame: Any, depth: int) -> str:
    """Work out and remember the site of the stack from ``frame`` that ``key`` stands for."""
    codes: list[types.CodeType] = []
    current = frame
    while current is not None and len(codes) < depth:
        codes.append(current.f_code)
        current = current.f_back
    site = repr(call_site(frame, depth))  # NOTE: repr of (str, int) pairs: equal strings only for equal sites
    if len(_sites) >= _SITES_CAPACITY:  # NOTE: bounded; a forgotten stack is worked out again when it comes back
        _sites.clear()
    _sites[key] = (site, tuple(codes))
    return site


def _cuda_initialized() -> bool:
    """Whether torch has initialized CUDA (asking does not initialize it)."""
    initialized: Callable[[], bool] = torch.cuda.is_initialized  # NOTE: torch leaves it unannotated
    # NOTE: is_initialized first: it reads a flag, while is_available asks the driver (about 1 us a call)
    return initialized() and torch.cuda.is_available()


# NOTE: the kernel writes all of /proc/meminfo on each read (several us), more than the rest of a call
# through a decorated function; the host's reading is reused for this long, so a call is keyed by the
# memory bucket of a reading at most this old (a loop of short calls reads it a few times a second)
_HOST_READING_SECONDS = 0.05
_host_reading: tuple[float, int] = (float("-inf"), 0)  # (time.monotonic() of the reading, bytes)


def available_memory() -> int:
    """Free bytes of the current CUDA device if CUDA is initialized, else of the host.

    The host's figure is read at most once every ``_HOST_READING_SECONDS`` (50 ms) and reused
    in between.
    """
    if _cuda_initialized():
        return int(torch.cuda.mem_get_info()[0])
    global _host_reading
    now = time.monotonic()
    read_at, free = _host_reading
    if not 0 <= now - read_at < _HOST_READING_SECONDS:
        free = _read_host_available()
        _host_reading = (now, free)  # NOTE: one tuple, swapped whole: threads see an old or a new reading
    return free


def _read_host_available() -> int:
    """The host's ``MemAvailable`` in bytes (else its free pages, else 0), read now."""
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
        cache: A ``BatchSizeCache`` subclass, or a function without arguments that
            returns a ``BatchSizeCache`` (checked when it is used).

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
