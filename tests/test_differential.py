"""Differential properties: every loader path against plain item-by-item loops.

Each property builds loaders from a generated :class:`Case` (fixed-size or size-aware, one
or two cost columns, oversize items, shuffle groups, ranks, three kinds of datasets) and
compares what they yield with the loops of :mod:`tests.reference`. The datasets make a
batch's content its own indices (``torch.arange(n)``, a map-style dataset with
``__getitems__`` whose samples are ``{"x": i, "y": -i}``, and an ``OutOfCoreDataset`` of
``np.array([i])`` in small chunks), so every batch is also checked for corruption. Every
loop over a loader is bounded (:func:`bound`), so that a loader that never ends fails
instead of hanging.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from fastsab import FastLoader, FastSizeAwareLoader, OutOfCoreDataset, adaptive, collate_batch, split_batches
from tests.reference import Row, above, batch_cost, fits, fixed_size_loop, greedy_loop, sorted_windows

pytestmark = pytest.mark.filterwarnings("ignore:.*larger than max_total_size:UserWarning")

# Values that make float sums land right at the cap (0.1 + 0.2 > 0.3, and so on).
ADVERSARIAL_FLOATS = [0.0, 0.1, 0.2, 0.3, 0.7, 1 / 3, 2 / 3, 1.0, 0.5, 1e-17, 3.0000000000000004]
ADVERSARIAL_CAPS = [0.3, 0.6, 1.0, 0.9, 1 / 3, 2.0, 3.0000000000000004]

#: ``sort_window`` values drawn for size-aware cases where a property holds with windows too.
WINDOWS = (None, None, 1, 2, 3, 7, 16, 64)


def examples(count: int) -> int:
    """``count`` examples in the default profile, scaled by the loaded profile's ``max_examples``."""
    return max(1, count * settings().max_examples // 100)


# -- cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The options of a loader's epoch order and ranks, which every case draws."""

    shuffle: bool
    seed: int
    group_size: int | None
    prefetch: int | None
    world_size: int
    even_batches: str


@dataclass(frozen=True)
class Case(Options):
    """One loader configuration, with everything the reference loops need."""

    kind: str  # "fixed" (FastLoader) or "sized" (FastSizeAwareLoader)
    n: int
    dataset: str  # "tensor", "getitems" or "ooc"
    chunk: int  # items per OutOfCoreDataset chunk
    numeric: str  # "int" or "float" sizes
    sizes: tuple[Row, ...]  # k sizes per item (sized)
    caps: tuple[Any, ...]  # k caps (sized)
    cost: str
    max_batch_size: int | None
    multiple: int
    oversize: str
    batch_size: int  # (fixed)
    drop_last: bool  # (fixed)
    balance: bool
    sort_window: int | None = None  # (sized)
    last_batch: str = "keep"  # (sized)

    @property
    def rows(self) -> Sequence[Row]:
        """Per-item cost rows: the sizes, or a count of one per item (fixed size)."""
        return self.sizes if self.kind == "sized" else ((1,),) * self.n

    @property
    def limit(self) -> tuple[Any, ...]:
        """The configured caps: ``max_total_size`` per column, or ``(batch_size,)``."""
        return self.caps if self.kind == "sized" else (self.batch_size,)


@st.composite
def cases(
    draw: Any,
    *,
    world_sizes: Sequence[int] = (1,),
    shuffle: Sequence[bool] = (False, True),
    kinds: Sequence[str] = ("fixed", "sized"),
    oversize: Sequence[str] = ("skip", "own_batch"),
    datasets: Sequence[str] = ("tensor", "getitems", "ooc"),
    min_n: int = 0,
    max_n: int = 300,
    windows: Sequence[int | None] = (None,),
) -> Case:
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(min_n, max_n))
    dataset = draw(st.sampled_from(datasets))
    numeric = draw(st.sampled_from(["int", "float", "adversarial"]))
    k = draw(st.sampled_from([1, 1, 2]))
    zero_column = k == 2 and draw(st.booleans())
    if numeric == "int":
        value: st.SearchStrategy[Any] = st.integers(0, 50)
        cap: st.SearchStrategy[Any] = st.integers(1, 120)
    elif numeric == "float":
        value = st.one_of(st.just(0.0), st.integers(0, 50).map(float), st.floats(0.0, 50.0))
        cap = st.one_of(st.integers(1, 120), st.floats(0.5, 120.0))
    else:
        value = st.sampled_from(ADVERSARIAL_FLOATS)
        cap = st.sampled_from(ADVERSARIAL_CAPS)
    zero = 0 if numeric == "int" else 0.0
    sizes: tuple[Row, ...] = ()
    if kind == "sized":
        sizes = tuple(tuple(zero if zero_column and j == 1 else draw(value) for j in range(k)) for _ in range(n))
    return Case(
        kind=kind,
        n=n,
        dataset=dataset,
        chunk=draw(st.integers(1, 64)),
        numeric="int" if numeric == "int" else "float",
        sizes=sizes,
        caps=tuple(draw(cap) for _ in range(k)),
        cost=draw(st.sampled_from(["sum", "sum", "padded"])),
        max_batch_size=draw(st.one_of(st.none(), st.integers(1, 20))),
        multiple=draw(st.sampled_from([1, 1, 1, 2, 3])),
        oversize=draw(st.sampled_from(oversize)),
        batch_size=draw(st.integers(1, 40)),
        drop_last=draw(st.booleans()),
        shuffle=draw(st.sampled_from(shuffle)),
        seed=draw(st.integers(0, 2**31 - 1)),
        group_size=None if dataset == "ooc" else draw(st.one_of(st.none(), st.integers(1, 64))),
        prefetch=draw(st.sampled_from([None, 0, 1, 2])),
        world_size=draw(st.sampled_from(world_sizes)),
        even_batches=draw(st.sampled_from(["pad", "drop"])),
        balance=draw(st.booleans()),
        # NOTE: drawn last and only when asked for, so that the other properties draw as before
        sort_window=draw(st.sampled_from(windows)) if kind == "sized" and tuple(windows) != (None,) else None,
    )


# -- datasets and loaders -----------------------------------------------------------------


