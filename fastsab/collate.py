"""Collators for variable-length sequences: padded ``(B, L)`` batches and packed ``(T,)`` rows.

:class:`PadCollator` and :class:`PackCollator` turn a list of samples (dicts of 1-D per-token
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
the layouts of :class:`~fastsab.ragged.RaggedDataset`, which makes the same batches by
gathering straight from flat values: both paths end in :meth:`Collator.from_flat`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, Union

import numpy as np
import torch

from fastsab._checks import check_optional_positive_int, short_repr

__all__ = ["Collator", "PackCollator", "PadCollator", "pack_positions"]

#: Flat per-token values of a batch: a numpy array where numpy holds the dtype, else a tensor.
Flat: TypeAlias = Union[np.ndarray, torch.Tensor]  # noqa: UP007  # (a runtime alias under Python 3.10)

#: The keys a packed batch makes, which samples may not hold.
PACKED_KEYS = ("position_ids", "cu_seqlens", "max_seqlen")


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
    positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], lengths)
    return cu, positions


class Collator:
    """What :class:`PadCollator` and :class:`PackCollator` share: reading samples, stacking scalars.

    Subclasses define :meth:`from_flat`, the batch made from the concatenated per-token
    values of its sequences, their lengths and the stacked scalars.
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
        columns = _columns(name, samples, self.reserved)
        tokens: dict[str, Flat] = {}
        scalars: dict[str, torch.Tensor] = {}
        lengths = np.zeros(len(samples), dtype=np.int64)
        for key, (kind, values) in columns.items():
            if kind == "token":
                tokens[key] = _concatenate(name, key, values)
                lengths = np.array([_length(v) for v in values], dtype=np.int64)
            else:
                scalars[key] = _stack(name, key, values)
        _check_sample_lengths(name, columns)
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
        raise NotImplementedError


