"""Differential properties of shape buckets: ``FastSizeAwareLoader(buckets=...)`` against a plain loop.

Each property builds loaders from a generated :class:`BucketCase` (bucket lengths given, chosen
or from a table, budgets with a fixed cost, item caps and multiples, oversize items, filled or
kept last batches, shuffle groups, ranks) and compares what they yield with
:func:`tests.reference.bucket_loop`. A sample's content is its own index, so every batch is also
checked for corruption, and its ``sample_mask`` against the repeats of its indices.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, PadCollator, adaptive
from fastsab.plan.shape_buckets import ShapeBuckets
from tests.reference import bucket_loop, largest_batch
from tests.test_differential import Options, examples, flat

pytestmark = pytest.mark.filterwarnings("ignore:.*longer than the longest bucket:UserWarning")


@dataclass(frozen=True)
class BucketCase(Options):
    """One loader with shape buckets, with what the reference loop needs."""

    lengths: tuple[int, ...]
    spec: str  # "count" (buckets=K), "lengths" (bucket lengths and a budget) or "table" (batch sizes given)
    count: int
    bucket_lengths: tuple[int, ...]
    table_sizes: tuple[int, ...]
    cap: int
    fixed: int
    max_batch_size: int | None
    multiple: int
    partial: str
    oversize: str
    dataset: str  # "dicts" (PadCollator batches) or "tensor" (a tensor of indices: partial="keep")

    @property
    def n(self) -> int:
        return len(self.lengths)


@st.composite
def bucket_cases(draw: Any, world_sizes: Sequence[int] = (1,), max_n: int = 200) -> BucketCase:
    lengths = tuple(draw(st.lists(st.integers(0, 60), max_size=max_n)))
    spec = draw(st.sampled_from(["count", "lengths", "table"]))
    ladder = tuple(sorted(draw(st.sets(st.integers(1, 70), min_size=1, max_size=5))))
    dataset = draw(st.sampled_from(["dicts", "dicts", "tensor"]))
    return BucketCase(
        lengths=lengths,
        spec=spec,
        count=draw(st.integers(1, 5)),
        bucket_lengths=ladder,
        table_sizes=tuple(draw(st.integers(1, 9)) for _ in ladder),
        cap=draw(st.integers(70, 400)),
        fixed=draw(st.sampled_from([0, 0, 5])),
        max_batch_size=draw(st.one_of(st.none(), st.integers(1, 12))),
        multiple=draw(st.sampled_from([1, 1, 2, 3])),
        partial="keep" if dataset == "tensor" else draw(st.sampled_from(["fill", "fill", "keep"])),
        oversize=draw(st.sampled_from(["skip", "own_batch"])),
        dataset=dataset,
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        group_size=draw(st.one_of(st.none(), st.integers(1, 40))),
        prefetch=draw(st.sampled_from([None, 0, 2])),
        world_size=draw(st.sampled_from(world_sizes)),
        even_batches=draw(st.sampled_from(["pad", "drop"])),
    )


class Samples:
    """Sample ``i`` is ``{"x": i, "input_ids": [i] * lengths[i]}``, fetched with ``__getitems__``."""

    def __init__(self, lengths: Sequence[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"x": i, "input_ids": torch.full((self.lengths[i],), i)} for i in indices]


def make_loader(case: BucketCase, rank: int = 0, world_size: int | None = None, **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "shuffle": case.shuffle,
        "seed": case.seed,
        "group_size": case.group_size,
        "prefetch": case.prefetch,
        "rank": rank,
        "world_size": case.world_size if world_size is None else world_size,
        "even_batches": case.even_batches,
        "oversize": case.oversize,
        "partial": case.partial,
    }
    if case.dataset == "dicts":
        dataset: Any = Samples(case.lengths)
        options["collate_fn"] = PadCollator(pad_value=-1)
    else:
        dataset = torch.arange(case.n)
    if case.spec == "table":
        options["buckets"] = ShapeBuckets(case.bucket_lengths, case.table_sizes)
    else:
        options["buckets"] = case.count if case.spec == "count" else list(case.bucket_lengths)
        options |= {
            "max_total_size": case.cap,
            "fixed_cost": case.fixed,
            "max_batch_size": case.max_batch_size,
            "batch_size_multiple": case.multiple,
        }
    lengths = np.asarray(case.lengths, dtype=np.int64)
    return FastSizeAwareLoader(dataset, lengths, **(options | overrides))


def expected_sizes(case: BucketCase, ladder: Sequence[int]) -> list[int]:
    if case.spec == "table":
        return list(case.table_sizes)
    # (no batch holds more rows than the dataset has items)
    rows = max(case.n, 1) if case.max_batch_size is None else min(case.max_batch_size, max(case.n, 1))
    return [largest_batch(case.cap, case.fixed, length, rows, case.multiple) for length in ladder]


def valid(case: BucketCase) -> bool:
    """Whether the case's buckets hold a row under its budget (else the loader refuses it: tested elsewhere)."""
    if case.spec == "lengths":
        return case.fixed + case.bucket_lengths[-1] <= case.cap
    if case.spec == "count":
        return any(case.fixed + max(length, 1) <= case.cap for length in case.lengths)
    return True


