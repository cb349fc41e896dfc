"""Preparing items ahead in a background thread: ``prefetched``.

A loader with ``prefetch=k`` makes its batches (planning, fetching, collating, moving) in one
thread, ``k`` batches ahead of the training loop, so that reading the next batch overlaps
the work on the current one. The thread queues its CUDA work (the batches' copies to the GPU)
on the stream current where the items are taken, as a loop without a thread would.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
from collections.abc import Callable, Generator
from typing import Any, Literal, TypeVar, Union

import torch

__all__ = ["prefetched"]

T = TypeVar("T")

# The running threads and their stop events, stopped at interpreter exit (see _stop_all)
_running: set[tuple[threading.Event, threading.Thread]] = set()

# What the thread sends: an item, the end, or the error that stopped it.
_Message = Union[tuple[Literal["item"], T], tuple[Literal["end"], None], tuple[Literal["error"], BaseException]]  # noqa: UP007


def prefetched(source: Generator[T, None, None], depth: int) -> Generator[T, None, None]:
    """Run ``source`` in a background thread, ``depth`` items ahead of the consumer.

    Errors in the thread are raised in the consumer. When the consumer stops early
    (``break``, an exception, ``close()``, garbage collection), the thread is told to stop,
    the queue is drained so that it cannot block, ``source`` is closed and the thread is
    joined: no thread outlives the loop.

    Args:
        source: The items, made in the thread.
        depth: How many items may wait for the consumer (at least 1).

    Examples:
        >>> list(prefetched((i * i for i in range(4)), depth=2))
        [0, 1, 4, 9]
    """
    items: queue.Queue[_Message[T]] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    stream = _consumer_stream()

    def put(message: _Message[T]) -> bool:
        while not stop.is_set():
            try:
                items.put(message, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            with stream:
                for item in source:
                    if not put(("item", item)):
                        return
            put(("end", None))
        except BaseException as err:  # forwarded to the consumer, which re-raises it
            put(("error", err))
        finally:
            source.close()

    thread = threading.Thread(target=produce, name="fastsab-prefetch", daemon=True)
    running = (stop, thread)
    _running.add(running)
    thread.start()
    try:
        while True:
            message = items.get()
            if message[0] == "item":
                yield message[1]
            elif message[0] == "end":
                return
            else:
                raise message[1]
    finally:
        stop.set()
        _drain(items)
        thread.join()
        _running.discard(running)


def _consumer_stream() -> contextlib.AbstractContextManager[Any]:
    """What makes the thread queue CUDA work on the stream current here, where the items are used."""
    # NOTE: a thread starts on the default stream. A loop on a side stream (torch's streams do not
    # wait for the default one) would read a batch before its copy ended, and the allocator would
    # give a used batch's memory to a later copy while the side stream still reads it. The copies
    # go on the loop's stream instead, ordered with its work, as they are without a thread. Where
    # CUDA is not initialized yet, the loop has no stream but the default one: nothing to do.
    initialized: Callable[[], bool] = torch.cuda.is_initialized  # NOTE: torch leaves it unannotated
    if initialized():
        return torch.cuda.stream(torch.cuda.current_stream())
    return contextlib.nullcontext()


@atexit.register
def _stop_all() -> None:
    """Stop the threads of loops left unfinished, before the interpreter tears down.

    A loop abandoned mid-epoch (an iterator still referenced at exit) would otherwise leave
    its thread fetching, possibly inside torch's native code, while the interpreter
    finalizes, which can abort the process.
    """
    running = list(_running)
    for stop, _ in running:
        stop.set()
    for _, thread in running:
        thread.join(timeout=5)


def _drain(items: queue.Queue[_Message[T]]) -> None:
    """Drop the items waiting in ``items``."""
    while True:
        try:
            items.get_nowait()
        except Exception:  # NOTE: queue.Empty, but a generator closed at interpreter exit may
            return  # find the queue module's names already cleared (raising then fails with TypeError)
