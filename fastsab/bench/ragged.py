"""Variable-length batches per epoch: ``RaggedDataset`` against fixed-shape rows and a list of tensors.

``ragged_rows`` measures an epoch of token sequences (log-normal lengths) batched under a
token budget (``cost="sum"``), padded (unsorted, and sorted by size within windows of
``SORT_WINDOW`` sequences) and packed, three ways: a ``RaggedDataset`` gathered in one pass
per batch, a list of per-sequence tensors fetched as a list and collated by
``PadCollator`` or ``PackCollator``, and the
floor: ``FastLoader`` over fixed-shape rows of the same total tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastsab.bench.epochs import Case, Progress, floor_rows
from fastsab.bench.report import Row
from fastsab.bench.workloads import lognormal_lengths
from fastsab.loaders.loader import FastLoader, FastSizeAwareLoader
from fastsab.varlen.collate import Collator, PackCollator, PadCollator
from fastsab.varlen.ragged import RaggedDataset

__all__ = ["BatchedSequenceList", "SequenceList", "ragged_rows"]

#: The table of ``ragged_rows``.
SUITE = "ragged"
FLOOR = "FastLoader, fixed-shape rows (floor)"
LIST = "list of tensors, DataLoader + "
HF = "Hugging Face Dataset (torch format), DataLoader + "
#: The ``sort_window`` of the padded rows that sort: most of an unsorted padded batch is padding.
SORT_WINDOW = 2048


class SequenceList(Dataset[dict[str, torch.Tensor]]):
    """A list of per-sequence tensors, as a map-style dataset: one ``__getitem__`` per sequence."""

    def __init__(self, sequences: list[torch.Tensor]) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.sequences[index]}


class BatchedSequenceList(SequenceList):
    """The same list with ``__getitems__``: one call per batch returns the list of samples a collator takes."""

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        sequences = self.sequences
        return [{"input_ids": sequences[i]} for i in indices]


def ragged_rows(
    samples: int = 50_000,
    budget: int = 16_384,
    epochs: int = 3,
    progress: Progress | None = None,
    window: int = SORT_WINDOW,
) -> list[Row]:
    """Epoch times of padded and packed token batches from a ``RaggedDataset`` and from a list of tensors.

    Lengths are ``lognormal_lengths`` (mean ~150, 8 to 4000), the
    batches those of ``FastSizeAwareLoader(..., budget, cost="sum")`` with the same seed for
    every case; padded batches also with ``sort_window=window``, the way padded batches are
    made in practice (without it most of a padded batch is padding). The floor is ``FastLoader``
    over a ``(rows, width)`` tensor of about the same total tokens (``width`` the mean length)
    in batches of ``budget // width`` rows. The list of tensors runs as most code does today: a
    ``DataLoader`` over the same batches (``batch_sampler``) calling ``__getitem__`` per
    sequence, then the collator; and with ``__getitems__`` through ``FastSizeAwareLoader``.
    ``x baseline`` is time / floor time; ``speed-up`` is the time of the ``DataLoader`` with the
    same collator and batches / this time, and the note of a ``RaggedDataset`` row says how
    much faster than that ``DataLoader`` the floor is: the most any gather could reach. Where
    ``datasets`` is installed, the same sequences as a Hugging Face ``Dataset`` in torch format
    run through the same ``DataLoader`` too, and the note of a ``RaggedDataset`` row without a
    window says how much faster it is.

    Examples:
        >>> rows = ragged_rows(samples=300, budget=4000, epochs=1, window=64)
        >>> [row.method for row in rows][:3]
        ['FastLoader, fixed-shape rows (floor)', 'RaggedDataset, padded', 'RaggedDataset, padded, sort_window=64']
        >>> all(row.seconds > 0 for row in rows)
        True
    """
    lengths = lognormal_lengths(samples)
    total = int(lengths.sum())
    tokens = torch.randint(0, 32_000, (total,), generator=torch.Generator().manual_seed(0))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    width = max(1, round(total / samples))
    rows = tokens[: total // width * width].reshape(-1, width)
    sequences = list(torch.split(tokens, lengths.tolist()))

    def sized(dataset: Any, collate_fn: Collator | None = None, sort_window: int | None = None) -> FastSizeAwareLoader:
        return FastSizeAwareLoader(
            dataset,
            lengths,
            budget,
            cost="sum",
            oversize="own_batch",
            seed=0,
            collate_fn=collate_fn,
            sort_window=sort_window,
        )

    def ragged(collator: Collator, sort_window: int | None = None) -> Callable[[], Iterable[Any]]:
        return lambda: sized(RaggedDataset(tokens, offsets, collator=collator), sort_window=sort_window)

    def data_loader(collate_fn: Collator, sort_window: int | None = None) -> Callable[[], Iterable[Any]]:
        # NOTE: one sampler per case: each iteration of it is the next epoch's batches
        sampler = sized(BatchedSequenceList(sequences), sort_window=sort_window).batch_sampler()
        return lambda: DataLoader(SequenceList(sequences), batch_sampler=sampler, collate_fn=collate_fn)

    windowed = f", sort_window={window:,}"
    # NOTE: each RaggedDataset row against the DataLoader over a list of tensors with its collator and batches
    against = {
        "RaggedDataset, padded": f"{LIST}PadCollator",
        f"RaggedDataset, padded{windowed}": f"{LIST}PadCollator{windowed}",
        "RaggedDataset, packed": f"{LIST}PackCollator",
    }
    cases: list[Case] = [
        (FLOOR, lambda: FastLoader(rows, max(1, budget // width), seed=0)),
        ("RaggedDataset, padded", ragged(PadCollator())),
        (f"RaggedDataset, padded{windowed}", ragged(PadCollator(), window)),
        ("RaggedDataset, packed", ragged(PackCollator())),
        (f"{LIST}PadCollator", data_loader(PadCollator())),
        (f"{LIST}PadCollator{windowed}", data_loader(PadCollator(), window)),
        (f"{LIST}PackCollator", data_loader(PackCollator())),
        (
            "list of tensors + __getitems__, FastSizeAwareLoader + PadCollator",
            lambda: sized(BatchedSequenceList(sequences), PadCollator()),
        ),
    ]
    hugging_face = _hugging_face_dataset(offsets, tokens)
    if hugging_face is not None:
        for collator in (PadCollator(), PackCollator()):
            sampler = sized(BatchedSequenceList(sequences)).batch_sampler()  # NOTE: one per case: epochs advance
            name = f"{HF}{type(collator).__name__}"
            cases.append((name, partial(DataLoader, hugging_face, batch_sampler=sampler, collate_fn=collator)))
    note = f"{samples:,} sequences, {total:,} tokens, budget {budget:,}"
    result = floor_rows(SUITE, lambda _: note, cases, epochs, progress)
    seconds_of = {row.method: row.seconds for row in result}
    for row in result:
        if row.method not in against:
            continue
        listed = seconds_of[against[row.method]]
        row.speedup = listed / row.seconds
        row.note += f"; the floor is {listed / seconds_of[FLOOR]:.1f}x faster than that DataLoader"
        hf_name = f"{HF}{against[row.method].removeprefix(LIST)}"
        if hf_name in seconds_of:
            row.note += f"; {seconds_of[hf_name] / row.seconds:.1f}x faster than the Hugging Face Dataset"
    return result


def _hugging_face_dataset(offsets: np.ndarray, tokens: torch.Tensor) -> Any:
    """The sequences as a Hugging Face ``datasets.Dataset`` in torch format, or ``None`` without ``datasets``."""
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        return None
    column = pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64)), pa.array(tokens.numpy()))
    return datasets.Dataset.from_dict({"input_ids": column}).with_format("torch")
