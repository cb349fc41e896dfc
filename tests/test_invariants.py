"""Invariants every loader and sampler keeps, each checked over all of them.

The subjects (:mod:`tests.invariants_factories`) are the fast loaders, their
``batch_sampler()`` and ``data_loader()``, the bionemo-compatible samplers and generator, and
the Lightning and WebDataset integrations. Each test is parametrized over every subject; where
an invariant does not apply to one, the test is skipped with the reason. Hypothesis draws the
sizes (zero, equal, huge, one item, none), the caps and the options.

``tests/test_differential.py`` checks the loaders' batches against the plain loops of
``tests/reference.py``; the properties here are those any batcher must keep, whatever its
batches.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.invariants_factories import MAX_N, Inputs, LoaderSubject, Report, Subject, applicable, flat, inputs
from tests.reference import batch_cost

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*max_total_size:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*outside the buckets:UserWarning"),
]

# NOTE: a few examples per subject keep the file under a minute on two busy cores; the
# deadline catches a batcher that slows down by orders of magnitude (a hang is caught by
# pytest-timeout).
FEW = settings(
    max_examples=8,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.differing_executors],
)


# -- helpers --------------------------------------------------------------------------------------


def run(subject: Subject, obj: Any, steps: int | None = None) -> list[list[int]]:
    """The next epoch of ``obj`` (or its first ``steps`` batches), bounded so that it cannot run forever."""
    batches: list[list[int]] = []
    source = subject.iterate(obj)
    try:
        for batch in source:
            batches.append(batch)
            assert len(batches) <= 2 * MAX_N + 4, "the epoch did not end"
            if steps is not None and len(batches) == steps:
                break
    finally:
        source.close()  # type: ignore[attr-defined]  # (as leaving a for loop early drops the iterator)
    return batches


def run_ranks(subject: Subject, ranks: list[Any], epoch: int | None = None) -> list[list[list[int]]]:
    """One epoch of every rank (after ``set_epoch(epoch)`` if given)."""
    if epoch is not None:
        for obj in ranks:
            subject.set_epoch(obj, epoch)
    return [run(subject, obj) for obj in ranks]


def epoch_report(subject: Subject, ranks: list[Any]) -> Report:
    """The epoch's report over all ranks: the skipped and dropped items (every rank reports the
    same epoch-wide lists), and the repeats every rank yields."""
    reports = [subject.report(obj) for obj in ranks]
    for report in reports[1:]:
        # invariant: every rank reports the same epoch-wide skipped and dropped items
        assert sorted(report.skipped) == sorted(reports[0].skipped)
        assert sorted(report.dropped) == sorted(reports[0].dropped)
    return Report(reports[0].skipped, reports[0].dropped, [i for r in reports for i in r.padded])


def check_exactly_once(n: int, batches: list[list[int]], report: Report) -> None:
    """Every index exactly once, but the reported skipped or dropped ones, plus the reported repeats."""
    expected = Counter(range(n))
    expected.subtract(Counter(report.skipped) + Counter(report.dropped))
    expected.update(Counter(report.padded))
    seen = Counter(flat(batches))
    # invariant: nothing is reported left out twice, or left out and yielded
    assert min(expected.values(), default=0) >= 0, f"reported twice: {report}"
    expected = +expected
    assert seen == expected, (
        f"lost {sorted((expected - seen).elements())}, extra {sorted((seen - expected).elements())}"
    )


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """A state as a checkpoint stores it: plain JSON."""
    return json.loads(json.dumps(state))


def saved_after(subject: Subject, inp: Inputs, steps: int, world: int | None = None) -> dict[str, Any]:
    """The state every rank saves after ``steps`` batches of the drawn epoch (they must agree)."""
    ranks = subject.ranks(inp, world)
    states = []
    for obj in ranks:
        subject.set_epoch(obj, inp.epoch)
        source = subject.iterate(obj)
        done = [next(source) for _ in range(steps)]
        assert len(done) == steps
        states.append(subject.state_dict(obj))
        source.close()  # type: ignore[attr-defined]
    # invariant: all ranks save the same state after the same steps
    assert all(state == states[0] for state in states), states
    return round_trip(states[0])


#: The edge cases every property runs besides the drawn ones: no item, and one item above a cap of 0.
EMPTY = Inputs(sizes=(), drop_last=True, world_size=2)
ONE = Inputs(sizes=(3,), world_size=3, oversize="own_batch")


def on_drawn_inputs(test: Callable[[Subject, Inputs], None]) -> Callable[..., None]:
    """``test(subject, inp)`` as a property of drawn inputs that also runs :data:`EMPTY` and :data:`ONE`."""
    return FEW(given(inp=inputs())(example(inp=EMPTY)(example(inp=ONE)(test))))  # type: ignore[no-any-return]


def epoch_of(subject: Subject, inp: Inputs) -> int | None:
    """The drawn epoch, for a subject that chooses its epoch (else ``None``: its next pass)."""
    return inp.epoch if "epochs" not in subject.lacks else None


# -- the invariants -------------------------------------------------------------------------------


@pytest.mark.parametrize("subject", applicable())
@on_drawn_inputs
def test_every_index_exactly_once(subject: Subject, inp: Inputs) -> None:
    assume(subject.accepts(inp))
    ranks = subject.ranks(inp)
    for epoch in (inp.epoch, inp.epoch + 1):
        batches = run_ranks(subject, ranks, epoch if "epochs" not in subject.lacks else None)
        # invariant: no batch is empty
        assert all(batch for rank in batches for batch in rank), "an empty batch"
        # invariant: all ranks run the same number of steps
        assert len({len(rank) for rank in batches}) == 1, [len(rank) for rank in batches]
        # invariant: over the ranks, an epoch yields every index once, but what it reports
        # skipped or dropped, plus what it reports padded
        check_exactly_once(inp.n, flat(batches), epoch_report(subject, ranks))


@pytest.mark.parametrize("subject", applicable("length"))
@FEW
@given(inp=inputs(), other=st.integers(0, 5))
def test_len_is_the_number_of_batches(subject: Subject, inp: Inputs, other: int) -> None:
    assume(subject.accepts(inp))
    ranks = subject.ranks(inp)
    for epoch in (inp.epoch, other):
        if "epochs" not in subject.lacks:
            for obj in ranks:
                subject.set_epoch(obj, epoch)
        announced = [subject.length(obj) for obj in ranks]
        # invariant: len() before an epoch (after set_epoch too) is the number of batches it yields, per rank
        assert announced == [len(batches) for batches in run_ranks(subject, ranks)]
    # invariant: without set_epoch, len() announces the next epoch (or pass)
    announced = [subject.length(obj) for obj in ranks]
    assert announced == [len(batches) for batches in run_ranks(subject, ranks)]


@pytest.mark.parametrize("subject", applicable())
@on_drawn_inputs
def test_same_seed_and_epoch_same_batches(subject: Subject, inp: Inputs) -> None:
    assume(subject.accepts(inp))
    first, second = subject.ranks(inp), subject.ranks(inp)
    epochs = "epochs" not in subject.lacks
    one = run_ranks(subject, first, epoch_of(subject, inp))
    # invariant: the same configuration (seed) and epoch give the same batches
    assert run_ranks(subject, second, epoch_of(subject, inp)) == one
    following = run_ranks(subject, first)
    # invariant: the next epoch (or pass) is the same on both (that each epoch holds every
    # item once is test_every_index_exactly_once)
    assert run_ranks(subject, second) == following
    if not inp.shuffle:
        # invariant: without shuffling every epoch plans the same batches (balancing may deal
        # them to other ranks)
        assert sorted(flat(following)) == sorted(flat(one))
    if epochs:
        # invariant: set_epoch chooses the epoch, whatever ran before
        assert run_ranks(subject, first, inp.epoch) == one


#: 64 items of size 1: the chance that two shuffled epochs agree is negligible.
MANY = Inputs(sizes=(1,) * 64, cap=4, batch_size=4, seed=1, group_size=16, world_size=2)


@pytest.mark.parametrize("subject", applicable())
def test_another_epoch_another_order_same_items(subject: Subject) -> None:
    ranks = subject.ranks(MANY)
    epochs = "epochs" not in subject.lacks
    one = run_ranks(subject, ranks, 0 if epochs else None)
    two = run_ranks(subject, ranks, 1 if epochs else None)
    # invariant: another epoch (or pass) holds the same items ...
    assert sorted(flat(flat(one))) == sorted(flat(flat(two))) == list(range(64))
    # ... in another order when shuffled (a stream keeps the order it is given)
    assert (flat(flat(one)) != flat(flat(two))) == subject.shuffles


@pytest.mark.parametrize("subject", applicable("pickle"))
@on_drawn_inputs
def test_pickled_copy_yields_the_same_batches(subject: Subject, inp: Inputs) -> None:
    assume(subject.accepts(inp))
    ranks = subject.ranks(inp)
    copies = [pickle.loads(pickle.dumps(obj)) for obj in ranks]
    # invariant: a pickled copy yields the same batches as the original, epoch after epoch
    expected = run_ranks(subject, ranks, epoch_of(subject, inp))
    assert run_ranks(subject, copies, epoch_of(subject, inp)) == expected
    assert run_ranks(subject, copies) == run_ranks(subject, ranks)
    if "state" in subject.lacks:
        # invariant: so does a copy pickled between passes (for the loaders, see
        # test_pickled_after_iterating_keeps_the_position)
        copies = [pickle.loads(pickle.dumps(obj)) for obj in ranks]
        assert run_ranks(subject, copies) == run_ranks(subject, ranks)


PICKLE_AFTER_ITERATING = (
    "EpochCursor keeps the last epoch's stream (a generator) in self._run once an epoch has started, also after "
    "it ended, and neither the loaders' __getstate__ nor EpochCursor drop it: pickle.dumps (and copy.deepcopy) "
    "of a FastLoader, FastSizeAwareLoader, batch_sampler(), data_loader() or FastDataModule that has iterated "
    "raises TypeError: cannot pickle 'generator' object"
)


@pytest.mark.parametrize("subject", applicable("state"))
@FEW
@given(inp=inputs(), data=st.data())
def test_pickled_after_iterating_keeps_the_position(subject: Subject, inp: Inputs, data: Any) -> None:
    assume(subject.accepts(inp))
    total = len(run_ranks(subject, subject.ranks(inp), inp.epoch)[0])
    steps = data.draw(st.integers(0, total), label="steps")
    ranks = subject.ranks(inp)
    for obj in ranks:
        subject.set_epoch(obj, inp.epoch)
        run(subject, obj, steps if steps < total else None)
    copies = [pickle.loads(pickle.dumps(obj)) for obj in ranks]
    # invariant: a copy pickled mid-epoch or after an epoch has the original's position ...
    assert [subject.state_dict(obj) for obj in copies] == [subject.state_dict(obj) for obj in ranks]
    # ... and goes on with the same batches
    assert run_ranks(subject, copies) == run_ranks(subject, ranks)


@pytest.mark.parametrize("subject", applicable("state"))
@on_drawn_inputs
def test_state_restores_exactly_the_rest(subject: Subject, inp: Inputs) -> None:
    assume(subject.accepts(inp))
    whole = subject.ranks(inp)
    full = run_ranks(subject, whole, inp.epoch)
    padded = epoch_report(subject, whole).padded
    total = len(full[0])
    for steps in range(total + 1):
        state = saved_after(subject, inp, steps)
        fresh = subject.ranks(inp)
        for obj in fresh:
            subject.load_state_dict(obj, state)
        announced = [subject.length(obj) for obj in fresh]
        rest = run_ranks(subject, fresh)
        if steps == total == 0:
            # invariant: a state saved before an epoch without batches began resumes that epoch: nothing
            assert rest == [[] for _ in fresh] and announced == [0] * len(fresh)
            continue
        if steps == total:
            # invariant: a state saved after the epoch's last batch starts the next epoch
            following = run_ranks(subject, subject.ranks(inp), inp.epoch + 1)
            assert rest == following and announced == [len(b) for b in following]
            continue
        # invariant: loaded into a fresh object, a state saved after k batches yields exactly the rest ...
        assert rest == [batches[steps:] for batches in full], f"resumed after {steps} of {total} batches"
        # ... and len() says how many
        assert announced == [subject.resumed_length(total, steps)] * len(fresh)
        # invariant: the resumed epoch reports what the epoch skips and drops, and the repeats
        # the epoch yields, as the uninterrupted one does, so nothing is lost across the resume
        report = epoch_report(subject, fresh)
        assert sorted(report.padded) == sorted(padded)
        check_exactly_once(inp.n, flat([b[:steps] for b in full] + rest), report)


#: Three items of size 0, one per batch, on two ranks: the second step of rank 1 repeats item 0.
#: Three items, one per batch, on two ranks: the second step of rank 1 repeats item 0.
PADDED = Inputs(sizes=(1, 1, 1), cap=1, shuffle=False, world_size=2)


def resume_once(subject: Subject, inp: Inputs, steps: int, world: int) -> tuple[Any, Report, Any, Report]:
    """The uninterrupted epoch and its report; the rest after a resume on ``world`` ranks, and its report."""
    whole = subject.ranks(inp)
    full = run_ranks(subject, whole, inp.epoch)
    state = saved_after(subject, inp, steps)
    fresh = subject.ranks(inp, world)
    for obj in fresh:
        subject.load_state_dict(obj, state)
    rest = run_ranks(subject, fresh)
    return full, epoch_report(subject, whole), rest, epoch_report(subject, fresh)


@pytest.mark.parametrize("subject", applicable("state"))
def test_padded_example_resumes_with_the_rest(subject: Subject) -> None:
    full, report, rest, _ = resume_once(subject, PADDED, 1, 2)
    # invariant: the uninterrupted epoch reports its repeat; the resumed one yields the rest
    assert full == [[[2], [1]], [[0], [0]]] and report.padded == [0]
    assert rest == [batches[1:] for batches in full]


@pytest.mark.parametrize("subject", applicable("state"))
def test_resumed_epoch_reports_its_padded_repeats(subject: Subject) -> None:
    _, _, _, resumed = resume_once(subject, PADDED, 1, 2)
    # invariant: a resumed epoch reports the repeats it yields, as an uninterrupted one does
    # (the yields are checked by test_padded_example_resumes_with_the_rest)
    assert resumed.padded == [0]


@pytest.mark.parametrize("subject", applicable("world_change"))
@FEW
@given(inp=inputs(), world=st.integers(1, 3), data=st.data())
def test_state_restores_on_another_world_size(subject: Subject, inp: Inputs, world: int, data: Any) -> None:
    assume(subject.accepts(inp))
    whole = subject.ranks(inp)
    total = len(run_ranks(subject, whole, inp.epoch)[0])
    skipped = epoch_report(subject, whole).skipped
    assume(total >= 1)
    steps = data.draw(st.integers(0, total - 1), label="steps")
    done = [run(subject, obj, steps) if steps else [] for obj in _at_epoch(subject, subject.ranks(inp), inp.epoch)]
    state = saved_after(subject, inp, steps)
    fresh = subject.ranks(inp, world)
    for obj in fresh:
        subject.load_state_dict(obj, state)
    announced = [subject.length(obj) for obj in fresh]
    rest = run_ranks(subject, fresh)
    # invariant: the new ranks run the same number of steps; len() announced them after the
    # steps run before the change, as a trainer that restores its step count counts them
    assert announced == [steps + len(batches) for batches in rest] and len(set(announced)) == 1
    # invariant: nothing lost: every index runs before or after the change, or is reported
    # skipped (the resumed epoch reports what the uninterrupted one does) or dropped (with
    # "drop", the new ranks' surplus too), never both
    yielded = flat(done) + flat(rest)
    report = epoch_report(subject, fresh)
    assert sorted(report.skipped) == sorted(skipped)
    left_out = set(report.skipped) | set(report.dropped)
    assert not left_out & set(flat(yielded)), f"reported left out but yielded: {sorted(left_out & set(flat(yielded)))}"
    assert left_out | set(flat(yielded)) == set(range(inp.n))
    # invariant: only whole batches repeat, to fill the last step ("pad") of the saved stretch's
    # dealing (its surplus slots go on with the rest) and of the new ranks' (that the repeats
    # are reported: test_resumed_epoch_reports_its_padded_repeats)
    distinct = {tuple(batch) for batch in yielded}
    assert len(flat(list(distinct))) == len(set(flat(list(distinct)))), "a repeat that is not a whole batch"
    fills = inp.world_size - 1 + world - 1 if inp.even_batches == "pad" else 0
    assert len(yielded) - len(distinct) <= fills


#: Item 1 is skipped; the first two batches use up the first shuffle group.
SKIPPING = Inputs(sizes=(0, 5, 1, 1, 1, 1), cap=1, shuffle=False, group_size=2)


def _sized_world_change_params() -> list[Any]:
    """The size-aware loaders and their views (a fixed-size epoch skips nothing)."""
    sized = [p for p in applicable("world_change") if isinstance(p.values[0], LoaderSubject)]
    return [p for p in sized if p.values[0].kind == "sized"]


@pytest.mark.parametrize("subject", _sized_world_change_params())
def test_skipping_example_resumes_with_the_rest(subject: Subject) -> None:
    full, report, rest, _ = resume_once(subject, SKIPPING, 2, 2)
    # invariant: the uninterrupted epoch reports item 1 skipped; the resumed one runs the rest
    # (a batch may repeat to fill the last step of the two ranks)
    assert report.skipped == [1]
    assert set(flat(flat(rest))) == set(flat(full[0][2:]))


@pytest.mark.parametrize("subject", _sized_world_change_params())
def test_resume_on_another_world_size_reports_the_skipped(subject: Subject) -> None:
    _, _, _, resumed = resume_once(subject, SKIPPING, 2, 2)
    # invariant: a resumed epoch reports the items the epoch skips, whatever the world size
    # (the yields are checked by test_skipping_example_resumes_with_the_rest)
    assert resumed.skipped == [1]


def _at_epoch(subject: Subject, ranks: list[Any], epoch: int) -> list[Any]:
    for obj in ranks:
        subject.set_epoch(obj, epoch)
    return ranks


def check_caps(subject: Subject, inp: Inputs, ranks: list[Any], batches: list[list[int]]) -> None:
    """Every batch within the subject's limit; the skipped items exactly those above the cap."""
    limit = subject.limit(inp)
    assert limit is not None
    rows = [(size,) for size in inp.sizes]
    for batch in batches:
        if limit.cost == "count":
            # invariant: a fixed-size batch holds at most batch_size items
            assert len(batch) <= limit.cap, f"{batch} holds more than {limit.cap} items"
            continue
        if len(batch) == 1 and inp.sizes[batch[0]] > limit.cap:
            # invariant: an item above the cap comes only as its own batch, and only if asked for
            assert limit.own_batch, f"oversize item {batch[0]} (size {inp.sizes[batch[0]]}) yielded"
            continue
        cost = batch_cost([rows[i] for i in batch], 0, limit.cost)
        # invariant: a batch's cost (sum, or len * max) is within the cap; its items within max_batch_size
        assert cost <= limit.cap, f"batch {batch} costs {cost} > {limit.cap} ({limit.cost})"
        assert limit.max_batch_size is None or len(batch) <= limit.max_batch_size
    if limit.cost == "count":
        return
    # invariant: what is reported skipped is exactly the items above the cap (and those a
    # bucket sampler finds outside its buckets)
    skipped = set(epoch_report(subject, ranks).skipped) - subject.outside(inp)
    oversize = {i for i, size in enumerate(inp.sizes) if size > limit.cap} - subject.outside(inp)
    assert skipped == (set() if limit.own_batch else oversize), (
        f"skipped {sorted(skipped)}, oversize {sorted(oversize)}"
    )


