"""fastsab against bionemo-size-aware-batching 1.0.0, the API it stands in for.

The same inputs go through bionemo's ``size_aware_batching``, ``SizeAwareBatchSampler``,
``BucketBatchSampler`` and ``create_buckets`` and through fastsab's, and the outputs are
compared: batches in order, the warnings given (count, kind, and where they come relative to
the batches), and the exceptions raised (bionemo's exception type must catch fastsab's).
The deliberate differences are tested at the end, each showing fastsab's behaviour.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from bionemo.size_aware_batching import sampler as bionemo_sampler
from bionemo.size_aware_batching import utils as bionemo_utils
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from fastsab import FastSizeAwareLoader, split_batches
from fastsab._checks import NotAnIntegerError, NotANumberError, NotASingleNumberError
from fastsab.bionemo import samplers as fastsab_samplers
from fastsab.bionemo.buckets import BucketBatchSampler, Buckets, NoElementInBucketsError, create_buckets
from fastsab.bionemo.samplers import SizeAwareBatchSampler
from fastsab.bionemo.streaming import size_aware_batching

PEER = SimpleNamespace(
    size_aware_batching=bionemo_sampler.size_aware_batching,
    SizeAwareBatchSampler=bionemo_sampler.SizeAwareBatchSampler,
    BucketBatchSampler=bionemo_sampler.BucketBatchSampler,
    create_buckets=bionemo_utils.create_buckets,
)
OURS = SimpleNamespace(
    size_aware_batching=size_aware_batching,
    SizeAwareBatchSampler=SizeAwareBatchSampler,
    BucketBatchSampler=BucketBatchSampler,
    create_buckets=create_buckets,
)


def examples(count: int) -> int:
    """``count`` examples in the default profile, scaled by the loaded profile's ``max_examples``."""
    return max(1, count * settings().max_examples // 100)


# -- recording ------------------------------------------------------------------------------

SKIP = re.compile(r"element (?P<element>\S+) exceeds max_total_size \((?P<size>.+?) > ")


def message_kind(message: str) -> str:
    if SKIP.search(message):
        return "skip"
    if "samples were batched from" in message:
        return "summary"
    return "other"


def as_number(text: str) -> float:
    """A size as printed in a warning (``5``, ``0.5`` or ``tensor(5.)``), as a float."""
    match = re.fullmatch(r"tensor\((.*?)(, dtype=.*)?\)", text)
    return float(match.group(1) if match else text)


def as_plain(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [as_plain(item) for item in batch]
    return batch


def run(make: Callable[[Callable[[str], None]], Iterable[Any]]) -> tuple[list[tuple[Any, ...]], BaseException | None]:
    """Events of one run: batches and warn_logger messages in order, then the error if any.

    ``make`` gets the recording warn_logger and returns the batches to iterate over.
    """
    events: list[tuple[Any, ...]] = []

    def warn_logger(message: str) -> None:
        events.append(("warn", message_kind(message), message))

    try:
        for batch in make(warn_logger):
            events.append(("batch", as_plain(batch)))
    except Exception as err:
        return events, err
    return events, None


def assert_same_events(ours: list[tuple[Any, ...]], peer: list[tuple[Any, ...]]) -> None:
    """Same batches and same warnings at the same points; skip messages name the same element and size."""
    assert [event[:2] for event in ours] == [event[:2] for event in peer]
    for our_event, peer_event in zip(ours, peer):
        if our_event[:2] == ("warn", "skip"):
            our_match, peer_match = SKIP.search(our_event[2]), SKIP.search(peer_event[2])
            assert our_match is not None and peer_match is not None
            assert our_match["element"] == peer_match["element"]
            assert as_number(our_match["size"]) == as_number(peer_match["size"])


def assert_same_outcome(
    ours: tuple[list[tuple[Any, ...]], BaseException | None],
    peer: tuple[list[tuple[Any, ...]], BaseException | None],
) -> None:
    our_events, our_error = ours
    peer_events, peer_error = peer
    if peer_error is None:
        assert our_error is None, f"fastsab raised {our_error!r} where bionemo did not"
        assert_same_events(our_events, peer_events)
    else:
        assert isinstance(our_error, type(peer_error)), f"bionemo raised {peer_error!r}, fastsab {our_error!r}"


# -- strategies -----------------------------------------------------------------------------

# NOTE: values that make float sums land right at the cap (0.1 + 0.2 > 0.3, ...), and zeros.
SPECIAL_SIZES = [0, 0.0, 0.1, 0.2, 0.3, 1 / 3, 2 / 3, 1.0, 3.0000000000000004]
size_values = st.one_of(
    st.integers(0, 12),
    st.sampled_from(SPECIAL_SIZES),
    st.floats(0, 12, allow_nan=False, allow_infinity=False),
)
int_size_lists = st.lists(st.integers(0, 12), max_size=30)
size_lists = st.one_of(int_size_lists, st.lists(size_values, max_size=30))
caps = st.one_of(
    st.integers(0, 15),
    st.sampled_from([0, 0.0, 0.3, 0.6, 1 / 3, 1.0, 3.0000000000000004]),
    st.floats(0, 15, allow_nan=False, allow_infinity=False),
)


def tensor_of(sizes: list[Any], floating: bool = False) -> torch.Tensor:
    """The sizes as an int64 tensor, or float64 if any is a float (float32 would round them)."""
    floating = floating or any(isinstance(size, float) for size in sizes)
    return torch.tensor(sizes, dtype=torch.float64 if floating else torch.int64)


def sizeof_returning(kind: str, sizes: list[Any], cap: Any = 0) -> Callable[[int], Any]:
    """``index -> size`` returning Python numbers, 0-d tensors or numpy numbers.

    NOTE: torch compares an integer tensor with a Python float in float32, so bionemo's
    comparisons of such sizes with a float budget are rounded; the tensors are float64 then.
    """
    if kind == "tensor":
        table = tensor_of(sizes, floating=isinstance(cap, float))
        return lambda i: table[i]
    if kind == "numpy":
        array = tensor_of(sizes).numpy()
        return lambda i: array[i]
    return sizes.__getitem__


# -- size_aware_batching ------------------------------------------------------------------


@settings(max_examples=examples(300))
@given(
    sizes=size_lists,
    cap=caps,
    returns=st.sampled_from(["number", "tensor", "numpy"]),
    collate=st.booleans(),
)
def test_size_aware_batching_matches_bionemo(sizes, cap, returns, collate):
    sizeof = sizeof_returning(returns, sizes, cap)
    collate_fn = tuple if collate else None
    infos: dict[str, list[str]] = {"peer": [], "ours": []}

    def make(api, name):
        return lambda warn_logger: api.size_aware_batching(
            range(len(sizes)), sizeof, cap, collate_fn, infos[name].append, warn_logger
        )

    ours, peer = run(make(OURS, "ours")), run(make(PEER, "peer"))
    assert_same_outcome(ours, peer)
    assert len(infos["ours"]) == len(infos["peer"]) == (peer[1] is None)


@settings(max_examples=examples(100))
@given(sizes=size_lists, cap=caps)
def test_size_aware_batching_warns_as_bionemo_with_warnings_warn(sizes, cap):
    def warnings_per_batch(api):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen = [len(caught) for _ in api.size_aware_batching(sizes, float, cap, warn_logger=warnings.warn)]
        return [*seen, len(caught)], [w.category for w in caught]

    assert warnings_per_batch(OURS) == warnings_per_batch(PEER)


def test_size_aware_batching_accepts_a_zero_budget():
    messages: list[str] = []
    batches = list(size_aware_batching([0, 0.0, 3, 0, 1], lambda x: x, 0, warn_logger=messages.append))
    assert batches == [[0, 0.0, 0]]
    assert [message_kind(m) for m in messages] == ["skip", "skip", "summary"]
    assert "element 3 exceeds max_total_size (3 > 0)" in messages[0]
    assert list(size_aware_batching([1, 2], lambda x: x, 0, warn_logger=None)) == []


# The events of sizes [1, 5, 1, 1, 5, 1, 0, 7] under a cap of 2: each skip is reported before the batch after it
SKIPS_BETWEEN_BATCHES = [
    ("warn", "skip"),
    ("batch", [0, 2]),
    ("warn", "skip"),
    ("warn", "skip"),
    ("batch", [3, 5, 6]),
    ("warn", "summary"),
]


def test_size_aware_batching_skip_warnings_come_where_bionemo_gives_them():
    sizes = [1, 5, 1, 1, 5, 1, 0, 7]

    def make(api):
        return lambda warn_logger: api.size_aware_batching(range(8), sizes.__getitem__, 2, warn_logger=warn_logger)

    ours, peer = run(make(OURS)), run(make(PEER))
    assert [e[:2] for e in ours[0]] == SKIPS_BETWEEN_BATCHES
    assert_same_outcome(ours, peer)


# -- SizeAwareBatchSampler ----------------------------------------------------------------


def index_sampler(kind: str, n: int, order: list[int], seed: int) -> Iterable[int]:
    if kind == "sequential":
        return SequentialSampler(range(n))
    if kind == "random":
        return RandomSampler(range(n), generator=torch.Generator().manual_seed(seed))
    if kind == "order":
        return order
    return range(n)


@settings(max_examples=examples(300))
@given(
    data=st.data(),
    sizes=size_lists,
    cap=caps,
    sampler_kind=st.sampled_from(["range", "sequential", "random", "order"]),
    sizeof_kind=st.sampled_from(["callable", "sequence", "tensor", "numpy", "callable_tensor", "callable_numpy"]),
    chunk_size=st.sampled_from([fastsab_samplers.CHUNK_SIZE, 1, 2, 3, 7]),
    seed=st.integers(0, 2**16),
)
def test_size_aware_batch_sampler_matches_bionemo(data, sizes, cap, sampler_kind, sizeof_kind, chunk_size, seed):
    n = len(sizes)
    order = data.draw(st.lists(st.integers(0, n - 1), max_size=40)) if n and sampler_kind == "order" else []
    ours_sizeof: Any = {
        "callable": sizes.__getitem__,
        "sequence": sizes,
        "tensor": tensor_of(sizes) if n else torch.tensor([], dtype=torch.int64),
        "numpy": tensor_of(sizes).numpy() if n else np.array([], dtype=np.int64),
        "callable_tensor": sizeof_returning("tensor", sizes, cap),
        "callable_numpy": sizeof_returning("numpy", sizes),
    }[sizeof_kind]
    peer_sizeof = ours_sizeof if callable(ours_sizeof) else sizeof_returning("number", sizes)
    infos: dict[str, list[str]] = {"peer": [], "ours": []}

    def make(api, name, sizeof):
        def batches(warn_logger):
            sampler = index_sampler(sampler_kind, n, order, seed)
            return api.SizeAwareBatchSampler(sampler, sizeof, cap, infos[name].append, warn_logger)

        return batches

    with mock.patch.object(fastsab_samplers, "CHUNK_SIZE", chunk_size):
        ours = run(make(OURS, "ours", ours_sizeof))
    peer = run(make(PEER, "peer", peer_sizeof))
    assert_same_outcome(ours, peer)
    assert len(infos["ours"]) == len(infos["peer"]) == (peer[1] is None)


@settings(max_examples=examples(100))
@given(sizes=size_lists, cap=caps, chunk_size=st.sampled_from([fastsab_samplers.CHUNK_SIZE, 1, 3]))
def test_size_aware_batch_sampler_warns_as_bionemo_with_warnings_warn(sizes, cap, chunk_size):
    def warnings_per_batch(api):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sampler = api.SizeAwareBatchSampler(range(len(sizes)), sizes.__getitem__, cap, warn_logger=warnings.warn)
            seen = [len(caught) for _ in sampler]
        return [*seen, len(caught)], [w.category for w in caught]

    with mock.patch.object(fastsab_samplers, "CHUNK_SIZE", chunk_size):
        ours = warnings_per_batch(OURS)
    assert ours == warnings_per_batch(PEER)


def test_size_aware_batch_sampler_skip_warnings_come_where_bionemo_gives_them():
    sizes = [1, 5, 1, 1, 5, 1, 0, 7]
    for chunk_size in (fastsab_samplers.CHUNK_SIZE, 2, 3):
        with mock.patch.object(fastsab_samplers, "CHUNK_SIZE", chunk_size):
            ours = run(lambda warn_logger: SizeAwareBatchSampler(range(8), sizes, 2, warn_logger=warn_logger))
        assert [e[:2] for e in ours[0]] == SKIPS_BETWEEN_BATCHES
        peer = run(lambda warn_logger: PEER.SizeAwareBatchSampler(range(8), sizes.__getitem__, 2, None, warn_logger))
        assert_same_outcome(ours, peer)


@pytest.mark.parametrize("sizeof", [[0, 4, 0, 0.0, 1], (lambda i: [0, 4, 0, 0.0, 1][i])])
def test_size_aware_batch_sampler_accepts_a_zero_budget(sizeof):
    messages: list[str] = []
    sampler = SizeAwareBatchSampler(range(5), sizeof, 0, warn_logger=messages.append)
    assert list(sampler) == [[0, 2, 3]]
    assert [message_kind(m) for m in messages] == ["skip", "skip", "summary"]
    assert sampler.num_skipped == 2


def test_size_aware_batch_sampler_names_the_index_of_a_bad_size():
    sizes = {7: 1.0, 9: float("nan")}
    with pytest.raises(ValueError, match=r"sizeof must return a finite number >= 0, got nan for the element 9"):
        list(SizeAwareBatchSampler([7, 9], sizes.__getitem__, 3))


# -- create_buckets -------------------------------------------------------------------------


@settings(max_examples=examples(200))
@given(
    sizes=st.lists(st.integers(-20, 60), min_size=1, max_size=40),
    dtype=st.sampled_from([torch.int64, torch.int32, torch.int16]),
    max_width=st.integers(1, 12),
    min_bucket_count=st.integers(1, 12),
)
def test_create_buckets_matches_bionemo(sizes, dtype, max_width, min_bucket_count):
    tensor = torch.tensor(sizes, dtype=dtype)
    ours = create_buckets(tensor, max_width=max_width, min_bucket_count=min_bucket_count)
    peer = PEER.create_buckets(tensor, max_width=max_width, min_bucket_count=min_bucket_count)
    assert isinstance(ours, Buckets)
    assert ours._fields == peer._fields == ("bucket_boundaries", "bucket_sizes")
    for our_tensor, peer_tensor in zip(ours, peer):
        assert our_tensor.dtype == torch.int64  # bionemo's boundaries are sometimes in the sizes' dtype
        assert our_tensor.tolist() == peer_tensor.tolist()


def test_create_buckets_result_is_a_named_tuple():
    result = create_buckets(torch.tensor([1, 1, 2, 2, 3, 9, 9]), max_width=4, min_bucket_count=3)
    assert result.bucket_boundaries.tolist() == [1, 3, 7, 10]
    assert result.bucket_sizes.tolist() == [4, 1, 2]
    boundaries, counts = result
    assert boundaries is result.bucket_boundaries and counts is result.bucket_sizes
    assert result == (result[0], result[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_width": 2.0}, r"max_width must be an integer, got 2.0 of type float"),
        ({"max_width": "2"}, r"max_width must be an integer, got '2' of type str"),
        ({"max_width": None}, r"max_width must be an integer, got None"),
        ({"min_bucket_count": 3.0}, r"min_bucket_count must be an integer, got 3.0 of type float"),
        ({"min_bucket_count": None}, r"min_bucket_count must be an integer, got None"),
    ],
)
def test_create_buckets_non_integer_arguments_are_type_and_value_errors(kwargs, message):
    arguments = {"sizes": torch.arange(10), "max_width": 3, "min_bucket_count": 2, **kwargs}
    for error in (TypeError, ValueError, NotAnIntegerError):
        with pytest.raises(error, match=message):
            create_buckets(**arguments)
    with pytest.raises(ValueError):
        PEER.create_buckets(**arguments)


# -- BucketBatchSampler ---------------------------------------------------------------------


@st.composite
def bucket_cases(draw):
    floating = draw(st.booleans())
    if floating:
        values = st.floats(-10, 40, allow_nan=False, allow_infinity=False, width=32)
        sizes = torch.tensor(draw(st.lists(values, max_size=40)), dtype=torch.float32)
    else:
        sizes = torch.tensor(draw(st.lists(st.integers(-10, 40), max_size=40)), dtype=torch.int64)
    if draw(st.booleans()):  # wide buckets over few sizes: empty buckets are likely
        boundary_values = st.integers(-30, 60)
    else:
        boundary_values = st.integers(-10, 40)
    boundaries = draw(st.lists(boundary_values, min_size=2, max_size=7, unique=True))
    boundaries = torch.tensor(boundaries, dtype=sizes.dtype)  # unsorted: the sampler sorts them
    num_buckets = len(boundaries) - 1
    base = draw(st.sampled_from(["torch", "fastsab", "each its own"]))
    shared: dict[str, Any] = {}
    individual: dict[str, list[Any]] = {}
    if base == "torch":
        shared["drop_last"] = draw(st.booleans())
        batch_sizes = st.integers(1, 6)
        if draw(st.booleans()):
            individual["batch_size"] = draw(st.lists(batch_sizes, min_size=num_buckets, max_size=num_buckets))
        else:
            shared["batch_size"] = draw(batch_sizes)
    else:
        costs = draw(st.lists(st.integers(0, 8), min_size=len(sizes), max_size=len(sizes)))
        shared["sizeof"] = costs.__getitem__
        bucket_caps = st.integers(0, 12)
        if draw(st.booleans()):
            individual["max_total_size"] = draw(st.lists(bucket_caps, min_size=num_buckets, max_size=num_buckets))
        else:
            shared["max_total_size"] = draw(bucket_caps)
    shuffle = draw(st.booleans())
    seed = draw(st.integers(0, 2**32)) if shuffle else None
    return sizes, boundaries, base, shared, individual, shuffle, seed


def make_bucket_sampler(api, case, warn_logger):
    sizes, boundaries, base, shared, individual, shuffle, seed = case
    if base == "torch":
        base_class = BatchSampler
    elif base == "fastsab":
        base_class = SizeAwareBatchSampler
    else:
        base_class = api.SizeAwareBatchSampler
    if base != "torch":
        shared = {**shared, "warn_logger": warn_logger}
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    sampler = api.BucketBatchSampler(sizes, boundaries, base_class, shared, individual, shuffle, generator)
    return sampler, generator


def build(api, case):
    """The sampler (or the error), the warnings of its construction, and its warn_logger's messages."""
    messages: list[tuple[Any, ...]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sampler, generator = make_bucket_sampler(api, case, lambda m: messages.append(("warn", message_kind(m), m)))
        except Exception as err:
            return err, [w.category for w in caught], messages
    return (sampler, generator), [w.category for w in caught], messages


def epoch(sampler, messages):
    """One pass: its batches and the base samplers' warn_logger messages, in order."""
    del messages[:]
    for batch in sampler:
        messages.append(("batch", as_plain(batch)))
    return list(messages)


@settings(max_examples=examples(300))
@given(case=bucket_cases())
def test_bucket_batch_sampler_matches_bionemo(case):
    ours, our_warnings, our_messages = build(OURS, case)
    peer, peer_warnings, peer_messages = build(PEER, case)
    assert our_warnings == peer_warnings
    if isinstance(peer, Exception):
        assert isinstance(ours, type(peer)), f"bionemo raised {peer!r}, fastsab {ours!r}"
        return
    assert not isinstance(ours, Exception), f"fastsab raised {ours!r} where bionemo did not"
    (our_sampler, our_generator), (peer_sampler, peer_generator) = ours, peer
    for name in ("num_buckets", "num_samples", "shuffle"):
        assert getattr(our_sampler, name) == getattr(peer_sampler, name), name
    if case[2] != "each its own":
        assert our_sampler.base_batch_sampler_class is peer_sampler.base_batch_sampler_class
    for name in ("sizes", "bucket_boundaries", "bucket_sizes"):
        assert getattr(our_sampler, name).tolist() == getattr(peer_sampler, name).tolist(), name
    assert our_sampler.bucket_element_indices == peer_sampler.bucket_element_indices
    assert our_sampler.base_batch_sampler_shared_kwargs.keys() == peer_sampler.base_batch_sampler_shared_kwargs.keys()
    assert our_sampler.base_batch_sampler_individual_kwargs == peer_sampler.base_batch_sampler_individual_kwargs
    assert len(our_sampler.base_batch_samplers) == len(peer_sampler.base_batch_samplers) == peer_sampler.num_buckets
    if case[2] == "torch":
        assert len(our_sampler) == len(peer_sampler)
    for _ in range(2):  # two passes drawing on from the same generator
        assert_same_events(epoch(our_sampler, our_messages), epoch(peer_sampler, peer_messages))
        assert our_sampler.bucket_element_indices == peer_sampler.bucket_element_indices
    if our_generator is not None:
        assert torch.equal(our_generator.get_state(), peer_generator.get_state())


def test_bucket_batch_sampler_without_a_generator_seeds_from_torch_as_bionemo():
    def two_passes(api):
        torch.manual_seed(5)
        sampler = empty_bucket_sampler(api, shuffle=True, bucket_boundaries=torch.tensor([0, 6, 15, 25]))
        return list(sampler), list(sampler)

    assert two_passes(OURS) == two_passes(PEER)


def empty_bucket_sampler(api, **kwargs):
    arguments = {
        "sizes": torch.arange(25),
        "bucket_boundaries": torch.tensor([-25, 0, 25, 50]),
        "base_batch_sampler_class": BatchSampler,
        "base_batch_sampler_shared_kwargs": {"drop_last": False},
        "base_batch_sampler_individual_kwargs": {"batch_size": [2, 10, 4]},
        "shuffle": False,
        **kwargs,
    }
    return api.BucketBatchSampler(**arguments)


def test_bucket_batch_sampler_keeps_empty_buckets():
    sampler = empty_bucket_sampler(OURS)
    assert sampler.num_buckets == 3
    assert sampler.bucket_sizes.tolist() == [0, 25, 0]
    assert sampler.bucket_element_indices == [[], list(range(25)), []]
    assert sampler.base_batch_sampler_individual_kwargs == [{"batch_size": 2}, {"batch_size": 10}, {"batch_size": 4}]
    assert list(sampler) == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    assert len(sampler) == 3


def test_bucket_batch_sampler_with_empty_buckets_shuffles_as_bionemo():
    ours = empty_bucket_sampler(OURS, shuffle=True, generator=torch.Generator().manual_seed(3))
    peer = empty_bucket_sampler(PEER, shuffle=True, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        batches = list(ours)
        assert [len(batch) for batch in batches] == [10, 10, 5]
        assert batches == list(peer)


def test_bucket_batch_sampler_has_bionemos_attributes():
    shared = {"drop_last": False}
    ours = empty_bucket_sampler(OURS, base_batch_sampler_shared_kwargs=shared)
    peer = empty_bucket_sampler(PEER, base_batch_sampler_shared_kwargs=shared)
    assert ours.base_batch_sampler_class is BatchSampler
    assert ours.base_batch_sampler_shared_kwargs == {"drop_last": False}
    assert ours.base_batch_sampler_individual_kwargs == peer.base_batch_sampler_individual_kwargs
    assert ours.num_buckets == peer.num_buckets == 3
    assert ours.generator is None and ours.shuffle is False
    assert [type(s) for s in ours.base_batch_samplers] == [BatchSampler] * 3
    public = {name for name in vars(peer) if not name.startswith("_")}
    assert public <= {name for name in vars(ours) if not name.startswith("_")}


def test_bucket_batch_sampler_per_bucket_kwargs_must_be_iterable():
    with pytest.raises(
        TypeError, match=r"base_batch_sampler_individual_kwargs\['batch_size'\] must be a sequence .* got 3"
    ):
        empty_bucket_sampler(OURS, base_batch_sampler_individual_kwargs={"batch_size": 3})


# -- errors: bionemo's exception type catches fastsab's -------------------------------------


def bucket_call(**kwargs):
    arguments = {
        "sizes": torch.arange(10),
        "bucket_boundaries": torch.tensor([0, 5, 10]),
        "base_batch_sampler_class": BatchSampler,
        "base_batch_sampler_shared_kwargs": {"drop_last": False, "batch_size": 2},
        "base_batch_sampler_individual_kwargs": None,
        "shuffle": True,
        "generator": torch.Generator().manual_seed(0),
        **kwargs,
    }
    return lambda api: list(api.BucketBatchSampler(**arguments))


def raising(index: int) -> int:
    raise KeyError(index)


BAD_CALLS: dict[str, Callable[[SimpleNamespace], Any]] = {
    # create_buckets
    "create_buckets sizes list": lambda api: api.create_buckets([1, 2], 2, 1),
    "create_buckets sizes 2-D": lambda api: api.create_buckets(torch.ones(2, 2, dtype=torch.int64), 2, 1),
    "create_buckets sizes float": lambda api: api.create_buckets(torch.ones(3), 2, 1),
    "create_buckets sizes bool": lambda api: api.create_buckets(torch.ones(3, dtype=torch.bool), 2, 1),
    "create_buckets sizes empty": lambda api: api.create_buckets(torch.tensor([], dtype=torch.int64), 2, 1),
    "create_buckets max_width float": lambda api: api.create_buckets(torch.arange(5), 2.0, 1),
    "create_buckets max_width str": lambda api: api.create_buckets(torch.arange(5), "2", 1),
    "create_buckets max_width None": lambda api: api.create_buckets(torch.arange(5), None, 1),
    "create_buckets max_width 0": lambda api: api.create_buckets(torch.arange(5), 0, 1),
    "create_buckets max_width -1": lambda api: api.create_buckets(torch.arange(5), -1, 1),
    "create_buckets max_width False": lambda api: api.create_buckets(torch.arange(5), False, 1),
    "create_buckets min_bucket_count float": lambda api: api.create_buckets(torch.arange(5), 2, 3.0),
    "create_buckets min_bucket_count 0": lambda api: api.create_buckets(torch.arange(5), 2, 0),
    "create_buckets min_bucket_count None": lambda api: api.create_buckets(torch.arange(5), 2, None),
    # BucketBatchSampler
    "bucket sizes list": bucket_call(sizes=[1, 2]),
    "bucket sizes 2-D": bucket_call(sizes=torch.ones(2, 2)),
    "bucket sizes bool": bucket_call(sizes=torch.ones(3, dtype=torch.bool)),
    "bucket sizes complex": bucket_call(sizes=torch.ones(3, dtype=torch.complex64)),
    "bucket sizes empty": bucket_call(sizes=torch.tensor([], dtype=torch.int64)),
    "bucket boundaries list": bucket_call(bucket_boundaries=[0, 5]),
    "bucket boundaries 2-D": bucket_call(bucket_boundaries=torch.ones(2, 2)),
    "bucket boundaries one": bucket_call(bucket_boundaries=torch.tensor([0])),
    "bucket boundaries bool": bucket_call(bucket_boundaries=torch.tensor([False, True])),
    "bucket boundaries repeated": bucket_call(bucket_boundaries=torch.tensor([0, 5, 5])),
    "bucket shuffle str": bucket_call(shuffle="yes"),
    "bucket shuffle None": bucket_call(shuffle=None),
    "bucket generator str": bucket_call(generator="seed"),
    "bucket base class int": bucket_call(base_batch_sampler_class=3),
    "bucket base class list": bucket_call(base_batch_sampler_class=list),
    "bucket shared list": bucket_call(base_batch_sampler_shared_kwargs=[("drop_last", False)]),
    "bucket shared int keys": bucket_call(base_batch_sampler_shared_kwargs={1: 2}),
    "bucket individual list": bucket_call(base_batch_sampler_individual_kwargs=[2, 2]),
    "bucket individual int keys": bucket_call(base_batch_sampler_individual_kwargs={1: [2, 2]}),
    "bucket individual wrong length": bucket_call(
        base_batch_sampler_shared_kwargs={"drop_last": False}, base_batch_sampler_individual_kwargs={"batch_size": [2]}
    ),
    "bucket individual not iterable": bucket_call(
        base_batch_sampler_shared_kwargs={"drop_last": False}, base_batch_sampler_individual_kwargs={"batch_size": 2}
    ),
    "bucket all outside": bucket_call(bucket_boundaries=torch.tensor([20, 30])),
    "bucket base sampler refuses": bucket_call(base_batch_sampler_shared_kwargs={"drop_last": False}),
    # SizeAwareBatchSampler
    "sampler sampler int": lambda api: list(api.SizeAwareBatchSampler(5, lambda i: 1, 3)),
    "sampler sampler str": lambda api: list(api.SizeAwareBatchSampler("abc", lambda i: 1, 3)),
    "sampler sizeof int": lambda api: list(api.SizeAwareBatchSampler(range(3), 5, 3)),
    "sampler max_total_size str": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: 1, "3")),
    "sampler max_total_size None": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: 1, None)),
    "sampler max_total_size list": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: 1, [3])),
    "sampler sizeof raises": lambda api: list(api.SizeAwareBatchSampler(range(3), raising, 3)),
    "sampler sizeof returns str": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: "1", 3)),
    "sampler sizeof returns None": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: None, 3)),
    "sampler sizeof returns list": lambda api: list(api.SizeAwareBatchSampler(range(3), lambda i: [1, 2], 3)),
    "sampler sizeof returns tensor pair": lambda api: list(
        api.SizeAwareBatchSampler(range(3), lambda i: torch.tensor([1, 2]), 3)
    ),
    "sampler sizeof returns array pair": lambda api: list(
        api.SizeAwareBatchSampler(range(3), lambda i: np.array([1, 2]), 3)
    ),
    "sampler index out of sizes": lambda api: list(api.SizeAwareBatchSampler([0, 3], [1, 1, 1].__getitem__, 3)),
    # size_aware_batching
    "batching sizeof int": lambda api: list(api.size_aware_batching([1, 2], 5, 3)),
    "batching sizeof raises": lambda api: list(api.size_aware_batching([1, 2], raising, 3)),
    "batching max_total_size str": lambda api: list(api.size_aware_batching([1, 2], lambda x: 1, "3")),
    "batching max_total_size None": lambda api: list(api.size_aware_batching([1, 2], lambda x: 1, None)),
    "batching dataset int": lambda api: list(api.size_aware_batching(5, lambda x: 1, 3)),
    "batching sizeof returns str": lambda api: list(api.size_aware_batching([1, 2], lambda x: "1", 3)),
    "batching sizeof returns None": lambda api: list(api.size_aware_batching([1, 2], lambda x: None, 3)),
    "batching sizeof returns list": lambda api: list(api.size_aware_batching([1, 2], lambda x: [1, 2], 3)),
    "batching sizeof returns tensor pair": lambda api: list(
        api.size_aware_batching([1, 2], lambda x: torch.tensor([1, 2]), 3)
    ),
    "batching sizeof returns array pair": lambda api: list(
        api.size_aware_batching([1, 2], lambda x: np.array([1, 2]), 3)
    ),
    "batching collate raises": lambda api: list(api.size_aware_batching([1, 2], lambda x: 1, 3, collate_fn=raising)),
}