class Items(Dataset):
    """A map-style dataset with ``__getitems__``: sample ``i`` is ``{"x": i, "y": -i}``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor(i), "y": torch.tensor(-i)}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        return [self[i] for i in indices]


def read_one(i: int) -> np.ndarray:
    return np.array([i], dtype=np.int64)


def make_dataset(case: Case, stack: ExitStack) -> Any:
    if case.dataset == "tensor":
        return torch.arange(case.n)
    if case.dataset == "getitems":
        return Items(case.n)
    # NOTE: 8 bytes per sample and half the budget per chunk: chunks of case.chunk items
    dataset = OutOfCoreDataset(range(case.n), read_one, cpu_memory_limit=16 * case.chunk)
    stack.callback(dataset.close)
    return dataset


def sizes_array(case: Case) -> np.ndarray:
    dtype = np.int64 if case.numeric == "int" else np.float64
    array = np.array(case.sizes, dtype=dtype).reshape(case.n, len(case.caps))
    return array[:, 0] if len(case.caps) == 1 else array


def make_loader(
    case: Case,
    stack: ExitStack,
    rank: int = 0,
    world_size: int | None = None,
    spelling: str = "plain",
    dataset: Any = None,
) -> Any:
    """A fresh loader (over a fresh dataset unless given) for ``case``.

    ``spelling`` writes the same options otherwise: ``"numpy"`` numpy scalars (and an array
    of caps), ``"int32"`` integer sizes as int32, ``"tensor"`` sizes as a tensor, ``"list"``
    sizes as a list of Python numbers.
    """
    world = case.world_size if world_size is None else world_size
    numpy = spelling == "numpy"
    common: dict[str, Any] = {
        "shuffle": case.shuffle,
        "seed": np.int64(case.seed) if numpy else case.seed,
        "group_size": case.group_size,
        "prefetch": case.prefetch,
        "rank": rank,
        "world_size": world,
        "even_batches": case.even_batches,
        "balance": case.balance,
    }
    if dataset is None:
        dataset = make_dataset(case, stack)
    if case.kind == "fixed":
        batch_size = np.int64(case.batch_size) if numpy else case.batch_size
        return FastLoader(dataset, batch_size, drop_last=case.drop_last, **common)
    sizes: Any = sizes_array(case)
    caps: Any = case.caps[0] if len(case.caps) == 1 else list(case.caps)
    max_batch_size: Any = case.max_batch_size
    if numpy:
        caps = np.asarray(case.caps)[0] if len(case.caps) == 1 else np.asarray(case.caps)
        max_batch_size = None if max_batch_size is None else np.int64(max_batch_size)
    elif spelling == "int32" and case.numeric == "int":
        sizes = sizes.astype(np.int32)
    elif spelling == "tensor":
        sizes = torch.from_numpy(sizes)
    elif spelling == "list":
        sizes = sizes.tolist()
    return FastSizeAwareLoader(
        dataset,
        sizes,
        caps,
        cost=case.cost,
        max_batch_size=max_batch_size,
        batch_size_multiple=case.multiple,
        oversize=case.oversize,
        sort_window=case.sort_window,
        last_batch=case.last_batch,
        **common,
    )


def make_ranks(case: Case, stack: ExitStack, world_size: int | None = None) -> list[Any]:
    world = case.world_size if world_size is None else world_size
    return [make_loader(case, stack, rank, world) for rank in range(world)]


# -- running epochs -----------------------------------------------------------------------

#: CPU seconds (of the whole process) one ``next()`` of a loader may take. A batch of at most
#: 300 items takes milliseconds, but a step of ``adaptive.run`` may retry several times, and
#: each retry runs a full garbage collection of the test process: a step past this is a loop
#: inside the loader that does not end.
BATCH_CPU_SECONDS = 10.0


class LoaderHang(Exception):
    """A single step of a loader ran past :data:`BATCH_CPU_SECONDS` of CPU time."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or (f"one step of the loader used more than {BATCH_CPU_SECONDS} s of CPU",)))


def bound(case: Case) -> int:
    """More batches than any epoch of ``case`` can have: a loop past it is a hang."""
    return 10 * case.n + 10


