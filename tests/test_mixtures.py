"""The loaders over a ``Mixture``, against the plain loops of :mod:`tests.reference`.

A mixture's epoch is the plain mixing loop (``mix_loop``) over each source's own order, and its
batches are the plain batching loops (``greedy_loop``, ``fixed_size_loop``, ``sorted_windows``,
``bucket_loop``) over that epoch's ids (``offset + i + n * source_epoch``; the item is ``id % n``).
Every source's sample holds its item's number among all sources, so that every batch is also
checked against the ids it was planned from.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastLoader, FastSizeAwareLoader, Mixture, OutOfCoreDataset, PadCollator, RaggedDataset
from fastsab.plan.shape_buckets import ShapeBuckets
from tests.reference import Row, bucket_loop, fixed_size_loop, greedy_loop, mix_loop, sorted_windows
from tests.test_differential import examples, guarded

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*larger than max_total_size:UserWarning", "ignore:.*read item by item:UserWarning"
)

#: Kinds of sources whose samples are ``{"x": item}`` (they share a batch); ``"tensor"`` gives ``item``.
DICT_KINDS = ("pytree", "getitems", "ooc", "hf")
#: The default chunk of a mixture's merged order, as the loaders use it.
MIX_CHUNK = 2**16


# -- cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixCase:
    """A mixture and a loader over it, with what the reference loops need."""

    kinds: tuple[str, ...]  # each source's dataset kind
    sizes: tuple[tuple[Row, ...], ...]  # each source's rows of k sizes
    weights: Any  # {name: weight} or a schedule
    stop: Any
    by: str
    loader: str  # "fixed" (FastLoader) or "sized"
    caps: tuple[int, ...]
    cost: str
    max_batch_size: int | None
    fixed_cost: tuple[int, ...] | None
    sort_window: int | None
    batch_size: int
    drop_last: bool
    shuffle: bool
    seed: int
    group_size: int | None
    prefetch: int | None
    world_size: int = 1
    even_batches: str = "pad"
    balance: bool = False

    @property
    def names(self) -> list[str]:
        return [f"s{j}" for j in range(len(self.kinds))]

    @property
    def lengths(self) -> list[int]:
        return [len(rows) for rows in self.sizes]

    @property
    def offsets(self) -> list[int]:
        return [sum(self.lengths[:j]) for j in range(len(self.lengths))]

    @property
    def n(self) -> int:
        return sum(self.lengths)

    @property
    def rows(self) -> list[Row]:
        """Every item's row of sizes, the sources end to end."""
        return [row for rows in self.sizes for row in rows]


def weight_maps(names: Sequence[str]) -> st.SearchStrategy[dict[str, float]]:
    values = st.lists(st.sampled_from([0, 1, 1, 2, 3, 0.5, 0.7]), min_size=len(names), max_size=len(names))
    return values.map(lambda ws: dict(zip(names, ws if any(ws) else [1, *ws[1:]])))


@st.composite
def mix_cases(
    draw: Any,
    *,
    loaders: Sequence[str] = ("sized", "sized", "fixed"),
    kinds: Sequence[str] = ("tensor", "dicts"),
    windows: Sequence[int | None] = (None,),
    world_sizes: Sequence[int] = (1,),
    max_items: int = 40,
    schedules: bool = True,
) -> MixCase:
    sources = draw(st.integers(1, 3))
    family = draw(st.sampled_from(kinds))
    source_kinds = tuple(
        family if family != "dicts" else draw(st.sampled_from(DICT_KINDS), label="kind") for _ in range(sources)
    )
    k = draw(st.sampled_from([1, 1, 2]))
    value = st.integers(0, 30)
    sizes = tuple(
        tuple(tuple(draw(value) for _ in range(k)) for _ in range(draw(st.integers(1, max_items), label="items")))
        for _ in range(sources)
    )
    names = [f"s{j}" for j in range(sources)]
    weights: Any = draw(weight_maps(names))
    by = draw(st.sampled_from(["cost", "cost", "items"]))
    if schedules and draw(st.booleans()):
        at = draw(st.integers(1, 300))
        weights = [(0, weights), (at, draw(weight_maps(names)), *(("linear",) if draw(st.booleans()) else ()))]
    stop = draw(
        st.one_of(
            st.sampled_from(["first", "last"]),
            st.integers(1, 60).map(lambda v: {"items": v}),
            st.integers(1, 400).map(lambda v: {"cost": v}),
        )
    )
    fixed = draw(st.sampled_from([None, None, 3]))
    return MixCase(
        kinds=source_kinds,
        sizes=sizes,
        weights=weights,
        stop=stop,
        by=by,
        loader=draw(st.sampled_from(loaders)),
        caps=tuple(draw(st.integers(1, 80)) for _ in range(k)),
        cost=draw(st.sampled_from(["sum", "padded"])),
        max_batch_size=draw(st.one_of(st.none(), st.integers(1, 9))),
        fixed_cost=None if fixed is None else (fixed,) * k,
        sort_window=draw(st.sampled_from(windows)),
        batch_size=draw(st.integers(1, 9)),
        drop_last=draw(st.booleans()),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        group_size=draw(st.sampled_from([None, 1, 5, 16])),
        prefetch=draw(st.sampled_from([None, 0, 2])),
        world_size=draw(st.sampled_from(world_sizes)),
        even_batches=draw(st.sampled_from(["pad", "drop"])),
        balance=draw(st.booleans()),
    )


