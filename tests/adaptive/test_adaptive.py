from __future__ import annotations

import functools
import gc
import io
import json
import resource
import subprocess
import sys
import textwrap
import types
import warnings
import weakref

import numpy as np
import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader, adaptive
from fastsab.adaptive import AdaptiveOOMError, GlobalCache, NoCache, StackMemoryCache

OOM = torch.OutOfMemoryError
# NOTE: taken before the autouse fixture below holds the available memory still
HOST_AVAILABLE_MEMORY = adaptive.caches.available_memory


class Workload:
    """A function that runs out of memory above a limit and records the sizes it was called with."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sizes: list[int] = []

    def __call__(self, batch_size: int, *args, **kwargs):
        self.sizes.append(batch_size)
        if batch_size > self.limit:
            raise OOM(f"CUDA out of memory. Tried to allocate {batch_size} MiB")
        return batch_size, args, kwargs


def make(cache, limit=100, **options):
    work = Workload(limit)
    return work, adaptive.batch(work, initial_batch_size=512, cache=cache, **options)


def call_site_a(fn):
    return fn()


def call_site_b(fn):
    return fn()


# --- the toma behaviours: sizes tried per cache type -------------------------------------------


def test_no_cache_starts_from_the_initial_size_every_time():
    work, fn = make(NoCache)
    assert fn() == (64, (), {})
    assert work.sizes == [512, 256, 128, 64]
    fn()
    assert work.sizes[4:] == [512, 256, 128, 64]


def test_global_cache_reuses_the_last_size_everywhere():
    work, fn = make(GlobalCache)
    call_site_a(fn)
    call_site_b(fn)
    assert work.sizes == [512, 256, 128, 64, 64]


@pytest.fixture(autouse=True)
def steady_memory(monkeypatch):
    # the host's available memory moves with everything else running; hold it still. Every test
    # starts with no size remembered for a context (explicit and execute forms)
    monkeypatch.setattr(adaptive.caches, "available_memory", lambda: 8 * 2**30)
    adaptive.caches._context_slots.clear()


def test_stack_memory_cache_is_per_call_site_and_memory(monkeypatch):
    work, fn = make("default")
    # NOTE: every call from one line of this test: only the site function and the memory tell them apart
    calls = [(call_site_a, 8 * 2**30)] * 2 + [(call_site_b, 8 * 2**30), (call_site_a, 10**12)]
    for site, memory in calls:  # one call site, as in a training loop; another site; another memory bucket
        monkeypatch.setattr(adaptive.caches, "available_memory", lambda memory=memory: memory)
        site(fn)
    assert work.sizes[:5] == [512, 256, 128, 64, 64]
    assert work.sizes[5:9] == [512, 256, 128, 64]  # another call site starts over
    assert work.sizes[9:] == [512, 256, 128, 64]  # another memory bucket starts over


def test_stack_memory_cache_keeps_two_lines_of_a_loop_apart():
    work, fn = make("default")
    for _ in range(3):
        fn()  # one call site, every iteration
        fn()  # another call site
    # NOTE: each line shrinks once to 64, then starts there in the next iterations
    assert work.sizes == [512, 256, 128, 64] * 2 + [64, 64] * 2


def through_one_caller(fn):
    return call_site_a(fn)


def through_another_caller(fn):
    return call_site_a(fn)


def test_stack_memory_cache_keeps_the_callers_of_one_call_site_apart():
    work, fn = make("default")
    for _ in range(2):
        through_one_caller(fn)  # fn is called from call_site_a both times: only the caller's caller differs
        through_another_caller(fn)
    # NOTE: each caller shrinks once to 64, then starts there
    assert work.sizes == [512, 256, 128, 64] * 2 + [64, 64]


def nested(levels, fn):
    """``fn(sys._getframe())`` called ``levels`` frames down from here, through two alternating functions."""
    return fn(sys._getframe()) if levels == 0 else (nested if levels % 2 else nested_other)(levels - 1, fn)


def nested_other(levels, fn):
    return fn(sys._getframe()) if levels == 0 else nested(levels - 1, fn)


@pytest.mark.parametrize("depth", [1, 2, 7, 8, 9, 15, 16, 17, 40])
def test_stack_memory_cache_key_tells_stacks_apart_as_call_site_does(depth):
    cache = StackMemoryCache(depth=depth)
    frames = []  # stacks of 0 to 24 frames below this test, which differ from one another at every depth
    for levels in range(25):
        for variant in (nested, nested_other):
            frames += variant(levels, lambda frame: [(frame, cache.key(frame), adaptive.call_site(frame, depth))])
    for frame, key, site in frames:
        for other_frame, other_key, other_site in frames:
            assert (key == other_key) == (site == other_site), (depth, frame, other_frame)
    assert len({site for _, _, site in frames}) > 1


def test_stack_memory_cache_key_follows_the_file_and_line_not_the_code_object():
    source = "def call(fn):\n    return fn(__import__('sys')._getframe())\n"
    calls = []
    for _ in range(2):  # the same source compiled twice: two code objects with the same file and lines
        namespace = {}
        exec(compile(source, "<recompiled>", "exec"), namespace)
        calls.append(namespace["call"])
    assert calls[0].__code__ is not calls[1].__code__
    cache = StackMemoryCache()
    keys = [call(cache.key) for call in calls]  # both from this line
    assert keys[0] == keys[1]


def test_stack_memory_cache_holds_the_code_of_the_stacks_it_knows():
    # NOTE: a stack is known by the ids of its code objects; a code object that no longer existed could
    # hand its id to another one, which would then be taken for it
    namespace = {}
    exec(compile("def call(fn):\n    return fn(__import__('sys')._getframe())\n", "<dropped>", "exec"), namespace)
    code = weakref.ref(namespace["call"].__code__)
    namespace["call"](StackMemoryCache().key)
    namespace.clear()
    gc.collect()
    assert code() is not None


def test_stack_memory_cache_forgets_stacks_beyond_its_capacity(monkeypatch):
    monkeypatch.setattr(adaptive.caches, "_sites", {})
    monkeypatch.setattr(adaptive.caches, "_SITES_CAPACITY", 4)
    cache = StackMemoryCache()
    keys = [[nested(levels, cache.key) for levels in range(10)] for _ in range(3)]  # every stack, three times
    assert len(adaptive.caches._sites) <= 4
    assert keys[0] == keys[1] == keys[2]  # worked out again, or remembered: the same keys
    assert len(set(keys[0])) == 10


def test_sizes_of_other_integer_types_from_a_custom_cache_are_taken_as_ints():
    class Fixed(adaptive.BatchSizeCache):
        def __init__(self, size):
            super().__init__()
            self.size = size

        def get(self, key, initial):
            return self.size

    work = Workload(1000)
    fn = adaptive.batch(work, initial_batch_size=512, cache=Fixed(np.int64(16)))
    fn()
    assert work.sizes == [16] and type(work.sizes[0]) is int
    fn.adaptive.cache = Fixed(True)
    with pytest.raises(TypeError, match=r"Fixed\.get returned True of type bool; a cache must return an integer size"):
        fn()


class FakeMeminfo:
    """Stands for ``open`` in the caches module: serves /proc/meminfo with a given MemAvailable, counting reads."""

    def __init__(self) -> None:
        self.kib = 1000
        self.reads = 0

    def __call__(self, path, mode="r"):
        assert path == "/proc/meminfo"
        self.reads += 1
        return io.BytesIO(b"MemTotal: 9999999 kB\nMemAvailable: " + str(self.kib).encode() + b" kB\n")


def test_host_memory_is_read_once_per_interval(monkeypatch):
    meminfo, clock = FakeMeminfo(), [1000.0]
    monkeypatch.setattr(adaptive.caches, "open", meminfo, raising=False)
    monkeypatch.setattr(adaptive.caches, "time", types.SimpleNamespace(monotonic=lambda: clock[0]), raising=False)
    monkeypatch.setattr(adaptive.caches, "_host_reading", (float("-inf"), 0), raising=False)
    monkeypatch.setattr(adaptive.caches, "_cuda_initialized", lambda: False)
    assert [HOST_AVAILABLE_MEMORY() for _ in range(100)] == [1000 * 1024] * 100
    assert meminfo.reads == 1
    meminfo.kib, clock[0] = 2000, clock[0] + 0.01
    assert HOST_AVAILABLE_MEMORY() == 1000 * 1024  # a reading 10 ms old is reused
    clock[0] += 1.0
    assert HOST_AVAILABLE_MEMORY() == 2000 * 1024  # an older one is read again
    assert meminfo.reads == 2
    clock[0] -= 10.0  # a reading from the future (a clock that went back) is not trusted either
    meminfo.kib = 3000
    assert HOST_AVAILABLE_MEMORY() == 3000 * 1024


def test_default_cache_can_be_changed_at_run_time():
    work, fn = make("default")
    try:
        adaptive.set_default_cache(GlobalCache)
        for site in (call_site_a, call_site_b):
            site(fn)
        assert work.sizes == [512, 256, 128, 64, 64]
    finally:
        adaptive.set_default_cache(StackMemoryCache)
    fn.adaptive.cache = NoCache
    fn()
    assert work.sizes[5:] == [512, 256, 128, 64]


def test_grow_back_after_successes():
    work, fn = make(GlobalCache(grow_after=2))
    fn()
    fn()
    work.limit = 1000  # memory became available
    fn()
    fn()
    fn()
    # two successes at 64 grow it to 128, two at 128 to 256
    assert work.sizes == [512, 256, 128, 64, 64, 128, 128, 256]


def test_arguments_are_passed_and_factor_and_minimum_apply():
    work, fn = make(None, factor=4)
    assert fn(1, key="v") == (32, (1,), {"key": "v"})
    assert work.sizes == [512, 128, 32]
    work, fn = make(None, limit=0, min_batch_size=100)
    with pytest.raises(
        AdaptiveOOMError, match=r"ran out of memory at every size tried \(512, 256, 128, 100\); the minimum is 100"
    ):
        fn()
    assert work.sizes == [512, 256, 128, 100]


def test_other_errors_propagate_unchanged():
    error = ValueError("not a memory problem")

    @adaptive.batch(initial_batch_size=8, cache=None)
    def fn(batch_size):
        raise error

    with pytest.raises(ValueError) as raised:
        fn()
    assert raised.value is error


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 3.00 GB, other allocations: 1.00 GB)"),
        RuntimeError("XPU out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes."),
        MemoryError(),
        OOM("CUDA out of memory."),
    ],
)
def test_every_backend_message_triggers_a_retry(error):
    sizes = []

    @adaptive.batch(initial_batch_size=4, cache=None)
    def fn(batch_size):
        sizes.append(batch_size)
        if batch_size > 1:
            raise error
        return batch_size

    assert fn() == 1 and sizes == [4, 2, 1]


@pytest.mark.parametrize(
    "message",
    [
        "not enough memory in my cache",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
    ],
)
def test_errors_that_only_mention_memory_are_not_retried(message):
    sizes = []

    @adaptive.batch(initial_batch_size=4, cache=None)
    def fn(batch_size):
        sizes.append(batch_size)
        raise RuntimeError(message)

    with pytest.raises(RuntimeError) as raised:
        fn()
    assert str(raised.value) == message and sizes == [4]


def test_the_failed_attempt_is_freed_before_the_retry():
    refs = []

    class Big:
        pass

    @adaptive.batch(initial_batch_size=2, cache=None)
    def fn(batch_size):
        if refs:
            gc.disable()  # only the clearing of the failed frame can free it now
            try:
                alive = refs[-1]() is not None
            finally:
                gc.enable()
            return alive
        held = Big()  # a local of the failing frame, like an activation tensor
        refs.append(weakref.ref(held))
        raise OOM("CUDA out of memory.")

    assert fn() is False


def test_range_retries_the_failed_chunk_and_covers_everything_once():
    chunks = []

    @adaptive.range(initial_step=256, cache=None)
    def fn(start, end, out):
        if end - start > 100:
            raise OOM("CUDA out of memory.")
        chunks.append((start, end))
        out[start:end] += 1

    out = torch.zeros(1000)
    fn(0, 1000, out)
    assert bool((out == 1).all())
    assert chunks[0] == (0, 64) and all(b - a <= 64 for a, b in chunks)
    assert [a for a, _ in chunks] == sorted({a for a, _ in chunks})


def test_chunked_along_a_dimension():
    x = torch.arange(24.0).reshape(2, 12)
    out = torch.zeros_like(x)

    @adaptive.chunked(initial_step=8, dim=1, cache=None)
    def double(chunk, start, end, out):
        if chunk.shape[1] > 3:
            raise OOM("CUDA out of memory.")
        out[:, start:end] = 2 * chunk

    double(x, out)
    assert torch.equal(out, 2 * x)
    with pytest.raises(TypeError, match="the first argument must be a tensor to chunk, got list"):
        double([1], out)


def test_a_size_that_ran_out_of_memory_is_remembered_even_if_the_call_then_fails():
    tried = []

    @adaptive.batch(initial_batch_size=64, cache=adaptive.GlobalCache)
    def fn(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise OOM("CUDA out of memory.")
        raise ValueError("a bug after the allocation")

    with pytest.raises(ValueError, match="a bug after the allocation"):
        fn()
    with pytest.raises(ValueError, match="a bug after the allocation"):
        fn()
    assert tried == [64, 32, 16, 16]


def test_a_call_that_asks_for_less_does_not_lower_the_remembered_size():
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise OOM("CUDA out of memory.")

    for initial in (64, 8, 64, 128):
        adaptive.explicit.batch(step, initial, adaptive_cache=GlobalCache)
    # 16 is remembered from the first call; the call that asked for 8 ran at 8 and left it so
    assert tried == [64, 32, 16, 8, 16, 16]
    tried.clear()
    for initial in (8, 64):  # no size ran out of memory: nothing is remembered, each starts at its own
        adaptive.explicit.batch(step, initial, adaptive_cache=GlobalCache, adaptive_context="fresh")
    assert tried == [8, 64, 32, 16]


def execute_in_a_loop(form, cache, limit, iterations=2):
    """The run-at-once forms in the body of a loop: a new block function in every iteration."""
    tried = []
    for _ in range(iterations):
        if form == "batch":

            @adaptive.execute.batch(initial_batch_size=64, cache=cache)
            def _(batch_size):
                tried.append(batch_size)
                if batch_size > limit:
                    raise OOM("CUDA out of memory.")

        elif form == "range":

            @adaptive.execute.range(0, 64, initial_step=64, cache=cache)
            def _(start, end):
                tried.append(end - start)
                if end - start > limit:
                    raise OOM("CUDA out of memory.")

        else:

            @adaptive.execute.chunked(torch.zeros(3, 64), initial_step=64, dim=1, cache=cache)
            def _(chunk, start, end):
                tried.append(chunk.shape[1])
                if end - start > limit:
                    raise OOM("CUDA out of memory.")

    return tried


@pytest.mark.parametrize("form", ["batch", "range", "chunked"])
@pytest.mark.parametrize("cache", ["default", adaptive.GlobalCache, adaptive.StackMemoryCache])
def test_execute_in_a_loop_starts_where_the_last_iteration_ended(form, cache):
    tried = execute_in_a_loop(form, cache, 20)
    if form == "batch":
        assert tried == [64, 32, 16, 16]
    else:
        assert tried == [64, 32, 16, 16, 16, 16, 16, 16, 16, 16]  # 4 chunks of 16, then 4 again


def test_execute_without_a_cache_starts_afresh_and_a_given_context_shares_sizes():
    assert execute_in_a_loop("batch", None, 20) == [64, 32, 16, 64, 32, 16]
    tried = []

    def block(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise OOM("CUDA out of memory.")

    adaptive.execute.batch(initial_batch_size=64, context="embed", cache=adaptive.GlobalCache)(block)
    adaptive.execute.batch(initial_batch_size=64, context="embed", cache=adaptive.GlobalCache)(block)  # other line
    adaptive.execute.batch(initial_batch_size=64, context="other", cache=adaptive.GlobalCache)(block)
    assert tried == [64, 32, 16, 16, 64, 32, 16]


def test_explicit_forms_remember_sizes_per_code():
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise OOM("CUDA out of memory.")
        return batch_size

    for _ in range(2):  # a new lambda in each iteration: the same code
        assert adaptive.explicit.batch(lambda batch_size: step(batch_size), 64) == 16
    assert tried == [64, 32, 16, 16]
    tried.clear()
    # NOTE: GlobalCache: the default cache also keys by the call site, and these are two lines
    assert adaptive.explicit.batch(step, 64, adaptive_cache=GlobalCache) == 16
    assert adaptive.explicit.batch(functools.partial(step), 64, adaptive_cache=GlobalCache) == 16  # step's code
    assert adaptive.explicit.batch(step, 64, adaptive_cache=None) == 16  # no cache: from the initial size
    assert tried == [64, 32, 16, 16, 64, 32, 16]
    tried.clear()
    for _ in range(2):
        adaptive.explicit.range(lambda start, end: step(end - start), 0, 40, 64, adaptive_context="mine")
    assert tried == [40, 32, 16, 16, 8, 16, 16, 8]  # the second call starts at 16


def test_code_contexts():
    class Model:
        def forward(self, batch_size):
            return batch_size

        def __call__(self, batch_size):
            return batch_size

    a, b = Model(), Model()
    code = (__file__, Model.forward.__code__)
    assert adaptive.code_context(Model.forward) == code
    assert adaptive.code_context(a.forward) == adaptive.code_context(a.forward) == (code, weakref.ref(a))
    assert adaptive.code_context(a.forward) != adaptive.code_context(b.forward)
    assert adaptive.code_context(functools.partial(a.forward, 1)) == adaptive.code_context(a.forward)
    assert adaptive.code_context(a) == weakref.ref(a) != adaptive.code_context(b)
    assert adaptive.code_context(len) is len and adaptive.code_context(int) is int
    assert adaptive.code_context([].append) == ("list.append", list)  # unhashable: per class


def test_explicit_forms_keep_the_sizes_of_each_callable_object_and_bound_method_apart():
    class Model:
        def __init__(self, limit):
            self.limit, self.sizes = limit, []

        def __call__(self, batch_size):
            self.sizes.append(batch_size)
            if batch_size > self.limit:
                raise OOM("CUDA out of memory.")
            return batch_size

        def forward(self, batch_size):
            return self(batch_size)

    small, large = Model(4), Model(100)
    for model in (small, large, small):  # a loop over models, one line
        adaptive.explicit.batch(model, 64, adaptive_cache=GlobalCache)
        adaptive.explicit.batch(model.forward, 64, adaptive_cache=GlobalCache)  # a new bound method each time
    assert large.sizes == [64, 64]  # not the small model's 4
    assert small.sizes == [64, 32, 16, 8, 4, 64, 32, 16, 8, 4, 4, 4]
    alive = weakref.ref(small)
    del small, model
    gc.collect()
    assert alive() is None  # remembered, not kept alive


def test_explicit_forms_keep_the_sizes_of_equal_code_in_two_files_apart():
    source = "\n".join(["def step(batch_size):", "    return work(batch_size)"])
    tasks = [{"work": Workload(4)}, {"work": Workload(100)}]
    for task, file in zip(tasks, ["task_a.py", "task_b.py"]):
        exec(compile(source, file, "exec"), task)
    assert tasks[0]["step"].__code__ == tasks[1]["step"].__code__  # Python's equality ignores the file
    for task in tasks:
        adaptive.explicit.batch(task["step"], 64, adaptive_cache=GlobalCache)
    assert tasks[1]["work"].sizes == [64]


def test_the_cache_does_not_keep_a_block_or_what_it_holds_alive():
    def run_once():
        data = torch.zeros(8)
        adaptive.explicit.batch(lambda batch_size: data[:batch_size].sum(), 4)
        return weakref.ref(data)

    alive = run_once()
    gc.collect()
    assert alive() is None and adaptive.caches._context_slots  # sizes are remembered, the data is not


def test_contexts_beyond_the_capacity_forget_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(adaptive.caches, "_CONTEXT_CAPACITY", 2)
    tried = []

    def block(batch_size):
        tried.append(batch_size)
        if batch_size > 20:
            raise OOM("CUDA out of memory.")

    for context in ["a", "b", "a", "c", "a", "b"]:  # "c" pushes out "b", the least recently used
        adaptive.explicit.batch(block, 64, adaptive_context=context, adaptive_cache=adaptive.GlobalCache)
    assert tried == [64, 32, 16] * 2 + [16] + [64, 32, 16] + [16] + [64, 32, 16]
    assert len(adaptive.caches._context_slots) == 2


def test_explicit_and_execute_forms():
    work = Workload(10)
    assert adaptive.explicit.batch(work, 64, "a")[0] == 8 and work.sizes == [64, 32, 16, 8]
    seen = []
    adaptive.explicit.range(lambda a, b: seen.append((a, b)), 0, 5, 2)
    assert seen == [(0, 2), (2, 4), (4, 5)]
    parts = []
    adaptive.explicit.chunked(lambda c, a, b: parts.append(c.tolist()), torch.arange(3), 2)
    assert parts == [[0, 1], [2]]

    @adaptive.execute.batch(initial_batch_size=16, cache=None)
    def result(batch_size):
        if batch_size > 5:
            raise OOM("CUDA out of memory.")
        return batch_size

    assert result == 4
    ranges = []

    @adaptive.execute.range(0, 10, initial_step=4, cache=None)
    def _(start, end):
        ranges.append((start, end))

    assert ranges == [(0, 4), (4, 8), (8, 10)]


def gen(batch_size):
    yield batch_size


async def coro(batch_size):
    return batch_size


async def agen(batch_size):
    yield batch_size


@pytest.mark.parametrize(
    ("make_fn", "error", "message"),
    [
        (
            lambda: adaptive.batch(len, initial_batch_size=0),
            ValueError,
            r"initial_batch_size must be a positive integer, got 0\.",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, min_batch_size=8),
            ValueError,
            r"min_batch_size \(8\) must not exceed initial_batch_size \(4\)\.",
        ),
        (
            lambda: adaptive.range(len, initial_step=4, min_step=0),
            ValueError,
            r"min_step must be a positive integer, got 0\.",
        ),
        (
            lambda: adaptive.chunked(len, initial_step=2.5),
            TypeError,
            r"initial_step must be an integer, got 2\.5 of type float\.",
        ),
        (lambda: adaptive.explicit.batch(len, 0), ValueError, r"initial_batch_size must be a positive integer, got 0"),
        (lambda: adaptive.explicit.range(len, 0, 4, 0), ValueError, r"initial_step must be a positive integer, got 0"),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, factor=1),
            ValueError,
            r"factor must be a finite number > 1, got 1\.",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, factor=float("inf")),
            ValueError,
            r"factor must be a finite number > 1, got inf\.",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, factor=float("nan")),
            ValueError,
            r"factor must be a finite number > 1, got nan\.",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, factor="2"),
            TypeError,
            r"factor must be a number, got '2' of type str\.",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, cache="lru"),
            TypeError,
            r"cache must be 'default', None, a BatchSizeCache or its class, got 'lru'",
        ),
        (
            lambda: adaptive.batch(len, initial_batch_size=4, cache=np.array([1, 2])),
            TypeError,
            r"cache must be 'default', None, a BatchSizeCache or its class, got array\(\[1, 2\]\)",
        ),
        (lambda: adaptive.batch(3, initial_batch_size=4), TypeError, r"func must be callable, got 3 of type int\."),
        (
            lambda: adaptive.chunked(len, initial_step=4, dim="1"),
            TypeError,
            r"dim must be an integer, got '1' of type str\.",
        ),
        (lambda: GlobalCache(grow_after=0), ValueError, r"grow_after must be a positive integer, got 0"),
        (lambda: adaptive.set_cpu_memory_limit(0), ValueError, r"gib must be a positive number or math\.inf"),
        (lambda: adaptive.set_cpu_memory_limit("4"), TypeError, r"gib must be a number, got '4' of type str\."),
        (lambda: adaptive.set_default_cache(3), TypeError, r"cache must be a BatchSizeCache class or factory, got 3"),
        (
            lambda: adaptive.set_default_cache(dict),
            TypeError,
            r"cache must be a BatchSizeCache class or factory, got <class 'dict'>",
        ),
    ],
)
def test_bad_arguments(make_fn, error, message):
    with pytest.raises(error, match=message):
        make_fn()


# --- lazy work: generators and coroutines run after the call returns, outside the retry ------------


@pytest.mark.parametrize(
    ("decorate", "what"),
    [
        (lambda f: adaptive.batch(f, initial_batch_size=4), "adaptive.batch"),
        (lambda f: adaptive.range(f, initial_step=4), "adaptive.range"),
        (lambda f: adaptive.chunked(f, initial_step=4), "adaptive.chunked"),
        (lambda f: adaptive.explicit.batch(f, 4), "adaptive.explicit.batch"),
        (lambda f: adaptive.explicit.range(f, 0, 8, 4), "adaptive.explicit.range"),
        (lambda f: adaptive.explicit.chunked(f, torch.zeros(8), 4), "adaptive.explicit.chunked"),
        (lambda f: adaptive.execute.batch(initial_batch_size=4)(f), "adaptive.batch"),
        (lambda f: adaptive.execute.range(0, 8, initial_step=4)(f), "adaptive.range"),
    ],
)
@pytest.mark.parametrize(
    ("func", "kind"),
    [(gen, "a generator function"), (agen, "an async generator function"), (coro, r"a coroutine function")],
)
def test_generator_and_async_functions_are_refused(decorate, what, func, kind):
    with pytest.raises(TypeError, match=rf"^{func.__qualname__} is {kind}.*; {what} cannot retry it"):
        decorate(func)


def test_the_refusal_says_what_to_do_instead():
    with pytest.raises(TypeError) as raised:
        adaptive.batch(gen, initial_batch_size=4)
    message = str(raised.value)
    assert "would repeat the items already yielded" in message
    assert "Return a list" in message and "adaptive.range" in message


def test_a_generator_returned_by_a_plain_function_is_refused_and_not_run():
    started = []

    def lazy(batch_size):
        def items():
            started.append(batch_size)
            yield batch_size

        return items()

    fn = adaptive.batch(lazy, initial_batch_size=4, cache=None)
    with pytest.raises(TypeError, match=r"lazy returned a generator; adaptive\.batch cannot retry"):
        fn()
    ranged = adaptive.range(lambda start, end: lazy(end - start), initial_step=4, cache=None)
    with pytest.raises(TypeError, match=r"returned a generator; adaptive\.range cannot retry"):
        ranged(0, 8)  # the chunk's work would silently never run
    assert started == []


def test_a_callable_object_whose_call_is_a_generator_is_refused():
    class Steps:
        def __call__(self, batch_size):
            yield batch_size

    with pytest.raises(TypeError, match=r"is a generator function"):
        adaptive.batch(Steps(), initial_batch_size=4)


# --- caches ---------------------------------------------------------------------------------------


def test_a_cache_shared_by_two_functions_keeps_their_sizes_apart():
    shared = GlobalCache()
    big = adaptive.batch(Workload(1000), initial_batch_size=512, cache=shared)
    small_work = Workload(1000)
    small = adaptive.batch(small_work, initial_batch_size=8, cache=shared)
    big()
    small()
    assert small_work.sizes == [8]  # not the 512 that worked for the other function


def test_sizes_a_custom_cache_returns_are_kept_within_the_bounds():
    class Wild(adaptive.BatchSizeCache):
        def __init__(self, size):
            super().__init__()
            self.size = size

        def get(self, key, initial):
            return self.size

    work = Workload(1000)
    fn = adaptive.batch(work, initial_batch_size=512, min_batch_size=4, cache=Wild(10**6))
    fn()
    fn.adaptive.cache = Wild(1)
    fn()
    assert work.sizes == [512, 4]
    fn.adaptive.cache = Wild("big")
    with pytest.raises(TypeError, match=r"Wild\.get returned 'big' of type str; a cache must return an integer size"):
        fn()


def test_the_cache_can_be_set_back_to_the_default():
    work, fn = make(NoCache)
    fn.adaptive.cache = "default"
    try:
        adaptive.set_default_cache(GlobalCache)
        call_site_a(fn)
        call_site_b(fn)
    finally:
        adaptive.set_default_cache(StackMemoryCache)
    assert work.sizes == [512, 256, 128, 64, 64]


def test_a_default_cache_factory_must_make_a_cache():
    fn = adaptive.batch(Workload(10), initial_batch_size=8)
    try:
        adaptive.set_default_cache(lambda: "not a cache")
        with pytest.raises(TypeError, match=r"the default cache factory .* made 'not a cache', not a BatchSizeCache"):
            fn()
    finally:
        adaptive.set_default_cache(StackMemoryCache)


# --- ranges and chunks ----------------------------------------------------------------------------


def test_a_failing_short_last_chunk_shrinks_below_its_own_length():
    calls = []

    @adaptive.range(initial_step=8, cache=None)
    def fn(start, end):
        calls.append((start, end))
        if start >= 8 and end - start > 1:
            raise OOM("CUDA out of memory.")

    fn(0, 10)
    assert calls == [(0, 8), (8, 10), (8, 9), (9, 10)]  # no rerun of (8, 10) at the same length


def test_the_step_after_a_short_chunk_fails_is_a_division_of_the_step_by_the_factor():
    calls = []

    @adaptive.range(initial_step=64, cache=adaptive.GlobalCache)
    def fn(start, end):
        calls.append((start, end))
        if end > 64 and end - start > 4:
            raise OOM("CUDA out of memory.")

    fn(0, 69)
    # 64 / 2**4 = 4 is the first step below the chunk's 5 items (not 5 // 2 = 2)
    assert calls == [(0, 64), (64, 69), (64, 68), (68, 69)]
    calls.clear()
    fn(0, 9)
    assert calls == [(0, 4), (4, 8), (8, 9)]  # the next call starts at the step that worked


def test_a_short_last_chunk_below_the_minimum_step_is_an_error():
    @adaptive.range(initial_step=8, min_step=4, cache=None)
    def fn(start, end):
        if start >= 8:
            raise OOM("CUDA out of memory.")

    with pytest.raises(AdaptiveOOMError, match=r"at every size tried \(2\); the minimum is 4"):
        fn(0, 10)


@pytest.mark.parametrize(
    ("start", "end", "error", "message"),
    [
        (0.5, 4, TypeError, r"start must be an integer, got 0\.5 of type float\."),
        (0, "4", TypeError, r"end must be an integer, got '4' of type str\."),
        (5, 3, ValueError, r"end must not be below start, got start=5 and end=3\."),
    ],
)
def test_range_bounds_are_checked(start, end, error, message):
    fn = adaptive.range(lambda a, b: None, initial_step=4, cache=None)
    with pytest.raises(error, match=message):
        fn(start, end)


def test_range_accepts_numpy_integers_and_empty_ranges():
    seen = []
    fn = adaptive.range(lambda a, b: seen.append((a, b)), initial_step=4, cache=None)
    fn(np.int64(2), np.int32(7))
    fn(3, 3)
    assert seen == [(2, 6), (6, 7)] and all(type(v) is int for pair in seen for v in pair)


def test_chunked_checks_the_dimension_against_the_tensor():
    fn = adaptive.chunked(lambda chunk, a, b: None, initial_step=4, dim=2, cache=None)
    with pytest.raises(ValueError, match=r"dim=2 is out of range for a tensor of shape \(3, 4\)\."):
        fn(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"dim=0 is out of range for a tensor of shape \(\)\."):
        adaptive.explicit.chunked(lambda chunk, a, b: None, torch.tensor(1.0), 4)
    parts = []
    adaptive.chunked(lambda chunk, a, b: parts.append((a, b)), initial_step=2, dim=-1, cache=None)(torch.zeros(2, 3))
    assert parts == [(0, 2), (2, 3)]


def test_keyword_arguments_named_like_the_forms_own_parameters_reach_the_function():
    def scale(batch_size, *, func, tensor):
        return func(batch_size), tensor

    assert adaptive.explicit.batch(scale, 4, func=str, tensor="t") == ("4", "t")
    out = []
    adaptive.chunked(lambda chunk, a, b, tensor: out.append(tensor), initial_step=4)(torch.zeros(2), tensor="t")
    adaptive.explicit.range(lambda a, b, start: out.append(start), 0, 2, 4, start="s")
    assert out == ["t", "s"]


def test_adaptive_oom_error_survives_pickling():
    import pickle

    error = AdaptiveOOMError("fn", [4, 2], 2, OOM("CUDA out of memory."))
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is AdaptiveOOMError and str(copy) == str(error) and copy.tried == [4, 2]


class DeviceOOM(RuntimeError):
    """An out-of-memory error whose ``__init__`` takes more than its message (pickles, does not unpickle)."""

    def __init__(self, device: int, message: str) -> None:
        super().__init__(message)
        self.device = device


def test_adaptive_oom_error_survives_pickling_with_a_last_error_that_does_not():
    import pickle

    error = AdaptiveOOMError("fn", [4, 2], 2, DeviceOOM(0, "CUDA out of memory."))
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.tried == [4, 2]
    assert type(copy.last) is RuntimeError and str(copy.last) == "DeviceOOM: CUDA out of memory."
    copy = pickle.loads(pickle.dumps(AdaptiveOOMError("fn", [1], 1, OOM("CUDA out of memory."))))
    assert type(copy.last) is OOM  # an error that pickles is kept as it is


# --- set_cpu_memory_limit, in child processes (the limit is per process) ----------------------------


def run_script(body: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_set_cpu_memory_limit_round_trips_and_inf_means_no_limit():
    script = """
        import math, resource
        from fastsab import adaptive
        AS = resource.RLIMIT_AS
        resource.setrlimit(AS, (resource.RLIM_INFINITY, resource.getrlimit(AS)[1]))
        assert adaptive.set_cpu_memory_limit(64.25) == math.inf  # there was no limit
        assert resource.getrlimit(AS)[0] == int(64.25 * 2**30)
        assert adaptive.set_cpu_memory_limit(math.inf) == 64.25
        assert resource.getrlimit(AS)[0] == resource.RLIM_INFINITY
        odd = 3 * 2**30 + 4096  # a limit set by other means, not a whole number of GiB
        resource.setrlimit(AS, (odd, resource.getrlimit(AS)[1]))
        old = adaptive.set_cpu_memory_limit(100)
        adaptive.set_cpu_memory_limit(old)
        assert resource.getrlimit(AS)[0] == odd
        print("ok")
    """
    if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
        pytest.skip("the hard address-space limit of this machine is finite")
    assert run_script(script) == "ok"


def test_set_cpu_memory_limit_rejects_what_it_cannot_set():
    script = """
        import math, resource
        from fastsab import adaptive
        AS = resource.RLIMIT_AS
        before = resource.getrlimit(AS)
        for gib in (float("nan"), -1.0, 1e-12, 1e30, float("-inf")):
            try:
                adaptive.set_cpu_memory_limit(gib)
            except ValueError as error:
                print(error)
        resource.setrlimit(AS, (2**40, 2**41))  # a finite hard limit: it cannot be lifted
        for gib in (math.inf, 2**11 + 1):
            try:
                adaptive.set_cpu_memory_limit(gib)
            except ValueError as error:
                print(error)
        assert resource.getrlimit(AS) == (2**40, 2**41)
    """
    lines = run_script(script).splitlines()
    assert lines == [
        "gib must be a positive number or math.inf (no limit), got nan.",
        "gib must be a positive number or math.inf (no limit), got -1.0.",
        "gib=1e-12 is less than one byte.",
        "gib=1e+30 is too large for an address-space limit; pass math.inf for no limit.",
        "gib must be a positive number or math.inf (no limit), got -inf.",
        "gib=inf is above the hard limit of 2048.00 GiB, which this process cannot raise.",
        "gib=2049 is above the hard limit of 2048.00 GiB, which this process cannot raise.",
    ]


# --- real out-of-memory errors under an address-space limit -------------------------------------

LIMITED_PRELUDE = """
import resource
import numpy as np
import torch
from fastsab import adaptive
vsz = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
adaptive.set_cpu_memory_limit((vsz + 768 * 2**20) / 2**30)
"""


def run_limited(body: str) -> str:
    script = textwrap.dedent(LIMITED_PRELUDE) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_real_out_of_memory_finds_a_working_batch_size():
    last = run_limited(
        """
        sizes = []

        @adaptive.batch(initial_batch_size=64, cache=None)
        def step(batch_size):
            sizes.append(batch_size)
            block = torch.ones(batch_size, 64 * 2**20, dtype=torch.uint8)  # 64 MiB per sample
            return int(block[:, 0].sum())

        print(step(), sizes)
        """
    )
    value, sizes = last.split(" ", 1)
    tried = eval(sizes)  # a printed list of ints
    assert tried[0] == 64 and tried[-1] == int(value) and tried[-1] <= 8 and len(tried) >= 4


@pytest.mark.slow
def test_real_out_of_memory_in_a_loader_epoch_processes_every_sample_once():
    last = run_limited(
        """
        from fastsab import FastSizeAwareLoader

        n = 400
        sizes = np.random.default_rng(0).integers(1, 16, n)  # MiB of work per sample
        loader = FastSizeAwareLoader(torch.arange(n), sizes, max_total_size=2048, seed=0)
        seen = []

        def step(batch):
            work = torch.ones(int(sizes[batch.numpy()].sum()) * 2**20, dtype=torch.uint8)
            seen.extend(batch.tolist())
            return int(work[0])

        results = list(adaptive.run(loader, step))
        ok = sorted(seen) == list(range(n)) and all(r == 1 for r in results)
        print(ok, len(loader.stats.limit_changes), loader.stats.num_splits)
        """
    )
    ok, changes, splits = last.split()
    assert ok == "True" and int(changes) >= 1 and int(splits) >= 1


# --- loader integration with fake out-of-memory errors -------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 2])
def test_size_aware_loader_survives_oom_without_loss_or_repeat(prefetch):
    n = 2000
    sizes = np.random.default_rng(1).integers(1, 50, n)

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitems__(self, indices):
            return torch.tensor(indices)

    loader = FastSizeAwareLoader(Indexed(), sizes, 1000, seed=3, prefetch=prefetch, group_size=300)
    processed = []

    def step(batch):
        cost = int(sizes[batch.numpy()].sum())
        if cost > 300:
            raise OOM("CUDA out of memory (fake)")
        processed.append(batch.tolist())
        return cost

    costs = list(adaptive.run(loader, step))
    flat = [i for b in processed for i in b]
    assert sorted(flat) == list(range(n))  # invariant: every sample exactly once
    assert all(c <= 300 for c in costs)
    assert loader.stats.limit_changes and loader.stats.num_splits >= 1
    assert all(new[0] <= old[0] for _, old, new in loader.stats.limit_changes)
    loader.set_epoch(0)
    assert len(list(loader)) == len(loader)  # a new epoch starts from the configured cap
    assert loader.limit == [1000]


def test_fixed_loader_survives_oom_and_single_sample_failure_is_an_error():
    loader = FastLoader(torch.arange(100), 32, seed=0, group_size=40)
    seen = []

    def step(batch):
        if len(batch) > 5:
            raise OOM("CUDA out of memory (fake)")
        seen.extend(batch.tolist())

    list(adaptive.run(loader, step))
    assert sorted(seen) == list(range(100))
    # 32, 16 and 8 failed: the batch was planned again each time, with the rest of the epoch
    assert [change[1:] for change in loader.stats.limit_changes] == [(32, 16), (16, 8), (8, 4)]

    def never(batch):
        raise OOM("CUDA out of memory (fake)")

    with pytest.raises(AdaptiveOOMError, match=r"step on the sample \d+ ran out of memory"):
        list(adaptive.run(FastLoader(torch.arange(4), 2), never))


@pytest.mark.slow
def test_ranks_split_failing_batches_but_keep_their_limit():
    sizes = np.random.default_rng(2).integers(1, 20, 300)
    loaders = [
        FastSizeAwareLoader(torch.arange(300), sizes, 200, rank=r, world_size=2, seed=1, even_batches="drop")
        for r in range(2)
    ]
    seen = []

    def step(batch):
        if int(sizes[batch.numpy()].sum()) > 60:
            raise OOM("CUDA out of memory (fake)")
        seen.extend(batch.tolist())

    steps = []
    for loader in loaders:
        list(adaptive.run(loader, step))
        steps.append(loader.stats.num_batches)
        assert loader.stats.num_splits > 0 and loader.stats.limit_changes == []
    assert steps[0] == steps[1]  # the same number of loader steps on every rank
    # invariant: every sample once, except the surplus batches "drop" leaves out (counted)
    assert len(seen) == len(set(seen))
    assert sorted(seen + loaders[0].stats.dropped) == list(range(300))


def test_lower_limit_validation():
    loader = FastSizeAwareLoader(torch.arange(10), np.ones(10), 5)
    with pytest.raises(ValueError, match=r"limit must have 1 cap\(s\), got \[1, 2\]"):
        loader.lower_limit([1, 2])
    with pytest.raises(ValueError, match="limit must be a positive finite number, got 0"):
        loader.lower_limit(0)
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        FastLoader(torch.arange(4), 2).lower_limit(0)


@pytest.mark.parametrize(("cost", "expected"), [("sum", [3.0]), ("padded", [6.0])])
def test_the_smaller_limit_is_the_failed_batch_cost_over_the_factor(cost, expected):
    # invariant: the cap lowered to is the failed batch's cost divided by the factor: the sum of
    # its sizes, or with padding its length times its largest size (here sizes 1, 4, 1)
    loader = FastSizeAwareLoader(torch.arange(3), np.array([1, 4, 1]), 100, cost=cost, shuffle=False)
    iterator = iter(loader)
    next(iterator)
    assert loader.smaller_limit(np.array([0, 1, 2]), 2) == expected


@pytest.fixture
def no_collection(monkeypatch):
    """Skip the garbage collection after each fake out-of-memory error (0.1 s each, not checked here)."""
    monkeypatch.setattr(adaptive.loop, "free_memory", lambda error: None)


def _accumulating_run(loader, fails, committed):
    """A training loop over ``adaptive.run`` that updates (commits) only when a step's last part ran."""
    accumulated = []

    def step(batch):
        if fails(batch):
            raise OOM("CUDA out of memory (fake)")
        accumulated.extend(batch.tolist())
        if loader.parts_left == 0:
            committed.extend(accumulated)
            accumulated.clear()

    return adaptive.run(loader, step)


