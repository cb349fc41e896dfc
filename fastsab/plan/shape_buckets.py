"""Shape buckets: a few padded lengths, and a fixed batch size for each.

Compiled models (``torch.compile(dynamic=False)``, CUDA graphs, XLA) compile once per input
shape. With shape buckets every batch is padded to one of ``K`` lengths ``L_1 < ... < L_K``
and a batch of bucket ``k`` holds ``B_k`` rows, so that an epoch has at most ``K`` batch
shapes. An item of length ``l`` goes to the first bucket whose length holds it
(``L_{k-1} < l <= L_k``); an item longer than ``L_K`` is oversize.

``ShapeBuckets`` is the table: the lengths, and optionally each bucket's batch size (given, or
measured by ``max_batch_sizes`` of ``fastsab.memory``). It is saved as JSON and loaded again.
``ShapeBuckets.fit`` chooses ``K`` lengths from the items' lengths that pad the fewest tokens
(``choose_lengths``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fastsab._arrays import as_numpy
from fastsab._checks import check_positive_int
from fastsab.plan.cost_sources import padded_length
from fastsab.plan.exact_caps import _INT64_MAX

__all__ = ["ShapeBuckets", "choose_lengths"]

#: The JSON format of a saved table, checked on load.
FORMAT = "fastsab.ShapeBuckets/1"

#: ``choose_lengths`` is exact for up to this many distinct lengths; more are grouped first.
MAX_CANDIDATES = 1024


@dataclass(frozen=True)
class ShapeBuckets:
    """``K`` padded lengths and, optionally, the batch size of each.

    Args:
        lengths: The bucket lengths, strictly increasing positive integers (up to ``2**63 - 1``).
        batch_sizes: Rows per batch of each bucket (one per length, positive integers up to ``2**63 - 1``), or
            ``None``: a loader derives them from its budget (``B_k`` is the largest count
            whose padded batch fits ``max_total_size``).
        source: How the batch sizes were found (free text kept in the JSON file, e.g. the
            device they were measured on).

    Examples:
        >>> buckets = ShapeBuckets([64, 128, 512], batch_sizes=[256, 128, 32])
        >>> buckets.bucket_of(np.array([1, 64, 65, 512, 513])).tolist()  # 3: longer than every bucket
        [0, 0, 1, 2, 3]
        >>> ShapeBuckets.from_json(buckets.to_json()) == buckets
        True
    """

    lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...] | None = None
    source: str = field(default="", compare=False)

    def __init__(self, lengths: Sequence[int], batch_sizes: Sequence[int] | None = None, source: str = "") -> None:
        checked = bucket_lengths("lengths", lengths)
        sizes = None if batch_sizes is None else _positive_ints("batch_sizes", batch_sizes)
        if sizes is not None and len(sizes) != len(checked):
            raise ValueError(
                f"batch_sizes must give one batch size per bucket length ({len(checked)}), got {list(sizes)!r}."
            )
        if not isinstance(source, str):
            raise TypeError(f"source must be a string, got {source!r}.")
        object.__setattr__(self, "lengths", checked)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "source", source)

    @property
    def num_buckets(self) -> int:
        """``K``, the number of buckets."""
        return len(self.lengths)

    def bucket_of(self, lengths: np.ndarray) -> np.ndarray:
        """The bucket of each length: the first whose length holds it, ``K`` for one longer than all."""
        return np.searchsorted(np.asarray(self.lengths, dtype=np.int64), lengths, side="left").astype(np.int64)

    def with_batch_sizes(self, batch_sizes: Sequence[int], source: str = "") -> ShapeBuckets:
        """The same lengths with ``batch_sizes``."""
        return ShapeBuckets(self.lengths, batch_sizes, source)

    @classmethod
    def fit(cls, lengths: Any, num_buckets: int, *, pad_to_multiple_of: int | None = None) -> ShapeBuckets:
        """``num_buckets`` bucket lengths that pad ``lengths`` the least (see ``choose_lengths``)."""
        return cls(choose_lengths(lengths, num_buckets, pad_to_multiple_of=pad_to_multiple_of))

    def to_json(self) -> str:
        """The table as JSON text (``from_json`` reads it back)."""
        sizes = None if self.batch_sizes is None else list(self.batch_sizes)
        table = {"format": FORMAT, "lengths": list(self.lengths), "batch_sizes": sizes, "source": self.source}
        return json.dumps(table, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ShapeBuckets:
        """The table written by ``to_json``.

        Raises:
            ValueError: If ``text`` is not such a table.
        """
        try:
            table = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not a ShapeBuckets table (invalid JSON: {error}).") from None
        if not isinstance(table, dict) or table.get("format") != FORMAT:
            shown = table.get("format") if isinstance(table, dict) else type(table).__name__
            raise ValueError(f"not a ShapeBuckets table: its format is {shown!r}, expected {FORMAT!r}.")
        if "lengths" not in table:
            raise ValueError(f"not a ShapeBuckets table: it has no 'lengths', only {sorted(table)!r}.")
        return cls(table["lengths"], table.get("batch_sizes"), table.get("source", ""))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the table to ``path`` as JSON."""
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ShapeBuckets:
        """The table saved at ``path`` by ``save``."""
        with open(path, encoding="utf-8") as file:
            return cls.from_json(file.read())