def outcome(call: Callable[[SimpleNamespace], Any], api: SimpleNamespace) -> BaseException | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(api)
        except Exception as err:
            return err
    return None


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bionemos_exception_type_catches_ours(name):
    peer_error = outcome(BAD_CALLS[name], PEER)
    our_error = outcome(BAD_CALLS[name], OURS)
    assert peer_error is not None, f"bionemo accepts {name}"
    assert our_error is not None, f"fastsab accepts {name} where bionemo raises {peer_error!r}"
    assert isinstance(our_error, type(peer_error)), f"bionemo raised {peer_error!r}, fastsab {our_error!r}"
    if isinstance(our_error, (TypeError, ValueError)) and not isinstance(peer_error, KeyError):
        assert str(our_error)[:1].isalpha() and len(str(our_error).split()) >= 4, our_error


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (BAD_CALLS["create_buckets max_width float"], NotAnIntegerError, r"max_width must be an integer, got 2.0"),
        (BAD_CALLS["sampler max_total_size str"], NotANumberError, r"max_total_size must be a real number, got '3'"),
        (
            BAD_CALLS["batching sizeof returns tensor pair"],
            NotASingleNumberError,
            r"sizeof must return a single number, got tensor\(\[1, 2\]\) of shape \(2,\) for the element 1",
        ),
        (
            BAD_CALLS["sampler sizeof returns array pair"],
            NotASingleNumberError,
            r"sizeof must return a single number, got array\(\[1, 2\]\) of shape \(2,\) for the element 0",
        ),
        (BAD_CALLS["bucket all outside"], NoElementInBucketsError, r"all 10 sizes lie outside the bucket ranges"),
    ],
)
def test_errors_bionemo_raises_as_other_types_are_still_type_or_value_errors(call, error, message):
    with pytest.raises(error, match=message) as info:
        call(OURS)
    assert isinstance(info.value, (TypeError, ValueError))


