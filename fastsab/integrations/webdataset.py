"""WebDataset: size-aware batching in a pipeline, safe decoding, and Lightning data modules.

* :func:`size_aware_batched` is a pipeline stage with the exact greedy semantics of
  :func:`fastsab.size_aware_batching`, streaming, holding at most one batch.
* :func:`safe_decoder` decodes sample fields by their extension without unpickling:
  tensors with ``torch.load(..., weights_only=True)``, numpy arrays without pickle, JSON,
  text and integer labels. Pickled fields (``.pyd``, ``.pickle``, ``.pkl``) are refused
  unless ``allow_pickle=True`` is given explicitly (with a warning): unpickling runs code.
* :class:`WebDataModule` and :class:`PickledDataWDS` are Lightning data modules over tar
  shards with the constructor arguments of their bionemo namesakes: shards globbed per
  split, an epoch length of ``n_samples // global_batch_size`` batches, shards split by
  rank and by worker, and a clear error for fewer shards than workers. They need
  ``lightning`` too (``pip install "fastsab[webdataset,lightning]"``), imported when one of
  them is first used: ``fastsab[webdataset]`` alone gives the two functions above.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from fastsab.bionemo.streaming import size_aware_batching
from fastsab.integrations._splits import Split

# NOTE: WebDataModule and PickledDataWDS are names of this module too (see __getattr__), left out
# of __all__ so that `import *` works without lightning
__all__ = ["Split", "safe_decoder", "size_aware_batched"]

PICKLE_EXTENSIONS = ("pyd", "pickle", "pkl")


def size_aware_batched(
    sizeof: Callable[[Any], Any],
    max_total_size: int | float,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    max_batch_size: int | None = None,
    warn_logger: Callable[[str], None] | None = warnings.warn,
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A WebDataset pipeline stage that batches samples under a size budget.

    The same greedy batches as :func:`fastsab.size_aware_batching` (oversize samples are
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


def safe_decoder(*, allow_pickle: bool = False) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Decode the fields of a WebDataset sample by extension, without unpickling by default.

    Extensions (the part of the key after its last dot): ``pth``/``pt`` (``torch.load``
    with ``weights_only=True``), ``npy`` (``numpy.load`` with ``allow_pickle=False``),
    ``json``, ``txt``/``text``, ``cls``/``index`` (an int). Other fields stay bytes;
    ``__key__``-like fields are kept. Pickled fields raise ``ValueError`` unless
    ``allow_pickle=True``.

    Examples:
        >>> buffer = io.BytesIO()
        >>> torch.save(torch.arange(3), buffer)
        >>> decode = safe_decoder()
        >>> decode({"__key__": "a", "x.pth": buffer.getvalue(), "y.cls": b"7"})
        {'__key__': 'a', 'x.pth': tensor([0, 1, 2]), 'y.cls': 7}
    """
    if not isinstance(allow_pickle, bool):
        raise TypeError(f"allow_pickle must be a bool, got {allow_pickle!r}.")
    if allow_pickle:
        warnings.warn(
            "allow_pickle=True: pickled fields of the shards will be unpickled, which can run arbitrary code; "
            "read only shards you trust.",
            stacklevel=2,
        )

    def decode(sample: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in sample.items():
            if key.startswith("__") or not isinstance(value, (bytes, bytearray)):
                out[key] = value
                continue
            extension = key.rsplit(".", 1)[-1].lower()
            if extension in ("pth", "pt"):
                out[key] = torch.load(io.BytesIO(value), weights_only=True)
            elif extension == "npy":
                out[key] = np.load(io.BytesIO(value), allow_pickle=False)
            elif extension == "json":
                out[key] = json.loads(value)
            elif extension in ("txt", "text"):
                out[key] = bytes(value).decode("utf-8")
            elif extension in ("cls", "index"):
                out[key] = int(value)
            elif extension in PICKLE_EXTENSIONS:
                if not allow_pickle:
                    raise ValueError(
                        f"field {key!r} of sample {sample.get('__key__')!r} is pickled; refusing to unpickle it "
                        "(it could run code). Pass allow_pickle=True only for shards you trust."
                    )
                out[key] = pickle.loads(value)
            else:
                out[key] = value
        return out

    return decode


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
