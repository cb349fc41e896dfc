"""The worker suite of ``fastsab bench``: a dataset whose ``__getitems__`` costs Python time, fetched in one
process (a prefetch thread) and in worker processes (started per epoch, or persistent), against a ``DataLoader``
with persistent workers over the same plan; a new loader's first epoch and the epochs after it apart."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastsab.bench.epochs import Case, Progress, one_thread
from fastsab.bench.report import Row
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader, LoaderBase

__all__ = ["WORKERS_SAMPLES", "EpochTiming", "TokenizedTexts", "first_and_later_epochs", "pad_tokens", "workers_rows"]

#: Texts of the worker suite by default.
WORKERS_SAMPLES = 10_000

#: Words of the made-up texts (a vocabulary of 2,000 words of 3 to 9 letters).
_VOCABULARY_SIZE = 2000


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
        lengths = np.clip(rng.lognormal(np.log(words_per_text), 0.6, samples), 5, 5 * words_per_text).astype(np.int64)
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


def workers_rows(
    samples: int = WORKERS_SAMPLES,
    batch_size: int = 64,
    epochs: int = 3,
    num_workers: int = 2,
    progress: Progress | None = None,
    rounds: int = 2,
) -> list[Row]:
    """One process with a prefetch thread against ``num_workers`` worker processes, first and later epochs.

    For ``FastLoader`` (``batch_size`` texts) and
    ``FastSizeAwareLoader`` (a budget of ``batch_size`` x the mean length in
    tokens), over ``TokenizedTexts``: one process (``prefetch=2``), workers started for
    each epoch, persistent workers, and a ``DataLoader`` with persistent workers over the
    loader's own plan (``batch_sampler=loader.batch_sampler()``) and ``collate_fn``. A
    training loop runs many epochs, so each case is timed on a new loader's first epoch
    (which starts the workers) and on the epochs after it (best of ``epochs - 1``, 1 to 4),
    best over ``rounds`` new loaders, the cases interleaved. Ratios are to one process in the
    same phase, speed-ups the ``DataLoader``'s time over a row's; the note gives the CPU time
    this process spends per batch (what worker processes cannot take off it). torch computes in
    one thread in this process, as it does in each worker process.
    """
    texts = TokenizedTexts(samples)
    budget = batch_size * int(texts.lengths.mean())

    def fixed(**options: Any) -> FastLoader[torch.Tensor]:
        return FastLoader(texts, batch_size, collate_fn=pad_tokens, **options)

    def sized(**options: Any) -> FastSizeAwareLoader[torch.Tensor]:
        return FastSizeAwareLoader(texts, texts.lengths, budget, collate_fn=pad_tokens, **options)

    def same_plan(make: Callable[..., LoaderBase[torch.Tensor]]) -> Iterable[Any]:
        return DataLoader(
            texts,  # type: ignore[arg-type]  # a map-style dataset with __getitems__
            batch_sampler=make().batch_sampler(),
            collate_fn=pad_tokens,
            num_workers=num_workers,
            persistent_workers=True,
        )

    cases: list[Case] = []
    makers: tuple[tuple[str, Callable[..., LoaderBase[torch.Tensor]]], ...] = (
        ("FastLoader", fixed),
        ("FastSizeAwareLoader", sized),
    )
    for name, make in makers:
        cases += [
            (f"{name}(prefetch=2), one process", partial(make, prefetch=2)),
            (f"{name}(num_workers={num_workers})", partial(make, num_workers=num_workers)),
            (
                f"{name}(num_workers={num_workers}, persistent_workers=True)",
                partial(make, num_workers=num_workers, persistent_workers=True),
            ),
            (
                f"DataLoader(num_workers={num_workers}, persistent_workers=True, batch_sampler={name}.batch_sampler())",
                partial(same_plan, make),
            ),
        ]
    # NOTE: one thread in this process too, as torch gives each worker process: the one-process
    # case's collate otherwise keeps a second thread spinning on a core the workers need
    with one_thread():
        first, later = first_and_later_epochs(cases, min(max(epochs - 1, 1), 4), rounds, progress)
    per_kind = len(cases) // len(makers)
    rows = []
    for start, kind in zip(range(0, len(cases), per_kind), ("fixed size", "size-aware")):
        group = [name for name, _ in cases[start : start + per_kind]]
        for phase, measured in (("first epoch", first), ("later epochs", later)):
            baseline, dataloader = group[0], group[-1]
            for name in group:
                timing = measured[name]
                rows.append(
                    Row(
                        "workers",
                        f"{kind}, {samples:,} texts, {phase}",
                        name,
                        timing.seconds,
                        baseline,
                        timing.seconds / measured[baseline].seconds,
                        f"{timing.batches:,} batches; {timing.cpu_per_batch * 1e3:.2f} ms CPU a batch in this process",
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
