"""Collators for variable-length sequences: padded ``(B, L)`` batches and packed ``(T,)`` rows.

``PadCollator`` and ``PackCollator`` turn a list of samples (dicts of 1-D per-token
values such as ``input_ids`` and ``labels``, and scalars such as a class label) into the two
forms models of sequences take:

- **padded**: every per-token key as a ``(B, L)`` tensor, ``L`` the longest sequence (rounded
  up to ``pad_to_multiple_of``), filled with a pad value per key, and ``attention_mask``
  (int64, 1 on real tokens);
- **packed**: every per-token key as one ``(T,)`` tensor of the ``T`` tokens of the batch, in
  order, with ``position_ids`` (int64, restarting at 0 for each sequence), ``cu_seqlens``
  (int32, ``B + 1`` entries from 0 to ``T``) and ``max_seqlen`` (an ``int``): the inputs of
  variable-length attention kernels. Nothing is padded.

Scalars are stacked into ``(B,)`` tensors in both forms. Both collators work as the
``collate_fn`` of the fastsab loaders and of ``torch.utils.data.DataLoader``, and they are
the layouts of ``RaggedDataset``, which makes the same batches by
gathering straight from flat values: through ``Collator.from_flat`` (``fastsab.varlen.collator``)
like the collators, or, for a padded batch of mostly real tokens, ``PadCollator._gather_rows``,
one gather straight into its rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from fastsab._checks import check_optional_positive_int, short_repr
from fastsab.plan.cost_sources import padded_length
from fastsab.plan.shape_buckets import bucket_lengths as bucket_lengths_of
from fastsab.varlen.collator import Collator, as_numpy_if_possible, as_tensor, pack_positions
from fastsab.varlen.sample_columns import Flat

__all__ = ["Collator", "Flat", "PackCollator", "PadCollator", "pack_positions"]

#: The most tokens a packed batch's int32 ``cu_seqlens`` can count (np.iinfo costs a call per batch).
_INT32_MAX = int(np.iinfo(np.int32).max)

#: The keys a packed batch makes, which samples may not hold.
PACKED_KEYS = ("position_ids", "cu_seqlens", "max_seqlen")


class PadCollator(Collator):
    """Pads per-token values to the longest sequence of the batch, with an attention mask.

    Args:
        pad_value: The value padded tokens get: one number for every key, or a mapping from
            key to number (keys not in it are padded with 0), e.g. ``{"labels": -100}``.
            Every key of the mapping must be a per-token key of the samples.
        pad_to_multiple_of: Round the padded length up to a multiple of this (e.g. 8 for
            tensor cores); ``None`` pads to the longest sequence.
        bucket_lengths: Shape buckets' lengths (increasing): pad every batch to the first of them
            that holds its longest sequence, so that batches take only these few lengths (a
            batch longer than all is padded to its longest). A loader with ``buckets`` sets
            them on a ``PadCollator`` given without (``padded_to``).

    The batch holds every per-token key as a ``(B, L)`` tensor of its samples' dtype, the
    scalars stacked into ``(B,)`` tensors, and ``attention_mask`` (int64, ``(B, L)``, 1 on real
    tokens). A sample may hold its own ``attention_mask`` (a tokenizer's): it is padded with
    0 and returned in place of the one made. An empty sequence gives a row of pad values
    with a mask of zeros; a batch of empty sequences has ``L = 0``.

    Raises:
        TypeError: If ``pad_value`` is not a number or a mapping from keys to numbers, or
            ``pad_to_multiple_of`` is not an integer.
        ValueError: If ``pad_to_multiple_of`` is not positive.

    Examples:
        >>> collate = PadCollator(pad_value={"labels": -100})
        >>> batch = collate([{"input_ids": [5, 6, 7], "labels": [6, 7, 8], "label": 1},
        ...                  {"input_ids": [9], "labels": [4], "label": 0}])
        >>> batch["input_ids"].tolist(), batch["labels"].tolist()
        ([[5, 6, 7], [9, 0, 0]], [[6, 7, 8], [4, -100, -100]])
        >>> batch["attention_mask"].tolist(), batch["label"].tolist()
        ([[1, 1, 1], [1, 0, 0]], [1, 0])
    """

    def __init__(
        self,
        pad_value: int | float | Mapping[str, int | float] = 0,
        pad_to_multiple_of: int | None = None,
        bucket_lengths: Sequence[int] | None = None,
    ) -> None:
        self.pad_value = _check_pad_value(pad_value)
        self.pad_to_multiple_of = check_optional_positive_int("pad_to_multiple_of", pad_to_multiple_of)
        self.bucket_lengths = None if bucket_lengths is None else bucket_lengths_of("bucket_lengths", bucket_lengths)

    def __repr__(self) -> str:
        buckets = "" if self.bucket_lengths is None else f", bucket_lengths={list(self.bucket_lengths)!r}"
        return f"PadCollator(pad_value={self.pad_value!r}, pad_to_multiple_of={self.pad_to_multiple_of!r}{buckets})"

    def padded_to(self, bucket_lengths: Sequence[int]) -> PadCollator:
        """This collator padding every batch to the first of ``bucket_lengths`` that holds it."""
        return PadCollator(self.pad_value, self.pad_to_multiple_of, bucket_lengths)

    def width(self, lengths: np.ndarray) -> int:
        """The padded length ``L`` of a batch of ``lengths``: the longest one's (see ``padded_length``)."""
        longest = int(lengths.max()) if len(lengths) else 0
        return padded_length(longest, self.pad_to_multiple_of, self.bucket_lengths)

    def _layout(
        self, tokens: Mapping[str, Flat], lengths: np.ndarray, positions: tuple[np.ndarray, np.ndarray], keys: list[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every per-token key padded to ``(B, L)``; ``attention_mask`` unless the batch holds one."""
        self._check_pad_keys(tokens)
        shape = (len(lengths), self.width(lengths))
        # NOTE: the cell of every token in the flat (B, L) batch: its row's start plus its
        # position; one scatter of the T tokens, where a boolean mask would scan all B * L cells
        cells = np.repeat(np.arange(shape[0], dtype=np.int64) * shape[1], lengths) + positions[1]
        made: dict[str, Any] = {key: _pad(key, flat, cells, shape, self._pad_for(key)) for key, flat in tokens.items()}
        if "attention_mask" in keys:
            return made, {}
        mask = np.zeros(shape, dtype=np.int64)
        mask.reshape(-1)[cells] = 1
        return made, {"attention_mask": torch.from_numpy(mask)}

    def _gather_rows(
        self,
        values: Mapping[str, Flat],
        starts: np.ndarray,
        lengths: np.ndarray,
        scalars: Mapping[str, torch.Tensor],
    ) -> dict[str, Any] | None:
        """The batch of the sequences ``values[key][starts[b]:starts[b] + lengths[b]]``, read straight into ``(B, L)``.

        One gather of ``B`` rows of ``L`` consecutive values per key (rows of a strided view of
        the values), the padding cells then set to the key's pad value, and the mask a broadcast
        compare of ``arange(L)`` against ``lengths``: the batch ``from_flat`` makes of the
        concatenated sequences, without the flat copy and its scatter. ``None`` where this does
        not pay or cannot run: a batch of fewer real tokens than padding (its ``B * L`` reads
        would cost more than the scatter of its tokens), or values that are not numpy arrays in
        the machine's byte order.

        Args:
            values: Per-token key -> the flat values the sequences are read from (one length).
            starts: Where each sequence of the batch starts in the values (int64, ``B``).
            lengths: Length of each sequence (int64, ``B``).
            scalars: Key -> one value per sequence (``B``).

        Examples:
            >>> flat = {"input_ids": np.array([5, 6, 7, 8, 9])}
            >>> batch = PadCollator(-1)._gather_rows(flat, np.array([3, 0]), np.array([2, 3]), {})
            >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
            ([[8, 9, -1], [5, 6, 7]], [[1, 1, 0], [1, 1, 1]])
        """
        shape = (len(lengths), self.width(lengths))
        real_tokens = int(lengths.sum())
        # NOTE: big-endian values take the flat gather, which reads them in the machine's byte order
        if 2 * real_tokens < shape[0] * shape[1] or not all(
            isinstance(v, np.ndarray) and v.dtype.isnative for v in values.values()
        ):
            return None
        self._check_pad_keys(values)
        # NOTE: the mask straight in int64 (1 on real tokens), with no boolean matrix to convert
        mask = np.less(np.arange(shape[1], dtype=np.int64), lengths[:, None], out=np.empty(shape, dtype=np.int64))
        full = real_tokens == mask.size
        padding: np.ndarray | None = None
        batch: dict[str, Any] = {}
        for key, flat in values.items():
            fill = _fitting_pad(key, self._pad_for(key), flat.dtype)
            out = _windows(cast(np.ndarray, flat), starts, shape[1])  # numpy: checked above
            if not full and fill == 0 and out.dtype == mask.dtype:
                out *= mask  # NOTE: exact for integers: a token times 1 is itself, times 0 the pad 0
            elif not full:
                padding = mask == 0 if padding is None else padding
                np.copyto(out, fill, where=padding, casting="unsafe")  # exact: _fitting_pad checked it
            batch[key] = torch.from_numpy(out)
        batch.update(scalars)  # NOTE: a scalar key is never a per-token key (RaggedDataset refuses it)
        if "attention_mask" not in batch:
            batch["attention_mask"] = torch.from_numpy(mask)
        return batch

    def _check_pad_keys(self, tokens: Mapping[str, Flat]) -> None:
        """Refuse a ``pad_value`` mapping that names a key the batch has no per-token values of."""
        if isinstance(self.pad_value, Mapping):
            unknown = sorted(set(self.pad_value) - set(tokens))
            if unknown:
                raise ValueError(
                    f"pad_value names {unknown!r}, which are not per-token keys of the batch "
                    f"(those are {sorted(tokens)!r}): a misspelt key would be padded with 0."
                )

    def _pad_for(self, key: str) -> int | float:
        if isinstance(self.pad_value, Mapping):
            # NOTE: a sample's own attention mask is padded with 0 unless the mapping says otherwise
            return self.pad_value.get(key, 0)
        return 0 if key == "attention_mask" else self.pad_value


class PackCollator(Collator):
    """Concatenates the sequences of a batch into one row, with what varlen attention needs.

    The batch holds every per-token key as a ``(T,)`` tensor of its samples' dtype (the ``T``
    tokens of the batch, sequence after sequence), ``position_ids`` (int64, ``(T,)``, from 0
    in each sequence), ``cu_seqlens`` (int32, ``(B + 1,)``, from 0 to ``T``: sequence ``b`` is
    ``[cu_seqlens[b], cu_seqlens[b + 1])``), ``max_seqlen`` (an ``int``, 0 for a batch of empty
    sequences) and the scalars stacked into ``(B,)`` tensors. An empty sequence adds no token
    and repeats its offset in ``cu_seqlens``. Samples may not hold the keys it makes.

    Examples:
        >>> batch = PackCollator()([{"input_ids": [5, 6, 7]}, {"input_ids": [9]}])
        >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
        ([5, 6, 7, 9], [0, 1, 2, 0])
        >>> batch["cu_seqlens"], batch["max_seqlen"]
        (tensor([0, 3, 4], dtype=torch.int32), 3)
    """

    reserved = PACKED_KEYS

    def __repr__(self) -> str:
        return "PackCollator()"

    def _layout(
        self, tokens: Mapping[str, Flat], lengths: np.ndarray, positions: tuple[np.ndarray, np.ndarray], keys: list[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every per-token key as one ``(T,)`` tensor; ``position_ids``, ``cu_seqlens``, ``max_seqlen``."""
        cu, position_ids = positions
        total = int(cu[-1])
        if total > _INT32_MAX:
            raise ValueError(
                f"a packed batch of {total} tokens does not fit int32 cu_seqlens: lower the batch's token budget."
            )
        made: dict[str, Any] = {key: as_tensor(flat) for key, flat in tokens.items()}
        layout = {
            "position_ids": torch.from_numpy(position_ids),
            "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
            "max_seqlen": int(lengths.max()) if len(lengths) else 0,
        }
        return made, layout


# -- padding ------------------------------------------------------------------------------


def _windows(flat: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Rows ``flat[s:s + width]`` for each start ``s``, as a new ``(len(starts), width)`` array.

    The cells of a row past the end of ``flat`` (padding of the batch's last sequences) read the
    last value; the caller overwrites them with the pad.
    """
    size = len(flat)
    last = size - width  # the last start whose whole row lies in the values
    if last < 0:
        out = np.empty((len(starts), width), dtype=flat.dtype)
        late = np.arange(len(starts))
    else:
        # NOTE: row s of this view is flat[s:s + width]: one fancy index copies whole rows, where a
        # (B, L) matrix of positions would read value by value; np.ndarray over the buffer costs
        # far less than as_strided, which takes views of any strides
        step = flat.strides[0]
        if flat.flags.c_contiguous:
            view = np.ndarray((last + 1, width), flat.dtype, flat, 0, (step, step))
        else:
            view = as_strided(flat, (last + 1, width), (step, step), writeable=False)
        # NOTE: asarray: a memory map's gather is a memmap instance that maps no file
        out = np.asarray(view[np.minimum(starts, last)])
        late = np.flatnonzero(starts > last)
    if late.size:
        cells = starts[late, None] + np.arange(width, dtype=np.int64)
        out[late] = flat[np.minimum(cells, size - 1)]
    return out


def _pad(key: str, flat: Flat, cells: np.ndarray, shape: tuple[int, int], pad: int | float) -> torch.Tensor:
    """A ``shape`` tensor: ``flat`` in the row-major ``cells``, ``pad`` elsewhere."""
    # NOTE: numpy does the scatter where it holds the dtype: torch has no index_put for uint16,
    # the dtype of memmapped token files
    flat = as_numpy_if_possible(flat)
    if isinstance(flat, np.ndarray):
        fill = _fitting_pad(key, pad, flat.dtype)
        out = np.zeros(shape, dtype=flat.dtype) if fill == 0 else np.full(shape, fill, dtype=flat.dtype)
        out.reshape(-1)[cells] = flat
        return torch.from_numpy(out)
    tensor_out = torch.full(shape, _fitting_pad(key, pad, flat.dtype), dtype=flat.dtype, device=flat.device)
    tensor_out.view(-1)[torch.from_numpy(cells).to(flat.device)] = flat
    return tensor_out


def _fitting_pad(key: str, pad: int | float, dtype: np.dtype[Any] | torch.dtype) -> int | float:
    """``pad`` if the dtype of ``key`` holds it exactly.

    Raises:
        ValueError: If the dtype does not hold ``pad``.
    """
    # NOTE: remembered per key, pad (and its type: 1 and 1.0 hash alike) and dtype, since every
    # batch asks again; a refusal raises, which is not remembered
    return _checked_pad(key, pad, type(pad).__name__, dtype)


@functools.lru_cache(maxsize=256)
def _checked_pad(key: str, pad: int | float, _: str, dtype: np.dtype[Any] | torch.dtype) -> int | float:
    try:
        if isinstance(dtype, torch.dtype):
            held = torch.tensor(pad, dtype=dtype).item()
        else:
            # NOTE: astype wraps around instead of raising, and warns of a value it cannot cast
            # (NaN to an integer, 1e300 to float32): the comparison below says so instead
            with np.errstate(invalid="ignore", over="ignore"):
                held = np.array(pad).astype(dtype).item()
    except (OverflowError, RuntimeError, TypeError):
        held = None
    if held != pad and not (
        isinstance(pad, float) and math.isnan(pad) and isinstance(held, float) and math.isnan(held)
    ):
        raise ValueError(f"pad_value {pad!r} of key {key!r} does not fit its dtype {dtype}: choose a value it holds.")
    return pad


def _check_pad_value(value: Any) -> int | float | dict[str, int | float]:
    if isinstance(value, Mapping):
        for key, pad in value.items():
            if not isinstance(key, str):
                raise TypeError(f"pad_value keys must be strings, got {key!r} of type {type(key).__name__}.")
            _check_pad_number(f"pad_value[{key!r}]", pad)
        return dict(value)
    return _check_pad_number("pad_value", value)


def _check_pad_number(name: str, value: Any) -> int | float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"{name} must be a number (or, for pad_value, a mapping from keys to numbers), "
            f"got {short_repr(value)} of type {type(value).__name__}."
        )
    return value.item() if isinstance(value, np.generic) else value
