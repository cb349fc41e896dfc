"""``adaptive.run`` resumed from a state taken after any of its results, against the run left alone.

A fake step runs out of memory (``torch.OutOfMemoryError``) on chosen batches, decided by their
content alone, so that a resumed run meets the same failures as the uninterrupted one.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastLoader, FastSizeAwareLoader, adaptive
from tests.test_differential import examples

pytestmark = pytest.mark.filterwarnings("ignore:.*longer than the longest bucket:UserWarning")


@pytest.fixture(autouse=True)
def no_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip the garbage collection after each fake out-of-memory error (0.1 s each, not checked here)."""
    monkeypatch.setattr(adaptive.loop, "free_memory", lambda error: None)


@dataclass(frozen=True)
class Case:
    """A loader, and the batches its step cannot hold."""

    kind: str  # "fixed", "sized", "zero" (sizes of 0: no cap splits a batch) or "buckets"
    n: int
    batch_size: int
    drop_last: bool
    partial: str
    lengths: tuple[int, ...]
    shuffle: bool
    seed: int
    rows: int  # a step holds at most this many rows
    heavy: frozenset[int]  # items a step holds only alone

    def loader(self, rank: int = 0, world_size: int = 1) -> Any:
        ranks: dict[str, Any] = {"rank": rank, "world_size": world_size} if world_size > 1 else {}
        common = {"shuffle": self.shuffle, "seed": self.seed, **ranks}
        data = {"x": torch.arange(self.n)}
        if self.kind == "fixed":
            return FastLoader(data, self.batch_size, drop_last=self.drop_last, **common)
        if self.kind == "zero":
            return FastSizeAwareLoader(data, np.zeros(self.n, dtype=np.int64), 0, **common)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        if self.kind == "sized":
            return FastSizeAwareLoader(data, lengths, 6 * max(self.lengths), **common)
        buckets = sorted({max(max(self.lengths) // 2, 1), max(self.lengths)})
        return FastSizeAwareLoader(
            data, lengths, 6 * max(self.lengths), buckets=buckets, partial=self.partial, **common
        )

    def step(self, batch: dict[str, torch.Tensor]) -> list[int]:
        """The batch's real items, or a fake out-of-memory error on a batch the step cannot hold."""
        rows = batch["x"].tolist()
        if len(rows) > self.rows or (len(rows) > 1 and self.heavy.intersection(rows)):
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        mask = batch.get("sample_mask")
        return rows if mask is None else batch["x"][mask].tolist()


KINDS = ["fixed", "sized", "zero", "buckets"]


@st.composite
def cases(draw: Any, kind: str) -> Case:
    n = draw(st.integers(1, 30))
    return Case(
        kind=kind,
        n=n,
        batch_size=draw(st.integers(1, 8)),
        drop_last=draw(st.booleans()),
        partial=draw(st.sampled_from(["keep", "fill"])),
        lengths=tuple(draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        rows=draw(st.integers(1, 6)),
        heavy=frozenset(draw(st.sets(st.integers(0, n - 1), max_size=3))),
    )


def run(loader: Any, step: Callable[[Any], list[int]]) -> Iterator[tuple[list[int], int]]:
    """``adaptive.run``'s results, each with the parts of its step still to run after it."""
    for result in adaptive.run(loader, step):
        yield result, loader.parts_left


def saved(loader: Any) -> dict[str, Any]:
    """``loader.state_dict()`` as it comes back from a JSON checkpoint."""
    return json.loads(json.dumps(loader.state_dict()))  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_a_state_after_any_result_resumes_with_exactly_the_results_not_run(kind: str, data: Any) -> None:
    case = data.draw(cases(kind))
    alone = case.loader()
    whole = list(run(alone, case.step))
    trained = [i for result, _ in whole for i in result]
    # invariant: every sample of the epoch is trained once (those drop_last leaves out excepted)
    assert Counter(trained) + Counter(alone.stats.dropped) == Counter(range(case.n))
    # invariant: stats count the loader's steps: every result, but the parts of a step split within it once
    assert alone.stats.num_batches == sum(1 for _, parts_left in whole if parts_left == 0)
    for k in range(1, len(whole)):  # (a state after the last result starts the next epoch)
        loader = case.loader()
        results = run(loader, case.step)
        for _ in range(k):
            next(results)
        if loader.parts_left:
            # invariant: on one process, only a batch no lower limit splits (it costs nothing) is
            # split within its step; no state between its parts resumes exactly: it is refused
            assert case.kind == "zero"
            with pytest.raises(RuntimeError, match="between the parts of a split step"):
                loader.state_dict()
            continue
        state = saved(loader)
        resumed = case.loader()
        resumed.load_state_dict(state)
        # invariant: the resumed run trains exactly the results not run yet, as the run left alone did
        assert list(run(resumed, case.step)) == whole[k:], k


def test_a_short_last_batch_of_a_bucket_kept_short_is_split_into_steps_of_the_loader() -> None:
    # one bucket of batch size 6: [0..5] and the short [6, 7], which runs out of memory; halving
    # the bucket's size (3) would leave it whole, to be split within its step
    make = lambda: FastSizeAwareLoader(  # noqa: E731
        {"x": torch.arange(8)}, np.full(8, 10), 60, buckets=[10], partial="keep", shuffle=False
    )
    step = Case("buckets", 8, 6, False, "keep", (10,) * 8, False, 0, rows=6, heavy=frozenset({6})).step
    loader = make()
    whole, states = [], []
    for result, parts_left in run(loader, step):
        whole.append(result)
        assert parts_left == 0
        states.append(saved(loader))
    assert whole == [[0, 1, 2, 3, 4, 5], [6], [7]]
    # the lowering is recorded, and stats count the loader's steps: the two parts, not the failed batch
    assert loader.stats.limit_changes == [(1, [6], [1])]
    assert (loader.stats.num_batches, loader.stats.num_splits) == (3, 1)
    resumed = make()
    resumed.load_state_dict(states[1])  # after [6]
    assert [result for result, _ in run(resumed, step)] == [[7]]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=examples(10), deadline=None)
@given(data=st.data(), world_size=st.sampled_from([2, 3]))
def test_under_ranks_a_state_resumes_at_the_start_of_a_step_left_between_its_parts(
    kind: str, data: Any, world_size: int
) -> None:
    case = data.draw(cases(kind))

    # a loop that updates the model when loader.parts_left is 0: its commits are the steps' items
    def committed_run(loader: Any, committed: list[int]) -> Iterator[int]:
        accumulated: list[int] = []
        for result, parts_left in run(loader, case.step):
            accumulated += result
            if parts_left == 0:
                committed += accumulated
                accumulated.clear()
            yield parts_left

    steps = []
    for rank in range(world_size):
        full: list[int] = []
        rank_steps = sum(1 for parts_left in committed_run(case.loader(rank, world_size), full) if parts_left == 0)
        steps.append(rank_steps)
        results = sum(1 for _ in committed_run(case.loader(rank, world_size), []))
        for k in range(1, results):
            committed: list[int] = []
            loader = case.loader(rank, world_size)
            running = committed_run(loader, committed)
            for _ in range(k):
                next(running)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (between the parts of a step: it resumes at its start)
                state = saved(loader)
            resumed = case.loader(rank, world_size)
            resumed.load_state_dict(state)
            for _ in committed_run(resumed, committed):
                pass
            # invariant: each item of the rank's share is committed exactly once
            assert Counter(committed) == Counter(full), (rank, k)
    # invariant: every rank runs the same number of loader steps
    assert len(set(steps)) == 1
