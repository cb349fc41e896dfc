"""The worker suite of ``fastsab bench``: a dataset whose ``__getitems__`` costs Python time (or waits, as a
remote read does), fetched in one process (a prefetch thread) and in worker processes (started per epoch, or
persistent), against a ``DataLoader`` with persistent workers over the same plan, for one or more worker counts;
a new loader's first epoch and the epochs after it apart."""

from __future__ import annotations

import gc
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastsab._checks import as_real_number
from fastsab.bench.epochs import Case, Progress, one_thread
from fastsab.bench.report import Row
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader, LoaderBase

__all__ = [
    "IO_WAIT_S",
    "WORKERS_SAMPLES",
    "EpochTiming",
    "RemoteReads",
    "TokenizedTexts",
    "first_and_later_epochs",
    "pad_tokens",
    "parse_worker_counts",
    "workers_rows",
]

#: Texts (or reads) of the worker suite by default.
WORKERS_SAMPLES = 10_000

#: Seconds the I/O-bound dataset's ``__getitems__`` waits per batch (``RemoteReads``).
IO_WAIT_S = 0.008

#: The datasets of the worker suite: ``"cpu"`` tokenizes texts in Python, ``"io"`` waits per batch.
WorkersDataset = Literal["cpu", "io"]

#: Words of the made-up texts (a vocabulary of 2,000 words of 3 to 9 letters).
_VOCABULARY_SIZE = 2000


def _text_lengths(rng: np.random.Generator, samples: int, words_per_text: int) -> np.ndarray:
    """Lengths of ``samples`` texts: a log-normal of median ``words_per_text``, clipped to [5, 5 x the median]."""
    return np.clip(rng.lognormal(np.log(words_per_text), 0.6, samples), 5, 5 * words_per_text).astype(np.int64)


class TokenizedTexts:
    """Texts tokenized in pure Python in ``__getitems__``: one list of token tensors per batch.

    Each text is a few dozen to a few hundred words; a token is the word's vocabulary id,
    or, for a word outside it, a hash of its letters computed letter by letter. This is the
    kind of per-batch Python work (tokenizing, decoding) that worker processes run in parallel.

    Args:
        samples: Number of texts.
        seed: Seed of the texts.
        words_per_text: Typical words per text (the median of a log-normal).

    Examples:
        >>> texts = TokenizedTexts(5)
        >>> batch = texts.__getitems__([0, 3])
        >>> [len(tokens) for tokens in batch] == [texts.lengths[0], texts.lengths[3]]
        True
    """

    def __init__(self, samples: int, seed: int = 0, words_per_text: int = 150) -> None:
        rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        words = ["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(_VOCABULARY_SIZE)]
        # NOTE: every tenth word is unknown (its letters reversed), so tokenizing does more than dict lookups
        self.vocabulary = {word: i for i, word in enumerate(words)}
        lengths = _text_lengths(rng, samples, words_per_text)
        picks = rng.integers(0, _VOCABULARY_SIZE, int(lengths.sum())).tolist()
        texts, start = [], 0
        for length in lengths.tolist():
            chosen = picks[start : start + length]
            texts.append(" ".join(words[p] if (start + k) % 10 else words[p][::-1] for k, p in enumerate(chosen)))
            start += length
        self.texts = texts
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.texts)

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [torch.tensor(self._tokens(self.texts[i]), dtype=torch.int64) for i in indices]

    def _tokens(self, text: str) -> list[int]:
        vocabulary = self.vocabulary
        tokens = []
        for word in text.lower().split():
            token = vocabulary.get(word)
            if token is None:
                token = 0
                for letter in word:
                    token = (token * 31 + ord(letter)) % 1_000_003
                token += _VOCABULARY_SIZE
            tokens.append(token)
        return tokens


def pad_tokens(samples: list[torch.Tensor]) -> torch.Tensor:
    """A batch of token tensors padded with 0 to the longest."""
    return torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)


