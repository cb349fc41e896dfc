"""WebDataset: size-aware batching in a pipeline, safe decoding, and Lightning data modules.

* ``size_aware_batched`` is a pipeline stage with the exact greedy semantics of
  ``fastsab.size_aware_batching``, streaming, holding at most one batch.
* ``safe_decoder`` decodes sample fields by their extension without unpickling:
  tensors with ``torch.load(..., weights_only=True)``, numpy arrays without pickle, JSON,
  text and integer labels. Pickled fields (``.pyd``, ``.pickle``, ``.pkl``) are refused
  unless ``allow_pickle=True`` is given explicitly (with a warning): unpickling runs code.
* ``WebDataModule`` and ``PickledDataWDS`` are Lightning data modules over tar
  shards with the constructor arguments of their bionemo namesakes: shards globbed per
  split, an epoch length of ``n_samples // global_batch_size`` batches, shards split by
  rank and by worker, and a clear error for fewer shards than workers. They need
  ``lightning`` too (``pip install "fastsab[webdataset,lightning]"``), imported when one of
  them is first used: ``fastsab[webdataset]`` alone gives the two functions above.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastsab.bionemo.streaming import size_aware_batching
from fastsab.integrations._decoder import safe_decoder
from fastsab.integrations._splits import Split

# NOTE: WebDataModule and PickledDataWDS are names of this module too (see __getattr__), left out
# of __all__ so that `import *` works without lightning
__all__ = ["Split", "safe_decoder", "size_aware_batched"]


def size_aware_batched(
    sizeof: Callable[[Any], Any],
    max_total_size: int | float,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    max_batch_size: int | None = None,
    warn_logger: Callable[[str], None] | None = warnings.warn,
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A WebDataset pipeline stage that batches samples under a size budget.

    The same greedy batches as ``fastsab.size_aware_batching`` (oversize samples are
    skipped and reported to ``warn_logger``), yielded as soon as they close; the only
    buffer is the batch being filled, also bounded by ``max_batch_size`` items if given.
    Each sample's size is checked as it arrives: ``sizeof`` must give one finite real
    number >= 0 (``TypeError``/``ValueError`` naming the sample otherwise).

    Examples:
        >>> stage = size_aware_batched(len, 4)
        >>> list(stage(iter(["ab", "c", "de", "fghij", "k"])))[:2]
        [['ab', 'c'], ['de', 'k']]
    """

    def stage(source: Iterable[Any]) -> Iterator[Any]:
        return size_aware_batching(
            source, sizeof, max_total_size, collate_fn, None, warn_logger, max_batch_size=max_batch_size
        )

    return stage


#: The names of this module that need another extra than ``webdataset``, and that extra.
OTHER_EXTRAS = {"PickledDataWDS": "lightning", "WebDataModule": "lightning"}


def __getattr__(name: str) -> Any:
    """The Lightning data modules, imported on first use; without lightning, an ``ImportError`` naming it."""
    # NOTE: the data modules subclass lightning's LightningDataModule: importing them with this
    # module would make `fastsab[webdataset]` need lightning for the pipeline stages too
    extra = OTHER_EXTRAS.get(name)
    if extra is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from fastsab.integrations import _webdataset_modules
    except ModuleNotFoundError as err:
        # NOTE: also webdataset itself, which this module's own stages do not need (fastsab[lightning] alone)
        missing = (err.name or "").split(".")[0]
        if missing not in (extra, "webdataset"):
            raise
        raise ImportError(
            f"{name} is a Lightning data module and needs {missing}, which is not installed: "
            f'pip install "fastsab[{missing}]".'
        ) from err
    return getattr(_webdataset_modules, name)
