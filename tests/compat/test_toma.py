"""fastsab.compat.toma against toma 1.1 itself: the same calls, sizes, results and errors.

Each case runs a block that runs out of memory above a limit, in a loop of iterations with
their own limits (the execute-in-a-loop pattern, where the cache is the point), through toma
and through fastsab, in every form (``batch``, ``range``, ``chunked``), flavour (decorator,
``explicit``, ``execute``, ``simple``) and cache type. The logs of calls must be equal, but
for one deliberate difference: toma reruns a failed last chunk unchanged at every step above
its length, fastsab shrinks the step until the chunk gets shorter, so toma's consecutive
repeats of one failed chunk are collapsed before comparing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import toma as peer
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toma import batchsize_cache as peer_caches

from fastsab import adaptive
from fastsab.compat import toma as ours
from tests.test_differential import examples

OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"
CACHES = ["StacktraceMemoryBatchsizeCache", "GlobalBatchsizeCache", "NoBatchsizeCache"]
FLAVOURS = ["decorator", "explicit", "execute", "simple"]


@contextlib.contextmanager
def fresh_caches() -> Iterator[None]:
    """Forget every remembered size of both libraries; hold the available memory still."""
    peer.get_cache_for_context.cache_clear()
    adaptive.caches._context_slots.clear()
    saved = peer_caches.StacktraceMemoryBatchsizeCache.TRACK_RAM, adaptive.caches.available_memory
    collectors = peer.gc_cuda, adaptive.retry.free_memory
    # NOTE: both caches key sizes by the available memory; the machine's changes between two
    # iterations would make either start afresh at random. Neither library's garbage collection
    # (toma's after every call) is what these tests compare, and it makes long ranges slow.
    peer_caches.StacktraceMemoryBatchsizeCache.TRACK_RAM = False
    adaptive.caches.available_memory = lambda: 2**34
    peer.gc_cuda = adaptive.retry.free_memory = lambda error=None: None
    try:
        yield
    finally:
        peer_caches.StacktraceMemoryBatchsizeCache.TRACK_RAM, adaptive.caches.available_memory = saved
        peer.gc_cuda, adaptive.retry.free_memory = collectors
        peer.get_cache_for_context.cache_clear()
        adaptive.caches._context_slots.clear()


def cache_type(lib: Any, name: str) -> Any:
    return getattr(peer_caches if lib is peer else ours, name)


class Loop:
    """A block that runs out of memory on more than ``limit`` items, run once per iteration of a loop.

    The work functions (and their decorated forms) are made once, before the loop, as a user's
    code makes them; only the ``execute`` blocks are made anew in each iteration, as they are in
    a loop body. Every call is logged.
    """

    def __init__(self, lib: Any, form: str, flavour: str, cache_name: str, initial: int, end: int) -> None:
        self.lib, self.form, self.flavour, self.initial, self.end = lib, form, flavour, initial, end
        self.cache = cache_type(lib, cache_name)
        self.limit = 0
        self.log: list = []
        self.tensor = torch.arange(2 * end).reshape(2, end)
        self.work = {"batch": self.work_batch, "range": self.work_range, "chunked": self.work_chunk}[form]
        if flavour == "decorator":
            decorate = {
                "batch": lambda: lib.toma.batch(initial_batchsize=initial, cache_type=self.cache),
                "range": lambda: lib.toma.range(initial_step=initial, cache_type=self.cache),
                "chunked": lambda: lib.toma.chunked(initial_step=initial, cache_type=self.cache),
            }[form]
            self.decorated = decorate()(self.work)

    def work_batch(self, batchsize: int) -> int:
        self.log.append(batchsize)
        if batchsize > self.limit:
            raise RuntimeError(OOM_MESSAGE)
        return batchsize * 10

    def work_range(self, start: int, stop: int) -> None:
        self.log.append((start, stop))
        if stop - start > self.limit:
            raise RuntimeError(OOM_MESSAGE)

    def work_chunk(self, chunk: torch.Tensor, start: int, stop: int) -> None:
        assert torch.equal(chunk, self.tensor[:, start:stop])
        self.work_range(start, stop)

    def run(self, limits: list[int]) -> list:
        """The block in a loop, one iteration per limit, as a user's training or inference loop runs it.

        The loop is in a function, not at a module's top level: there toma's call-site context is
        empty, and it falls back to caching per function object (none across iterations).
        """
        outcomes: list = []
        for limit in limits:
            self.limit = limit
            self.log.append("iteration")
            try:
                outcomes.append(("returned", self.iteration()))
            except RuntimeError as error:
                outcomes.append(("raised", type(error), str(error)))
                break
        return outcomes

    def iteration(self) -> Any:
        lib, form, flavour, cache, initial, end, work = (
            self.lib,
            self.form,
            self.flavour,
            self.cache,
            self.initial,
            self.end,
            self.work,
        )
        if flavour == "decorator":
            # NOTE: toma 1.1 ignores the decorator's ``dimension`` (it passes the call's on); the call's works in both
            args = {"batch": (), "range": (0, end), "chunked": (self.tensor,)}[form]
            options = {"toma_dimension": 1} if form == "chunked" else {}
            return self.decorated(*args, **options)
        if flavour == "execute":
            return self.execute()
        if flavour == "explicit":
            if form == "batch":
                return lib.explicit.batch(work, initial, toma_cache_type=cache)
            if form == "range":
                return lib.explicit.range(work, 0, end, initial, toma_cache_type=cache)
            return lib.explicit.chunked(work, self.tensor, initial, toma_dimension=1, toma_cache_type=cache)
        if form == "batch":
            return lib.simple.batch(work, initial)
        if form == "range":
            return lib.simple.range(work, 0, end, initial)
        return lib.simple.chunked(work, self.tensor, initial, dimension=1)

    def execute(self) -> Any:
        lib, cache, initial, work = self.lib, self.cache, self.initial, self.work
        if self.form == "batch":

            @lib.toma.execute.batch(initial, cache_type=cache)
            def result(batchsize: int) -> int:
                return work(batchsize)

            return result
        if self.form == "range":

            @lib.toma.execute.range(0, self.end, initial, cache_type=cache)
            def _(start: int, stop: int) -> None:
                work(start, stop)

            return None

        @lib.toma.execute.chunked(self.tensor, initial, dimension=1, cache_type=cache)
        def _(chunk: torch.Tensor, start: int, stop: int) -> None:
            work(chunk, start, stop)

        return None


def run_loop(lib: Any, form: str, flavour: str, cache_name: str, initial: int, end: int, limits: list[int]):
    """The log of calls and the outcome of each iteration."""
    loop = Loop(lib, form, flavour, cache_name, initial, end)
    outcomes = loop.run(limits)
    return loop.log, outcomes


def without_repeated_failures(log: list) -> list:
    """``log`` without the calls that repeat the next one (toma's reruns of one failed chunk)."""
    return [
        call for call, following in zip(log, [*log[1:], None]) if not (isinstance(call, tuple) and call == following)
    ]


@pytest.mark.slow
@settings(max_examples=examples(150))
@given(
    form=st.sampled_from(["batch", "range", "chunked"]),
    flavour=st.sampled_from(FLAVOURS),
    cache_name=st.sampled_from(CACHES),
    initial=st.integers(1, 130),
    end=st.integers(0, 300),
    limits=st.lists(st.integers(0, 140), min_size=1, max_size=4),
)
def test_same_calls_results_and_errors_as_toma(form, flavour, cache_name, initial, end, limits):
    with fresh_caches():
        peer_log, peer_outcomes = run_loop(peer, form, flavour, cache_name, initial, end, limits)
    with fresh_caches():
        our_log, our_outcomes = run_loop(ours, form, flavour, cache_name, initial, end, limits)
    assert our_log == without_repeated_failures(peer_log)
    assert our_outcomes == peer_outcomes


@pytest.mark.parametrize("cache_name", ["StacktraceMemoryBatchsizeCache", "GlobalBatchsizeCache"])
@pytest.mark.parametrize("lib", [peer, ours], ids=["toma", "fastsab"])
def test_execute_in_a_loop_starts_where_the_last_run_ended(lib, cache_name):
    with fresh_caches():
        log, outcomes = run_loop(lib, "batch", "execute", cache_name, 64, 0, [20, 20])
    assert log == ["iteration", 64, 32, 16, "iteration", 16]
    assert outcomes == [("returned", 160), ("returned", 160)]


def test_the_default_cache_remembers_across_iterations_in_the_loaded_form():
    """The decorated default ``toma.batch``, the form of toma's README, in a loop over data."""
    tried = []

    @ours.toma.batch(initial_batchsize=512)
    def embed(batchsize, rows):
        tried.append(batchsize)
        if batchsize > 100:
            raise torch.OutOfMemoryError("CUDA out of memory (example)")
        return rows[:batchsize].sum()

    with fresh_caches():
        for rows in (torch.ones(600), torch.ones(700)):
            embed(rows)
    assert tried == [512, 256, 128, 64, 64]


def test_the_error_at_the_smallest_size_is_the_out_of_memory_error_itself():
    def fails(batchsize):
        raise torch.OutOfMemoryError(f"CUDA out of memory. At {batchsize}")

    with fresh_caches():
        with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory\. At 1") as peer_error:
            peer.simple.batch(fails, 4)
        with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory\. At 1") as our_error:
            ours.simple.batch(fails, 4)
    assert type(our_error.value) is type(peer_error.value)
    # NOTE: fastsab says what it tried
    assert isinstance(our_error.value.__cause__, adaptive.AdaptiveOOMError)
    assert our_error.value.__cause__.tried == [4, 2, 1]


@pytest.mark.parametrize("lib", [peer, ours], ids=["toma", "fastsab"])
def test_other_errors_pass_unchanged(lib):
    def broken(batchsize):
        raise ValueError(f"bad input at {batchsize}")

    with fresh_caches(), pytest.raises(ValueError, match="bad input at 8"):
        lib.explicit.batch(broken, 8)


@pytest.mark.parametrize("lib", [peer, ours], ids=["toma", "fastsab"])
def test_call_options_and_extra_arguments_reach_the_function(lib):
    seen = []

    @lib.toma.batch(initial_batchsize=16, cache_type=cache_type(lib, "NoBatchsizeCache"))
    def scaled(batchsize, x, *, y):
        seen.append((batchsize, x, y))
        return batchsize

    with fresh_caches():
        assert scaled("x", y="y") == 16
        assert scaled("x", y="y", toma_initial_batchsize=4) == 4
        lib.explicit.range(lambda start, stop, z: seen.append((start, stop, z)), 0, 3, 2, "z")
    assert seen == [(16, "x", "y"), (4, "x", "y"), (0, 2, "z"), (2, 3, "z")]


# -- where fastsab deliberately differs ----------------------------------------------------------


def failing_last_chunk_log(lib: Any) -> list:
    log: list = []

    def work(start, stop):
        log.append((start, stop))
        if stop > 64 and stop - start > 1:  # the items from 64 on are large: one at a time
            raise RuntimeError(OOM_MESSAGE)

    with fresh_caches():
        lib.simple.range(work, 0, 69, 64)  # [0, 64) fits; the short last chunk [64, 69) does not
    return log


def test_a_failed_short_chunk_is_not_rerun_unchanged():
    peer_log, our_log = failing_last_chunk_log(peer), failing_last_chunk_log(ours)
    assert peer_log[:5] == [(0, 64), (64, 69), (64, 69), (64, 69), (64, 69)]  # steps 64, 32, 16 and 8
    assert our_log[:3] == [(0, 64), (64, 69), (64, 68)]  # the step goes from 64 to 4 at once
    assert our_log == without_repeated_failures(peer_log)


def test_a_new_lambda_in_each_iteration_keeps_the_size():
    """toma remembers sizes per function object; fastsab per code, which a fresh lambda keeps."""

    def loop(lib):
        tried = []

        def step(batchsize):
            tried.append(batchsize)
            if batchsize > 20:
                raise RuntimeError(OOM_MESSAGE)

        for _ in range(2):
            lib.explicit.batch(lambda batchsize: step(batchsize), 64)
        return tried

    with fresh_caches():
        assert loop(peer) == [64, 32, 16, 64, 32, 16]
    with fresh_caches():
        assert loop(ours) == [64, 32, 16, 16]


def test_decorator_dimension_and_explicit_arguments_are_honoured():
    """toma 1.1 chunks along dimension 0 whatever the decorator says, and its explicit.chunked
    fails on extra arguments; fastsab does what the call says."""
    tensor = torch.arange(6).reshape(2, 3)
    chunks = []

    @ours.toma.chunked(initial_step=2, dimension=1, cache_type=ours.NoBatchsizeCache)
    def collect(chunk, start, stop, tag):
        chunks.append((chunk.tolist(), start, stop, tag))

    collect(tensor, "t")
    assert chunks == [([[0, 1], [3, 4]], 0, 2, "t"), ([[2], [5]], 2, 3, "t")]
    with pytest.raises(TypeError):
        peer.explicit.chunked(lambda chunk, start, stop, tag: None, tensor, 2, "t")
    ours.explicit.chunked(lambda chunk, start, stop, tag: chunks.append(tag), tensor, 2, "u")
    assert chunks[-1] == "u"


def test_cudnn_not_supported_is_not_out_of_memory():
    """toma halves the batch on cuDNN's NOT_SUPPORTED; a smaller batch does not cure it."""
    error = RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")
    assert peer.should_reduce_batch_size(error) and not ours.should_reduce_batch_size(error)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: ours.simple.batch(len, 0), ValueError, r"initial_batchsize must be a positive integer, got 0"),
        (lambda: ours.simple.batch(len, 8.0), TypeError, r"initial_batchsize must be an integer, got 8\.0"),
        (
            lambda: ours.toma.batch(len)(),
            TypeError,
            r"toma_initial_batchsize or initial_batchsize must be an integer, got None",
        ),
        (lambda: ours.explicit.range(len, 0, 4, None), TypeError, r"initial_step must be an integer, got None"),
        (
            lambda: ours.explicit.batch(len, 4, toma_cache_type=peer_caches.GlobalBatchsizeCache),
            TypeError,
            r"toma_cache_type must be a cache class \(StacktraceMemoryBatchsizeCache",
        ),
        (lambda: ours.toma.execute.batch(4, context=[1])(len), TypeError, r"context must be hashable, got \[1\]"),
        (
            lambda: ours.toma.batch(64),
            TypeError,
            r"toma\.batch takes its options by keyword \(initial_batchsize=64\); func must be a function, got 64",
        ),
        (lambda: ours.toma.range(8), TypeError, r"toma\.range takes .* \(initial_step=8\); func .* got 8"),
        (lambda: ours.toma.chunked(8), TypeError, r"toma\.chunked takes .* \(initial_step=8\); func .* got 8"),
    ],
)
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("lib", [peer, ours], ids=["toma", "fastsab"])
def test_two_models_of_one_class_keep_their_sizes_apart(lib):
    class Model(torch.nn.Module):
        def __init__(self, limit: int) -> None:
            super().__init__()
            self.limit, self.sizes = limit, []

        def forward(self, batchsize: int) -> int:
            self.sizes.append(batchsize)
            if batchsize > self.limit:
                raise RuntimeError(OOM_MESSAGE)
            return batchsize

    small, large = Model(4), Model(100)
    with fresh_caches():
        for model in (small, large):
            lib.explicit.batch(model, 64, toma_cache_type=cache_type(lib, "GlobalBatchsizeCache"))
            lib.explicit.batch(model.forward, 64, toma_cache_type=cache_type(lib, "GlobalBatchsizeCache"))
    assert large.sizes == [64, 64]


