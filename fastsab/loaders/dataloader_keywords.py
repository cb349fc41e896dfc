"""The keywords of ``torch.utils.data.DataLoader`` and what fastsab's loaders take instead.

A user moving from ``DataLoader`` passes its keywords out of habit. The loaders take the
ones that mean the same thing in fastsab (``batch_size``, ``shuffle``, ``drop_last``,
``collate_fn``, ``pin_memory``, ``num_workers``, ``worker_init_fn``,
``multiprocessing_context``, ``persistent_workers``); for every other keyword, ``check_dataloader_keywords``
raises a ``TypeError`` that names it and says what to use instead. The advice lives in one
table, which also renders the list of docs/coming-from/dataloader.md
(``keyword_list``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

__all__ = [
    "ACCEPTED_NOTES",
    "ADVICE",
    "LOADER_ADVICE",
    "TakesDataLoaderKeywords",
    "check_dataloader_keywords",
    "keyword_list",
    "without_dataloader_defaults",
]

_Made = TypeVar("_Made")

_WORKER_OPTION = "an option of worker processes: pass it to loader.data_loader(num_workers=..., {name}=...)"

#: What to use instead of a DataLoader keyword that no fastsab loader takes.
ADVICE: dict[str, str] = {
    "sampler": (
        "the loader orders each epoch itself: use shuffle= and seed= (a seeded grouped permutation that depends "
        "only on seed and epoch); to batch the indices of a sampler of your own by size, give "
        "fastsab.SizeAwareBatchSampler(sampler, sizeof, max_total_size) to a DataLoader as its batch_sampler"
    ),
    "batch_sampler": (
        "the loader is its own batch sampler: loader.batch_sampler() gives its plan to a DataLoader, and "
        "fastsab.SizeAwareBatchSampler and fastsab.BucketBatchSampler are batch samplers for a DataLoader"
    ),
    "timeout": _WORKER_OPTION.format(name="timeout"),
    "prefetch_factor": (
        "prefetch=k is the number of batches each worker process prepares ahead with num_workers (default 2), or "
        "a background thread without"
    ),
    "generator": (
        "epoch orders depend only on (seed, epoch), not on the state of a generator: pass seed= an integer "
        "(and set_epoch(epoch) for a given epoch)"
    ),
    "pin_memory_device": (
        "pin_memory=True pins host memory for the accelerator in use, and device= moves every batch to that device"
    ),
    "in_order": (
        "batches are always yielded in the order of the plan, so that a saved state resumes exactly; "
        "loader.data_loader(...) keeps that order too"
    ),
}

#: What to use instead of a DataLoader keyword that one loader takes and another does not.
LOADER_ADVICE: dict[str, dict[str, str]] = {
    "FastSizeAwareLoader": {
        "batch_size": (
            "its batches are bounded by their total cost, max_total_size=, and max_batch_size= caps the items per "
            "batch too; FastLoader makes batches of a fixed size"
        ),
        "drop_last": (
            "size-aware batches have no fixed size, so no batch is a partial last one: every batch is kept "
            "(oversize= decides about items above the cap); FastLoader(drop_last=True) drops a partial last batch"
        ),
    },
}

#: How a keyword a loader takes compares with DataLoader's (for the list of the docs).
ACCEPTED_NOTES: dict[str, str] = {
    "dataset": "same (also tensors, arrays and pytrees of them)",
    "batch_size": "same",
    "shuffle": "same; the default is True (DataLoader's is False)",
    "drop_last": "same (counted in stats.num_dropped)",
    "collate_fn": "same (default fastsab.collate_batch)",
    "pin_memory": "same (a warning where no accelerator exists)",
    "num_workers": (
        "same: worker processes fetch and collate whole batches, yielded in the order of the plan and moved to "
        "device= in this process (in-memory tensor data and an OutOfCoreDataset are read in this process whatever "
        "num_workers says)"
    ),
    "worker_init_fn": "same",
    "multiprocessing_context": "same (needs num_workers)",
    "persistent_workers": (
        "same (needs num_workers): the workers live across epochs and lowered limits, re-seeded for each epoch as "
        "new workers would be, until loader.close(), garbage collection or exit"
    ),
}


@functools.cache
def _accepted(loader: type) -> frozenset[str]:
    """The keywords ``loader``'s constructor takes."""
    return frozenset(inspect.signature(loader).parameters)


@functools.cache
def _dataloader_keywords() -> tuple[str, ...]:
    return tuple(inspect.signature(torch.utils.data.DataLoader).parameters)


