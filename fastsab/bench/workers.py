"""The worker suite of ``fastsab bench``: a dataset whose ``__getitems__`` costs Python time, fetched in one
process (a prefetch thread) and in worker processes, against a ``DataLoader`` with workers over the same plan."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastsab.bench.epochs import Case, Progress, epoch_times
from fastsab.bench.report import Row
from fastsab.loader import FastLoader, FastSizeAwareLoader, LoaderBase

__all__ = ["WORKERS_SAMPLES", "TokenizedTexts", "pad_tokens", "workers_rows"]

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
) -> list[Row]:
    """One process with a prefetch thread, ``num_workers`` worker processes, and a ``DataLoader`` with as many.

    For :class:`~fastsab.FastLoader` (``batch_size`` texts) and
    :class:`~fastsab.FastSizeAwareLoader` (a budget of ``batch_size`` x the mean length in
    tokens), over :class:`TokenizedTexts`. The ``DataLoader`` takes the loader's own plan
    (``batch_sampler=loader.batch_sampler()``) and its ``collate_fn``. Ratios are to one
    process in the same run, speed-ups the ``DataLoader``'s time over a row's; the time includes
    starting the workers, once per epoch for both.
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
            (f"DataLoader(num_workers={num_workers}, batch_sampler={name}.batch_sampler())", partial(same_plan, make)),
        ]
    measured = epoch_times(cases, epochs, progress)
    rows = []
    for start in (0, 3):
        baseline = cases[start][0]
        for name, _ in cases[start : start + 3]:
            seconds, batches = measured[name]
            workload = f"{'fixed size' if start == 0 else 'size-aware'}, {samples:,} texts"
            ratio = seconds / measured[baseline][0]
            dataloader = measured[cases[start + 2][0]][0]  # speed-up: the DataLoader's time over this one
            note = f"{batches:,} batches"
            rows.append(Row("workers", workload, name, seconds, baseline, ratio, note, dataloader / seconds))
    return rows