@pytest.mark.parametrize("subject", applicable("limit"))
@on_drawn_inputs
def test_batches_respect_the_cap(subject: Subject, inp: Inputs) -> None:
    assume(subject.accepts(inp))
    ranks = subject.ranks(inp)
    batches = flat(run_ranks(subject, ranks, epoch_of(subject, inp)))
    check_caps(subject, inp, ranks, batches)


#: Sizes whose sum over the epoch passes 2**63, under a cap that three of them fit.
HUGE = replace(MANY, sizes=(2**61,) * 5 + (0, 1, 2), cap=3 * 2**61)


@pytest.mark.parametrize("subject", applicable("limit"))
def test_huge_sizes_are_batched_exactly(subject: Subject) -> None:
    if not subject.accepts(HUGE):
        pytest.skip(f"{subject.name} refuses sizes that all lie outside its buckets")
    ranks = subject.ranks(HUGE)
    batches = flat(run_ranks(subject, ranks, 0 if "epochs" not in subject.lacks else None))
    # invariant: sizes near the int64 range are batched as any others: every index once, each batch within the cap
    check_exactly_once(HUGE.n, batches, epoch_report(subject, ranks))
    check_caps(subject, HUGE, ranks, batches)


# -- worker processes -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fixed", "sized"])
def test_data_loader_with_a_worker_process(kind: str) -> None:
    from fastsab import FastLoader, FastSizeAwareLoader

    sizes = [i % 5 for i in range(23)]

    def loader(rank: int = 0) -> Any:
        data = torch.arange(23)
        if kind == "fixed":
            return FastLoader(data, 4, seed=3, rank=rank, world_size=2)
        return FastSizeAwareLoader(data, sizes, 6, seed=3, rank=rank, world_size=2)

    options = _worker_options()
    workers = [loader(rank).data_loader(**options) for rank in range(2)]
    in_process = [loader(rank).data_loader() for rank in range(2)]
    batches = [[b.tolist() for b in dl] for dl in workers]
    # invariant: worker processes fetch the same batches, len() is exact, every index once (padded aside)
    assert batches == [[b.tolist() for b in dl] for dl in in_process]
    assert [len(dl) for dl in workers] == [len(b) for b in batches]
    check_exactly_once(23, flat(batches), Report(padded=[i for dl in workers for i in dl.stats.padded]))
    # invariant: a state saved after k received batches (the workers fetch ahead) resumes with the rest
    for steps in (1, len(batches[0]) - 1):
        states = []
        for dl in [loader(rank).data_loader(**options) for rank in range(2)]:
            source = iter(dl)
            for _ in range(steps):
                next(source)
            states.append(round_trip(dl.state_dict()))
            del source
        assert states[0] == states[1]
        fresh = [loader(rank).data_loader(**options) for rank in range(2)]
        for dl in fresh:
            dl.load_state_dict(states[0])
        assert [[b.tolist() for b in dl] for dl in fresh] == [b[steps:] for b in batches]


WORKER_STATE_BEFORE_FIRST_BATCH = (
    "PlannedDataLoader.state_dict() between iter() and the first batch received falls back to the sampler's "
    "position, which counts the batches the worker processes already took ahead: "
    "dl = FastLoader(torch.arange(8), 2, shuffle=False).data_loader(num_workers=1); iter(dl); dl.state_dict() "
    "has steps=2, so a resume from it skips two batches never trained on"
)


def test_data_loader_state_before_the_first_batch_with_a_worker_process() -> None:
    from fastsab import FastLoader

    def loader() -> Any:
        return FastLoader(torch.arange(8), 2, shuffle=False).data_loader(**_worker_options())

    dl = loader()
    source = iter(dl)
    state = round_trip(dl.state_dict())
    del source
    fresh = loader()
    fresh.load_state_dict(state)
    # invariant: a state saved before the loop received a batch resumes at the epoch's start
    assert [b.tolist() for b in fresh] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def _worker_options() -> dict[str, Any]:
    return {"num_workers": 1, "multiprocessing_context": "fork" if "fork" in _contexts() else None}


def _contexts() -> list[str]:
    import multiprocessing

    return multiprocessing.get_all_start_methods()
