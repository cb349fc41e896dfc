"""Samples read for a collator: every key's values, checked to be per-token values or scalars alike.

A sample is a dict of 1-D per-token values (tensors, arrays or lists of numbers) and scalars.
``read_columns`` checks that every sample has the first one's keys, kinds and shapes;
``concatenate`` and ``stack`` join a key's values in their common dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, Union

import numpy as np
import torch

from fastsab._checks import short_repr

__all__ = ["Flat", "check_sample_lengths", "concatenate", "read_columns", "sequence_length", "stack"]

#: Flat per-token values of a batch: a numpy array where numpy holds the dtype, else a tensor.
Flat: TypeAlias = Union[np.ndarray, torch.Tensor]  # noqa: UP007  # (a runtime alias under Python 3.10)


def read_columns(name: str, samples: Sequence[Any], reserved: tuple[str, ...]) -> dict[str, tuple[str, list[Any]]]:
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


def sequence_length(value: torch.Tensor | np.ndarray | list[Any]) -> int:
    # NOTE: shape[0], not len(): a tensor's __len__ is a Python function
    return len(value) if isinstance(value, list) else int(value.shape[0])


def check_sample_lengths(name: str, columns: dict[str, tuple[str, list[Any]]]) -> None:
    tokens = {key: values for key, (kind, values) in columns.items() if kind == "token"}
    if len(tokens) < 2:
        return
    lengths = np.array([[sequence_length(v) for v in values] for values in tokens.values()])
    bad = np.flatnonzero((lengths != lengths[0]).any(axis=0))
    if len(bad):
        found = ", ".join(f"{key} {int(row[bad[0]])}" for key, row in zip(tokens, lengths))
        raise ValueError(f"{name}: sample {bad[0]} has per-token values of different lengths: {found}.")


def concatenate(name: str, key: str, values: list[Any]) -> Flat:
    """The per-token values of every sample, one after the other, in their common dtype."""
    dtype = _common_dtype(name, key, values)
    if isinstance(dtype, torch.dtype):
        return torch.cat([torch.as_tensor(v, dtype=dtype) if isinstance(v, list) else v for v in values])
    return np.concatenate([np.asarray(v, dtype=dtype) for v in values])


def stack(name: str, key: str, values: list[Any]) -> torch.Tensor:
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