# -- a zero budget in the rest of fastsab -----------------------------------------------------


def test_split_batches_and_the_loader_accept_a_zero_budget():
    split = split_batches([0, 3, 0, 0.0, 1], 0)
    assert [b.tolist() for b in split.batches()] == [[0, 2, 3]]
    assert split.skipped.tolist() == [1, 4]
    padded = split_batches([0, 3, 0, 0], 0, cost="padded")
    assert [b.tolist() for b in padded.batches()] == [[0, 2, 3]]
    loader = FastSizeAwareLoader(torch.arange(5), torch.tensor([0, 3, 0, 0, 1]), 0, shuffle=False)
    with pytest.warns(UserWarning, match="2 items were larger than max_total_size"):
        assert [b.tolist() for b in loader] == [[0, 2, 3]]
    with pytest.raises(ValueError, match=r"max_total_size must be a finite number >= 0, got -1"):
        split_batches([0], -1)
    with pytest.raises(ValueError, match=r"max_total_size must be a finite number >= 0, got -1"):
        FastSizeAwareLoader(torch.arange(5), torch.zeros(5), -1)


# -- deliberate differences -------------------------------------------------------------------


def test_difference_bad_sizes_raise_where_bionemo_batches_them():
    for bad, error, message in [
        (-1, ValueError, r"sizeof must return a finite number >= 0, got -1 for the element 1"),
        (float("nan"), ValueError, r"sizeof must return a finite number >= 0, got nan for the element 1"),
        (float("inf"), ValueError, r"sizeof must return a finite number >= 0, got inf for the element 1"),
        (True, TypeError, r"sizeof must return a real number, got True of type bool for the element 1"),
    ]:
        sizes = [1, bad, 1]
        assert list(PEER.size_aware_batching(range(3), sizes.__getitem__, 3))  # bionemo batches them
        with pytest.raises(error, match=message):
            list(size_aware_batching(range(3), sizes.__getitem__, 3))
        with pytest.raises(error, match=message):
            list(SizeAwareBatchSampler(range(3), sizes.__getitem__, 3))