@pytest.mark.parametrize(
    ("make", "fails"),
    [
        (lambda **kw: FastLoader(torch.arange(16), 4, seed=0, **kw), lambda b: len(b) > 2),
        (lambda **kw: FastLoader(torch.arange(23), 8, seed=3, **kw), lambda b: len(b) > 2),
        # zero costs: no smaller cap splits a batch, so it is halved by count within its step
        (lambda **kw: FastSizeAwareLoader(torch.arange(20), np.zeros(20), 5, seed=1, **kw), lambda b: len(b) > 3),
    ],
)
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_state_saved_between_the_parts_of_a_split_step_resumes_at_its_start(make, fails, world_size, no_collection):
    # invariant: under ranks, with a loop that updates the model when loader.parts_left is 0, a state saved
    # after any result (with what the model committed so far) resumes with every item of the
    # rank committed exactly once: the parts of an interrupted step run again, as its model
    # update never happened
    for rank in range(world_size):
        ranks = {"rank": rank, "world_size": world_size} if world_size > 1 else {}
        full: list[int] = []
        for _ in _accumulating_run(make(**ranks), fails, full):
            pass
        assert len(full) == len(set(full))
        results = len(list(_accumulating_run(make(**ranks), fails, [])))
        for k in range(1, results):  # (a state after the last result starts the next epoch)
            committed: list[int] = []
            loader = make(**ranks)
            run = _accumulating_run(loader, fails, committed)
            for _ in range(k):
                next(run)
            mid_step = loader.parts_left > 0
            if mid_step and world_size == 1:
                # invariant: on one process no state between the parts of a step is exact: refused
                with pytest.raises(RuntimeError, match=r"between the parts of a split step \(\d part\(s\) still"):
                    loader.state_dict()
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                state = loader.state_dict()
            assert [str(w.message).startswith("state_dict() was called between the parts") for w in caught] == (
                [True] if mid_step else []
            )
            saved = list(committed)
            resumed = make(**ranks)
            resumed.load_state_dict(state)
            for _ in _accumulating_run(resumed, fails, saved):
                pass
            assert sorted(saved) == sorted(full), (rank, k)


