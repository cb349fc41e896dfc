"""An optional compiled walk for ``cost="padded"`` splits (numba), off by default.

``use_compiled()`` starts compiling ``_walk_lengths`` with numba in a thread of its own; once it is
compiled, padded splits over per-item costs walk their batches with it, one pass over the items,
and until then (or where numba is not installed) with the numpy walk of
``fastsab.plan._padded_kernel``. The two give the same batches (``tests/plan/test_compiled.py``
checks them against each other), so a split never waits for a compile: the first batch of a loader
comes as soon as without it. ``import fastsab`` does not import numba; ``use_compiled()`` does, in
that thread.

Examples:
    >>> from fastsab.plan.compiled import use_compiled
    >>> use_compiled(False)
    False
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable

import numpy as np

__all__ = ["use_compiled"]

Walk = Callable[[np.ndarray, np.ndarray, int, np.ndarray], int]


class _State:
    """Whether the compiled walk is asked for, the walk once compiled, and the thread compiling it."""

    enabled = False
    walk: Walk | None = None
    thread: threading.Thread | None = None
    lock = threading.Lock()


def use_compiled(enabled: bool = True, *, wait: bool = False) -> bool:
    """Walk padded splits with a numba-compiled loop once it is compiled (or stop, with ``False``).

    Args:
        enabled: ``True`` to compile the walk (in a thread) and use it once compiled, ``False``
            to go back to the numpy walk.
        wait: Wait for the compile to end before returning (a benchmark's warm-up); by default
            splits take the numpy walk until it ends.

    Returns:
        Whether padded splits take (or will take, once compiled) the compiled walk: ``False``
        where numba is not installed (``pip install "fastsab[compiled]"``) or with ``enabled=False``.

    Raises:
        TypeError: If ``enabled`` or ``wait`` is not a bool.
    """
    for name, value in (("enabled", enabled), ("wait", wait)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}.")
    if not enabled or importlib.util.find_spec("numba") is None:
        _State.enabled = False
        return False
    with _State.lock:
        _State.enabled = True
        if _State.thread is None:
            # NOTE: a daemon thread: a compile still running never holds up the interpreter's exit
            _State.thread = threading.Thread(target=_compile, name="fastsab-numba-compile", daemon=True)
            _State.thread.start()
        thread = _State.thread
    if wait:
        thread.join()
    return True


def compiled_walk() -> Walk | None:
    """The compiled walk if it is asked for and compiled, else ``None`` (take the numpy walk)."""
    return _State.walk if _State.enabled else None


def _compile() -> None:
    numba = importlib.import_module("numba")
    # NOTE: one signature, compiled here and now (the arrays _padded_split passes are contiguous):
    # a call of other types raises instead of compiling while a split waits. cache=True keeps the
    # machine code on disk, so later processes load it instead of compiling; nogil lets another
    # thread run while a split walks
    signature = "int64(int64[::1], boolean[::1], int64, int64[::1])"
    _State.walk = numba.njit(signature, cache=True, nogil=True)(_walk_lengths)


def _walk_lengths(lengths: np.ndarray, is_over: np.ndarray, multiple: int, ends: np.ndarray) -> int:
    """The batches from position 0 over the items' length bounds: writes their ends into ``ends``, returns how many.

    ``lengths[i] >= 1`` is the most items a batch holding item ``i`` may have, so a batch from
    ``i`` grows while its length stays within the smallest bound of its items. A full batch (one
    that does not end at an oversize item, ``is_over``, or at the last item) longer than
    ``multiple`` is cut down to a multiple of it. The rules of ``_padded_split``'s numpy walk,
    one loop over the items (compiled by numba: plain Python, slow, without it).
    """
    m = len(lengths)
    count = 0
    i = 0
    next_over = 0  # the first oversize position at or after i (m if none)
    while i < m:
        if next_over < i:
            next_over = i
        while next_over < m and not is_over[next_over]:
            next_over += 1
        bound = lengths[i]
        end = i + 1
        while end < m:
            if lengths[end] < bound:
                bound = lengths[end]
            if end - i + 1 > bound:
                break
            end += 1
        size = end - i
        if multiple > 1 and end < next_over and size > multiple:
            end -= size % multiple
        ends[count] = end
        count += 1
        i = end
    return count