@pytest.mark.parametrize(
    ("cap", "error", "message"),
    [
        (-1, ValueError, r"max_total_size must be a finite number >= 0, got -1"),
        (float("nan"), ValueError, r"max_total_size must be a finite number >= 0, got nan"),
        (float("inf"), ValueError, r"max_total_size must be a finite number >= 0, got inf"),
        (True, NotANumberError, r"max_total_size must be a real number, got True of type bool"),
    ],
)
def test_difference_budgets_bionemo_accepts_are_refused(cap, error, message):
    list(PEER.size_aware_batching(range(3), lambda i: 1, cap))
    list(PEER.SizeAwareBatchSampler(range(3), lambda i: 1, cap))
    with pytest.raises(error, match=message):
        size_aware_batching(range(3), lambda i: 1, cap)
    with pytest.raises(error, match=message):
        SizeAwareBatchSampler(range(3), lambda i: 1, cap)


def test_difference_tensor_sizes_compare_exactly_with_a_float_budget():
    # torch compares an integer tensor with a Python float in float32: 2.9999999 becomes 3.0
    sizes = torch.tensor([3, 1])
    assert list(PEER.size_aware_batching(range(2), lambda i: sizes[i], 2.9999999)) == [[0], [1]]
    messages: list[str] = []
    assert list(size_aware_batching(range(2), lambda i: sizes[i], 2.9999999, warn_logger=messages.append)) == [[1]]
    assert messages[0] == "Size of element 0 exceeds max_total_size (3 > 2.9999999), skipping"
    assert list(SizeAwareBatchSampler(range(2), sizes, 2.9999999, warn_logger=None)) == [[1]]