def test_parts_left_counts_the_parts_of_a_step_still_to_run(no_collection):
    loader = FastLoader(torch.arange(8), 8, shuffle=False, rank=0, world_size=2)
    seen = []

    def step(batch):
        if len(batch) > 1:
            raise OOM("CUDA out of memory (fake)")
        seen.append((batch.item(), loader.parts_left))

    list(adaptive.run(loader, step))
    # rank 0's batch of 8 is halved, its first half halved again, ...: the parts known to be
    # still to run, 0 only for the step's last
    assert seen == [(0, 3), (1, 2), (2, 2), (3, 1), (4, 2), (5, 1), (6, 1), (7, 0)]
    assert loader.parts_left == 0


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_configured_cap_of_zero_survives_oom_by_halving(world_size, no_collection):
    # a cap of 0 batches the items of cost 0; no smaller cap exists, so a failing batch is halved
    ranks = {"rank": 0, "world_size": world_size} if world_size > 1 else {}
    make = lambda: FastSizeAwareLoader(torch.arange(12), np.zeros(12, dtype=np.int64), 0, shuffle=False, **ranks)  # noqa: E731
    expected = [i for batch in make() for i in batch.tolist()]
    loader = make()

    def step(batch):
        if len(batch) > 2:
            raise OOM("CUDA out of memory (fake)")
        return batch.tolist()

    seen = [i for part in adaptive.run(loader, step) for i in part]
    assert seen == expected
    assert len(set(seen)) == len(seen) > 0


