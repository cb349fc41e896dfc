"""Greedy size-aware batching.

Two entry points share one semantics:

* :func:`split_batches`, the vectorized kernel: per-item costs in epoch order in, batch
  boundaries out. It is what the loaders and samplers use.
* :func:`size_aware_batching`, the streaming generator of the bionemo API, for plain
  iterables of data.

The greedy rule (bionemo compatible): items are taken in order; an item whose cost exceeds
``max_total_size`` is oversize (skipped and counted by default); an item joins the current
batch while the batch's cost stays ``<= max_total_size`` (the cap is inclusive), otherwise
the batch is emitted and a new one starts with that item; the last partial batch is
emitted; no empty batch is ever emitted.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Literal, TypeVar

import numpy as np

from fastsab._checks import (
    as_numeric_array,
    as_size,
    check_choice,
    check_nonnegative_real,
    check_optional_positive_int,
    check_positive_int,
    short_repr,
)

__all__ = ["BatchSplit", "Carry", "size_aware_batching", "split_batches"]

Data = TypeVar("Data")
CostMode = Literal["sum", "padded"]
OversizePolicy = Literal["skip", "own_batch", "error"]

_UNIT_ROUNDOFF = 2.0**-53
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Carry:
    """The open batch at the end of a non-final :func:`split_batches` call.

    Pass it as ``carry=`` to the next call (with the next chunk of costs) to continue the
    split exactly as if the chunks had been one array.

    Attributes:
        ids: Ids of the items of the open batch, in order.
        costs: Their costs, shape ``(len(ids), k)``.
        next_position: Global position of the next chunk's first item (used for default ids).
    """

    ids: np.ndarray
    costs: np.ndarray
    next_position: int

    def __len__(self) -> int:
        return len(self.ids)


class BatchSplit:
    """Result of :func:`split_batches`: batches in CSR form.

    Batch ``b`` is ``ids[offsets[b]:offsets[b + 1]]``.

    Attributes:
        ids: Ids of the batched items, batch after batch (global positions by default,
            made on first access).
        offsets: ``int64`` array of ``num_batches + 1`` offsets into ``ids``.
        skipped: Ids of the oversize items that were skipped (``oversize="skip"``).
        carry: The open batch to pass to the next call, or ``None`` after a final call.
    """

    __slots__ = ("_ids", "carry", "offsets", "skipped")

    def __init__(self, ids: np.ndarray | range, offsets: np.ndarray, skipped: np.ndarray, carry: Carry | None) -> None:
        self._ids = ids
        self.offsets = offsets
        self.skipped = skipped
        self.carry = carry

    @property
    def ids(self) -> np.ndarray:
        if isinstance(self._ids, range):
            self._ids = np.arange(self._ids.start, self._ids.stop, dtype=np.int64)
        return self._ids

    @property
    def num_batches(self) -> int:
        """Number of complete batches in this result."""
        return len(self.offsets) - 1

    def batches(self) -> list[np.ndarray]:
        """The batches as a list of id arrays (views into :attr:`ids`).

        Examples:
            >>> split_batches([2, 2, 3, 1], 4).batches()
            [array([0, 1]), array([2, 3])]
        """
        offsets = self.offsets
        ids = self.ids
        return [ids[offsets[b] : offsets[b + 1]] for b in range(len(offsets) - 1)]

    def __repr__(self) -> str:
        return (
            f"BatchSplit(num_batches={self.num_batches}, num_items={int(self.offsets[-1])}, "
            f"num_skipped={len(self.skipped)}, carry={None if self.carry is None else len(self.carry)})"
        )


def split_batches(
    costs: Any,
    max_total_size: Any,
    *,
    max_batch_size: int | None = None,
    cost: CostMode = "sum",
    batch_size_multiple: int = 1,
    oversize: OversizePolicy = "skip",
    ids: Any = None,
    carry: Carry | None = None,
    final: bool = True,
) -> BatchSplit:
    """Split items with per-item costs into greedy batches, vectorized.

    Gives exactly the batches of the greedy loop described in the module docstring, for
    integer costs (exact ``int64`` sums; padded costs exact for every ``int64`` cost, never
    wrapped around) and float costs (``float64`` sums accumulated in item order from the
    batch start, as the loop does, so values right at the cap agree).
    The work is a prefix sum and one binary search per batch (``sum`` mode) or a short
    running-max window per batch (``padded`` mode); there is no Python loop per item.

    Args:
        costs: Per-item costs in order: 1-D, or ``(n, k)`` for ``k`` limits at once (e.g.
            nodes and edges of a graph); numpy array, torch tensor or sequence; finite, >= 0.
        max_total_size: The inclusive cap of a batch's cost; one number, or ``k`` numbers
            for ``(n, k)`` costs (an item joins while every column stays within its cap).
            Finite and >= 0 (a cap of 0 batches the items of cost 0); caps past int64
            (``2**70``, ``1e19``) work as "no practical cap".
        max_batch_size: Optional cap on the number of items in a batch.
        cost: ``"sum"`` (a batch costs the sum of its items, bionemo) or ``"padded"`` (a
            batch costs ``len(batch) * max(cost in batch)``, the padded-tensor cost).
        batch_size_multiple: A full batch (one closed because the next item does not fit)
            longer than this multiple is cut down to a multiple of it; the remainder opens
            the next batch (fairseq's ``required_batch_size_multiple``). The last batch and
            batches closed by an ``own_batch`` item are kept whole.
        oversize: What to do with an item whose cost alone exceeds the cap: ``"skip"`` it
            (returned in :attr:`BatchSplit.skipped`; callers warn), give it a batch of its
            ``"own_batch"``, or raise ``ValueError`` (``"error"``).
        ids: Optional ids of the items (same length as ``costs``), returned in place of
            positions, e.g. dataset indices in epoch order.
        carry: The :attr:`BatchSplit.carry` of the previous chunk's call.
        final: ``False`` if more chunks follow: the trailing batch that could still grow is
            returned as :attr:`BatchSplit.carry` instead of being emitted.

    Returns:
        A :class:`BatchSplit` with the batches in CSR form.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If a value is out of range (negative or NaN costs, negative or
            infinite caps, a mismatched ``ids`` length or carry), an item is oversize with
            ``oversize="error"``, or integer costs that may share a batch sum past 2**62
            in one call (``cost="sum"``; split the order into chunks).

    Examples:
        >>> split = split_batches([2, 2, 5, 3, 1, 4], 4)
        >>> [b.tolist() for b in split.batches()], split.skipped.tolist()
        ([[0, 1], [3, 4], [5]], [2])
        >>> split_batches([1, 1, 1, 1, 1], 10, batch_size_multiple=2, max_batch_size=3).batches()
        [array([0, 1]), array([2, 3, 4])]
        >>> split_batches([1, 3, 1, 1], 6, cost="padded").batches()  # 2 * 3 <= 6 < 3 * 3
        [array([0, 1]), array([2, 3])]

        Chunk by chunk gives the same batches as one call:

        >>> first = split_batches([2, 2, 3], 4, final=False)
        >>> rest = split_batches([1, 4], 4, carry=first.carry)
        >>> [b.tolist() for b in first.batches() + rest.batches()]
        [[0, 1], [2, 3], [4]]
    """
    mode = check_choice("cost", cost, ("sum", "padded"))
    policy = check_choice("oversize", oversize, ("skip", "own_batch", "error"))
    max_items = check_optional_positive_int("max_batch_size", max_batch_size)
    multiple = check_positive_int("batch_size_multiple", batch_size_multiple)
    if not isinstance(final, bool):
        raise TypeError(f"final must be a bool, got {final!r}.")
    if carry is not None and not isinstance(carry, Carry):
        raise TypeError(f"carry must be a Carry from a previous split, got {type(carry).__name__}.")

    c = as_numeric_array("costs", costs, ndim=(1, 2))
    if c.ndim == 1:
        c = c[:, None]
    n, k = c.shape
    cap_values = _as_caps(max_total_size, k)
    start = 0 if carry is None else carry.next_position
    item_ids = None  # None: the ids are the positions start, start + 1, ... (made lazily)
    if ids is not None:
        item_ids = np.asarray(ids)
        if item_ids.ndim != 1 or len(item_ids) != n:
            raise ValueError(f"ids must be 1-D with one id per item ({n}), got shape {tuple(item_ids.shape)}.")
    if carry is not None:
        if carry.costs.shape[1] != k:
            raise ValueError(
                f"carry has {carry.costs.shape[1]} cost columns but costs has {k}; "
                "use the carry of a split over the same kind of costs."
            )
        if carry.costs.dtype != c.dtype:
            c = c.astype(np.float64)
    float_mode = c.dtype == np.float64 or (carry is not None and carry.costs.dtype == np.float64)
    caps = _caps_for_dtype(cap_values, float_mode)
    if float_mode:
        c = c.astype(np.float64, copy=False)

    over: np.ndarray | None = None
    skipped = np.empty(0, dtype=np.int64 if item_ids is None else item_ids.dtype)
    if n and (c.max(axis=0) > caps).any():
        over = np.asarray((c > caps).any(axis=1))
        if policy == "error":
            pos = int(np.argmax(over))
            item = start + pos if item_ids is None else item_ids[pos].item()
            raise ValueError(
                f"item {item!r} has cost {_row(c, pos)!r} above max_total_size {max_total_size!r} (oversize='error')."
            )
        if policy == "skip":
            if item_ids is None:
                item_ids = np.arange(start, start + n, dtype=np.int64)
            skipped = item_ids[over]
            c = c[~over]
            item_ids = item_ids[~over]
            over = None

    if carry is not None and len(carry):
        if item_ids is None:
            item_ids = np.arange(start, start + n, dtype=np.int64)
        c = np.concatenate([carry.costs.astype(c.dtype, copy=False), c])
        item_ids = np.concatenate([carry.ids, item_ids])
        if over is not None:
            over = np.concatenate([np.zeros(len(carry), dtype=bool), over])

    if mode == "sum":
        count = _sum_counter(c, caps, over is not None)
    else:
        count = _padded_counter(c, caps, cap_values)
    ends, open_start = _greedy_ends(len(c), count, max_items, multiple, over, final)
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends
    next_carry = None
    if not final:
        rest = np.arange(start + open_start, start + n) if item_ids is None else item_ids[open_start:]
        next_carry = Carry(rest, c[open_start:], start + n)
    batched = range(start, start + open_start) if item_ids is None else item_ids[:open_start]
    return BatchSplit(batched, offsets, skipped, next_carry)


def _row(c: np.ndarray, pos: int) -> Any:
    return c[pos, 0].item() if c.shape[1] == 1 else c[pos].tolist()


def _as_caps(max_total_size: Any, k: int) -> list[int | float]:
    if isinstance(max_total_size, (Sequence, np.ndarray)) and not isinstance(max_total_size, str):
        caps = [check_nonnegative_real("max_total_size", v) for v in max_total_size]
        if len(caps) != k:
            raise ValueError(f"max_total_size has {len(caps)} caps but costs has {k} columns: {max_total_size!r}.")
        return caps
    return [check_nonnegative_real("max_total_size", max_total_size)] * k


def _caps_for_dtype(caps: list[int | float], float_mode: bool) -> np.ndarray:
    # NOTE: the loop compares a running total with the cap exactly (Python semantics). For
    # integer totals `total <= cap` equals `total <= floor(cap)`; for float totals it equals
    # `total <= the largest float64 not above cap`. Converting the cap once this way keeps
    # every later comparison exact in a single numpy dtype. An integer cap past int64 acts
    # as the largest int64: no int64 cost exceeds it, and sums stay below 2**62 (see
    # _sum_counter); padded mode works from the exact caps instead (see _padded_limits).
    if float_mode:
        out = []
        for cap in caps:
            if isinstance(cap, Integral) and cap > sys.float_info.max:
                f = sys.float_info.max
            else:
                f = float(cap)
                if isinstance(cap, Integral) and f > cap:
                    f = math.nextafter(f, -math.inf)
            out.append(f)
        return np.array(out, dtype=np.float64)
    return np.array([min(math.floor(cap), _INT64_MAX) for cap in caps], dtype=np.int64)


def _greedy_ends(
    m: int,
    count: Callable[[int, int, int], int],
    max_items: int | None,
    multiple: int,
    over: np.ndarray | None,
    final: bool,
) -> tuple[list[int], int]:
    """Walk the ``m`` items' batches: one ``count`` call per batch. Returns batch ends and the open start."""
    over_pos = [] if over is None else np.flatnonzero(over).tolist()
    ends: list[int] = []
    append = ends.append
    i = 0
    guess = 64
    while i < m:
        hi = m
        certain = False  # the batch cannot grow past hi, whatever follows this chunk
        cut_ok = True  # a batch closed at hi counts as "full" for the multiple rule
        if over_pos:
            j = bisect_left(over_pos, i)
            if j < len(over_pos):
                if over_pos[j] == i:
                    append(i + 1)
                    i += 1
                    continue
                hi, certain, cut_ok = over_pos[j], True, False
        if max_items is not None and i + max_items < hi:
            # a next item exists, so a batch that reaches max_items is full
            hi, certain, cut_ok = i + max_items, True, True
        n_items = count(i, hi, guess)
        if n_items == 0 and i < hi:
            # NOTE: only a carry from a split under a larger cap can hold an item that fits
            # in no batch; going on would emit empty batches forever
            raise ValueError(
                f"item at position {i} of this split costs more than max_total_size and came in the carry; "
                "split a carry's chunk again under the cap it was made with."
            )
        end = i + n_items
        if end < hi:
            full = True
        elif certain:
            full = cut_ok
        elif final:
            full = False
        else:
            break
        if full and n_items > multiple > 1:
            n_items -= n_items % multiple
            end = i + n_items
        append(end)
        guess = n_items
        i = end
    return ends, i


def _sum_counter(c: np.ndarray, caps: np.ndarray, unbounded: bool) -> Callable[[int, int, int], int]:
    """Counter for ``cost="sum"``: how many items from ``i`` fit, at most ``hi - i``.

    ``unbounded`` says that some items (``own_batch`` ones) may cost more than the cap.
    """
    m, k = c.shape
    counters = []
    for j in range(k):
        column = c[:, j]
        cap = caps[j].item()
        prefix = np.zeros(m + 1, dtype=c.dtype)
        if c.dtype == np.float64:
            np.cumsum(column, out=prefix[1:])
            counters.append(_float_column_counter(prefix.data, column, cap))
        else:
            # NOTE: in sum mode no batch cost passes the cap, but the prefix sums of a whole
            # call must stay in int64; the cap bounds every item, so this check is cheap.
            if (m * (cap + 1) >= 2**63 or unbounded) and float(column.sum(dtype=np.float64)) >= 2**62:
                raise ValueError("costs sum past 2**62 in one call; split the order into smaller chunks.")
            np.cumsum(column, out=prefix[1:])
            counters.append(_int_column_counter(prefix.data, cap))
    if k == 1:
        return counters[0]

    def count(i: int, hi: int, guess: int) -> int:
        for counter in counters:
            hi = i + counter(i, hi, guess)
        return hi - i

    return count


def _gallop(prefix: memoryview, x: Any, i: int, hi: int, guess: int) -> int:
    """Largest ``t`` in ``[i, hi]`` with ``prefix[t] <= x``, given ``prefix[i] <= x``."""
    # NOTE: bisect over a memoryview reads Python numbers directly (no numpy call per
    # batch); probing first at twice the previous batch length keeps searches short.
    probe = i + 2 * guess + 1
    if probe < hi:
        if prefix[probe] > x:
            return bisect_right(prefix, x, i, probe) - 1
        return bisect_right(prefix, x, probe, hi + 1) - 1
    return bisect_right(prefix, x, i, hi + 1) - 1


def _int_column_counter(prefix: memoryview, cap: int) -> Callable[[int, int, int], int]:
    def count(i: int, hi: int, guess: int) -> int:
        return _gallop(prefix, prefix[i] + cap, i, hi, guess) - i

    return count


def _float_column_counter(prefix: memoryview, column: np.ndarray, cap: float) -> Callable[[int, int, int], int]:
    # NOTE: prefix differences differ from the loop's running sums (which restart at each
    # batch) by rounding. Both are within m*u*total of the exact sums (the standard bound
    # for recursive summation of non-negative terms), so a search bracketed by +-tolerance
    # is certain when both ends agree, and an exact local cumsum over the bracket settles
    # the rest (rare: only batches that end within the tolerance of the cap).
    m = len(column)
    tolerance = 4.0 * (m + 2) * _UNIT_ROUNDOFF * (prefix[m] + cap) + 1e-300

    def count(i: int, hi: int, guess: int) -> int:
        base = prefix[i]
        low = base + cap - tolerance
        lo_end = _gallop(prefix, low, i, hi, guess) if prefix[i] <= low else i
        high = base + cap + tolerance
        if lo_end == hi or prefix[lo_end + 1] > high:
            return lo_end - i
        hi_end = bisect_right(prefix, high, lo_end + 1, hi + 1) - 1
        local = np.cumsum(column[i : min(hi_end + 1, hi)])
        return int(np.searchsorted(local, cap, side="right"))

    return count


def _padded_counter(c: np.ndarray, caps: np.ndarray, exact_caps: list[int | float]) -> Callable[[int, int, int], int]:
    """Counter for ``cost="padded"``: ``len * running max`` is monotone, so count the fits.

    ``caps`` are the caps of :func:`_caps_for_dtype`, ``exact_caps`` those given.
    """
    single = c.shape[1] == 1
    column = np.ascontiguousarray(c[:, 0]) if single else c
    if c.dtype == np.float64:
        fits = _padded_float_fits(len(c), caps, single)
    else:
        fits = _padded_int_fits(c, [math.floor(cap) for cap in exact_caps], single)

    def count(i: int, hi: int, guess: int) -> int:
        width = max(2 * guess, 16)
        while True:
            stop = min(i + width, hi)
            n_fit = fits(np.maximum.accumulate(column[i:stop], axis=0))
            if n_fit < stop - i or stop == hi:
                return n_fit
            width *= 2

    return count


def _padded_float_fits(m: int, caps: np.ndarray, single: bool) -> Callable[[np.ndarray], int]:
    """How many leading lengths of a window have ``len * running max <= cap`` (float costs).

    The function takes the window's running max (and overwrites it).
    """
    # NOTE: the product is rounded as the loop's Python float product is; past the float
    # range it is inf, above every cap, as in the loop.
    steps = np.arange(1, m + 1, dtype=np.float64)
    if single:
        cap = caps[0]

        def fits(running: np.ndarray) -> int:
            running *= steps[: len(running)]
            return int(running.searchsorted(cap, side="right"))  # non-decreasing padded costs

        return fits
    lengths = steps[:, None]

    def fits_all(running: np.ndarray) -> int:
        running *= lengths[: len(running)]
        return int(np.count_nonzero((running <= caps).all(axis=1)))  # the fits are a prefix

    return fits_all


def _padded_int_fits(c: np.ndarray, caps: list[int], single: bool) -> Callable[[np.ndarray], int]:
    """How many leading lengths of a window have ``len * running max <= cap`` (integer costs).

    Tested as ``running max <= cap // len``, exact for every int64 cost and every cap: the
    product can pass int64 (and so can the caps), the quotients that matter cannot. The
    function takes the window's running max (and overwrites it).
    """
    tops = [int(top) for top in c.max(axis=0)] if len(c) else [0] * len(caps)
    limits = np.empty((0, len(caps)), dtype=np.int64)
    column_limits = limits[:, 0]

    def grow(length: int) -> None:
        # NOTE: the limits grow with the longest window so far, not with the whole call.
        nonlocal limits, column_limits
        limits = _padded_limits(caps, tops, min(max(length, 2 * len(limits)), len(c)))
        if single:
            column_limits = np.ascontiguousarray(limits[:, 0])

    def fits(running: np.ndarray) -> int:
        length = len(running)
        if length > len(limits):
            grow(length)
        # running max - limit is non-decreasing (no overflow: both are in [0, 2**63))
        np.subtract(running, column_limits[:length], out=running)
        return int(running.searchsorted(0, side="right"))

    def fits_all(running: np.ndarray) -> int:
        length = len(running)
        if length > len(limits):
            grow(length)
        return int(np.count_nonzero((running <= limits[:length]).all(axis=1)))  # the fits are a prefix

    return fits if single else fits_all


def _padded_limits(caps: list[int], tops: list[int], size: int) -> np.ndarray:
    """``out[L - 1, j]``: the largest running max with which ``L`` items fit cap ``j``.

    That is ``cap // L``; lengths up to ``cap // top`` (``top``: the column's largest cost)
    fit whatever the items, and get the largest int64 instead.
    """
    out = np.full((size, len(caps)), _INT64_MAX, dtype=np.int64)
    for j, (cap, top) in enumerate(zip(caps, tops, strict=True)):
        free = cap // top if top else size
        if free >= size:
            continue
        if cap <= _INT64_MAX:
            out[free:, j] = cap // np.arange(free + 1, size + 1, dtype=np.int64)
        else:
            # NOTE: past `free` the quotients are below `top`, but the cap does not fit int64:
            # Python ints, only for costs so large that a few of them pass int64.
            out[free:, j] = [cap // length for length in range(free + 1, size + 1)]
    return out


def size_aware_batching(
    dataset: Iterable[Data],
    sizeof: Callable[[Data], Any] | Mapping[Any, Any],
    max_total_size: int | float,
    collate_fn: Callable[[list[Data]], Any] | None = None,
    info_logger: Callable[[str], None] | None = None,
    warn_logger: Callable[[str], None] | None = None,
    *,
    max_batch_size: int | None = None,
) -> Iterator[Any]:
    """Batch an iterable so that no batch's total size exceeds ``max_total_size``.

    The streaming, per-item form of the greedy rule (bionemo compatible): it consumes
    ``dataset`` once and yields each batch as soon as the next item would not fit. Use it
    for plain iterables; for indexable data with known sizes prefer the vectorized
    :class:`~fastsab.SizeAwareBatchSampler` or the fast loaders.

    Args:
        dataset: The input iterable.
        sizeof: A function (or mapping) giving the size of each element of ``dataset``.
        max_total_size: The inclusive cap on a batch's total size; a finite number >= 0
            (a huge one such as ``2**70`` works as "no practical cap"; with 0, the elements
            of size 0 are batched and the others skipped).
        collate_fn: Optional function applied to each batch (a list) before it is yielded.
        info_logger: Optional function called with a summary at the end.
        warn_logger: Optional function called for each skipped oversize element and with
            a count of the skipped ones at the end.
        max_batch_size: Optional cap on the number of elements of a batch (an extension of
            the bionemo API; the batch being filled is the generator's only buffer).

    Yields:
        Batches (lists of elements, or what ``collate_fn`` returns).

    Raises:
        TypeError: If ``dataset`` is not iterable, ``sizeof`` is neither callable nor a
            mapping, ``max_total_size`` is not a number, or ``sizeof`` gives an element a size
            that is not one real number (a 0-d tensor or a numpy number is fine).
        ValueError: If ``max_total_size`` is negative or not finite, or ``sizeof`` gives an
            element a NaN, infinite or negative size (checked as each element arrives).
        RuntimeError: If ``sizeof`` raises for an element.

    Examples:
        >>> import torch
        >>> from torch.utils.data import default_collate
        >>> dataset = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]),
        ...            torch.tensor([7, 8]), torch.tensor([9, 10])]
        >>> list(size_aware_batching(dataset, lambda x: x.numel(), 4, collate_fn=default_collate))
        [tensor([[1, 2],
                [3, 4]]), tensor([[5, 6],
                [7, 8]]), tensor([[ 9, 10]])]
    """
    if not (isinstance(dataset, Iterable) or hasattr(type(dataset), "__getitem__")):
        raise TypeError(f"dataset must be an iterable, got {short_repr(dataset)} of type {type(dataset).__name__}.")
    if isinstance(sizeof, Mapping):
        sizeof = sizeof.__getitem__
    elif not callable(sizeof):
        raise TypeError(f"sizeof must be a callable or a mapping, got {type(sizeof).__name__}.")
    max_total_size = check_nonnegative_real("max_total_size", max_total_size)
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}.")
    max_items = check_optional_positive_int("max_batch_size", max_batch_size)
    return _size_aware_batches(dataset, sizeof, max_total_size, collate_fn, info_logger, warn_logger, max_items)


def _size_aware_batches(
    dataset: Iterable[Data],
    sizeof: Callable[[Data], Any],
    max_total_size: int | float,
    collate_fn: Callable[[list[Data]], Any] | None,
    info_logger: Callable[[str], None] | None,
    warn_logger: Callable[[str], None] | None,
    max_items: int | None,
) -> Iterator[Any]:
    batch: list[Data] = []
    total: Any = 0
    n_samples = n_batched = n_batches = 0
    for data in dataset:
        n_samples += 1
        try:
            size = sizeof(data)
        except Exception as err:
            raise RuntimeError(f"sizeof raised an error for data={short_repr(data)}: {err}") from err
        kind = type(size)
        # NOTE: one cheap test per item: a plain int or float within [0, max_total_size]. The
        # rest (oversize items, numpy and tensor numbers, bad values) gets the full check.
        if not ((kind is int or kind is float) and 0 <= size <= max_total_size):
            size = as_size("sizeof", size, data)
            if size > max_total_size:
                if warn_logger is not None:
                    warn_logger(f"Size of element {data} exceeds max_total_size ({size} > {max_total_size}), skipping")
                continue
        if batch and (size + total > max_total_size or len(batch) == max_items):
            n_batches += 1
            yield batch if collate_fn is None else collate_fn(batch)
            batch, total = [], 0
        batch.append(data)
        total += size
        n_batched += 1
    if batch:
        n_batches += 1
        yield batch if collate_fn is None else collate_fn(batch)
    report_batching(n_samples, n_batched, n_batches, max_total_size, info_logger, warn_logger)


def report_batching(
    n_samples: int,
    n_batched: int,
    n_batches: int,
    max_total_size: Any,
    info_logger: Callable[[str], None] | None,
    warn_logger: Callable[[str], None] | None,
) -> None:
    """Send the end-of-epoch summary of a size-aware batching run to the loggers."""
    if warn_logger is not None and n_batched < n_samples:
        warn_logger(
            f"{n_batched} samples were batched from {n_samples} of the input data. Missing "
            f"samples are due to exceeding max_total_size={max_total_size}"
        )
    if info_logger is not None:
        info_logger(
            f"Batched {n_batched} samples into {n_batches} batches. If this doesn't match "
            "your expectation, consider adjusting max_total_size or the sizeof functor"
        )