class RemoteReads:
    """Samples read from a slow store: ``__getitems__`` waits ``wait_s`` per batch, then returns its token tensors.

    The wait stands for a remote read or a slow disk: it holds no core, so worker processes
    overlap their waits on any machine, and what ``n`` workers gain over one process then
    measures the loader's own pipeline (enough batches in flight, little work per batch in the
    loop's process) rather than the machine's cores. Sample ``i`` is ``lengths[i]`` consecutive
    token ids (lengths as ``TokenizedTexts``'s), the same read alone (``dataset[i]``, without
    the wait) or in a batch.

    Args:
        samples: Number of samples.
        seed: Seed of the lengths.
        words_per_text: Typical tokens per sample (the median of a log-normal).
        wait_s: Seconds each ``__getitems__`` waits.

    Raises:
        TypeError: If ``wait_s`` is not a real number.
        ValueError: If ``wait_s`` is negative, infinite or NaN.

    Examples:
        >>> reads = RemoteReads(5, wait_s=0.0)
        >>> batch = reads.__getitems__([3, 0])
        >>> [tokens.tolist() for tokens in batch] == [reads[3].tolist(), reads[0].tolist()]
        True
    """

    def __init__(self, samples: int, seed: int = 0, words_per_text: int = 150, wait_s: float = IO_WAIT_S) -> None:
        # NOTE: finite: time.sleep(inf) raises OverflowError, and only at the first batch read
        if not 0 <= as_real_number("wait_s", wait_s) < math.inf:
            raise ValueError(f"wait_s must be seconds (0 or more) to wait per batch, got {wait_s!r}.")
        self.lengths = _text_lengths(np.random.default_rng(seed), samples, words_per_text)
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.wait_s = wait_s

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(self.starts[index])
        return torch.arange(start, start + int(self.lengths[index]))

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        time.sleep(self.wait_s)  # (one wait per batch, as one request for the batch's samples)
        return [self[i] for i in indices]


def parse_worker_counts(text: str) -> tuple[int, ...]:
    """``fastsab bench --workers``'s value as worker counts: comma-separated positive integers, each once.

    Raises:
        ValueError: If a part is not a positive integer, or a count comes twice.

    Examples:
        >>> parse_worker_counts("1, 2,4,8")
        (1, 2, 4, 8)
    """
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    return _checked_counts(counts, "--workers", text)


def _checked_counts(counts: tuple[int, ...], name: str, value: object) -> tuple[int, ...]:
    """``counts`` if they are positive and distinct, else a ``ValueError`` naming ``name`` and its ``value``."""
    if not counts or any(isinstance(count, bool) or not isinstance(count, int) or count < 1 for count in counts):
        # NOTE: 0 is refused rather than read as one process: the one-process row is measured anyway
        raise ValueError(
            f"{name} must be worker counts of at least 1 (one process is always measured), such as 1,2,4,8; "
            f"got {value!r}."
        )
    if len(set(counts)) < len(counts):
        raise ValueError(f"{name} names a worker count more than once, got {value!r}; give each count once.")
    return counts