_SIZES = np.random.default_rng(1).integers(1, 10, 30)


@pytest.mark.parametrize(
    ("make", "fails"),
    [
        (
            lambda: FastSizeAwareLoader(torch.arange(30), _SIZES, 40, seed=0, group_size=6, sort_window=5),
            lambda ids: _SIZES[ids].sum() > 9,
        ),
        (
            lambda: FastSizeAwareLoader(torch.arange(30), _SIZES, 40, seed=0, group_size=6),
            lambda ids: _SIZES[ids].sum() > 9,
        ),
        (lambda: FastLoader(torch.arange(30), 16, seed=0, group_size=6), lambda ids: len(ids) > 3),
    ],
    ids=["sort_window", "size_aware", "fixed_size"],
)
def test_a_state_saved_after_a_batch_split_twice_resumes_with_the_same_batches(make, fails, no_collection):
    # the first batch fails, and so does the first part of it: the limit is lowered twice at
    # the same position (caps 40 -> 20 -> 7.5 for the sizes), and a resume replays both lowerings
    def step(batch):
        ids = batch.tolist()
        if len(ids) > 1 and fails(ids):
            raise OOM("CUDA out of memory (fake)")
        return ids

    loader = make()
    full = list(adaptive.run(loader, step))
    changes = loader.stats.limit_changes
    assert len(changes) >= 2 and changes[0][0] == changes[1][0] == 0  # two lowerings before the first result
    for k in range(1, len(full)):
        loader = make()
        run = adaptive.run(loader, step)
        done = [next(run) for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        run.close()
        resumed = make()
        resumed.load_state_dict(state)
        # invariant: the resumed loader yields exactly the batches the uninterrupted run had left
        assert done + list(adaptive.run(resumed, step)) == full, f"resumed after {k} results"