# -- sources, mixtures and loaders ----------------------------------------------------------


class Items:
    """A map-style dataset with ``__getitems__``: sample ``i`` is ``{"x": first + i}``."""

    def __init__(self, first: int, n: int) -> None:
        self.first, self.n = first, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor(self.first + i)}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        return [self[i] for i in indices]


def dict_sample(item: int) -> dict[str, np.ndarray]:
    return {"x": np.array(item, dtype=np.int64)}


def make_source(kind: str, first: int, n: int, stack: ExitStack) -> Any:
    """A source of ``n`` items whose samples hold ``first + i`` (as ``{"x": ...}``, or as is for ``"tensor"``)."""
    if kind == "tensor":
        return torch.arange(first, first + n)
    if kind == "pytree":
        return {"x": torch.arange(first, first + n)}
    if kind == "getitems":
        return Items(first, n)
    if kind == "hf":
        import datasets

        return datasets.Dataset.from_dict({"x": list(range(first, first + n))}).with_format("torch")
    # NOTE: 8 bytes a sample, 4 samples a chunk: a source's epoch spans several chunks
    dataset = OutOfCoreDataset(range(first, first + n), dict_sample, cpu_memory_limit=64, sample_bytes=8)
    stack.callback(dataset.close)
    return dataset


def make_mixture(case: MixCase, stack: ExitStack) -> Mixture:
    sources = {
        name: make_source(kind, first, n, stack)
        for name, kind, first, n in zip(case.names, case.kinds, case.offsets, case.lengths)
    }
    return Mixture(sources, case.weights, stop=case.stop, by=case.by)


def sizes_of(case: MixCase) -> dict[str, np.ndarray]:
    k = len(case.caps)
    return {
        name: np.array(rows, dtype=np.int64).reshape(len(rows), k)[:, 0] if k == 1 else np.array(rows, dtype=np.int64)
        for name, rows in zip(case.names, case.sizes)
    }


def make_loader(case: MixCase, stack: ExitStack, rank: int = 0, world_size: int | None = None, **more: Any) -> Any:
    options: dict[str, Any] = {
        "shuffle": case.shuffle,
        "seed": case.seed,
        "group_size": case.group_size,
        "prefetch": case.prefetch,
        "rank": rank,
        "world_size": case.world_size if world_size is None else world_size,
        "even_batches": case.even_batches,
        "balance": case.balance,
    } | more
    mix = make_mixture(case, stack)
    if case.loader == "fixed":
        return FastLoader(mix, case.batch_size, drop_last=case.drop_last, **options)
    caps: Any = case.caps[0] if len(case.caps) == 1 else list(case.caps)
    fixed: Any = (
        0 if case.fixed_cost is None else (case.fixed_cost[0] if len(case.caps) == 1 else list(case.fixed_cost))
    )
    return FastSizeAwareLoader(
        mix,
        sizes_of(case),
        caps,
        cost=case.cost,
        max_batch_size=case.max_batch_size,
        fixed_cost=fixed,
        sort_window=case.sort_window,
        **options,
    )


def make_ranks(case: MixCase, stack: ExitStack, world_size: int | None = None) -> list[Any]:
    world = case.world_size if world_size is None else world_size
    return [make_loader(case, stack, rank, world) for rank in range(world)]


# -- reading what a loader yields ----------------------------------------------------------


def bound(case: MixCase) -> int:
    """More batches than an epoch of ``case`` can have (its sources upsampled at most a few times)."""
    total = 0.0
    if isinstance(case.stop, dict):  # (an epoch of a total takes as many items as reach it)
        ((kind, amount),) = case.stop.items()
        positive = [row[0] for rows in case.sizes for row in rows if row[0] > 0]
        # (FastLoader weighs items, whatever ``by`` says: each costs 1)
        by_items = kind == "items" or case.by == "items" or case.loader == "fixed"
        total = amount if by_items or not positive else amount / min(positive)
    return 50 * case.n + 50 + int(total)


def content(batch: Any) -> list[int]:
    """The items a batch holds."""
    x = batch["x"] if isinstance(batch, dict) else batch
    assert x.ndim == 1, f"corrupted batch {batch!r}"
    return x.tolist()  # type: ignore[no-any-return]