def test_generator_functions_are_refused_when_decorated():
    def rows(batchsize):
        yield batchsize

    for decorate in (ours.toma.batch(initial_batchsize=4), ours.toma.range(initial_step=4)):
        with pytest.raises(TypeError, match=r"rows is a generator function; toma\.(batch|range) cannot retry it"):
            decorate(rows)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda t: ours.explicit.chunked(print, t, 2, toma_dimension=2), ValueError, r"^toma_dimension=2 is out of"),
        (lambda t: ours.explicit.chunked(print, t, 2, toma_dimension=1.0), TypeError, r"^toma_dimension must be an"),
        (lambda t: ours.simple.chunked(print, t, 2, dimension=-3), ValueError, r"^dimension=-3 is out of range"),
        (lambda t: ours.toma.execute.chunked(t, 2, dimension=5)(print), ValueError, r"^dimension=5 is out of range"),
        (
            lambda t: ours.toma.chunked(initial_step=2, dimension=5)(print)(t),
            ValueError,
            r"^toma_dimension or dimension=5 is out of range for a tensor of shape \(3, 4\)",
        ),
    ],
)
def test_a_bad_dimension_is_named_as_the_call_names_it(call, error, message):
    with pytest.raises(error, match=message):
        call(torch.ones(3, 4))