def test_difference_size_aware_batching_checks_arguments_when_called():
    for args in [([1], 5, 3), ([1], len, -1), ([1], len, 3, 5)]:
        PEER.size_aware_batching(*args)  # bionemo raises (or not) only when iterated
        with pytest.raises((TypeError, ValueError)):
            size_aware_batching(*args)
    # a collate_fn that is not callable: bionemo ignores it
    assert list(PEER.size_aware_batching([1], lambda x: 1, 3, collate_fn=5)) == [[1]]
    with pytest.raises(TypeError, match="collate_fn must be callable or None, got int"):
        size_aware_batching([1], lambda x: 1, 3, collate_fn=5)


def test_difference_sizeof_may_be_a_mapping_a_sequence_an_array_or_a_tensor():
    sizes = [3, 1, 2, 4, 1]
    for sizeof in (sizes, tuple(sizes), np.array(sizes), torch.tensor(sizes), dict(enumerate(sizes))):
        with pytest.raises(TypeError):
            PEER.SizeAwareBatchSampler(range(5), sizeof, 4)
        assert list(SizeAwareBatchSampler(range(5), sizeof, 4)) == [[0, 1], [2], [3], [4]]
    assert list(size_aware_batching(range(5), dict(enumerate(sizes)), 4)) == [[0, 1], [2], [3], [4]]


