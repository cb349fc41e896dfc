from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Generator

import pytest
import torch

from fastsab.fetch.prefetch import prefetched


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastsab-prefetch"]


def counting(n: int, made: list[int], closed: threading.Event) -> Generator[int, None, None]:
    try:
        for i in range(n):
            made.append(i)
            yield i
    finally:
        closed.set()


def test_items_come_in_order_and_the_thread_ends():
    made: list[int] = []
    closed = threading.Event()
    assert list(prefetched(counting(50, made, closed), depth=3)) == list(range(50))
    assert closed.is_set() and not prefetch_threads()


def test_an_error_in_the_source_is_raised_in_the_consumer_after_the_items_before_it():
    def failing() -> Generator[int, None, None]:
        yield 1
        yield 2
        raise KeyError("cannot read item 3")

    seen = []
    with pytest.raises(KeyError, match="cannot read item 3"):
        for item in prefetched(failing(), depth=1):
            seen.append(item)
    assert seen == [1, 2] and not prefetch_threads()


def test_closing_early_stops_the_thread_and_closes_the_source():
    made: list[int] = []
    closed = threading.Event()
    items = prefetched(counting(10**6, made, closed), depth=2)
    assert next(items) == 0
    time.sleep(0.05)  # the thread fills the queue and waits
    items.close()
    assert closed.is_set() and not prefetch_threads()
    assert len(made) <= 5  # it stopped: at most the queue and the item being put were made


def test_the_source_runs_ahead_at_most_depth_items():
    made: list[int] = []
    items = prefetched(counting(100, made, threading.Event()), depth=4)
    next(items)
    time.sleep(0.1)
    assert len(made) <= 1 + 4 + 1  # the one consumed, the queue, the one waiting to be put
    items.close()


@pytest.mark.slow
def test_a_loop_left_unfinished_at_exit_stops_its_thread_before_the_interpreter_tears_down():
    # a loader iterator still referenced at exit: its prefetch thread must not run on while the
    # interpreter finalizes (it used to abort the process, or print an ignored exception)
    script = textwrap.dedent(
        """
        import torch
        from fastsab import FastLoader

        class Items:
            def __len__(self):
                return 100

            def __getitems__(self, ids):
                return torch.tensor(ids)

        batches = iter(FastLoader(Items(), 4, prefetch=2))
        next(batches)
        """
    )
    for _ in range(3):  # (the failure depended on timing: most runs showed it)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize("initialized", [True, False])
def test_the_thread_queues_cuda_work_on_the_stream_of_the_loop(monkeypatch, initialized):
    # NOTE: CUDA is faked here, a stream being a name: what is checked is the stream the thread makes its
    # items under (the loop's, taken where the loop runs), not a GPU; tests/gpu runs the copies on one
    loop_stream = "the loop's stream"
    entered: list[tuple[str, str]] = []
    current: list[str] = []

    @contextlib.contextmanager
    def stream(chosen):
        entered.append((threading.current_thread().name, chosen))
        current.append(chosen)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: loop_stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)

    def source() -> Generator[str | None, None, None]:
        for _ in range(3):
            yield current[-1] if current else None

    made_under = list(prefetched(source(), depth=2))
    if initialized:
        assert entered == [("fastsab-prefetch", loop_stream)] and made_under == [loop_stream] * 3
    else:  # CUDA not initialized: the loop has only the default stream, and nothing is entered
        assert entered == [] and made_under == [None] * 3