def read(batch: Any, case: BucketCase) -> list[int]:
    """A batch's indices, every row (fillers too), checking its content and mask."""
    if case.dataset == "tensor":
        return batch.tolist()  # type: ignore[no-any-return]
    ids = batch["x"].tolist()
    rows = batch["input_ids"]
    for row, index in zip(rows.tolist(), ids):
        # invariant: a row holds its own sample: its length of its index, then padding
        assert row == [index] * case.lengths[index] + [-1] * (rows.shape[1] - case.lengths[index])
    if case.partial == "fill":
        first = [index not in ids[:j] for j, index in enumerate(ids)]
        # invariant: the mask is True exactly on the first place of each index (fillers repeat)
        assert batch["sample_mask"].tolist() == first
        assert first == sorted(first, reverse=True), "filler rows come after the real ones"
    return ids  # type: ignore[no-any-return]


def run_epoch(loader: Any, case: BucketCase, steps: int | None = None) -> list[list[int]]:
    batches = []
    for batch in loader:
        batches.append(read(batch, case))
        if steps is not None and len(batches) == steps:
            break
        assert len(batches) <= 10 * case.n + 10, "the epoch does not end"
    return batches


def real(batches: Sequence[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in dict.fromkeys(batch)]


def epoch_groups(loader: Any, epoch: int) -> list[list[int]]:
    return [group.tolist() for group in loader.order.chunks(epoch)]


@settings(max_examples=examples(120), deadline=None)
@given(case=bucket_cases(), epoch=st.integers(0, 2))
def test_an_epoch_is_the_plain_loop_chunk_by_chunk(case: BucketCase, epoch: int) -> None:
    if not valid(case):
        return
    loader = make_loader(case)
    ladder = loader.buckets.lengths
    sizes = expected_sizes(case, ladder)
    # invariant: each bucket's batch size is the largest its budget holds (or the table's)
    assert list(loader.buckets.batch_sizes) == sizes
    loader.set_epoch(epoch)
    batches = run_epoch(loader, case)
    chunks, skipped = bucket_loop(
        epoch_groups(loader, epoch), case.lengths, ladder, sizes, partial=case.partial, oversize=case.oversize
    )
    position = 0
    for chunk in chunks:
        got = batches[position : position + len(chunk)]
        # invariant: the batches of each planned chunk are the plain loop's, in bucket order
        # unshuffled, in some order shuffled
        assert (got == chunk) if not case.shuffle else (sorted(got) == sorted(chunk)), (position, chunk, got)
        position += len(chunk)
    assert position == len(batches)
    # invariant: every item once, but those skipped (reported); len() is exact
    assert sorted(real(batches)) == sorted(set(range(case.n)) - set(skipped))
    assert sorted(loader.stats.skipped) == sorted(skipped)
    assert len(loader) == len(batches) == loader.stats.num_batches
    assert loader.stats.num_items == len(real(batches))
    fillers = sum(len(batch) - len(set(batch)) for batch in batches)
    assert loader.stats.num_filler_rows == (fillers if batches else None)
    shapes = set()
    for batch in batches:
        longest = max(case.lengths[i] for i in batch)
        bucket = next((k for k, length in enumerate(ladder) if longest <= length), None)
        if bucket is None:  # an oversize item's own batch
            assert case.oversize == "own_batch" and len(batch) == 1
            continue
        shapes.add((len(batch), ladder[bucket]))
        if case.partial == "fill" or len(batch) == len(set(batch)) == sizes[bucket]:
            assert len(batch) == sizes[bucket]
        if case.spec != "table":
            # invariant: no batch's padded shape exceeds the budget
            assert case.fixed + len(batch) * ladder[bucket] <= case.cap
    # invariant: at most K shapes (K more, the kept last batches, with partial="keep")
    assert len(shapes) <= len(ladder) * (1 if case.partial == "fill" else 2)
    real_tokens = sum(case.lengths[i] for i in real(batches))
    assert loader.stats.real_tokens == (real_tokens if batches else None)


@settings(max_examples=examples(60), deadline=None)
@given(case=bucket_cases(world_sizes=(2, 3)))
def test_ranks_share_the_single_process_batches(case: BucketCase) -> None:
    if not valid(case):
        return
    single = run_epoch(make_loader(case, 0, 1), case)
    ranks = [make_loader(case, rank) for rank in range(case.world_size)]
    per_rank = [run_epoch(loader, case) for loader in ranks]
    # invariant: every rank runs the same number of steps, as len() says
    assert len({len(batches) for batches in per_rank}) == 1
    assert [len(loader) for loader in ranks] == [len(per_rank[0])] * case.world_size
    together = Counter(tuple(batch) for batches in per_rank for batch in batches)
    planned = Counter(tuple(batch) for batch in single)
    dropped = flat([loader.stats.dropped for loader in ranks[:1]])
    padded = flat([loader.stats.padded for loader in ranks])
    if case.even_batches == "drop":
        # invariant: the ranks' batches are the single process's, but the surplus ones dropped
        assert not together - planned
        assert sorted(real(list((planned - together).elements()))) == sorted(dropped)
    else:
        # invariant: the ranks' batches are the single process's, and repeats to even the steps
        assert not planned - together
        assert sorted(real(list((together - planned).elements()))) == sorted(padded)


def resume_point(total: int, data: Any) -> int:
    return data.draw(st.integers(0, total), label="steps")


@settings(max_examples=examples(60), deadline=None)
@given(case=bucket_cases(world_sizes=(1, 2, 3)), other=st.sampled_from([1, 2, 3]), data=st.data())
def test_resume_at_any_step_also_on_another_world_size(case: BucketCase, other: int, data: Any) -> None:
    if not valid(case):
        return
    full = [run_epoch(make_loader(case, rank), case) for rank in range(case.world_size)]
    steps = resume_point(len(full[0]), data)
    ranks = [make_loader(case, rank) for rank in range(case.world_size)]
    for loader, batches in zip(ranks, full):
        assert run_epoch(loader, case, steps) == batches[:steps] if steps else True
    states = [json.loads(json.dumps(loader.state_dict())) for loader in ranks]
    assert all(state == states[0] for state in states)
    if 0 < steps < len(full[0]):
        fresh = [make_loader(case, rank) for rank in range(case.world_size)]
        for loader in fresh:
            loader.load_state_dict(states[0])
        # invariant: a fresh loader loading the state yields exactly the remaining batches
        assert [run_epoch(loader, case) for loader in fresh] == [batches[steps:] for batches in full]
    if not 0 < steps < len(full[0]):
        return
    moved = [make_loader(case, rank, other) for rank in range(other)]
    for loader in moved:
        loader.load_state_dict(states[0])
    rest = [run_epoch(loader, case) for loader in moved]
    # invariant: resumed on another world size, the ranks run equal steps and the epoch's items
    # not yet run are each run once (besides the repeats that even the ranks' steps)
    assert len({len(batches) for batches in rest}) == 1
    before = Counter(real([batch for batches in full for batch in batches[:steps]]))
    after = Counter(real([batch for batches in rest for batch in batches]))
    repeats = Counter(flat([loader.stats.padded for loader in moved + ranks]))
    dropped = set(flat([loader.stats.dropped for loader in moved + ranks]))
    skipped = set(moved[0].stats.skipped)
    # NOTE: the stats of a stretch report the whole epoch's repeats (also those another stretch ran)
    assert all(count - 1 <= repeats[item] for item, count in (before + after).items())
    assert set(before + after) | dropped | skipped == set(range(case.n))


@settings(max_examples=examples(60), deadline=None)
@given(case=bucket_cases(), data=st.data())
def test_a_lowered_bucket_size_applies_from_the_next_batch_and_resumes(case: BucketCase, data: Any) -> None:
    if not valid(case):
        return
    full = run_epoch(make_loader(case), case)
    if not full:
        return
    at = data.draw(st.integers(1, len(full)), label="lowered after")
    loader = make_loader(case)
    configured = list(loader.buckets.batch_sizes)
    lowered = [data.draw(st.integers(1, size), label=f"bucket {k}") for k, size in enumerate(configured)]
    iterator = iter(loader)
    batches = [read(next(iterator), case) for _ in range(at)]
    loader.lower_limit(lowered)
    state_steps = data.draw(st.integers(at, at + 5), label="saved after")
    after: list[list[int]] = []
    state = None
    for batch in iterator:
        after.append(read(batch, case))
        if at + len(after) == state_steps:
            state = json.loads(json.dumps(loader.state_dict()))
        assert len(after) <= 10 * case.n + 10
    # invariant: the batches before the lowering are the uninterrupted run's
    assert batches == full[:at]
    ladder = loader.buckets.lengths
    for batch in after:
        longest = max(case.lengths[i] for i in batch)
        bucket = next((k for k, length in enumerate(ladder) if longest <= length), None)
        if bucket is not None:
            # invariant: from the next batch on, every bucket's batches hold at most its lowered size
            assert len(batch) <= lowered[bucket]
            assert case.partial == "keep" or len(batch) == lowered[bucket]
    # invariant: every item once in the epoch, lowering or not
    assert Counter(real(batches + after)) == Counter(real(full))
    if state is not None and state_steps < at + len(after):  # (a state at the epoch's end starts the next)
        fresh = make_loader(case)
        fresh.load_state_dict(state)
        # invariant: a state saved after a lowering resumes with the lowered batches
        assert run_epoch(fresh, case) == after[state_steps - at :]


@settings(max_examples=examples(40), deadline=None)
@given(case=bucket_cases(), rows=st.integers(1, 6))
def test_adaptive_run_shrinks_a_failing_bucket_and_runs_every_item_once(case: BucketCase, rows: int) -> None:
    if not valid(case) or case.dataset == "tensor":
        return
    loader = make_loader(case, oversize="skip")
    done: list[int] = []

    def step(batch: Any) -> None:
        if len(batch["x"]) > rows:
            raise torch.OutOfMemoryError("CUDA out of memory (a test step that holds few rows)")
        done.extend(batch["x"][batch["sample_mask"]].tolist() if case.partial == "fill" else batch["x"].tolist())

    for _ in adaptive.run(loader, step):
        pass
    # invariant: every item the epoch holds ran once, in batches of at most the rows that fit
    expected = sorted(set(range(case.n)) - set(loader.stats.skipped))
    assert sorted(done) == expected


@settings(max_examples=examples(10), deadline=None)
@given(case=bucket_cases(max_n=120))
def test_worker_processes_make_the_same_batches(case: BucketCase) -> None:
    if not valid(case) or case.dataset == "tensor":
        return
    here = run_epoch(make_loader(case), case)
    workers = make_loader(case, num_workers=2, prefetch=None)
    try:
        assert run_epoch(workers, case) == here
    finally:
        workers.close()
