"""The chunks an ``OutOfCoreDataset`` holds, and the next one it reads ahead in a thread.

``ChunkCache`` holds at most two chunks: the one served and the next of the epoch's
order, read ahead in a background thread, or the two a batch spans. It starts afresh in a
forked process (a DataLoader worker) and when unpickled: no thread, no chunk held.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["ChunkCache"]

ChunkReader = Callable[[int], Any]  # chunk number -> pytree of stacked tensors


class ChunkCache:
    """The chunks held (at most two) and the read ahead of the next one.

    Args:
        num_chunks: How many chunks the dataset has.
        read_ahead: Read the next chunk of the epoch in a background thread.

    Attributes:
        reads: Chunks read so far (read-ahead included).
        order: The order in which the epoch visits the chunks (empty: unknown).
    """

    _executor: ThreadPoolExecutor | None  # the read-ahead thread
    _pending: dict[int, Future[Any]]  # chunks being read ahead
    _chunks: OrderedDict[int, Any]  # chunks held

    def __init__(self, num_chunks: int, read_ahead: bool) -> None:
        self.num_chunks = num_chunks
        self.read_ahead = read_ahead
        self.order: list[int] = []
        self._position: dict[int, int] = {}  # each chunk's place in the order
        self._served: tuple[int | None, int | None] = (None, None)  # the chunks served last, in turn
        self.reads = 0
        self._start_in_this_process()

    @property
    def pending(self) -> dict[int, Future[Any]]:
        """The reads ahead under way, by chunk."""
        return self._pending

    @property
    def chunks(self) -> OrderedDict[int, Any]:
        """The chunks held, by chunk."""
        return self._chunks

    def set_order(self, order: Sequence[int]) -> None:
        """The order in which an epoch visits the chunks, for read-ahead."""
        self._check_process()
        with self._lock:
            self.order = [int(c) for c in order]
            self._position = {chunk: i for i, chunk in enumerate(self.order)}

    def in_order(self, chunks: list[int]) -> tuple[list[int], bool]:
        """``chunks`` in the epoch's order (others last, by number), and whether they follow each other in it.

        NOTE: a batch larger than a chunk spans chunks that follow each other in the epoch's
        order; read in that order, its first chunk is the one the batch before ended in (still
        held) and its last the one the next batch begins in, so that each is read once.
        """
        position = self._position
        ordered = sorted(chunks, key=lambda chunk: (chunk not in position, position.get(chunk, chunk)))
        places = [position[chunk] for chunk in ordered if chunk in position]
        return ordered, len(places) == len(ordered) and places[-1] - places[0] == len(places) - 1

    def held(self, needed: list[int], read: ChunkReader, *, ahead: bool = True) -> dict[int, Any]:
        """The data of the ``needed`` chunks (one or two): held, read ahead, or read now by ``read(chunk)``.

        Before anything is read, every other chunk is dropped and a read ahead of a chunk
        that is not the next one is cancelled (or waited for, if it has started), so that
        at most two chunks are in memory: the needed ones, or the one needed and the next
        in the epoch's order, which is read ahead (if ``ahead``) while it is served.
        """
        self._check_process()
        with self._lock:
            position = self._position
            last = max(needed, key=lambda chunk: position.get(chunk, chunk))
            for chunk in sorted(needed, key=lambda chunk: position.get(chunk, chunk)):
                if chunk != self._served[1]:
                    self._served = (self._served[1], chunk)
            # NOTE: read ahead only while one chunk is served; a batch across two chunks
            # holds both, and a third would pass the budget
            nxt = self._next_chunk(last) if ahead and self.read_ahead and len(needed) == 1 else None
            # NOTE: without a read ahead, the chunk served before stays in the second place of the
            # budget: a rank's balanced steps may come back to it
            keep = {*needed, self._served[0] if nxt is None and len(needed) == 1 else nxt}
            for old in [chunk for chunk in self._chunks if chunk not in keep]:
                del self._chunks[old]
            held = {chunk: self._chunks.get(chunk) for chunk in needed}
            pending = {chunk: self._pending.pop(chunk) for chunk in needed if chunk in self._pending}
            stale = [self._pending.pop(chunk) for chunk in list(self._pending) if chunk not in keep]
        _forget(stale)
        for chunk in needed:
            if held[chunk] is None:
                held[chunk] = pending[chunk].result() if chunk in pending else self._read(read, chunk)
        with self._lock:
            self._chunks.update(held)
            if nxt is not None and nxt not in self._chunks and nxt not in self._pending:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastsab-read-ahead")
                self._pending[nxt] = self._executor.submit(self._read, read, nxt)
        return held

    def _read(self, read: ChunkReader, chunk: int) -> Any:
        data = read(chunk)
        with self._lock:
            self.reads += 1
        return data

    def _next_chunk(self, chunk: int) -> int | None:
        """The chunk after ``chunk`` in the epoch's order; without an order, a guess or ``None``.

        NOTE: without an order (a dataset in a DataLoader's worker process, say), the next
        chunk is guessed to be ``chunk + 1`` only when the chunk served before ``chunk`` was
        ``chunk - 1``: a wrong guess would be read for nothing.
        """
        position = self._position.get(chunk)
        if position is not None:
            return self.order[position + 1] if position + 1 < len(self.order) else None
        sequential = self._served == (chunk - 1, chunk)
        return chunk + 1 if sequential and chunk + 1 < self.num_chunks else None

    def close(self) -> None:
        """Stop the read-ahead thread and drop the held chunks."""
        self._check_process()
        with self._lock:
            executor, self._executor = self._executor, None
            self._chunks.clear()
            self._pending.clear()
        if executor is not None:
            executor.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_pid", "_lock", "_executor", "_pending", "_chunks"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_in_this_process()

    def _start_in_this_process(self) -> None:
        """A new lock, no read-ahead thread, no chunks held."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._executor = None
        self._pending = {}
        self._chunks = OrderedDict()

    def _check_process(self) -> None:
        """Start afresh in a forked process (a DataLoader worker).

        NOTE: a forked child inherits the lock (possibly held by the read-ahead thread) and
        the executor, but not its thread: a read submitted to it would never run.
        """
        if self._pid != os.getpid():
            self._start_in_this_process()


def _forget(reads: list[Future[Any]]) -> None:
    """Cancel reads ahead that are not needed; wait for those that have started (ignoring
    their errors), so that their chunks are freed before the next read. Empties ``reads``."""
    while reads:
        read = reads.pop()
        if not read.cancel():
            read.exception()