class PadCollator(Collator):
    """Pads per-token values to the longest sequence of the batch, with an attention mask.

    Args:
        pad_value: The value padded tokens get: one number for every key, or a mapping from
            key to number (keys not in it are padded with 0), e.g. ``{"labels": -100}``.
            Every key of the mapping must be a per-token key of the samples.
        pad_to_multiple_of: Round the padded length up to a multiple of this (e.g. 8 for
            tensor cores); ``None`` pads to the longest sequence.

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
        self, pad_value: int | float | Mapping[str, int | float] = 0, pad_to_multiple_of: int | None = None
    ) -> None:
        self.pad_value = _check_pad_value(pad_value)
        self.pad_to_multiple_of = check_optional_positive_int("pad_to_multiple_of", pad_to_multiple_of)

    def __repr__(self) -> str:
        return f"PadCollator(pad_value={self.pad_value!r}, pad_to_multiple_of={self.pad_to_multiple_of!r})"

    def width(self, lengths: np.ndarray) -> int:
        """The padded length ``L`` of a batch of sequences of ``lengths``."""
        longest = int(lengths.max()) if len(lengths) else 0
        multiple = self.pad_to_multiple_of
        return longest if multiple is None else -(-longest // multiple) * multiple

    def from_flat(
        self,
        tokens: Mapping[str, Flat],
        lengths: np.ndarray,
        scalars: Mapping[str, torch.Tensor],
        order: Sequence[str] | None = None,
        positions: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """The padded batch; see :meth:`Collator.from_flat`."""
        if isinstance(self.pad_value, Mapping):
            unknown = sorted(set(self.pad_value) - set(tokens))
            if unknown:
                raise ValueError(
                    f"pad_value names {unknown!r}, which are not per-token keys of the batch "
                    f"(those are {sorted(tokens)!r}): a misspelt key would be padded with 0."
                )
        _, position_ids = pack_positions(lengths) if positions is None else positions
        shape = (len(lengths), self.width(lengths))
        # NOTE: the cell of every token in the flat (B, L) batch: its row's start plus its
        # position; one scatter of the T tokens, where a boolean mask would scan all B * L cells
        cells = np.repeat(np.arange(shape[0], dtype=np.int64) * shape[1], lengths) + position_ids
        made: dict[str, Any] = {key: _pad(key, flat, cells, shape, self._pad_for(key)) for key, flat in tokens.items()}
        made.update(scalars)
        batch = {key: made[key] for key in (order or made)}
        if "attention_mask" not in batch:
            mask = np.zeros(shape, dtype=np.int64)
            mask.reshape(-1)[cells] = 1
            batch["attention_mask"] = torch.from_numpy(mask)
        return batch

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

    def from_flat(
        self,
        tokens: Mapping[str, Flat],
        lengths: np.ndarray,
        scalars: Mapping[str, torch.Tensor],
        order: Sequence[str] | None = None,
        positions: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """The packed batch; see :meth:`Collator.from_flat`."""
        cu, position_ids = pack_positions(lengths) if positions is None else positions
        total = int(cu[-1])
        if total > np.iinfo(np.int32).max:
            raise ValueError(
                f"a packed batch of {total} tokens does not fit int32 cu_seqlens: lower the batch's token budget."
            )
        made: dict[str, Any] = {key: _as_tensor(flat) for key, flat in tokens.items()}
        made.update(scalars)
        batch = {key: made[key] for key in (order or made)}
        batch["position_ids"] = torch.from_numpy(position_ids)
        batch["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32))
        batch["max_seqlen"] = int(lengths.max()) if len(lengths) else 0
        return batch


# -- padding ------------------------------------------------------------------------------


def _pad(key: str, flat: Flat, cells: np.ndarray, shape: tuple[int, int], pad: int | float) -> torch.Tensor:
    """A ``shape`` tensor: ``flat`` in the row-major ``cells``, ``pad`` elsewhere."""
    # NOTE: numpy does the scatter where it holds the dtype: torch has no index_put for uint16,
    # the dtype of memmapped token files
    flat = _as_numpy_if_possible(flat)
    if isinstance(flat, np.ndarray):
        fill = _fitting_pad(key, pad, flat.dtype)
        out = np.zeros(shape, dtype=flat.dtype) if fill == 0 else np.full(shape, fill, dtype=flat.dtype)
        out.reshape(-1)[cells] = flat
        return torch.from_numpy(out)
    tensor_out = torch.full(shape, _fitting_pad(key, pad, flat.dtype), dtype=flat.dtype, device=flat.device)
    tensor_out.view(-1)[torch.from_numpy(cells).to(flat.device)] = flat
    return tensor_out


def _fitting_pad(key: str, pad: int | float, dtype: np.dtype[Any] | torch.dtype) -> int | float:
    """``pad`` if the dtype of ``key`` holds it exactly."""
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


# -- reading samples ----------------------------------------------------------------------


def _columns(name: str, samples: Sequence[Any], reserved: tuple[str, ...]) -> dict[str, tuple[str, list[Any]]]:
    """Key -> (``"token"`` or ``"scalar"``, the values of every sample), checked."""
    first = samples[0]
    if not isinstance(first, Mapping):
        raise TypeError(
            f"{name} takes samples that are dicts of per-token values and scalars, "
            f"got sample 0 = {short_repr(first)} of type {type(first).__name__}."
        )
    keys = list(first)
    clash = [key for key in keys if key in reserved]
    if clash:
        raise ValueError(f"{name} makes the keys {list(reserved)!r}, so samples may not hold them; got {clash!r}.")
    kinds = {key: _kind(name, key, 0, _value(name, key, 0, first[key]), first[key]) for key in keys}
    columns: dict[str, tuple[str, list[Any]]] = {key: (kind, []) for key, kind in kinds.items()}
    first_keys = first.keys()
    for position, sample in enumerate(samples):
        if not (type(sample) is dict or isinstance(sample, Mapping)) or sample.keys() != first_keys:
            got = list(sample) if isinstance(sample, Mapping) else type(sample).__name__
            raise ValueError(
                f"{name} takes samples with the same keys: sample 0 has {keys!r}, sample {position} {got!r}."
            )
        for key, (kind, values) in columns.items():
            raw = sample[key]
            value = raw if type(raw) is torch.Tensor else _value(name, key, position, raw)
            if _kind(name, key, position, value, raw) != kind:
                raise ValueError(
                    f"{name}: {key!r} is a {kind} in sample 0 but not in sample {position}, "
                    f"whose value is {short_repr(raw)}."
                )
            values.append(value)
    return columns


def _kind(name: str, key: str, position: int, value: torch.Tensor | np.ndarray | list[Any], raw: Any) -> str:
    """``"token"`` for a 1-D value (or an empty list), ``"scalar"`` for a 0-d one."""
    if isinstance(value, list) or value.ndim == 1:
        return "token"
    if value.ndim == 0:
        return "scalar"
    raise ValueError(
        f"{name} takes 1-D per-token values and scalars, got {key!r} of shape "
        f"{tuple(value.shape)} in sample {position}: {short_repr(raw)}."
    )


def _value(name: str, key: str, position: int, value: Any) -> torch.Tensor | np.ndarray | list[Any]:
    """A sample's value as a tensor or numpy array (an empty list stays an empty list: it has no dtype)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and not value:
        return []
    if isinstance(value, (np.ndarray, np.generic, list, tuple, bool, int, float)):
        array = np.asarray(value)
        if array.dtype.kind in "biuf":
            return array
    raise TypeError(
        f"{name} takes tensors, arrays, lists and numbers, got {key!r} = {short_repr(value)} "
        f"of type {type(value).__name__} in sample {position}."
    )


