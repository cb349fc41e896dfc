"""Optional compiled walks of splits and of the mixing rule (numba), off by default.

``use_compiled()`` starts compiling two walks with numba in a thread of its own: ``_walk_lengths``
for ``cost="padded"`` splits over per-item costs, and ``_walk_sums`` for ``cost="sum"`` splits.
Once compiled, such splits walk their batches with them, one pass over the items, and until then
(or where numba is not installed) with the numpy walks of ``fastsab.plan._padded_kernel`` and
``fastsab.plan._sum_kernel``. Each pair gives the same batches (``tests/plan/test_compiled.py``
checks them against each other and the sum walk against the greedy loop), so a split never waits
for a compile: the first batch of a loader comes as soon as without it. The same thread compiles
``take_run`` of ``fastsab.plan._mix_kernel``, the mixing rule's inner loop, which a mixture's walk
runs as plain Python until then: one source, the same float operations in the same order, so the
same items (``tests/plan/test_mix_walk.py``). ``import fastsab`` does not import numba;
``use_compiled()`` does, in that thread.

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
from functools import partial

import numpy as np

from fastsab.plan._mix_kernel import take_run

__all__ = ["use_compiled"]

Walk = Callable[[np.ndarray, np.ndarray, int, np.ndarray], int]
SumWalk = Callable[[np.ndarray, np.ndarray, bool, int, int, np.ndarray, bool, np.ndarray], int]
TakeRun = Callable[..., tuple[int, int]]


class _State:
    """Whether the compiled walks are asked for, the walks once compiled, and the thread compiling them."""

    enabled = False
    walk: Walk | None = None
    sum_walk: SumWalk | None = None
    take_run: TakeRun | None = None
    thread: threading.Thread | None = None
    lock = threading.Lock()


def use_compiled(enabled: bool = True, *, wait: bool = False) -> bool:
    """Walk splits and mixtures with numba-compiled loops once they are compiled (or stop, with ``False``).

    Args:
        enabled: ``True`` to compile the walks (in a thread) and use them once compiled, ``False``
            to go back to the numpy walks (and the mixing rule's Python loop).
        wait: Wait for the compile to end before returning (a benchmark's warm-up); by default
            splits take the numpy walks until it ends.

    Returns:
        Whether splits and mixtures take (or will take, once compiled) the compiled walks: ``False``
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
    """The compiled walk of padded splits if it is asked for and compiled, else ``None`` (take the numpy walk)."""
    return _State.walk if _State.enabled else None


def compiled_sum_walk() -> SumWalk | None:
    """The compiled walk of sum splits if it is asked for and compiled, else ``None`` (take the numpy walk)."""
    return _State.sum_walk if _State.enabled else None


def compiled_take_run() -> TakeRun | None:
    """The compiled run of the mixing rule if it is asked for and compiled, else ``None`` (take it in Python)."""
    return _State.take_run if _State.enabled else None


def _compile() -> None:
    numba = importlib.import_module("numba")
    # NOTE: the signatures, compiled here and now (the arrays the splits pass are contiguous):
    # a call of other types raises instead of compiling while a split waits. cache=True keeps the
    # machine code on disk, so later processes load it instead of compiling; nogil lets another
    # thread run while a split walks
    compile_now = partial(numba.njit, cache=True, nogil=True)
    _State.walk = compile_now("int64(int64[::1], boolean[::1], int64, int64[::1])")(_walk_lengths)
    sums = "int64({0}[:, ::1], {0}[::1], boolean, int64, int64, boolean[::1], boolean, int64[::1])"
    _State.sum_walk = compile_now([sums.format(dtype) for dtype in ("int64", "float64")])(_walk_sums)
    # NOTE: no fastmath (nor any other flag): the compiled run rounds as Python does, so both take the same items
    f, i = "float64[::1]", "int64[::1]"
    mixing = (
        f"UniTuple(int64, 2)({f}, {f}, {f}, {i}, {f}, {i}, {i}, {f}, {i}, {f}, float64, float64, {i}, int64, int64)"
    )
    _State.take_run = compile_now(mixing)(take_run)


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


def _walk_sums(
    c: np.ndarray,
    caps: np.ndarray,
    floats: bool,
    max_items: int,
    multiple: int,
    is_over: np.ndarray,
    final: bool,
    ends: np.ndarray,
) -> int:
    """The batches from position 0 of sum costs ``c`` ``(m, k)`` under ``caps``: writes their ends into ``ends``.

    ``floats`` says whether the costs are float64 (else int64). Returns how many ends it wrote,
    or ``-1 - i`` if the item at ``i`` (not oversize) fits in no batch. The rules of
    ``fastsab.plan._greedy_walk._greedy_ends``, one loop over the items (compiled by numba:
    plain Python, slow, without it): an oversize item (``is_over``, empty for none) has a batch
    of its own; a batch grows while every column's total, summed in item order from its start,
    stays within its cap, and up to ``max_items`` items (0 for no bound); a full batch (one
    closed by an item that does not fit or by ``max_items``) longer than ``multiple`` is cut
    down to a multiple of it; without ``final``, a batch that reaches the last item stays open
    (it is not in ``ends``).
    """
    m, k = c.shape
    totals = np.zeros(k, dtype=c.dtype)
    count = 0
    i = 0
    next_over = 0 if len(is_over) else m  # the first oversize position at or after i (m if none)
    while i < m:
        if next_over < i:
            next_over = i
        while next_over < m and not is_over[next_over]:
            next_over += 1
        if next_over == i:
            ends[count] = i + 1
            count += 1
            i += 1
            continue
        hi, certain, cut_ok = next_over, next_over < m, False
        if 0 < max_items < hi - i:  # (not i + max_items < hi: that sum may pass int64)
            hi, certain, cut_ok = i + max_items, True, True
        end = i
        # NOTE: integers compare the cost with the room left (the total never passes the cap,
        # so nothing overflows); floats add first, as the greedy loop rounds
        if k == 1:  # one column: its total in a register, about twice as fast as through totals
            cap, total = caps[0], totals[0]
            while end < hi and not ((c[end, 0] > cap - total) if not floats else (total + c[end, 0] > cap)):
                total += c[end, 0]
                end += 1
        else:
            totals[:] = 0
            while end < hi:
                fits = True
                for j in range(k):
                    if (c[end, j] > caps[j] - totals[j]) if not floats else (totals[j] + c[end, j] > caps[j]):
                        fits = False
                        break
                if not fits:
                    break
                for j in range(k):
                    totals[j] += c[end, j]
                end += 1
        if end == i:
            return -1 - i
        # NOTE: _greedy_ends's rules restated (numba compiles this function alone; the tests hold
        # the two walks to the same batches): a batch that reaches hi stays open unless hi is
        # certain or the split final, and is full if closed by an item or by max_items
        if end == hi and not certain and not final:
            break
        full = end < hi or (certain and cut_ok)
        if full and end - i > multiple > 1:
            end -= (end - i) % multiple
        ends[count] = end
        count += 1
        i = end
    return count