def test_difference_size_aware_batch_sampler_warns_by_default():
    sizes = [1, 5, 1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(PEER.SizeAwareBatchSampler(range(3), sizes.__getitem__, 2)) == [[0, 2]]
    assert caught == []
    with pytest.warns(UserWarning, match="Size of element 1 exceeds max_total_size") as record:
        assert list(SizeAwareBatchSampler(range(3), sizes.__getitem__, 2)) == [[0, 2]]
    assert [message_kind(str(w.message)) for w in record] == ["skip", "summary"]


def test_difference_numeric_types_bionemo_refuses_are_accepted():
    # budgets given as numpy integers or 0-d tensors
    for cap in (np.int64(4), torch.tensor(4)):
        with pytest.raises(ValueError):
            PEER.SizeAwareBatchSampler(range(3), lambda i: 2, cap)
        assert list(SizeAwareBatchSampler(range(3), lambda i: 2, cap)) == [[0, 1], [2]]
    # numpy integer widths and counts, unsigned and numpy sizes in create_buckets
    with pytest.raises(ValueError):
        PEER.create_buckets(torch.arange(5), np.int64(2), 2)
    assert create_buckets(torch.arange(5), np.int64(2), 2).bucket_boundaries.tolist() == [0, 2, 4, 5]
    assert create_buckets(np.arange(5), 2, 2).bucket_sizes.tolist() == [2, 2, 1]
    with pytest.raises(ValueError):
        PEER.create_buckets(torch.arange(5).to(torch.uint16), 2, 2)
    assert create_buckets(torch.arange(5).to(torch.uint16), 2, 2).bucket_sizes.tolist() == [2, 2, 1]
    # unsigned and numpy sizes in BucketBatchSampler
    kwargs = {"base_batch_sampler_shared_kwargs": {"batch_size": 2, "drop_last": False}, "shuffle": False}
    with pytest.raises(ValueError):
        PEER.BucketBatchSampler(torch.arange(4).to(torch.uint16), torch.tensor([0, 4]), BatchSampler, **kwargs)
    for sizes, boundaries in [(torch.arange(4).to(torch.uint16), torch.tensor([0, 4])), (np.arange(4), [0, 4])]:
        boundaries = np.array(boundaries) if isinstance(sizes, np.ndarray) else boundaries
        assert list(BucketBatchSampler(sizes, boundaries, BatchSampler, **kwargs)) == [[0, 1], [2, 3]]


def test_difference_create_buckets_boundaries_are_int64():
    # bionemo computes the last boundary in the sizes' dtype, where it can wrap around
    peer = PEER.create_buckets(torch.tensor([0, 255], dtype=torch.uint8), 1000, 1)
    assert peer.bucket_boundaries.tolist() == [0, 0]
    ours = create_buckets(torch.tensor([0, 255], dtype=torch.uint8), 1000, 1)
    assert ours.bucket_boundaries.tolist() == [0, 255, 256] and ours.bucket_sizes.tolist() == [1, 1]
    assert ours.bucket_boundaries.dtype == torch.int64
    assert PEER.create_buckets(torch.tensor([0, 1], dtype=torch.int32), 9, 5).bucket_boundaries.dtype == torch.int32
    assert create_buckets(torch.tensor([0, 1], dtype=torch.int32), 9, 5).bucket_boundaries.dtype == torch.int64


def test_difference_booleans_are_not_numbers():
    assert PEER.create_buckets(torch.arange(3), True, 1).bucket_sizes.tolist() == [1, 1, 1]
    with pytest.raises(NotAnIntegerError, match="max_width must be an integer, got True of type bool"):
        create_buckets(torch.arange(3), True, 1)


def test_difference_nan_in_bucket_sizes_or_boundaries_is_refused():
    kwargs = {"base_batch_sampler_shared_kwargs": {"batch_size": 2, "drop_last": False}, "shuffle": False}
    nan = float("nan")
    with pytest.warns(UserWarning, match="1 elements are outside the buckets"):
        assert list(
            PEER.BucketBatchSampler(torch.tensor([1.0, nan, 2.0]), torch.tensor([0, 5]), BatchSampler, **kwargs)
        )
    with pytest.raises(ValueError, match=r"sizes must not hold NaN, got nan at position 1"):
        BucketBatchSampler(torch.tensor([1.0, nan, 2.0]), torch.tensor([0, 5]), BatchSampler, **kwargs)
    with pytest.raises(ValueError, match=r"bucket_boundaries must not hold NaN, got nan at position 0"):
        BucketBatchSampler(torch.tensor([1.0, 2.0]), torch.tensor([nan, 0.0, 5.0]), BatchSampler, **kwargs)


def test_difference_generator_is_checked_when_constructed():
    kwargs = {"base_batch_sampler_shared_kwargs": {"batch_size": 2, "drop_last": False}, "shuffle": False}
    assert list(PEER.BucketBatchSampler(torch.arange(3), torch.tensor([0, 5]), BatchSampler, generator=7, **kwargs))
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None, got int"):
        BucketBatchSampler(torch.arange(3), torch.tensor([0, 5]), BatchSampler, generator=7, **kwargs)


def test_difference_sizes_are_looked_up_ahead():
    looked_up: list[int] = []

    def sizeof(index: int) -> int:
        looked_up.append(index)
        if index == 3:
            raise KeyError(index)
        return 1

    peer_batches = []
    with pytest.raises(RuntimeError):
        for batch in PEER.SizeAwareBatchSampler(range(5), sizeof, 1):
            peer_batches.append(batch)
    assert peer_batches == [[0], [1]]  # bionemo yields the batches before the failing index
    looked_up.clear()
    our_batches = []
    with pytest.raises(RuntimeError, match="sizeof raised an error for index 3"):
        for batch in SizeAwareBatchSampler(range(5), sizeof, 1):
            our_batches.append(batch)
    assert our_batches == [] and looked_up == [0, 1, 2, 3]


def test_fastsab_exceptions_are_bionemo_compatible_types():
    assert issubclass(NotAnIntegerError, TypeError) and issubclass(NotAnIntegerError, ValueError)
    assert issubclass(NotASingleNumberError, TypeError) and issubclass(NotASingleNumberError, RuntimeError)
    assert issubclass(NoElementInBucketsError, ValueError) and issubclass(NoElementInBucketsError, RuntimeError)