def workers_rows(
    samples: int = WORKERS_SAMPLES,
    batch_size: int = 64,
    epochs: int = 3,
    worker_counts: Sequence[int] = (2,),
    progress: Progress | None = None,
    rounds: int = 2,
    dataset: WorkersDataset = "cpu",
) -> list[Row]:
    """One process with a prefetch thread against worker processes, for each worker count, first and later epochs.

    For ``FastLoader`` (``batch_size`` samples) and ``FastSizeAwareLoader`` (a budget of
    ``batch_size`` x the mean length in tokens), over ``TokenizedTexts`` (``dataset="cpu"``) or
    ``RemoteReads`` (``"io"``, waiting ``IO_WAIT_S`` per batch): one process (``prefetch=2``),
    then for each count ``w`` of ``worker_counts``: ``w`` workers started for each epoch,
    ``w`` persistent workers, and a ``DataLoader`` with ``w`` persistent workers over the
    loader's own plan (``batch_sampler=loader.batch_sampler()``) and ``collate_fn``. A training
    loop runs many epochs, so each case is timed on a new loader's first epoch (which starts
    the workers) and on the epochs after it (best of ``epochs - 1``, 1 to 4), best over
    ``rounds`` new loaders, the cases interleaved. Ratios are to one process in the same phase;
    speed-ups are the ``DataLoader``'s time (with the row's worker count; the one-process row:
    the first count's) over a row's. The note gives the CPU time this process spends per batch
    (what worker processes cannot take off it) and, for a row with workers, its speed-up over
    one process and that speed-up per worker (a count above the machine's cores says so).
    torch computes in one thread in this process, as it does in each worker process.

    Raises:
        TypeError: If ``worker_counts`` is not a sequence.
        ValueError: If a worker count is not a positive integer or comes twice, or ``dataset``
            is neither ``"cpu"`` nor ``"io"``.
    """
    if not isinstance(worker_counts, Sequence):
        raise TypeError(f"worker_counts must be a sequence of worker counts such as (1, 2, 4), got {worker_counts!r}.")
    counts = _checked_counts(tuple(worker_counts), "worker_counts", worker_counts)
    data: TokenizedTexts | RemoteReads
    if dataset == "cpu":
        data, described = TokenizedTexts(samples), f"{samples:,} texts"
    elif dataset == "io":
        data, described = RemoteReads(samples), f"{samples:,} reads waiting {IO_WAIT_S * 1e3:g} ms a batch"
    else:
        raise ValueError(f"dataset must be 'cpu' (texts tokenized) or 'io' (reads that wait), got {dataset!r}.")
    budget = batch_size * int(data.lengths.mean())

    def fixed(**options: Any) -> FastLoader[torch.Tensor]:
        return FastLoader(data, batch_size, collate_fn=pad_tokens, **options)

    def sized(**options: Any) -> FastSizeAwareLoader[torch.Tensor]:
        return FastSizeAwareLoader(data, data.lengths, budget, collate_fn=pad_tokens, **options)

    def same_plan(make: Callable[..., LoaderBase[torch.Tensor]], num_workers: int) -> Iterable[Any]:
        return DataLoader(
            data,  # type: ignore[arg-type]  # a map-style dataset with __getitems__
            batch_sampler=make().batch_sampler(),
            collate_fn=pad_tokens,
            num_workers=num_workers,
            persistent_workers=True,
        )

    cases: list[Case] = []
    # per kind of loader: each case's name, its worker count and the name of the DataLoader its speed-up is to
    groups: list[tuple[str, list[tuple[str, int, str]]]] = []
    makers: tuple[tuple[str, str, Callable[..., LoaderBase[torch.Tensor]]], ...] = (
        ("fixed size", "FastLoader", fixed),
        ("size-aware", "FastSizeAwareLoader", sized),
    )
    for kind, name, make in makers:
        one = f"{name}(prefetch=2), one process"
        cases.append((one, partial(make, prefetch=2)))
        group = []
        for count in counts:
            dataloader = (
                f"DataLoader(num_workers={count}, persistent_workers=True, batch_sampler={name}.batch_sampler())"
            )
            cases += [
                (f"{name}(num_workers={count})", partial(make, num_workers=count)),
                (
                    f"{name}(num_workers={count}, persistent_workers=True)",
                    partial(make, num_workers=count, persistent_workers=True),
                ),
                (dataloader, partial(same_plan, make, count)),
            ]
            group += [(case, count, dataloader) for case, _ in cases[-3:]]
        groups.append((kind, [(one, 0, group[2][2]), *group]))
    # NOTE: one thread in this process too, as torch gives each worker process: the one-process
    # case's collate otherwise keeps a second thread spinning on a core the workers need. Counts
    # above the cores run as asked (their notes say so), without DataLoader's warning about them
    with one_thread(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        first, later = first_and_later_epochs(cases, min(max(epochs - 1, 1), 4), rounds, progress)
    cores = os.cpu_count() or 1
    rows = []
    for kind, group in groups:
        baseline = group[0][0]
        for phase, measured in (("first epoch", first), ("later epochs", later)):
            for name, count, dataloader in group:
                timing = measured[name]
                note = f"{timing.batches:,} batches; {timing.cpu_per_batch * 1e3:.2f} ms CPU a batch in this process"
                if count:
                    speedup = measured[baseline].seconds / timing.seconds
                    note += f"; {speedup:.2f}x one process, {speedup / count:.2f}x per worker"
                if count > cores:
                    note += f" ({count} workers > {cores} cores)"
                rows.append(
                    Row(
                        "workers",
                        f"{kind}, {described}, {phase}",
                        name,
                        timing.seconds,
                        baseline,
                        timing.seconds / measured[baseline].seconds,
                        note,
                        measured[dataloader].seconds / timing.seconds,
                    )
                )
    return rows


@dataclass
class EpochTiming:
    """A case's best epoch: wall seconds, batches, and this process's CPU seconds per batch in that epoch."""

    seconds: float = float("inf")
    batches: int = 0
    cpu_per_batch: float = 0.0

    def add(self, seconds: float, cpu: float, batches: int) -> None:
        if seconds < self.seconds:
            self.seconds, self.batches, self.cpu_per_batch = seconds, batches, cpu / max(batches, 1)


def first_and_later_epochs(
    cases: list[Case], later: int, rounds: int, progress: Progress | None = None
) -> tuple[dict[str, EpochTiming], dict[str, EpochTiming]]:
    """Each case's best first epoch (of a new iterable) and best later epoch (``later`` after the first).

    Every round makes every case's iterable anew; its epochs run in turn with the other cases'
    (all first epochs, then all second epochs, ...), so that a slow spell of a shared machine
    hits all cases alike. The iterables of a round are dropped (their workers shut down)
    before the next round.
    """
    first = {name: EpochTiming() for name, _ in cases}
    after = {name: EpochTiming() for name, _ in cases}
    for _ in range(rounds):
        iterables = {}
        for name, make in cases:
            if progress is not None:
                progress(name)
            iterables[name] = make()
        for epoch in range(1 + later):
            for name, iterable in iterables.items():
                gc.collect()
                wall, cpu = time.perf_counter(), time.process_time()
                batches = sum(1 for _ in iterable)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                (first if epoch == 0 else after)[name].add(wall, cpu, batches)
        for iterable in iterables.values():
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        del iterables
        gc.collect()
    return first, after
