"""What a loader is given besides its dataset and batching rule: ``LoaderOptions``.

Both loaders take the same seventeen options, as keywords of their constructors; a loader
keeps them, as given, in ``loader.options``. ``LoaderOptions`` defines them (names, types,
defaults); ``LoaderKeywords`` restates names and types for type checkers, and
``takes_loader_options`` gives the constructors their full signature at run time. The
limit types name what a batch size or caps (``lower_limit``) may be.
"""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

import numpy as np
import torch
from typing_extensions import TypedDict, TypeVar

from fastsab._checks import check_nonnegative_int
from fastsab.plan.costs import Limit
from fastsab.position.distributed import EvenBatches

__all__ = ["DEFAULT_CHUNK_BYTES", "Limit", "LimitLike", "LoaderKeywords", "LoaderOptions", "takes_loader_options"]

#: Default bound on the bytes gathered at once from an in-memory tensor dataset.
DEFAULT_CHUNK_BYTES = 64 * 2**20

#: A limit as it may be given: a batch size, one cap, or a sequence or array of caps.
LimitLike = int | float | Sequence[int | float] | np.ndarray

#: The batch type of a loader: what its ``collate_fn`` returns, ``Any`` where it cannot be known.
T = TypeVar("T", default=Any)
#: A constructor that takes the loader options as ``**options``.
_Init = TypeVar("_Init", bound=Callable[..., None])


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """The options ``FastLoader`` and ``FastSizeAwareLoader`` share.

    The loaders take them as keywords; ``loader.options`` holds them as given, so that a
    loader like another one is ``FastLoader(other_data, 8, **loader.options.keywords())``.
    ``prefetch`` and the worker options are checked here, the other values by the parts of a
    loader that use them when it is made (with the same messages).

    Attributes:
        shuffle: Shuffle every epoch (grouped permutation); otherwise sequential order.
        seed: Seed of the epoch orders: the order depends only on ``(seed, epoch)``.
        group_size: Items per shuffle group, the unit of planning and of in-memory gathers;
            by default 2**16, or the chunks of a chunked dataset such as
            ``OutOfCoreDataset`` (then read once per epoch each).
        collate_fn: Applied to what is fetched for a batch (see ``fastsab.fetch.fetcher``).
        device: Move each batch (pytree) there; ``None`` leaves batches where they are.
        pin_memory: Pin host memory before copying to an accelerator (ignored, with a
            warning, where none is available).
        non_blocking: Asynchronous host-to-device copies.
        prefetch: Batches a background thread prepares ahead; ``None`` chooses 0 for
            in-memory tensor data and datasets declaring ``getitems_in_memory`` (see
            ``fastsab.fetch.fetcher``), 2 for datasets that fetch. With ``num_workers``, the
            batches each worker process prepares ahead (``None``: 2; at least 1).
        chunk_bytes: Largest in-memory gather of one shuffle group; bigger groups are
            gathered batch by batch.
        rank, world_size: This process's share of the epoch; default from
            ``torch.distributed`` when it is initialized, else one process (a
            ``world_size`` above 1 without a process group needs ``rank``). Every rank
            plans the same global batches and runs the same number of steps. Under ranks
            an iteration without ``set_epoch`` starts the next epoch only once the last
            one ran to its end (an epoch left before, by a peek, starts again).
        even_batches: ``"pad"`` (fill the last step with repeats of the first batches) or
            ``"drop"`` (leave the surplus batches out); counted in ``stats``.
        balance: Deal batches of similar cost to the ranks at each step (see
            ``fastsab.position.distributed``); ``stats.spread_before``/``spread_after`` report it.
        num_workers: Worker processes that fetch and collate whole batches (one
            ``__getitems__`` and ``collate_fn`` per batch; see ``fastsab.fetch.workers``); 0 fetches
            in this process. Batches are yielded in plan order and moved to ``device`` here.
            In-memory tensor data (gathered, not fetched) is always gathered in this process, and a
            dataset read in chunks (``OutOfCoreDataset``) always read in it.
        worker_init_fn: Called in each worker process with its id, as by ``DataLoader``.
        multiprocessing_context: How worker processes start (``"fork"``, ``"spawn"``,
            ``"forkserver"`` or a context); ``None``: as ``DataLoader`` (fork on Linux).
        persistent_workers: Keep the worker processes across epochs (and lowered limits), as
            ``DataLoader``'s option does, until ``loader.close()``, garbage collection or exit;
            they are re-seeded for each epoch as new workers would be (``worker_init_fn`` runs
            once per process) and hold the dataset as it was when they started. Needs ``num_workers``.

    Examples:
        >>> options = LoaderOptions(shuffle=False, prefetch=2)
        >>> options.shuffle, options.seed, options.prefetch
        (False, 0, 2)
        >>> sorted(options.keywords())[:3]
        ['balance', 'chunk_bytes', 'collate_fn']
    """

    shuffle: bool = True
    seed: int = 0
    group_size: int | None = None
    collate_fn: Callable[[Any], Any] | None = None
    device: str | torch.device | None = None
    pin_memory: bool = False
    non_blocking: bool = True
    prefetch: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    rank: int | None = None
    world_size: int | None = None
    even_batches: EvenBatches = "pad"
    balance: bool = True
    num_workers: int = 0
    worker_init_fn: Callable[[int], None] | None = None
    multiprocessing_context: str | multiprocessing.context.BaseContext | None = None
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        if self.prefetch is not None:
            check_nonnegative_int("prefetch", self.prefetch)
        if check_nonnegative_int("num_workers", self.num_workers) > 0 and self.prefetch == 0:
            raise ValueError(
                f"prefetch must be at least 1 with worker processes (each prepares that many batches ahead), got "
                f"prefetch={self.prefetch!r} with num_workers={self.num_workers!r}; pass prefetch=None for 2."
            )
        if self.worker_init_fn is not None and not callable(self.worker_init_fn):
            raise TypeError(f"worker_init_fn must be callable or None, got {self.worker_init_fn!r}.")
        _check_context(self.multiprocessing_context, self.num_workers)
        _check_persistent(self.persistent_workers, self.num_workers)

    @classmethod
    def given_to(cls, owner: str, keywords: Mapping[str, object]) -> LoaderOptions:
        """The options given to ``owner``'s constructor as ``keywords``; the others take their defaults.

        Raises:
            TypeError: If a keyword is not an option (naming ``owner``), or ``prefetch``, ``num_workers``,
                ``worker_init_fn``, ``multiprocessing_context`` or ``persistent_workers`` is of a wrong type.
            ValueError: If ``prefetch`` is not None or a non-negative integer (at least 1 with
                ``num_workers``), ``num_workers`` is negative, or ``multiprocessing_context`` is
                an unknown start method or given without ``num_workers``, or ``persistent_workers`` is
                ``True`` without ``num_workers``.
        """
        names = {field.name for field in dataclasses.fields(cls)}
        for name, value in keywords.items():
            if name not in names:
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r} (got {name}={value!r}).")
        return cls(**keywords)  # type: ignore[arg-type]

    def keywords(self) -> dict[str, Any]:
        """The options as keyword arguments of a loader (the values themselves, not copies)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


class LoaderKeywords(TypedDict, Generic[T], total=False):
    """The options as a loader constructor's ``**options`` (PEP 692), for type checkers.

    The same names and types as ``LoaderOptions``, whose defaults apply; ``collate_fn``
    returns the loader's batch type. ``tests/loaders/test_options.py`` keeps the two equal.
    """

    shuffle: bool
    seed: int
    group_size: int | None
    collate_fn: Callable[[Any], T] | None
    device: str | torch.device | None
    pin_memory: bool
    non_blocking: bool
    prefetch: int | None
    chunk_bytes: int
    rank: int | None
    world_size: int | None
    even_batches: EvenBatches
    balance: bool
    num_workers: int
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: str | multiprocessing.context.BaseContext | None
    persistent_workers: bool


def _check_context(context: object, num_workers: int) -> None:
    """Refuse a ``multiprocessing_context`` that is not a start method or context, or has no workers to start."""
    if context is None:
        return
    if isinstance(context, str):
        if context not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"multiprocessing_context must be one of {multiprocessing.get_all_start_methods()!r} or a "
                f"multiprocessing context, got {context!r}."
            )
    elif not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            f"multiprocessing_context must be a start method name or a multiprocessing context, got {context!r}."
        )
    if num_workers == 0:
        raise ValueError(
            f"multiprocessing_context={context!r} starts worker processes, so it needs num_workers of 1 or more, "
            "got num_workers=0."
        )


def _check_persistent(persistent: object, num_workers: int) -> None:
    """Refuse a ``persistent_workers`` that is not a bool, or is ``True`` without workers to keep."""
    if not isinstance(persistent, bool):
        raise TypeError(f"persistent_workers must be True or False, got {persistent!r}.")
    if persistent and num_workers == 0:
        raise ValueError(
            "persistent_workers=True keeps worker processes across epochs, so it needs num_workers of 1 or more, "
            "got num_workers=0."
        )


def _option_parameters() -> list[inspect.Parameter]:
    """Every option as a keyword-only parameter: its default from ``LoaderOptions``, its type from
    ``LoaderKeywords`` (as written)."""
    annotations = LoaderKeywords.__annotations__
    return [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=getattr(annotations[field.name], "__forward_arg__", annotations[field.name]),
        )
        for field in dataclasses.fields(LoaderOptions)
    ]


def takes_loader_options(init: _Init) -> _Init:
    """Give a constructor that takes ``**options: Unpack[LoaderKeywords]`` the signature naming every option.

    ``inspect.signature`` and ``help()`` then show each option as an explicit keyword with its
    default, in place of ``**options`` (type checkers read the ``Unpack`` annotation itself).

    Examples:
        >>> def init(self, dataset: object, **options: object) -> None: ...
        >>> list(inspect.signature(takes_loader_options(init)).parameters)[:4]
        ['self', 'dataset', 'shuffle', 'seed']
    """
    signature = inspect.signature(init)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    # NOTE: set on the function, so that the metaclass's __signature__ (and DataLoader keyword
    # checks) read it from cls.__init__ as for any explicit signature
    init.__signature__ = signature.replace(parameters=[*own, *_option_parameters()])  # type: ignore[attr-defined]
    return init
