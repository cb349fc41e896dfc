"""The base of the collators: samples read into flat per-token values, then laid out as a batch.

``Collator`` reads a list of samples (``fastsab.varlen.sample_columns``), concatenates their
per-token values and stacks their scalars; its subclasses (``fastsab.varlen.collate``) lay the flat
values out in ``Collator._layout``, the one step ``Collator.from_flat`` leaves to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastsab._checks import short_repr
from fastsab.varlen.sample_columns import (
    Flat,
    check_sample_lengths,
    concatenate,
    read_columns,
    sequence_length,
    stack,
)

__all__ = ["Collator", "as_numpy_if_possible", "as_tensor", "pack_positions"]


def pack_positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cu_seqlens`` (int64, ``B + 1``) and the position of every token in its sequence (int64, ``T``).

    Vectorized: one cumulative sum, one ``repeat`` and one subtraction.

    Examples:
        >>> cu, positions = pack_positions(np.array([2, 0, 3]))
        >>> cu.tolist(), positions.tolist()
        ([0, 2, 2, 5], [0, 1, 0, 1, 2])
    """
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    positions = np.arange(cu[-1], dtype=np.int64)
    positions -= np.repeat(cu[:-1], lengths)
    return cu, positions


class Collator:
    """What ``PadCollator`` and ``PackCollator`` share.

    Reading samples, stacking scalars, and ``from_flat``: the batch made from the
    concatenated per-token values of its sequences, their lengths and the stacked scalars.
    Subclasses define ``_layout``, how the per-token values are laid out.
    """

    #: The keys the layout makes; a sample holding one of them is refused.
    reserved: tuple[str, ...] = ()

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The batch of ``samples``: a list of dicts with the same keys.

        Raises:
            TypeError: If ``samples`` is not a non-empty list of dicts, or a value is neither a
                1-D sequence of numbers nor a scalar.
            ValueError: If the samples' keys, kinds (per-token or scalar) or dtypes differ, a
                per-token value is not 1-D, or a sample's per-token values differ in length.
        """
        name = type(self).__name__
        if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)):
            raise TypeError(
                f"{name} takes a list of samples, got {short_repr(samples)} of type {type(samples).__name__}."
            )
        if not samples:
            raise ValueError(f"{name} takes at least one sample, got an empty list {samples!r}.")
        columns = read_columns(name, samples, self.reserved)
        tokens: dict[str, Flat] = {}
        scalars: dict[str, torch.Tensor] = {}
        lengths = np.zeros(len(samples), dtype=np.int64)
        for key, (kind, values) in columns.items():
            if kind == "token":
                tokens[key] = concatenate(name, key, values)
                lengths = np.array([sequence_length(v) for v in values], dtype=np.int64)
            else:
                scalars[key] = stack(name, key, values)
        check_sample_lengths(name, columns)
        return self.from_flat(tokens, lengths, scalars, order=list(columns))

    def from_flat(
        self,
        tokens: Mapping[str, Flat],
        lengths: np.ndarray,
        scalars: Mapping[str, torch.Tensor],
        order: Sequence[str] | None = None,
        positions: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """The batch of sequences whose per-token values are concatenated in ``tokens``.

        Args:
            tokens: Per-token key -> the values of all sequences, one after the other.
            lengths: Length of each sequence (int64, ``B``).
            scalars: Key -> one value per sequence (``B``).
            order: Order of the keys in the batch (default: ``tokens``, then ``scalars``).
            positions: ``pack_positions(lengths)`` if already computed.
        """
        keys = list(order or dict.fromkeys([*tokens, *scalars]))
        made, layout = self._layout(tokens, lengths, pack_positions(lengths) if positions is None else positions, keys)
        made.update(scalars)
        batch = {key: made[key] for key in keys}
        batch.update(layout)
        return batch

    def _layout(
        self, tokens: Mapping[str, Flat], lengths: np.ndarray, positions: tuple[np.ndarray, np.ndarray], keys: list[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The per-token values laid out, and the keys the layout adds after the batch's ``keys``.

        Args:
            tokens: As for ``from_flat``.
            lengths: As for ``from_flat``.
            positions: ``pack_positions(lengths)``: ``cu_seqlens`` and every token's position.
            keys: The keys of the batch, in order.
        """
        raise NotImplementedError


def as_numpy_if_possible(flat: Flat) -> Flat:
    """A CPU tensor as a numpy view of it when numpy holds its dtype; anything else unchanged."""
    if isinstance(flat, torch.Tensor) and flat.device.type == "cpu" and not flat.requires_grad:
        try:
            return flat.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            return flat
    return flat


def as_tensor(flat: Flat) -> torch.Tensor:
    return flat if isinstance(flat, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(flat))