class _Watchdog:
    """Fails a loader step that runs past :data:`BATCH_CPU_SECONDS` of process CPU time.

    One daemon thread polls while a step is armed. On expiry it raises :class:`LoaderHang`
    asynchronously in the loader's prefetch threads if there are any (a planning loop that
    never ends runs there; the thread forwards the error to the main thread), else in the
    main thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        with self._lock:
            self._since = time.process_time()
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="test-watchdog", daemon=True)
                self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                if self._since is None or time.process_time() - self._since < BATCH_CPU_SECONDS:
                    continue
                self._since = None
                # NOTE: with a prefetch thread the planning runs there and the main thread only
                # waits for it: raise in that thread alone (it forwards the error), or the main
                # thread would get a second exception at some later, unrelated point
                producers = [t for t in threading.enumerate() if t.name.startswith("fastsab-prefetch")]
                for thread in producers or [threading.main_thread()]:
                    if thread.ident is not None:
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(thread.ident), ctypes.py_object(LoaderHang)
                        )


_WATCHDOG = _Watchdog()


def guarded_next(source: Iterator[Any]) -> Any:
    """``next(source)``, failing with :class:`LoaderHang` instead of running forever.

    CPU time, not wall time, is measured: a loaded machine does not trip the guard.
    """
    if threading.current_thread() is not threading.main_thread():
        return next(source)
    _WATCHDOG.arm()
    try:
        return next(source)
    finally:
        _WATCHDOG.disarm()


def guarded(iterable: Any, limit: int, what: str) -> Iterator[Any]:
    """The items of ``iterable``, failing if one takes forever or there are more than ``limit``."""
    source = iter(iterable)
    count = 0
    while True:
        try:
            item = guarded_next(source)
        except StopIteration:
            return
        count += 1
        assert count <= limit, f"{what} did not end after {count} items"
        yield item


def ids_of(batch: Any, case: Case) -> list[int]:
    """The indices a batch holds (its content), checking the parts of a sample agree."""
    if case.dataset == "getitems":
        assert torch.equal(batch["y"], -batch["x"]), f"corrupted batch {batch!r}"
        return batch["x"].tolist()
    if case.dataset == "ooc":
        assert batch.ndim == 2 and batch.shape[1] == 1, f"corrupted batch {batch!r}"
        return batch[:, 0].tolist()
    assert batch.ndim == 1, f"corrupted batch {batch!r}"
    return batch.tolist()


def batches_of(source: Iterator[Any], case: Case, with_indices: bool, limit: int | None = None) -> list[list[int]]:
    """Up to ``limit`` batches of ``source`` (all by default) as lists of indices.

    With ``with_indices`` the source yields ``(indices, batch)`` and the content must equal
    the indices.
    """
    out: list[list[int]] = []
    while limit is None or len(out) < limit:
        try:
            item = guarded_next(source)
        except StopIteration:
            break
        if with_indices:
            ids, batch = item
            assert isinstance(ids, np.ndarray) and ids.dtype == np.int64, f"indices {ids!r} are not int64"
            # invariant: a batch's content is exactly the data at its indices (no corruption)
            assert ids_of(batch, case) == ids.tolist(), f"batch content differs from its indices {ids.tolist()}"
            out.append(ids.tolist())
        else:
            out.append(ids_of(item, case))
        assert len(out) <= bound(case), f"the loader did not end after {len(out)} batches (n={case.n})"
    return out


def epoch(loader: Any, case: Case, with_indices: bool = False) -> list[list[int]]:
    """One whole epoch of ``loader``."""
    source = loader.iter_with_indices() if with_indices else iter(loader)
    try:
        return batches_of(source, case, with_indices)
    finally:
        source.close()


def start(loader: Any, stack: ExitStack, with_indices: bool = True) -> Iterator[Any]:
    """An epoch iterator that is closed (its prefetch thread joined) when ``stack`` closes."""
    source = loader.iter_with_indices() if with_indices else iter(loader)
    stack.callback(source.close)
    return source


def flat(batches: Sequence[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


@dataclass
class Plan:
    """The single-process plan of an epoch: batches, skipped and dropped indices."""

    batches: list[list[int]]
    skipped: list[int]
    dropped: list[int]


def single_process(case: Case, epoch_number: int = 0) -> Plan:
    """What one process (``world_size=1``) yields in ``epoch_number``, with its stats."""
    with ExitStack() as stack:
        loader = make_loader(case, stack, 0, 1)
        loader.set_epoch(epoch_number)
        batches = epoch(loader, case, with_indices=True)
        return Plan(batches, list(loader.stats.skipped), list(loader.stats.dropped))


def reference(
    case: Case, order: Sequence[int], limit: Sequence[Any] | None = None
) -> tuple[list[list[int]], list[int]]:
    """The plain loop over ``order`` under ``limit`` (default the configured one).

    Returns the batches and the skipped (size-aware) or dropped (fixed size) indices. Items
    above ``limit`` but within the configured caps get batches of their own.
    """
    if case.kind == "fixed":
        return fixed_size_loop(order, case.batch_size if limit is None else limit[0], case.drop_last)
    return greedy_loop(
        order,
        case.sizes,
        case.caps if limit is None else limit,
        cost=case.cost,
        max_batch_size=case.max_batch_size,
        multiple=case.multiple,
        oversize=case.oversize,
        policy_caps=case.caps,
    )


def oversize_items(case: Case) -> list[int]:
    """Indices whose own size is above the configured caps (size-aware)."""
    if case.kind == "fixed":
        return []
    return [i for i in range(case.n) if above(case.sizes[i], case.caps)]


def check_limits(batches: Sequence[Sequence[int]], case: Case, limit: Sequence[Any] | None = None) -> None:
    """No empty batch; every batch within ``limit`` and ``max_batch_size``, but a single item above it."""
    caps = case.limit if limit is None else tuple(limit)
    for batch in batches:
        # invariant: no batch is empty
        assert batch, "an empty batch was yielded"
        if case.kind == "fixed":
            # invariant: a fixed-size batch has at most batch_size (or the lowered limit) items
            assert len(batch) <= caps[0], f"batch of {len(batch)} items over the limit {caps[0]}"
            continue
        rows = [case.sizes[i] for i in batch]
        if len(batch) == 1 and above(rows[0], caps):
            # invariant: only a single item above the cap is allowed, as a batch of its own
            assert case.oversize == "own_batch" or not above(rows[0], case.caps), f"oversize item {batch} yielded"
            continue
        # invariant: no batch exceeds the cap (sum, or len * max per column) nor max_batch_size
        assert fits(rows, caps, case.cost, case.max_batch_size), f"batch {batch} exceeds {caps} ({case.cost})"


# -- the kernel and the oracle ---------------------------------------------------------------


@settings(max_examples=examples(60))
@given(
    case=cases(kinds=("sized",), oversize=("skip", "own_batch", "error"), max_n=120), cuts=st.lists(st.integers(0, 120))
)
def test_split_batches_chunk_by_chunk_is_the_plain_loop(case: Case, cuts: list[int]) -> None:
    # invariant: split_batches gives the plain loop's batches and skipped items, in one call
    # or chunk by chunk with a carry (chunks cut anywhere)
    costs, caps, options = split_arguments(case)
    try:
        expected, skipped = reference(case, range(case.n))
    except ValueError:
        with pytest.raises(ValueError):
            split_batches(costs, caps, **options)
        return
    split = split_batches(costs, caps, **options)
    assert [b.tolist() for b in split.batches()] == expected
    assert split.skipped.tolist() == skipped
    batches, chunk_skipped, _ = split_in_chunks(costs, caps, cuts, options)
    if case.n:
        assert batches == expected and chunk_skipped == skipped


def split_arguments(case: Case) -> tuple[np.ndarray, Any, dict[str, Any]]:
    """The costs, caps and options of ``split_batches`` for a size-aware ``case``."""
    caps = case.caps[0] if len(case.caps) == 1 else list(case.caps)
    options = {
        "cost": case.cost,
        "max_batch_size": case.max_batch_size,
        "batch_size_multiple": case.multiple,
        "oversize": case.oversize,
        "last_batch": case.last_batch,
    }
    return sizes_array(case), caps, options


def split_in_chunks(
    costs: np.ndarray, caps: Any, cuts: list[int], options: dict[str, Any]
) -> tuple[list[list[int]], list[int], list[int]]:
    """``split_batches`` chunk by chunk with a carry, the chunks cut at ``cuts``: batches, skipped, dropped."""
    n = len(costs)
    bounds = sorted({0, n, *[c for c in cuts if c <= n]})
    carry, batches, skipped, dropped = None, [], [], []
    for lo, hi in itertools.pairwise(bounds):
        part = split_batches(costs[lo:hi], caps, ids=np.arange(lo, hi), carry=carry, final=hi == n, **options)
        carry = part.carry
        batches += [b.tolist() for b in part.batches()]
        skipped += part.skipped.tolist()
        dropped += part.dropped.tolist()
    return batches, skipped, dropped


# -- one process ------------------------------------------------------------------------------


@settings(max_examples=examples(80))
@given(case=cases(shuffle=(False,), oversize=("skip", "own_batch", "error")))
def test_unshuffled_epoch_is_the_plain_loop(case: Case) -> None:
    try:
        expected, left_out = reference(case, range(case.n))
    except ValueError:
        expected, left_out = None, []
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        if expected is None:
            # invariant: oversize="error" with an oversize item raises ValueError, never a silent epoch
            with pytest.raises(ValueError):
                len(loader)
                epoch(loader, case)
            return
        # invariant: len() is exact before the epoch
        assert len(loader) == len(expected)
        # invariant: shuffle=False yields exactly the batches of the plain loop over 0..n-1
        assert epoch(loader, case) == expected
        stats = loader.stats
        skipped, dropped = (left_out, []) if case.kind == "sized" else ([], left_out)
        # invariant: skipped and dropped indices are exactly those of the loop, and counted
        assert sorted(stats.skipped) == sorted(skipped) and stats.num_skipped == len(skipped)
        assert sorted(stats.dropped) == sorted(dropped) and stats.num_dropped == len(dropped)
        assert stats.num_batches == len(expected) and stats.num_items == len(flat(expected))
        check_limits(expected, case)
        # invariant: iter_with_indices() gives the same batches, with content equal to the indices
        assert len(loader) == len(expected)
        assert epoch(loader, case, with_indices=True) == expected


@settings(max_examples=examples(80))
@given(case=cases(shuffle=(True,)))
def test_shuffled_epoch_is_the_plain_loop_over_its_own_order(case: Case) -> None:
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        announced = len(loader)
        batches = epoch(loader, case, with_indices=True)
        stats = loader.stats
    order = flat(batches)
    # invariant: the epoch's order (yielded, then skipped and dropped) is a permutation of range(n)
    assert sorted(order + list(stats.skipped) + list(stats.dropped)) == list(range(case.n))
    # invariant: len() announced the number of batches yielded
    assert announced == len(batches) == stats.num_batches
    if case.kind == "fixed":
        # invariant: fixed-size batches are the loop over the order; drop_last drops the tail
        assert reference(case, order + list(stats.dropped)) == (batches, list(stats.dropped))
    else:
        # invariant: size-aware batches are the plain greedy loop over the loader's own order
        assert reference(case, order) == (batches, [])
        # invariant: the skipped indices are exactly the oversize ones (oversize="skip")
        expected_skipped = oversize_items(case) if case.oversize == "skip" else []
        assert sorted(stats.skipped) == expected_skipped and stats.num_skipped == len(expected_skipped)
    check_limits(batches, case)


# -- sorted windows ------------------------------------------------------------------------------


def window_reference(case: Case, loader: Any, epoch_number: int = 0) -> tuple[list[list[int]], list[int]]:
    """The plain loop over the loader's epoch order with each window sorted by size (batches in plan order)."""
    assert case.sort_window is not None
    groups = [group.tolist() for group in loader.order.chunks(epoch_number)]
    return reference(case, sorted_windows(groups, case.sizes, case.sort_window))