def _length(value: torch.Tensor | np.ndarray | list[Any]) -> int:
    # NOTE: shape[0], not len(): a tensor's __len__ is a Python function
    return len(value) if isinstance(value, list) else int(value.shape[0])


def _check_sample_lengths(name: str, columns: dict[str, tuple[str, list[Any]]]) -> None:
    tokens = {key: values for key, (kind, values) in columns.items() if kind == "token"}
    if len(tokens) < 2:
        return
    lengths = np.array([[_length(v) for v in values] for values in tokens.values()])
    bad = np.flatnonzero((lengths != lengths[0]).any(axis=0))
    if len(bad):
        found = ", ".join(f"{key} {int(row[bad[0]])}" for key, row in zip(tokens, lengths))
        raise ValueError(f"{name}: sample {bad[0]} has per-token values of different lengths: {found}.")


def _concatenate(name: str, key: str, values: list[Any]) -> Flat:
    """The per-token values of every sample, one after the other, in their common dtype."""
    dtype = _common_dtype(name, key, values)
    if isinstance(dtype, torch.dtype):
        return torch.cat([torch.as_tensor(v, dtype=dtype) if isinstance(v, list) else v for v in values])
    return np.concatenate([np.asarray(v, dtype=dtype) for v in values])


def _stack(name: str, key: str, values: list[Any]) -> torch.Tensor:
    dtype = _common_dtype(name, key, values)
    if isinstance(dtype, torch.dtype):
        return torch.stack(values)
    return torch.from_numpy(np.stack(values))


def _common_dtype(name: str, key: str, values: list[Any]) -> torch.dtype | np.dtype[Any]:
    """The dtype every sample's value of ``key`` has: a torch dtype if they are tensors, else a numpy one."""
    typed = [(position, v) for position, v in enumerate(values) if not isinstance(v, list)]
    if not typed:
        return np.dtype(np.int64)  # only empty lists: token ids
    first_position, first = typed[0]
    for position, value in typed:
        if type(value) is not type(first) or value.dtype != first.dtype:
            raise ValueError(
                f"{name}: {key!r} is {_describe(first)} in sample {first_position} but {_describe(value)} in sample "
                f"{position}; give every sample the same kind and dtype."
            )
    return first.dtype  # type: ignore[no-any-return]


def _describe(value: Any) -> str:
    kind = "a tensor" if isinstance(value, torch.Tensor) else "an array"
    return f"{kind} of dtype {value.dtype}"


# -- conversions ---------------------------------------------------------------------------


def _as_numpy_if_possible(flat: Flat) -> Flat:
    """A CPU tensor as a numpy view of it when numpy holds its dtype; anything else unchanged."""
    if isinstance(flat, torch.Tensor) and flat.device.type == "cpu" and not flat.requires_grad:
        try:
            return flat.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks
            return flat
    return flat


def _as_tensor(flat: Flat) -> torch.Tensor:
    return flat if isinstance(flat, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(flat))