def test_the_call_initial_size_is_a_ceiling_and_only_out_of_memory_lowers_the_size():
    """toma starts every call at the cached size, whatever the call's own initial size says."""

    def loop(lib):
        seen = []

        @lib.toma.batch(initial_batchsize=64, cache_type=cache_type(lib, "GlobalBatchsizeCache"))
        def step(batchsize):
            seen.append(batchsize)

        step()
        step(toma_initial_batchsize=8)
        step(toma_initial_batchsize=128)
        return seen

    with fresh_caches():
        assert loop(peer) == [64, 64, 64]
    with fresh_caches():
        assert loop(ours) == [64, 8, 128]


def test_every_name_of_the_module_is_the_one_its_parts_define():
    from fastsab.compat import _toma_calls

    assert ours.__all__ == [
        "DEFAULT_CACHE_TYPE",
        "GlobalBatchsizeCache",
        "NoBatchsizeCache",
        "StacktraceMemoryBatchsizeCache",
        "explicit",
        "should_reduce_batch_size",
        "simple",
        "toma",
    ]
    for name in ours.__all__[:-1]:
        assert getattr(ours, name) is getattr(_toma_calls, name)
    assert ours.NoBatchsizeCache is adaptive.NoCache and ours.GlobalBatchsizeCache is adaptive.GlobalCache
    assert ours.StacktraceMemoryBatchsizeCache is ours.DEFAULT_CACHE_TYPE is adaptive.StackMemoryCache