@settings(max_examples=examples(80))
@given(case=cases(kinds=("sized",), shuffle=(False,), windows=WINDOWS[2:], oversize=("skip", "own_batch", "error")))
def test_unshuffled_sorted_windows_are_the_plain_loop(case: Case) -> None:
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        try:
            expected, skipped = window_reference(case, loader)
        except ValueError:
            # invariant: oversize="error" with an oversize item raises ValueError, never a silent epoch
            with pytest.raises(ValueError):
                len(loader)
                epoch(loader, case)
            return
        # invariant: len() is exact before the epoch
        assert len(loader) == len(expected)
        # invariant: without shuffle, sorted windows yield the plain loop over the window-sorted
        # order, batch after batch (nothing random)
        assert epoch(loader, case, with_indices=True) == expected
        assert sorted(loader.stats.skipped) == sorted(skipped) and loader.stats.num_skipped == len(skipped)
    check_limits(expected, case)


@settings(max_examples=examples(80))
@given(case=cases(kinds=("sized",), shuffle=(True,), windows=WINDOWS[2:]), epoch_number=st.integers(0, 2))
def test_shuffled_sorted_windows_are_the_plain_loop_in_another_order(case: Case, epoch_number: int) -> None:
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        loader.set_epoch(epoch_number)
        announced = len(loader)
        batches = epoch(loader, case, with_indices=True)
        expected, skipped = window_reference(case, loader, epoch_number)
        stats = loader.stats
    # invariant: len() announced the number of batches yielded
    assert announced == len(batches) == stats.num_batches
    # invariant: the batches are those of the plain loop over the window-sorted order, each
    # once; only the order in which they come differs
    assert sorted(batches) == sorted(expected)
    assert sorted(stats.skipped) == sorted(skipped) and stats.num_skipped == len(skipped)
    check_limits(batches, case)


# -- ranks --------------------------------------------------------------------------------------