def choose_lengths(
    lengths: Any, num_buckets: int, *, pad_to_multiple_of: int | None = None, counts: Any = None
) -> tuple[int, ...]:
    """The ``num_buckets`` bucket lengths that pad ``lengths`` to the fewest tokens.

    Each item is padded to the first bucket length that holds it, so the padded tokens are
    ``sum_k n_k * L_k`` (``n_k`` items in bucket ``k``); the longest length is always the last
    bucket. A dynamic program over the histogram of distinct lengths finds the exact minimum
    (``num_buckets`` rows of one vectorized step each). With more than ``MAX_CANDIDATES``
    distinct lengths, the candidates are that many lengths at evenly spaced quantiles (and
    the longest), and each length counts at the first candidate that holds it.

    Args:
        lengths: The items' lengths (non-negative integers, any array-like; padded, up to ``2**63 - 1``).
        num_buckets: ``K``; fewer lengths are returned when there are fewer distinct lengths.
        pad_to_multiple_of: Round lengths up to a multiple of this first (bucket lengths are then
            multiples of it, at least the multiple itself: a length of 0 pads to one multiple).
        counts: How many items have each of ``lengths`` (a histogram); ``None``: one each.

    Examples:
        >>> choose_lengths([1, 2, 2, 3, 10, 10, 10, 11], 2)
        (3, 11)
        >>> choose_lengths([5, 17, 30], 4, pad_to_multiple_of=8)
        (8, 24, 32)
    """
    check_positive_int("num_buckets", num_buckets)
    values = as_numpy("lengths", lengths, "a sequence of lengths")
    if values.ndim > 1 and values.shape[1:] != (1,):
        raise ValueError(
            f"lengths must be 1-D (one length per item), got shape {values.shape}: pass the column of lengths."
        )
    values = values.reshape(-1)
    if not len(values):
        raise ValueError("lengths is empty: bucket lengths are chosen from at least one item's length.")
    if values.dtype.kind not in "iu":
        raise ValueError(
            f"lengths must be non-negative integers to choose bucket lengths, got dtype {values.dtype}: round them up "
            "(np.ceil) to the tokens they pad to, and cast them to integers."
        )
    if int(values.min()) < 0:
        least = values.min().item()
        raise ValueError(f"lengths must be non-negative integers to choose bucket lengths, got {least!r}.")
    multiple = 1 if pad_to_multiple_of is None else check_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    # NOTE: a bucket length is an int64 (a loader pads to it): one a length pads to past it is refused,
    # where numpy would wrap it around to a negative length, and the ladder leave its item out
    past = values > (_INT64_MAX // multiple) * multiple if multiple <= _INT64_MAX else np.ones(len(values), bool)
    if past.any():
        at = int(np.argmax(past))
        padded = f" padded to a multiple of {multiple}" if multiple > 1 else ""
        raise ValueError(
            f"lengths[{at}] = {values[at].item()!r}{padded} is past int64's largest (2**63 - 1), the longest bucket "
            "length: check the lengths (tokens per item) and pad_to_multiple_of."
        )
    values = padded_length(values.astype(np.int64), multiple)
    weights = None if counts is None else as_numpy("counts", counts).reshape(-1)
    if weights is not None and len(weights) != len(values):
        raise ValueError(f"counts must give one count per length ({len(values)}), got {len(weights)}.")
    if weights is not None:
        numbers = weights.dtype.kind in "iuf"
        bad = ~((weights >= 0) & (weights % 1 == 0)) if numbers else np.ones(len(weights), dtype=bool)
        if bad.any():
            at = int(np.argmax(bad))
            raise ValueError(
                f"counts must be non-negative integers (how many items have each length), got {weights[at].item()!r} "
                f"at position {at}."
            )
    # NOTE: a bucket length is a positive multiple: a length of 0 pads to the multiple itself
    distinct, where = np.unique(np.maximum(values, multiple), return_inverse=True)
    counts = np.bincount(where.reshape(-1), weights=weights).astype(np.int64)
    if len(distinct) > MAX_CANDIDATES:
        cumulative = np.cumsum(counts)
        marks = np.linspace(0, cumulative[-1], MAX_CANDIDATES + 1)[1:]
        candidates = np.unique(distinct[np.searchsorted(cumulative, marks, side="left").clip(max=len(distinct) - 1)])
        counts = np.bincount(np.searchsorted(candidates, distinct), weights=counts, minlength=len(candidates))
        distinct, counts = candidates, counts.astype(np.int64)
    if len(distinct) <= num_buckets:
        return tuple(int(v) for v in distinct)
    return tuple(int(v) for v in distinct[_best_boundaries(distinct, counts, num_buckets)])


def _best_boundaries(values: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` values (the last one included) that minimise ``sum(count * bucket length)``.

    ``best[j]`` is the least cost of the values ``0..j-1`` in buckets whose last bucket length
    is ``values[j - 1]``; a new row of buckets is one minimum over a ``(m + 1, m + 1)`` matrix.
    """
    m = len(values)
    below = np.zeros(m + 1, dtype=np.int64)  # items with one of the first j values
    np.cumsum(counts, out=below[1:])
    top = np.concatenate([[0], values]).astype(np.int64)  # the bucket length ending at value j - 1
    huge: float = np.iinfo(np.int64).max // 4
    if int(values[-1]) * int(below[-1]) >= huge:
        # NOTE: padded tokens past int64 would wrap around (and a length be chosen twice): summed in
        # float64 instead, exact up to its rounding, with no sum that stands for "no ladder" but inf
        below, top, huge = below.astype(np.float64), top.astype(np.float64), math.inf
    best = np.where(np.arange(m + 1) > 0, top * below, huge)
    best[0] = huge
    choices = []
    earlier = np.arange(m + 1)[:, None] < np.arange(m + 1)[None, :]  # i < j: a bucket ends at i, the next at j
    for _ in range(k - 1):
        # NOTE: row i, column j: the cost up to value i - 1, plus values i..j-1 padded to values[j - 1]
        options = np.where(earlier, best[:, None] + top[None, :] * (below[None, :] - below[:, None]), huge)
        choices.append(options.argmin(axis=0))
        best = np.minimum(options.min(axis=0), huge)
    ends = [m]
    for choice in reversed(choices):
        ends.append(int(choice[ends[-1]]))
    return np.asarray(sorted(ends), dtype=np.int64) - 1


def bucket_lengths(name: str, lengths: Sequence[int]) -> tuple[int, ...]:
    """``lengths`` checked as bucket lengths (strictly increasing positive integers), errors naming ``name``.

    Raises:
        TypeError: If ``lengths`` is not a sequence of integers.
        ValueError: If it is empty, or not of strictly increasing positive integers up to ``2**63 - 1``.
    """
    checked = _positive_ints(name, lengths)
    if any(b <= a for a, b in itertools.pairwise(checked)):
        raise ValueError(f"{name} must be strictly increasing, got {list(checked)!r}: sort them and drop repeats.")
    return checked


def _positive_ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    """``values`` as a non-empty tuple of positive integers, or a ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(values, torch.Tensor) and values.ndim == 1:  # (as lengths may be a tensor)
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of positive integers, got {values!r}.")
    if not len(values):
        raise ValueError(f"{name} must hold at least one positive integer, got {list(values)!r}.")
    checked = tuple(check_positive_int(name, int(v) if isinstance(v, np.integer) else v) for v in values)
    # NOTE: the planner counts batches and pads rows in int64: a value past it (a typo such as
    # 10**20 in a saved table) is refused here, by name, not by numpy once a loader counts its batches
    for at, value in enumerate(checked):
        if value > _INT64_MAX:
            raise ValueError(
                f"{name} must be at most 2**63 - 1 (int64's largest), got {value!r} at position {at}: "
                "correct the value (a bucket's length in tokens, or its batch size in rows)."
            )
    return checked