def advice_for(loader_name: str, name: str) -> str | None:
    """What to use instead of the DataLoader keyword ``name`` with the loader ``loader_name``, if known."""
    return LOADER_ADVICE.get(loader_name, {}).get(name) or ADVICE.get(name)


@functools.cache
def _dataloader_defaults() -> dict[str, object]:
    """DataLoader's keywords whose default value asks for nothing fastsab does not do already.

    ``batch_size`` is not one: its default (batches of one item) is a choice, not the absence of one.
    """
    return {
        name: parameter.default
        for name, parameter in inspect.signature(torch.utils.data.DataLoader).parameters.items()
        if parameter.default is not inspect.Parameter.empty and name != "batch_size"
    }


def _is_default(name: str, value: object) -> bool:
    defaults = _dataloader_defaults()
    if name not in defaults:
        return False
    default = defaults[name]
    # NOTE: the same type too: 0.0 or False for num_workers=0 is not what DataLoader's default says
    return value is default or (type(value) is type(default) and value == default)


def without_dataloader_defaults(loader: type, keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` without the DataLoader keywords ``loader`` does not take that are at their default values.

    ``num_workers=0``, ``sampler=None``, ``timeout=0``, ... ask for what the loaders do
    anyway, so a call written for ``DataLoader`` keeps working; any other value of such a
    keyword raises the ``TypeError`` of ``check_dataloader_keywords``.
    """
    extra = keywords.keys() - _accepted(loader)
    if not extra:
        return keywords
    kept = {name: value for name, value in keywords.items() if name not in extra or not _is_default(name, value)}
    check_dataloader_keywords(loader, kept)
    return kept


class TakesDataLoaderKeywords(type):
    """The metaclass of the loaders: a call drops the DataLoader keywords at their default values.

    The constructors keep their explicit signatures (``inspect.signature`` shows ``__init__``'s);
    a DataLoader keyword the loader does not take, at another value, raises a ``TypeError``
    naming it with what to use instead.
    """

    def __call__(cls: type[_Made], *args: Any, **kwargs: Any) -> _Made:
        # NOTE: typed as making an instance of the class, so that type checkers check the
        # call against __init__'s explicit signature
        made: _Made = type.__call__(cls, *args, **without_dataloader_defaults(cls, kwargs))
        return made

    @property
    def __signature__(cls) -> inspect.Signature:
        signature = inspect.signature(cls.__init__)  # type: ignore[misc]
        return signature.replace(
            parameters=tuple(signature.parameters.values())[1:], return_annotation=inspect.Signature.empty
        )


def check_dataloader_keywords(loader: type, keywords: Mapping[str, object]) -> None:
    """Raise a ``TypeError`` naming the first DataLoader keyword in ``keywords`` that ``loader`` does not take.

    Keywords that are not DataLoader's are left alone (the constructor call raises
    Python's own error for them). Calling the loader also accepts DataLoader's keywords at
    their default values (``without_dataloader_defaults``); this check does not.

    Examples:
        >>> from fastsab import FastLoader
        >>> check_dataloader_keywords(FastLoader, {"batch_size": 4})
        >>> check_dataloader_keywords(FastLoader, {"generator": None})
        Traceback (most recent call last):
        ...
        TypeError: FastLoader does not take DataLoader's keyword generator (got generator=None): epoch orders ...
    """
    extra = keywords.keys() - _accepted(loader)
    if not extra:
        return
    for name in keywords:  # in the order given
        if name not in extra or name not in _dataloader_keywords():
            continue
        advice = advice_for(loader.__name__, name) or "fastsab's loaders have no such option"
        raise TypeError(
            f"{loader.__name__} does not take DataLoader's keyword {name} (got {name}={keywords[name]!r}): {advice}."
        )


def keyword_list(loaders: tuple[type, ...]) -> str:
    """The docs page's list: every DataLoader keyword and what ``loaders`` take instead.

    Examples:
        >>> from fastsab import FastLoader, FastSizeAwareLoader
        >>> print(keyword_list((FastLoader, FastSizeAwareLoader)).splitlines()[1])
        - `batch_size`: FastLoader: same. FastSizeAwareLoader: its batches are bounded by their total cost, ...
    """
    lines = []
    for name in _dataloader_keywords():
        texts = [
            ACCEPTED_NOTES.get(name, "same") if name in _accepted(loader) else advice_for(loader.__name__, name) or "-"
            for loader in loaders
        ]
        if len(set(texts)) == 1:
            lines.append(f"- `{name}`: {texts[0]}.")
        else:
            lines.append(f"- `{name}`: " + " ".join(f"{c.__name__}: {t}." for c, t in zip(loaders, texts)))
    return "\n".join(lines)