@settings(max_examples=examples(80))
@given(case=cases(world_sizes=(2, 3, 4), windows=WINDOWS))
def test_ranks_share_the_single_process_plan(case: Case) -> None:
    single = single_process(case)
    world = case.world_size
    with ExitStack() as stack:
        loaders = make_ranks(case, stack)
        announced = [len(loader) for loader in loaders]
        per_rank = [epoch(loader, case) for loader in loaders]
        stats = [loader.stats for loader in loaders]
    steps = [len(batches) for batches in per_rank]
    plan_batches = len(single.batches)
    expected_steps = -(-plan_batches // world) if case.even_batches == "pad" else plan_batches // world
    # invariant: all ranks run the same number of steps, announced by len() before the epoch
    assert steps == [expected_steps] * world and announced == steps
    for batches in per_rank:
        check_limits(batches, case)
    # invariant: every rank reports the same epoch-wide skipped and dropped indices
    for key in ("skipped", "dropped"):
        assert all(sorted(getattr(s, key)) == sorted(getattr(stats[0], key)) for s in stats), key
    # invariant: the skipped indices are those of the single-process epoch
    assert sorted(stats[0].skipped) == sorted(single.skipped)
    # invariant: the ranks run whole batches of the single-process plan, nothing else
    planned = {tuple(b) for b in single.batches}
    run = Counter(tuple(b) for batches in per_rank for b in batches)
    assert set(run) <= planned, f"batches outside the plan: {sorted(set(run) - planned)}"
    not_run = [list(b) for b in single.batches if tuple(b) not in run]
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    once = Counter(flat(single.batches))
    if case.even_batches == "drop":
        # invariant: with "drop" every index runs at most once; the missing ones are exactly stats.dropped
        assert max(seen.values(), default=1) == 1
        assert sorted(stats[0].dropped) == sorted(single.dropped + flat(not_run))
        assert stats[0].num_dropped == len(stats[0].dropped)
        assert len(not_run) == plan_batches % world
    else:
        # invariant: with "pad" nothing is missing and only whole batches repeat
        assert not not_run and not (once - seen)
        assert sorted(stats[0].dropped) == sorted(single.dropped)
        assert sum(run.values()) - len(run) == expected_steps * world - plan_batches
        # invariant: the extra appearances are exactly the ranks' stats.padded (each rank
        # reports the repeats it yields) and every rank reports the epoch's number of padded steps
        padded = Counter(i for s in stats for i in s.padded)
        assert seen - once == padded
        assert [s.num_padded for s in stats] == [expected_steps * world - plan_batches] * world


@settings(max_examples=examples(50))
@given(case=cases(world_sizes=(1, 2, 3, 4), windows=WINDOWS), epoch_number=st.integers(0, 3))
def test_same_seed_and_epoch_same_batches(case: Case, epoch_number: int) -> None:
    # invariant: the batches depend only on (seed, epoch, rank, world_size)
    with ExitStack() as stack:
        first = make_ranks(case, stack)
        second = make_ranks(case, stack)
        counted = make_ranks(case, stack)
        for loader in first + second:
            loader.set_epoch(epoch_number)
        a = [epoch(loader, case) for loader in first]
        b = [epoch(loader, case) for loader in second]
        # invariant: without set_epoch, each iteration starts the next epoch
        for loader in counted:
            for _ in range(epoch_number):
                epoch(loader, case)
        c = [epoch(loader, case) for loader in counted]
    assert a == b == c
    if case.shuffle:
        # invariant: set_epoch changes the order (the chance of equal orders of 20 items is 1 / 20!)
        now, after = single_process(case, epoch_number), single_process(case, epoch_number + 1)
        if len(flat(now.batches)) >= 20:
            assert flat(now.batches) != flat(after.batches)


# -- resume -------------------------------------------------------------------------------------


def resume_points(total: int, data: Any) -> list[int]:
    """Every step of a short epoch; the ends and a drawn sample of a long one."""
    if total <= 16:
        return list(range(total + 1))
    drawn = data.draw(st.lists(st.integers(0, total), min_size=8, max_size=8), label="resume steps")
    return sorted({0, 1, total - 1, total, *drawn})


def lockstep_state(loaders: list[Any]) -> dict[str, Any]:
    """The state every rank reports (they must agree), through a JSON round trip."""
    states = [loader.state_dict() for loader in loaders]
    # invariant: all ranks report the same state after the same steps
    assert all(state == states[0] for state in states), states
    return json.loads(json.dumps(states[0]))


# NOTE: 10 of the 40 cases in the quick suite, the other 30 in the slow one
# (test_resume_at_every_step_more_cases): a resume at every step is the heaviest property here
@settings(max_examples=examples(10))
@given(case=cases(world_sizes=(1, 2, 3, 4), windows=WINDOWS), data=st.data())
def test_resume_at_every_step(case: Case, data: Any) -> None:
    with ExitStack() as stack:
        loaders = make_ranks(case, stack)
        full = [epoch(loader, case) for loader in loaders]
        following = [epoch(loader, case) for loader in loaders]
    total = len(full[0])
    points = resume_points(total, data)
    for steps in points:
        with ExitStack() as stack:
            loaders = make_ranks(case, stack)
            done = [batches_of(start(loader, stack), case, True, steps) for loader in loaders]
            assert done == [batches[:steps] for batches in full]
            state = lockstep_state(loaders)
            fresh = make_ranks(case, stack)
            for loader in fresh:
                loader.load_state_dict(state)
            remaining = [len(loader) for loader in fresh]
            if steps == total:
                # invariant: a state saved after an epoch's last step (the epoch is done) starts
                # the next epoch, with its whole length
                assert [epoch(loader, case) for loader in fresh] == following
                assert remaining == [len(batches) for batches in following]
                continue
            # invariant: a fresh loader loading the state yields exactly the remaining batches
            assert [epoch(loader, case, with_indices=True) for loader in fresh] == [b[steps:] for b in full], (
                f"resumed after {steps} steps"
            )
            # invariant: len() right after load_state_dict is the whole epoch's steps, as a trainer
            # that restores its step count counts them (the steps run, then those left)
            assert remaining == [total] * case.world_size, f"len() after loading a state of step {steps}"
            # invariant: after the resumed epoch, the next epoch is the uninterrupted run's next one
            if steps == points[(len(points) - 1) // 2]:
                assert [epoch(loader, case) for loader in fresh] == following
    # invariant: a state taken between epochs starts the next epoch
    with ExitStack() as stack:
        loaders = make_ranks(case, stack)
        for loader in loaders:
            epoch(loader, case)
        state = lockstep_state(loaders)
        fresh = make_ranks(case, stack)
        for loader in fresh:
            loader.load_state_dict(state)
        assert [epoch(loader, case) for loader in fresh] == following


@pytest.mark.slow
@settings(max_examples=examples(30))
@given(case=cases(world_sizes=(1, 2, 3, 4), windows=WINDOWS), data=st.data())
def test_resume_at_every_step_more_cases(case: Case, data: Any) -> None:
    test_resume_at_every_step.hypothesis.inner_test(case, data)  # type: ignore[attr-defined]


def steps_run_before(state: dict[str, Any] | None) -> int:
    """The steps of the epoch a state was saved in that ran before it, over every stretch."""
    if state is None:
        return 0
    return int(state["steps"]) + sum(int(stretch["steps"]) for stretch in state["history"])


@settings(max_examples=examples(60))
@given(
    case=cases(windows=WINDOWS),
    stages=st.lists(
        st.tuples(st.integers(1, 4), st.booleans(), st.sampled_from(["pad", "drop"])), min_size=2, max_size=4
    ),
    data=st.data(),
)
def test_resume_chain_across_world_sizes(case: Case, stages: list[tuple[int, bool, str]], data: Any) -> None:
    # each stage runs on its own world size and dealing (balance, even_batches): a state
    # records how its steps were dealt, so any chain resumes exactly
    single = single_process(case)
    worlds = [world for world, _, _ in stages]
    yielded: list[list[int]] = []
    state: dict[str, Any] | None = None
    allowed_repeats = 0
    final_dropped: list[int] = []
    final_len: tuple[list[int], list[int]] = ([], [])
    for stage, world in enumerate(worlds):
        _, balance, even_batches = stages[stage]
        staged = replace(case, balance=balance, even_batches=even_batches)
        with ExitStack() as stack:
            loaders = make_ranks(staged, stack, world)
            if state is not None:
                for loader in loaders:
                    loader.load_state_dict(state)
            # (len() counts the steps of the earlier stages too, as a trainer does: those left here)
            announced = [len(loader) - steps_run_before(state) for loader in loaders]
            last = stage == len(worlds) - 1
            sources = [start(loader, stack) for loader in loaders]
            steps = None if last else data.draw(st.integers(0, max(announced)), label=f"steps of stage {stage}")
            if steps is not None and steps >= max(announced):
                # a state saved after the epoch's last step starts the next epoch: the chain ends here
                last, steps = True, None
            run = [batches_of(source, case, True, steps) for source in sources]
            if steps is not None and any(len(batches) < steps for batches in run):
                last = True  # the epoch ended within this stage: the chain ends here
            if last:
                final_dropped = list(loaders[0].stats.dropped)
                final_len = (announced, [len(batches) for batches in run])
            else:
                state = lockstep_state(loaders)
            # invariant: the ranks run in lockstep: the same number of steps each
            assert len({len(batches) for batches in run}) == 1, f"stage {stage} (world size {world}): {run}"
            for batches in run:
                check_limits(batches, case)
                yielded += batches
            if even_batches == "pad":
                allowed_repeats += world - 1
        if last:
            break
    seen = Counter(flat(yielded))
    once = Counter(flat(single.batches))
    note(f"yielded={yielded}")
    # invariant: across the chain no index of the epoch is lost (but the final drop, reported)
    assert not (once - seen - Counter(final_dropped)), (
        f"lost: {sorted((once - seen - Counter(final_dropped)).elements())}"
    )
    # invariant: the missing indices are exactly those the last stage reports dropped
    assert sorted((once - seen).elements()) == sorted(set(final_dropped) - set(single.dropped))
    assert set(single.dropped) <= set(final_dropped)
    # invariant: only whole batches repeat, at most world_size - 1 per stage with "pad" (none
    # without)
    distinct = {tuple(b) for b in yielded}
    assert len(flat(distinct)) == len(set(flat(distinct))), "a repeat that is not a whole batch"
    assert len(yielded) - len(distinct) <= allowed_repeats
    # invariant: after a load, len() on every rank is the number of steps left
    assert final_len[0] == final_len[1], f"len() {final_len[0]} but steps run {final_len[1]}"


# -- refused and accepted states ------------------------------------------------------------------

# balance and even_batches are not here: a state records how its steps were dealt and any
# dealing resumes it exactly (test_resume_chain_across_world_sizes)
VARIANTS = (
    "caps",
    "batch_size",
    "max_batch_size",
    "seed",
    "n",
    "sizes",
    "shuffle",
    "group_size",
    "cost",
    "oversize",
    "drop_last",
    "multiple",
    "sort_window",
)


def vary(case: Case, field: str, data: Any) -> Case:
    """``case`` with one option changed."""
    if field in ("balance", "shuffle", "drop_last"):
        return replace(case, **{field: not getattr(case, field)})
    if field == "even_batches":
        return replace(case, even_batches="drop" if case.even_batches == "pad" else "pad")
    if field == "caps":
        deltas = data.draw(st.lists(st.sampled_from([-1, 1, 2, 5]), min_size=len(case.caps), max_size=len(case.caps)))
        return replace(case, caps=tuple(c + d if c + d > 0 else c + 1 for c, d in zip(case.caps, deltas)))
    if field == "batch_size":
        return replace(case, batch_size=case.batch_size + 1)
    if field == "max_batch_size":
        return replace(case, max_batch_size=2 if case.max_batch_size is None else case.max_batch_size + 1)
    if field == "seed":
        return replace(case, seed=case.seed + 1)
    if field == "n":
        return replace(case, n=case.n + 1, sizes=case.sizes + case.sizes[-1:] if case.sizes else ())
    if field == "sizes":
        if not case.sizes:
            return case
        i = data.draw(st.integers(0, case.n - 1), label="changed size")
        row = tuple(v + 1 for v in case.sizes[i])
        return replace(case, sizes=(*case.sizes[:i], row, *case.sizes[i + 1 :]))
    if field == "group_size":
        return replace(case, group_size=7 if case.group_size is None else case.group_size + 1)
    if field == "cost":
        return replace(case, cost="padded" if case.cost == "sum" else "sum")
    if field == "oversize":
        return replace(case, oversize="own_batch" if case.oversize == "skip" else "skip")
    if field == "sort_window":
        return replace(case, sort_window=4 if case.sort_window is None else case.sort_window + 1)
    return replace(case, multiple=case.multiple + 1)


def all_ranks(case: Case) -> list[list[list[int]]]:
    with ExitStack() as stack:
        return [epoch(loader, case) for loader in make_ranks(case, stack)]


def state_after(case: Case, steps: int) -> dict[str, Any]:
    with ExitStack() as stack:
        loaders = make_ranks(case, stack)
        for loader in loaders:
            batches_of(start(loader, stack), case, True, steps)
        return lockstep_state(loaders)


@pytest.mark.parametrize("field", VARIANTS)
@settings(max_examples=examples(10))
@given(case=cases(world_sizes=(1, 2, 3, 4), min_n=4, max_n=120, windows=WINDOWS), data=st.data())
def test_state_refused_by_another_configuration(field: str, case: Case, data: Any) -> None:
    other = vary(case, field, data)
    base = all_ranks(case)
    total = len(base[0])
    assume(total >= 2)
    steps = data.draw(st.integers(1, total - 1), label="steps")
    if all_ranks(other) == base:
        return  # the change does not change which batches run: either answer is right
    state = state_after(case, steps)
    with ExitStack() as stack:
        loaders = make_ranks(other, stack)
        # invariant: a state is refused by a loader whose batches differ (ValueError), never misapplied
        for loader in loaders:
            with pytest.raises(ValueError):
                loader.load_state_dict(state)
                len(loader)
                epoch(loader, other)


@pytest.mark.parametrize("spelling", ["numpy", "int32", "tensor", "list"])
@settings(max_examples=examples(12))
@given(case=cases(world_sizes=(1, 2, 3, 4), min_n=2, max_n=120, windows=WINDOWS), data=st.data())
def test_state_accepted_by_the_same_configuration_spelled_otherwise(spelling: str, case: Case, data: Any) -> None:
    base = all_ranks(case)
    total = len(base[0])
    # (a state after the last step starts the next epoch: test_resume_at_every_step)
    steps = data.draw(st.integers(0, max(total - 1, 0)), label="steps")
    state = state_after(case, steps)
    with ExitStack() as stack:
        loaders = [make_loader(case, stack, rank, spelling=spelling) for rank in range(case.world_size)]
        # invariant: numpy scalars, tensors or lists for the same options accept the state and
        # yield exactly the remaining batches
        for loader in loaders:
            loader.load_state_dict(state)
        assert [epoch(loader, case) for loader in loaders] == [b[steps:] for b in base]


TAMPERED: list[tuple[str, Any]] = [
    ("steps", "past the end"),
    ("steps", 10**12),
    ("steps", -1),
    ("steps", 1.5),
    ("steps", "as float"),
    ("steps", "1"),
    ("steps", None),
    ("steps", True),
    ("steps", "missing"),
    ("epoch", -1),
    ("epoch", 0.5),
    ("epoch", "as float"),
    ("epoch", "0"),
    ("epoch", None),
    ("epoch", True),
    ("epoch", "missing"),
    ("world_size", 0),
    ("world_size", -2),
    ("world_size", "as float"),
    ("world_size", "2"),
    ("world_size", None),
    ("world_size", True),
    ("world_size", "missing"),
    ("seed", "0"),
    ("seed", None),
    ("seed", 0.5),
    ("seed", "missing"),
    ("fingerprint", None),
    ("fingerprint", 7),
    ("fingerprint", "missing"),
    ("format", None),
    ("format", "missing"),
]


@pytest.mark.parametrize(("key", "value"), TAMPERED, ids=[f"{key}={value!r}" for key, value in TAMPERED])
@settings(max_examples=examples(5))
@given(case=cases(world_sizes=(1, 2, 3), max_n=16), use_sampler=st.booleans(), data=st.data())
def test_tampered_state_is_refused_naming_the_key(
    key: str, value: Any, case: Case, use_sampler: bool, data: Any
) -> None:
    total = len(all_ranks(case)[0])
    steps = data.draw(st.integers(0, total), label="steps")
    state = state_after(case, steps)
    if value == "missing":
        del state[key]
    elif value == "past the end":
        state[key] = total + 1
    elif value == "as float":
        state[key] = float(state[key])
    else:
        state[key] = value
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        target = loader.batch_sampler() if use_sampler else loader
        # invariant: a tampered state raises ValueError/TypeError naming the key, never a silent epoch
        with pytest.raises((ValueError, TypeError), match=re.escape(key)):
            target.load_state_dict(state)
            len(target)
            if use_sampler:
                list(target)
            else:
                epoch(target, case)


# -- lowering the limit -------------------------------------------------------------------------------


def draw_lower(case: Case, current: Sequence[Any], data: Any) -> tuple[Any, ...]:
    """A limit below ``current`` in at least one column, possibly below pending items' costs."""
    if case.kind == "fixed":
        return (data.draw(st.integers(1, current[0] - 1), label="lowered batch size"),)
    lowered = []
    for cap in current:
        choices = [st.floats(0.05, float(cap)).map(lambda x, cap=cap: min(x, cap))]
        if cap >= 1:
            choices.append(st.integers(1, math.floor(cap)))
        lowered.append(data.draw(st.one_of(choices), label="lowered cap"))
    assume(any(low < cap for low, cap in zip(lowered, current)))
    return tuple(lowered)


def limit_argument(case: Case, limit: Sequence[Any]) -> Any:
    return limit[0] if len(limit) == 1 else list(limit)


def run_lowered(
    case: Case, stack: ExitStack, lowerings: list[tuple[int, tuple[Any, ...]]], stop: int | None = None
) -> tuple[Any, list[list[int]]]:
    """Run an epoch (or its first ``stop`` batches), lowering the limit after the given steps."""
    loader = make_loader(case, stack)
    source = start(loader, stack)
    batches: list[list[int]] = []
    pending = dict(lowerings)
    while stop is None or len(batches) < stop:
        got = batches_of(source, case, True, 1)
        if not got:
            break
        batches += got
        if len(batches) in pending:
            loader.lower_limit(limit_argument(case, pending[len(batches)]))
    return loader, batches


@st.composite
def lowered_cases(
    draw: Any, kinds: Sequence[str] = ("fixed", "sized"), windows: Sequence[int | None] = WINDOWS
) -> tuple[Case, Plan, list[tuple[int, tuple[Any, ...]]]]:
    """A one-process case, its unlowered epoch and one or two lowerings after steps >= 1."""
    case = draw(cases(min_n=2, kinds=kinds, windows=windows))
    assume(case.kind == "sized" or case.batch_size >= 2)
    plain = single_process(case)
    total = len(plain.batches)
    assume(total >= 2)
    first = draw(st.integers(1, total - 1), label="lowered after step")
    limit = draw_lower(case, case.limit, _Drawer(draw))
    lowerings = [(first, limit)]
    if draw(st.booleans()) and (case.kind == "sized" or limit[0] >= 2):
        second = first + draw(st.integers(1, 10), label="lowered again after")
        lowerings.append((second, draw_lower(case, limit, _Drawer(draw))))
    return case, plain, lowerings


class _Drawer:
    """Adapts a composite's ``draw`` to the ``data.draw(strategy, label=...)`` interface."""

    def __init__(self, draw: Any) -> None:
        self._draw = draw

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self._draw(strategy)


def expected_once(case: Case) -> Counter[int]:
    """The indices an epoch must yield once, or report as dropped: all but the skipped."""
    skipped = set(oversize_items(case)) if case.oversize == "skip" else set()
    return Counter(i for i in range(case.n) if i not in skipped)


@settings(max_examples=examples(80))
@given(lowered=lowered_cases())
def test_lower_limit_mid_epoch(lowered: tuple[Case, Plan, list[tuple[int, tuple[Any, ...]]]]) -> None:
    case, plain, lowerings = lowered
    with ExitStack() as stack:
        loader, batches = run_lowered(case, stack, lowerings)
        stats = loader.stats
    first = lowerings[0][0]
    dropped = list(stats.dropped)
    lowerings = [(step, limit) for step, limit in lowerings if step < len(batches)]
    # invariant: every index of the epoch is yielded exactly once (the skipped and dropped are reported)
    assert Counter(flat(batches)) + Counter(dropped) == expected_once(case)
    assert sorted(stats.skipped) == sorted(plain.skipped)
    # invariant: the batches before the change are those of the unlowered epoch
    assert batches[:first] == plain.batches[:first]
    if case.sort_window is None:
        # invariant: the rest follows the same epoch order (with sorted windows: test_lower_limit_with_sorted_windows)
        order = flat(plain.batches) + plain.dropped
        rest = [i for i in order if i not in set(flat(batches[:first]))]
        assert flat(batches[first:]) + dropped == rest
    assert [change[0] for change in stats.limit_changes if change[0] < len(batches)] == [step for step, _ in lowerings]
    ends = [step for step, _ in lowerings[1:]] + [len(batches)]
    for (step, limit), end in zip(lowerings, ends):
        segment = batches[step:end]
        # invariant: batches after the change respect the new limit (an item above it alone)
        check_limits(segment, case, limit)
        if end != len(batches) or case.sort_window is not None:
            continue  # (a segment cut by the next lowering is not an epoch's end for the loop)
        # invariant: they are the plain loop over the rest under the new limit; items above it
        # but within the original cap get batches of their own. What drop_last drops is decided
        # by the configured batch size: a lowering re-batches the same items, it never changes
        # which ones the epoch trains on.
        assert reference(replace(case, drop_last=False), flat(segment), limit) == (segment, [])
    assert dropped == plain.dropped


@settings(max_examples=examples(60))
@given(lowered=lowered_cases(), more=st.integers(0, 12))
def test_resume_after_lowering(lowered: tuple[Case, Plan, list[tuple[int, tuple[Any, ...]]]], more: int) -> None:
    case, _, lowerings = lowered
    with ExitStack() as stack:
        _, whole = run_lowered(case, stack, lowerings)
    stop = min(lowerings[-1][0] + more, len(whole))
    with ExitStack() as stack:
        loader, done = run_lowered(case, stack, lowerings, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        fresh = make_loader(case, stack)
        fresh.load_state_dict(state)
        remaining = len(fresh)
        rest = epoch(fresh, case, with_indices=True)
        dropped = list(fresh.stats.dropped)
    assert len(done) == stop, "the lowered epoch ended early"
    if stop == len(whole):
        # invariant: a state saved after the lowered epoch's last step starts the next epoch,
        # under the configured limit again
        assert rest == single_process(case, 1).batches and remaining == len(rest)
        return
    # invariant: resumed after a lowered limit, no index is lost or repeated
    seen = Counter(flat(done + rest)) + Counter(dropped)
    assert seen == expected_once(case), (
        f"lost {sorted(expected_once(case) - seen)}, repeated {sorted(seen - expected_once(case))}"
    )
    # invariant: the same lowerings after the same steps give the same batches
    assert done == whole[:stop]
    # invariant: the resumed loader yields exactly the rest of the lowered epoch; len() counts the
    # steps run before the state and that rest
    assert rest == whole[stop:]
    assert remaining == len(whole)


#: What is asked after a received batch: ``("lower", limit)`` (lower_limit) or ``("retry", limit)``.
Action = tuple[str, tuple[Any, ...]]


def draw_retry_limit(case: Case, current: Sequence[Any], data: Any) -> tuple[Any, ...]:
    """A limit for a retry: the one in force (a batch retried as it was) or one below it."""
    if (case.kind == "fixed" and current[0] < 2) or data.draw(st.booleans(), label="retry at the same limit"):
        return tuple(current)
    return draw_lower(case, current, data)


@st.composite
def repeated_lowerings(draw: Any) -> tuple[Case, dict[int, Action]]:
    """A one-process case and lowerings, several of them at one position, keyed by received batch.

    A lowering (or retry) after the ``k``-th batch received, then retries after each of the
    next batches: the retries apply where the first did, one after the other (a batch split,
    then its first part split again). Maybe another such run of lowerings later.
    """
    case = draw(cases(min_n=2, windows=WINDOWS))
    assume(case.kind == "sized" or case.batch_size >= 2)
    total = len(single_process(case).batches)
    assume(total >= 1)
    drawer = _Drawer(draw)
    actions: dict[int, Action] = {}
    current: tuple[Any, ...] = case.limit
    received = 0
    for _ in range(draw(st.integers(1, 2), label="runs of lowerings")):
        received += draw(st.integers(1, max(total - received, 1)), label="received before the run")
        first = "retry" if draw(st.booleans(), label="first retries") else "lower"
        if first == "lower" and case.kind == "fixed" and current[0] < 2:
            break
        current = draw_lower(case, current, drawer) if first == "lower" else draw_retry_limit(case, current, drawer)
        actions[received] = (first, current)
        for _ in range(draw(st.integers(1, 3), label="retries at the same position")):
            received += 1
            current = draw_retry_limit(case, current, drawer)
            actions[received] = ("retry", current)
    return case, actions


def run_actions(
    case: Case,
    stack: ExitStack,
    actions: dict[int, Action],
    stop: int | None = None,
    state: dict[str, Any] | None = None,
) -> tuple[Any, list[list[int]], int]:
    """Run an epoch (or its first ``stop`` batches received), asking ``actions`` after the batches.

    With ``state`` the loader resumes from it first. Returns the loader, the batches run (a
    retried batch is taken back) and the batches received.
    """
    loader = make_loader(case, stack)
    if state is not None:
        loader.load_state_dict(state)
    source = start(loader, stack)
    kept: list[list[int]] = []
    received = 0
    while stop is None or received < stop:
        got = batches_of(source, case, True, 1)
        if not got:
            break
        received += 1
        kept += got
        assert received <= 2 * bound(case), "the lowered epoch did not end"
        if received in actions:
            kind, limit = actions[received]
            if kind == "retry":
                loader.retry_last_batch(limit_argument(case, limit))
                kept.pop()
            else:
                loader.lower_limit(limit_argument(case, limit))
    return loader, kept, received


def test_a_resume_at_the_end_of_a_chunk_plans_a_retry_there_as_the_run_did():
    # a state saved where a chunk ends, then two retries of the next batch: the run re-plans from
    # after that chunk; so must the resumed loader, which passed over the chunk (all its batches
    # ran before the state)
    ones = (7, 195, 236)
    case = Case(
        kind="sized", n=237, dataset="tensor", chunk=1, numeric="int",
        sizes=tuple((int(i in ones),) for i in range(237)), caps=(2,), cost="padded", max_batch_size=None,
        multiple=1, oversize="skip", batch_size=1, drop_last=False, shuffle=True, seed=5, group_size=15,
        prefetch=None, world_size=1, even_batches="pad", balance=False, sort_window=1,
    )  # fmt: skip
    actions: dict[int, Action] = {2: ("retry", (1.0,)), 3: ("retry", (1.0,))}
    with ExitStack() as stack:
        _, whole, _ = run_actions(case, stack, actions)
    with ExitStack() as stack:
        loader, done, _ = run_actions(case, stack, actions, 1)
        state = json.loads(json.dumps(loader.state_dict()))
    with ExitStack() as stack:
        _, rest, _ = run_actions(case, stack, {1: actions[2], 2: actions[3]}, state=state)
    # invariant: the resumed loader yields exactly the batches the run had left, in the same order
    assert done + rest == whole


@pytest.mark.slow
@settings(max_examples=examples(40))
@given(lowered=repeated_lowerings(), data=st.data())
def test_resume_after_several_lowerings_at_one_position(lowered: tuple[Case, dict[int, Action]], data: Any) -> None:
    case, actions = lowered
    with ExitStack() as stack:
        loader, whole, received = run_actions(case, stack, actions)
        changes = [change[0] for change in loader.stats.limit_changes]
    note(f"limit changes at {changes}")
    for stop in resume_points(received, data):
        with ExitStack() as stack:
            loader, done, _ = run_actions(case, stack, actions, stop)
            state = json.loads(json.dumps(loader.state_dict()))
        # invariant: the same lowerings after the same batches give the same batches
        assert done == whole[: len(done)]
        if len(done) == len(whole):
            with ExitStack() as stack:
                fresh = make_loader(case, stack)
                fresh.load_state_dict(state)
                # invariant: a state saved after the lowered epoch's last step starts the next epoch
                assert epoch(fresh, case) == single_process(case, 1).batches
            continue
        later = {at - stop: action for at, action in actions.items() if at > stop}
        with ExitStack() as stack:
            fresh = make_loader(case, stack)
            fresh.load_state_dict(state)
            remaining = len(fresh)
            # (the loader resumed gets the lowerings the uninterrupted run got after the state)
            _, rest, _ = run_actions(case, stack, later, state=state)
        # invariant: the resumed loader yields exactly the batches the uninterrupted run had
        # left, however many lowerings applied at one position
        assert rest == whole[len(done) :], f"resumed after {stop} batches received (state {state['lowered']})"
        if not later:
            # invariant: len() after loading the state is the steps run before it and those left
            assert remaining == len(done) + len(rest)


@settings(max_examples=examples(60))
@given(lowered=lowered_cases(kinds=("sized",), windows=WINDOWS[2:]))
def test_lower_limit_with_sorted_windows(lowered: tuple[Case, Plan, list[tuple[int, tuple[Any, ...]]]]) -> None:
    case, plain, lowerings = lowered
    assert case.sort_window is not None
    with ExitStack() as stack:
        loader, batches = run_lowered(case, stack, lowerings)
        stats = loader.stats
    first = lowerings[0][0]
    # invariant: the batches before the change are those of the unlowered epoch; afterwards
    # every index not yet yielded comes exactly once (re-planned, then the later groups sorted
    # anew), none is reported twice
    assert batches[:first] == plain.batches[:first]
    assert Counter(flat(batches)) == expected_once(case)
    assert sorted(stats.skipped) == sorted(plain.skipped) and stats.num_skipped == len(plain.skipped)


@pytest.mark.slow
@settings(max_examples=examples(80))
@given(case=cases(min_n=1, windows=WINDOWS), data=st.data())
def test_adaptive_run_processes_every_index_once(case: Case, data: Any) -> None:
    rows = case.rows
    thresholds = []
    for cap in case.limit:
        high = max(1.0, float(cap) * 1.5)
        thresholds.append(
            data.draw(st.one_of(st.integers(1, math.ceil(high)), st.floats(0.5, high)), label="threshold")
        )
    processed: list[list[int]] = []
    calls = [0]

    def step(batch: Any) -> list[int]:
        calls[0] += 1
        assert calls[0] <= 4 * bound(case), "adaptive.run did not end"
        ids = ids_of(batch, case)
        assert ids, "an empty batch was run"
        spent = [batch_cost([rows[i] for i in ids], j, case.cost) for j in range(len(thresholds))]
        if any(cost > limit for cost, limit in zip(spent, thresholds)):
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        processed.append(ids)
        return ids

    skipped = set(oversize_items(case)) if case.oversize == "skip" else set()
    to_run = [i for i in range(case.n) if i not in skipped]
    kept = set(flat(single_process(case).batches))  # not dropped by drop_last
    too_big = [i for i in to_run if i in kept and above(rows[i], thresholds)]
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        results: list[list[int]] = []
        if too_big:
            # invariant: a single sample that does not fit raises AdaptiveOOMError
            with pytest.raises(adaptive.AdaptiveOOMError):
                for result in guarded(adaptive.run(loader, step), 2 * bound(case), "adaptive.run"):
                    results.append(result)
            assert max(Counter(flat(processed)).values(), default=1) == 1, "an index was processed twice"
            return
        for result in guarded(adaptive.run(loader, step), 2 * bound(case), "adaptive.run"):
            results.append(result)
        dropped = list(loader.stats.dropped)
    # invariant: every index is processed exactly once (the skipped and dropped are reported)
    assert results == processed
    assert Counter(flat(processed)) + Counter(dropped) == Counter(to_run)
    if case.kind == "sized":
        assert sorted(loader.stats.skipped) == sorted(skipped)


# -- batch_sampler() in a DataLoader --------------------------------------------------------------------


def sampler_batches(sampler: Any, dataset: Any, case: Case, limit: int | None = None) -> list[list[int]]:
    # (collate_batch: OutOfCoreDataset.__getitems__ returns whole batches, not lists of samples)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=0, collate_fn=collate_batch)
    return batches_of(iter(loader), case, False, limit)


@settings(max_examples=examples(40))
@given(case=cases(world_sizes=(1, 2, 3), windows=WINDOWS), data=st.data())
def test_batch_sampler_in_a_dataloader(case: Case, data: Any) -> None:
    full = all_ranks(case)
    total = len(full[0])
    world = case.world_size

    def samplers_and_data(stack: ExitStack, of: Case = case) -> list[tuple[Any, Any]]:
        datasets = [make_dataset(of, stack) for _ in range(world)]
        return [(make_loader(of, stack, r, dataset=d).batch_sampler(), d) for r, d in enumerate(datasets)]

    with ExitStack() as stack:
        pairs = samplers_and_data(stack)
        # invariant: DataLoader(batch_sampler=loader.batch_sampler()) gives the loader's batches; len() is exact
        assert [len(sampler) for sampler, _ in pairs] == [total] * world
        assert [sampler_batches(sampler, dataset, case) for sampler, dataset in pairs] == full
    # (a state after the last step starts the next epoch: test_resume_at_every_step)
    steps = data.draw(st.integers(0, max(total - 1, 0)), label="steps")
    with ExitStack() as stack:
        pairs = samplers_and_data(stack)
        done = [sampler_batches(sampler, dataset, case, steps) for sampler, dataset in pairs]
        assert done == [b[:steps] for b in full]
        state = lockstep_state([sampler for sampler, _ in pairs])
        fresh = samplers_and_data(stack)
        for sampler, _ in fresh:
            sampler.load_state_dict(state)
        # invariant: a sampler resumes like a loader: len() is the whole epoch's, then exactly the rest
        assert [len(sampler) for sampler, _ in fresh] == [total] * world
        assert [sampler_batches(sampler, dataset, case) for sampler, dataset in fresh] == [b[steps:] for b in full]
    other = replace(case, seed=case.seed + 1)
    if 0 < steps < total and case.shuffle and all_ranks(other) != full:
        with ExitStack() as stack:
            sampler = samplers_and_data(stack, other)[0][0]
            # invariant: a sampler refuses a state of another configuration
            with pytest.raises(ValueError):
                sampler.load_state_dict(state)
                list(sampler)