def take(source: Iterator[Any], case: MixCase, limit: int | None = None) -> list[list[int]]:
    """Up to ``limit`` batches of ``iter_with_indices()`` as lists of ids, their content checked."""
    out: list[list[int]] = []
    for ids, batch in guarded(source, bound(case), "the mixture's epoch"):
        # invariant: a batch holds the items its ids name (id % n), from the source they name
        assert content(batch) == (ids % case.n).tolist(), (ids.tolist(), batch)
        out.append(ids.tolist())
        if limit is not None and len(out) == limit:
            break
    return out


def run_epoch(loader: Any, case: MixCase) -> list[list[int]]:
    source = loader.iter_with_indices()
    try:
        return take(source, case)
    finally:
        source.close()


def start(loader: Any, stack: ExitStack) -> Iterator[Any]:
    source = loader.iter_with_indices()
    stack.callback(source.close)
    return source


def flat(batches: Sequence[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


# -- the reference -----------------------------------------------------------------------


class ById:
    """Per-item values read with a mixture's ids (``id % n``)."""

    def __init__(self, values: Sequence[Any], n: int) -> None:
        self.values, self.n = values, n

    def __getitem__(self, index: int) -> Any:
        return self.values[index % self.n]


def source_orders(case: MixCase, loader: Any) -> list[Any]:
    """Each source's order in its source epoch ``k``: ``range(n)`` unshuffled; else the loader's, checked."""

    def order(s: int, k: int) -> list[int]:
        if not case.shuffle:
            return list(range(case.lengths[s]))
        visited = flat([chunk.tolist() for chunk in loader.order.orders[s].chunks(k)])
        # invariant: a source's epoch is a permutation of its items
        assert sorted(visited) == list(range(case.lengths[s]))
        return visited

    return [lambda k, s=s: order(s, k) for s in range(len(case.kinds))]


def item_cost(case: MixCase) -> Any:
    """What the weights count of an item: 1 by items (and under ``FastLoader``), else its first size."""
    rows = case.rows

    def cost(s: int, item: int) -> float:
        if case.by == "items" or case.loader == "fixed":
            return 1.0
        return float(rows[case.offsets[s] + item][0])

    return cost


def stop_of(case: MixCase) -> tuple[str, float]:
    if isinstance(case.stop, str):
        return case.stop, 0
    ((kind, amount),) = case.stop.items()
    return kind, amount


def mixed_epochs(case: MixCase, loader: Any, epochs: int) -> list[list[int]]:
    """The reference's mixture ids of ``epochs`` epochs (``ValueError`` where the loop refuses a source)."""
    schedule = loader.order.schedule
    weights = (
        (lambda cost, items: schedule.at(items).tolist())
        if schedule.over == "items"
        else (lambda cost, items: schedule.at(cost).tolist())
    )
    result = mix_loop(source_orders(case, loader), item_cost(case), weights, stop_of(case), epochs)
    return [[case.offsets[s] + i + case.n * k for s, i, k in epoch] for epoch in result]


def batched(case: MixCase, order: list[int]) -> tuple[list[list[int]], list[int]]:
    """The plain batching loop of the case's loader over an epoch's ids: batches, and the ids left out."""
    if case.loader == "fixed":
        return fixed_size_loop(order, case.batch_size, case.drop_last)
    if case.sort_window is not None:
        chunk = case.group_size or MIX_CHUNK
        groups = [order[i : i + chunk] for i in range(0, len(order), chunk)]
        # a mixture's windows hold one source: each chunk's items gathered by source, in order
        groups = [sorted(group, key=lambda i: source_of(case, i)) for group in groups]
        order = sorted_windows(groups, ById(case.rows, case.n), case.sort_window)
    return greedy_loop(
        order,
        ById(case.rows, case.n),
        list(case.caps),
        cost=case.cost,
        max_batch_size=case.max_batch_size,
        fixed=case.fixed_cost,
    )


# -- the differential properties ---------------------------------------------------------------


@settings(max_examples=examples(50))
@given(case=mix_cases(windows=(None, None, 1, 3, 8)))
def test_epochs_are_the_plain_loops(case: MixCase) -> None:
    epochs = 3
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        try:
            expected = mixed_epochs(case, loader, epochs)
        except ValueError:
            # invariant: a source that would hold the epoch's end off forever is refused, never a hang
            with pytest.raises(ValueError, match="costs nothing"):
                for _ in range(epochs):
                    run_epoch(loader, case)
            return
        for number, order in enumerate(expected):
            announced = len(loader)
            batches = run_epoch(loader, case)
            plan, left_out = batched(case, order)
            # invariant: the epoch is the plain batching loop over the plain mixing loop's ids,
            # batch after batch (with sorted windows unshuffled; as a multiset shuffled)
            if case.sort_window is None or not case.shuffle:
                assert batches == plan, f"epoch {number}"
            else:
                assert sorted(batches) == sorted(plan), f"epoch {number}"
            assert announced == len(batches) == loader.stats.num_batches
            left = loader.stats.dropped if case.loader == "fixed" else loader.stats.skipped
            assert sorted(left) == sorted(left_out)
            check_sources(case, loader, expected[: number + 1])


def check_sources(case: MixCase, loader: Any, epochs: list[list[int]]) -> None:
    """``stats.sources`` against a count of the reference's ids of the last of ``epochs``."""
    figures = loader.stats.sources
    cost = item_cost(case)
    order = epochs[-1]
    located = [(s, i) for s, i, _ in zip(*loader.order.locate(np.array(order, dtype=np.int64)))]
    costs = Counter[int]()
    for s, i in located:
        costs[int(s)] += cost(int(s), int(i))
    total = sum(costs.values())
    taken = Counter(int(s) for s, _ in located)
    before = Counter(loader.order.locate(np.array(flat(epochs), dtype=np.int64))[0].tolist())
    targets = epoch_targets(case, loader, epochs)
    assert list(figures) == case.names
    for s, name in enumerate(case.names):
        got = figures[name]
        # invariant: per source, the items and cost the epoch's plan took, its source epochs
        # completed since the start, its share of the cost and the share its weights gave it
        assert got.items == taken[s], name
        assert got.cost == pytest.approx(costs[s]), name
        assert got.source_epochs == before[s] // case.lengths[s], name
        assert got.share == pytest.approx(costs[s] / total if total else 0.0), name
        assert got.target == pytest.approx(targets[s], abs=1e-9), name


def epoch_targets(case: MixCase, loader: Any, epochs: list[list[int]]) -> list[float]:
    """Each source's target share of the last epoch: every item's cost shared by the weights then in force."""
    schedule = loader.order.schedule
    cost = item_cost(case)
    spent, count = 0.0, 0
    target = [0.0] * len(case.kinds)
    for number, order in enumerate(epochs):
        sources, items, _ = loader.order.locate(np.array(order, dtype=np.int64))
        for s, i in zip(sources.tolist(), items.tolist()):
            w = schedule.at(count if schedule.over == "items" else spent)
            c = cost(s, i)
            if number == len(epochs) - 1:
                for r in range(len(target)):
                    target[r] += c * w[r] / w.sum()
            spent += c
            count += 1
    total = sum(cost(int(s), int(i)) for s, i, _ in zip(*loader.order.locate(np.array(epochs[-1]))))
    return [t / total if total else 0.0 for t in target]


# -- resume ------------------------------------------------------------------------------------


def lockstep_state(loaders: list[Any]) -> dict[str, Any]:
    """The state every rank reports (they must agree), through a JSON round trip."""
    states = [loader.state_dict() for loader in loaders]
    # invariant: all ranks report the same state after the same steps
    assert all(state == states[0] for state in states)
    return json.loads(json.dumps(states[0]))


def resumable(case: MixCase, stack: ExitStack, epochs: int = 1) -> bool:
    """Whether the case's first ``epochs`` + 1 epochs run (no source refused for costing nothing)."""
    try:
        mixed_epochs(case, make_loader(case, stack, 0, 1), epochs + 1)
    except ValueError:
        return False
    return True


def resume_points(total: int, data: Any) -> list[int]:
    """Every step of a short epoch; the ends and a drawn sample of a long one."""
    if total <= 8:
        return list(range(total + 1))
    drawn = data.draw(st.lists(st.integers(0, total), min_size=4, max_size=4), label="resume steps")
    return sorted({0, 1, total - 1, total, *drawn})


# NOTE: 6 cases in the quick suite, 30 more in the slow one (test_resume_at_every_step_more_cases)
@settings(max_examples=examples(6))
@given(
    case=mix_cases(windows=(None, None, 3), world_sizes=(1, 2, 3), max_items=25),
    epoch_number=st.integers(0, 2),
    data=st.data(),
)
def test_resume_at_every_step(case: MixCase, epoch_number: int, data: Any) -> None:
    with ExitStack() as stack:
        if not resumable(case, stack, epoch_number + 1):
            return
        loaders = make_ranks(case, stack)
        for loader in loaders:
            loader.set_epoch(epoch_number)
        full = [run_epoch(loader, case) for loader in loaders]
        following = [run_epoch(loader, case) for loader in loaders]
    total = len(full[0])
    for steps in resume_points(total, data):
        with ExitStack() as stack:
            loaders = make_ranks(case, stack)
            for loader in loaders:
                loader.set_epoch(epoch_number)
            assert [take(start(loader, stack), case, steps) if steps else [] for loader in loaders] == [
                batches[:steps] for batches in full
            ]
            state = lockstep_state(loaders)
            fresh = make_ranks(case, stack)
            for loader in fresh:
                loader.load_state_dict(state)
            if steps < total or not total:
                # invariant: a fresh loader loading the state yields exactly the remaining batches
                assert [run_epoch(loader, case) for loader in fresh] == [b[steps:] for b in full], steps
            # invariant: then the epochs that follow, as the uninterrupted run
            assert [run_epoch(loader, case) for loader in fresh] == following, steps


@pytest.mark.slow
@settings(max_examples=examples(30))
@given(
    case=mix_cases(windows=(None, None, 3), world_sizes=(1, 2, 3), max_items=25),
    epoch_number=st.integers(0, 2),
    data=st.data(),
)
def test_resume_at_every_step_more_cases(case: MixCase, epoch_number: int, data: Any) -> None:
    test_resume_at_every_step.hypothesis.inner_test(case, epoch_number, data)  # type: ignore[attr-defined]


def single_plan(case: MixCase, epoch_number: int) -> tuple[list[list[int]], list[int]]:
    """The single-process epoch: its batches, and the ids it drops (fixed size)."""
    with ExitStack() as stack:
        loader = make_loader(case, stack, 0, 1)
        loader.set_epoch(epoch_number)
        return run_epoch(loader, case), list(loader.stats.dropped)


@settings(max_examples=examples(15))
@given(
    case=mix_cases(windows=(None, None, 3), max_items=25),
    worlds=st.tuples(st.sampled_from([1, 2, 3, 8]), st.sampled_from([1, 2, 3, 8])),
    dealing=st.tuples(st.booleans(), st.sampled_from(["pad", "drop"]), st.booleans(), st.sampled_from(["pad", "drop"])),
    epoch_number=st.integers(0, 2),
    data=st.data(),
)
def test_resume_on_another_world_size(
    case: MixCase, worlds: tuple[int, int], dealing: tuple[bool, str, bool, str], epoch_number: int, data: Any
) -> None:
    saved = replace(case, world_size=worlds[0], balance=dealing[0], even_batches=dealing[1])
    resumed = replace(case, world_size=worlds[1], balance=dealing[2], even_batches=dealing[3])
    with ExitStack() as stack:
        if not resumable(case, stack, epoch_number + 1):
            return
    single, single_dropped = single_plan(case, epoch_number)
    with ExitStack() as stack:
        loaders = make_ranks(saved, stack)
        for loader in loaders:
            loader.set_epoch(epoch_number)
        steps = data.draw(st.integers(0, max(min(len(loader) for loader in loaders) - 1, 0)), label="steps")
        before = [take(start(loader, stack), case, steps) if steps else [] for loader in loaders]
        state = lockstep_state(loaders)
    with ExitStack() as stack:
        fresh = make_ranks(resumed, stack)
        for loader in fresh:
            loader.load_state_dict(state)
        after = [run_epoch(loader, case) for loader in fresh]
        dropped = list(fresh[0].stats.dropped)
        # invariant: the ranks run in lockstep after a resume
        assert len({len(batches) for batches in after}) == 1
        next_epoch = [run_epoch(loader, case) for loader in fresh]
    yielded = [b for batches in before + after for b in batches]
    planned = Counter(tuple(b) for b in single)
    run = Counter(tuple(b) for b in yielded)
    # invariant: the ranks run whole batches of the single-process epoch, nothing else
    assert set(run) <= set(planned), sorted(set(run) - set(planned))
    # invariant: nothing is lost but what the last stretch reports dropped (with "drop")
    assert sorted(flat(list((planned - run).elements()))) == sorted(set(dropped) - set(single_dropped))
    # invariant: only whole batches repeat, at most world_size - 1 per stretch with "pad"
    repeats = sum((run - planned).values())
    allowed = (worlds[0] - 1 if dealing[1] == "pad" else 0) + (worlds[1] - 1 if dealing[3] == "pad" else 0)
    assert repeats <= allowed
    # invariant: the next epoch is the uninterrupted run's on the world size resumed on
    with ExitStack() as stack:
        plain = make_ranks(resumed, stack)
        for loader in plain:
            loader.set_epoch(epoch_number + 1)
        assert next_epoch == [run_epoch(loader, case) for loader in plain]


# -- weights given anew at a resume ------------------------------------------------------------


def check_source_epochs(case: MixCase, loader: Any, ids: Sequence[int]) -> None:
    """Each source epoch the ids reach holds each item of its source at most once; those completed, every item."""
    sources, items, source_epochs = loader.order.locate(np.array(ids, dtype=np.int64))
    seen: dict[tuple[int, int], list[int]] = {}
    for s, i, k in zip(sources.tolist(), items.tolist(), source_epochs.tolist()):
        seen.setdefault((s, k), []).append(i)
    for (s, k), got in seen.items():
        # invariant: no item of a source is repeated within its source epoch, nor skipped in one
        # the run went past
        assert len(got) == len(set(got)), (case.names[s], k)
        if (s, k + 1) in seen:
            assert sorted(got) == list(range(case.lengths[s])), (case.names[s], k)


# NOTE: 8 cases in the quick suite, 30 more in the slow one (test_weights_given_anew_more_cases)
@settings(max_examples=examples(8))
@given(case=mix_cases(max_items=25), epoch_number=st.integers(0, 1), data=st.data())
@pytest.mark.filterwarnings("ignore:the state was saved with other weights:UserWarning")
def test_weights_given_anew_at_a_resume(case: MixCase, epoch_number: int, data: Any) -> None:
    new = replace(case, weights=data.draw(weight_maps(case.names), label="new weights"))
    with ExitStack() as stack:
        if not resumable(case, stack, epoch_number + 1) or not resumable(new, stack, epoch_number + 2):
            return
        loader = make_loader(case, stack)
        old = mixed_epochs(case, loader, epoch_number + 1)
        loader.set_epoch(epoch_number)
        full = run_epoch(loader, case)
        steps = data.draw(st.integers(0, len(full)), label="steps")
        loader.set_epoch(epoch_number)
        done = take(start(loader, stack), case, steps) if steps else []
        state = json.loads(json.dumps(loader.state_dict()))
        fresh = make_loader(new, stack)
        fresh.load_state_dict(state)
        epochs = [full] if steps == len(full) > 0 else [done + run_epoch(fresh, case)]
        # invariant: the epoch saved runs on with the weights it was saved with
        assert epochs[0] == full
        epochs += [run_epoch(fresh, case) for _ in range(2)]
        # invariant: the new weights apply from the next epoch: the plain loop with the old
        # weights to the saved epoch's end, the new ones after
        switch = sum(len(order) for order in old)
        schedules = [make_loader(c, stack).order.schedule for c in (case, new)]

        def weights(cost: float, items: int) -> list[float]:
            schedule = schedules[items >= switch]
            return schedule.at(items if schedule.over == "items" else cost).tolist()  # type: ignore[no-any-return]

        expected = mix_loop(source_orders(case, loader), item_cost(case), weights, stop_of(case), epoch_number + 3)
        ids = [[case.offsets[s] + i + case.n * k for s, i, k in epoch] for epoch in expected]
        for number, batches in enumerate(epochs[1:], start=epoch_number + 1):
            assert batches == batched(case, ids[number])[0], f"epoch {number}"
        everything = flat(old[:epoch_number]) + [i for order in ids[epoch_number:] for i in order]
        check_source_epochs(case, loader, everything)


@pytest.mark.slow
@settings(max_examples=examples(30))
@given(case=mix_cases(max_items=25), epoch_number=st.integers(0, 1), data=st.data())
@pytest.mark.filterwarnings("ignore:the state was saved with other weights:UserWarning")
def test_weights_given_anew_more_cases(case: MixCase, epoch_number: int, data: Any) -> None:
    test_weights_given_anew_at_a_resume.hypothesis.inner_test(case, epoch_number, data)  # type: ignore[attr-defined]


# -- shape buckets -----------------------------------------------------------------------------


@settings(max_examples=examples(30))
@given(
    case=mix_cases(kinds=("dicts",), loaders=("sized",), max_items=30),
    ladder=st.sets(st.integers(1, 35), min_size=1, max_size=4).map(sorted),
    table=st.lists(st.integers(1, 6), min_size=4, max_size=4),
    partial=st.sampled_from(["fill", "keep"]),
    epoch_number=st.integers(0, 2),
)
def test_buckets_are_the_plain_loop(
    case: MixCase, ladder: list[int], table: list[int], partial: str, epoch_number: int
) -> None:
    case = replace(case, caps=case.caps[:1], sizes=tuple(tuple(row[:1] for row in rows) for rows in case.sizes))
    with ExitStack() as stack:
        mix = make_mixture(case, stack)
        buckets = ShapeBuckets(ladder, table[: len(ladder)])
        options = {"shuffle": case.shuffle, "seed": case.seed, "group_size": case.group_size, "prefetch": case.prefetch}
        loader = FastSizeAwareLoader(mix, sizes_of(case), buckets=buckets, partial=partial, **options)
        try:
            orders = mixed_epochs(case, loader, epoch_number + 1)
        except ValueError:
            return
        loader.set_epoch(epoch_number)
        announced = len(loader)
        batches = []
        for ids, batch in guarded(loader.iter_with_indices(), bound(case), "the epoch"):
            # invariant: a batch holds its ids' items; filler rows repeat items of their batch
            assert content(batch) == (ids % case.n).tolist()
            batches.append(ids.tolist())
        order = orders[epoch_number]
        chunk = case.group_size or MIX_CHUNK
        groups = [order[i : i + chunk] for i in range(0, len(order), chunk)]
        chunks, skipped = bucket_loop(groups, ById(flat(case.rows), case.n), ladder, table, partial=partial)
        position = 0
        for expected in chunks:
            got = batches[position : position + len(expected)]
            # invariant: each chunk's batches are the plain loop's, in bucket order (any order shuffled)
            assert got == expected if not case.shuffle else sorted(got) == sorted(expected)
            position += len(expected)
        assert position == len(batches) == announced == loader.stats.num_batches
        assert sorted(loader.stats.skipped) == sorted(skipped)
        check_sources(case, loader, orders)


# -- sources of every kind ---------------------------------------------------------------------


def counted_reads(dataset: OutOfCoreDataset) -> Counter[int]:
    """Counts the reads of ``dataset``, by chunk."""
    reads: Counter[int] = Counter()
    read = dataset._read_chunk

    def counting(chunk: int) -> Any:
        reads[chunk] += 1
        return read(chunk)

    dataset._read_chunk = counting  # type: ignore[method-assign]
    return reads


@settings(max_examples=examples(20))
@given(case=mix_cases(kinds=("dicts",), schedules=False), chunk=st.integers(1, 8))
def test_out_of_core_sources_read_each_chunk_once_per_source_epoch(case: MixCase, chunk: int) -> None:
    case = replace(case, kinds=("ooc",) * len(case.kinds), sort_window=None)
    with ExitStack() as stack:
        sources = {}
        for name, first, n in zip(case.names, case.offsets, case.lengths):
            dataset = OutOfCoreDataset(
                range(first, first + n), dict_sample, cpu_memory_limit=16 * chunk, sample_bytes=8, read_ahead=False
            )
            stack.callback(dataset.close)
            sources[name] = dataset
        reads = {name: counted_reads(dataset) for name, dataset in sources.items()}
        mix = Mixture(sources, case.weights, stop=case.stop, by=case.by)
        options = {"shuffle": case.shuffle, "seed": case.seed, "prefetch": case.prefetch}
        if case.loader == "fixed":
            loader: Any = FastLoader(mix, case.batch_size, **options)
        else:
            loader = FastSizeAwareLoader(mix, sizes_of(case), list(case.caps), cost=case.cost, **options)
        try:
            mixed_epochs(case, loader, 3)
        except ValueError:
            return
        ids = flat([flat(run_epoch(loader, case)) for _ in range(3)])
        sources_of, items, source_epochs = loader.order.locate(np.array(ids, dtype=np.int64))
        for s, name in enumerate(case.names):
            mine = sources_of == s
            visits = list(zip(source_epochs[mine].tolist(), (items[mine] // chunk).tolist()))
            # invariant: a source's chunks are read at most once per source epoch that visits them
            # (a chunk still held from the source epoch before is not read again)
            assert sum(reads[name].values()) <= len(set(visits)), (name, visits, dict(reads[name]))
            assert set(reads[name]) == {c for _, c in visits}


def test_ragged_sources_with_their_own_equal_collators_share_a_batch() -> None:
    first = RaggedDataset.from_sequences([[1] * 3, [2] * 5, [3]])
    second = RaggedDataset.from_sequences([[7] * 2, [8] * 4], collator=PadCollator())
    mix = Mixture({"a": first, "b": second}, stop="last")
    loader = FastSizeAwareLoader(mix, {"a": first.lengths, "b": second.lengths}, 20, shuffle=False)
    batches = [(ids.tolist(), batch) for ids, batch in loader.iter_with_indices()]
    values = {0: 1, 1: 2, 2: 3, 3: 7, 4: 8}
    lengths = [3, 5, 1, 2, 4]
    for ids, batch in batches:
        width = max(lengths[i % 5] for i in ids)
        # invariant: each row holds its own sequence, padded to the batch's longest (PadCollator's layout)
        assert batch["input_ids"].tolist() == [
            [values[i % 5]] * lengths[i % 5] + [0] * (width - lengths[i % 5]) for i in ids
        ]
        assert batch["attention_mask"].sum(1).tolist() == [lengths[i % 5] for i in ids]
    assert {i % 5 for ids, _ in batches for i in ids} == {0, 1, 2, 3, 4}


# -- lowering, adaptive.run, worker processes, prefetch, data_loader() ---------------------------


@settings(max_examples=examples(25))
@given(case=mix_cases(loaders=("sized",), max_items=30), data=st.data())
def test_lower_limit_mid_epoch(case: MixCase, data: Any) -> None:
    with ExitStack() as stack:
        loader = make_loader(case, stack)
        try:
            orders = mixed_epochs(case, loader, 2)
        except ValueError:
            return
        plain = run_epoch(loader, case)
        following = run_epoch(loader, case)
        if len(plain) < 2:
            return
        first = data.draw(st.integers(1, len(plain) - 1), label="lowered after step")
        limit = [data.draw(st.integers(1, cap), label="lowered cap") for cap in case.caps]
        loader = make_loader(case, stack)
        source = start(loader, stack)
        batches = take(source, case, first)
        loader.lower_limit(limit[0] if len(limit) == 1 else limit)
        batches += take(source, case)
        after = run_epoch(loader, case)
    # invariant: the batches before the lowering are the plain epoch's; the rest is the plain
    # loop under the lowered limit over the same mixture order (no item lost or repeated)
    assert batches[:first] == plain[:first]
    done = set(flat(batches[:first]))
    rest = [i for i in orders[0] if i not in done]
    expected, _ = greedy_loop(
        rest,
        ById(case.rows, case.n),
        limit,
        cost=case.cost,
        max_batch_size=case.max_batch_size,
        fixed=case.fixed_cost,
        policy_caps=list(case.caps),
    )
    if case.sort_window is None:
        assert batches[first:] == expected
    # invariant: the next epoch is the plain one (the configured limit again, the same mixture)
    assert after == following


@settings(max_examples=examples(20))
@given(case=mix_cases(), data=st.data())
def test_adaptive_run_processes_every_id_once(case: MixCase, data: Any) -> None:
    from fastsab import adaptive

    threshold = data.draw(st.integers(1, 12), label="items a step holds")
    processed: list[list[int]] = []

    def step(batch: Any) -> list[int]:
        items = content(batch)
        if len(items) > threshold:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        processed.append(items)
        return items

    with ExitStack() as stack:
        loader = make_loader(case, stack)
        try:
            orders = mixed_epochs(case, loader, 1)
        except ValueError:
            return
        plain = make_loader(case, stack)
        run_epoch(plain, case)
        kept = [i % case.n for i in orders[0] if i not in set(plain.stats.skipped) | set(plain.stats.dropped)]
        results = list(guarded(adaptive.run(loader, step), 4 * bound(case), "adaptive.run"))
    # invariant: every item of the mixture's epoch is run once, those skipped or dropped aside
    assert results == processed
    assert sorted(flat(processed)) == sorted(kept)


@settings(max_examples=examples(3))
@given(case=mix_cases(kinds=("dicts",), world_sizes=(1, 2)))
def test_worker_processes_prefetch_and_data_loader_are_the_loop_in_process(case: MixCase) -> None:
    with ExitStack() as stack:
        if not resumable(case, stack):
            return
        plain = [make_loader(case, stack, rank, prefetch=0) for rank in range(case.world_size)]
        expected = [[run_epoch(loader, case) for _ in range(2)] for loader in plain]
        workers = [make_loader(case, stack, rank, num_workers=2, prefetch=2) for rank in range(case.world_size)]
        for loader in workers:
            stack.callback(loader.close)
        # invariant: worker processes and a thread ahead give the in-process batches, epoch after epoch
        assert [[run_epoch(loader, case) for _ in range(2)] for loader in workers] == expected
        planned = [make_loader(case, stack, rank).data_loader() for rank in range(case.world_size)]
        got = []
        for loader in planned:
            epochs = []
            for number in range(2):
                loader.batch_sampler.set_epoch(number)
                epochs.append([content(batch) for batch in loader])
            got.append(epochs)
        # invariant: data_loader() gives the same batches (as their items)
        assert got == [[[[i % case.n for i in b] for b in batches] for batches in epochs] for epochs in expected]


@pytest.mark.slow
@settings(max_examples=examples(20))
@given(case=mix_cases(kinds=("dicts",), world_sizes=(1, 2)))
def test_worker_processes_more_cases(case: MixCase) -> None:
    test_worker_processes_prefetch_and_data_loader_are_the_loop_in_process.hypothesis.inner_test(case)  # type: ignore[attr-defined]


def source_of(case: MixCase, mixture_id: int) -> int:
    """The source (its number) of a mixture's id."""
    item = mixture_id % case.n
    return max(s for s, first in enumerate(case.offsets) if first <= item)


@pytest.mark.parametrize("stop", ["first", "last", {"items": 5}])
def test_a_pickled_loader_over_a_mixture_gives_the_same_batches(stop: object) -> None:
    sources = {"a": torch.arange(7), "b": torch.arange(100, 104)}
    mix = Mixture(sources, weights={"a": 2, "b": 1}, stop=stop)
    sizes = {"a": np.arange(1, 8), "b": np.full(4, 3)}
    for loader in (FastSizeAwareLoader(mix, sizeof=sizes, max_total_size=8, seed=1), FastLoader(mix, 3, seed=1)):
        copy = pickle.loads(pickle.dumps(loader))
        for epoch in range(3):
            loader.set_epoch(epoch)
            copy.set_epoch(epoch)
            assert [b.tolist() for b in copy] == [b.tolist() for b in loader]


def test_weights_given_anew_at_a_resume_are_said_to_apply_from_the_next_epoch():
    sources = {"a": torch.arange(6), "b": torch.arange(100, 104)}
    loader = FastLoader(Mixture(sources, {"a": 1, "b": 1}, stop="last"), batch_size=2, seed=0)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    same = FastLoader(Mixture(sources, {"a": 1, "b": 1}, stop="last"), batch_size=2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.load_state_dict(state)  # (the weights it was saved with: nothing to say)
    reweighted = FastLoader(Mixture(sources, {"a": 3, "b": 1}, stop="last"), batch_size=2, seed=0)
    with pytest.warns(UserWarning, match=r"epoch 0, which it resumes, keeps .* apply from epoch 1 on"):
        reweighted.load_state_dict(state)
