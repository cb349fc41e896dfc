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
  rank and by worker, and a clear error for fewer shards than workers.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import webdataset as wds

from fastsab._checks import check_optional_positive_int, check_positive_int
from fastsab.distributed import resolve_rank
from fastsab.integrations._splits import Split
from fastsab.streaming import size_aware_batching

__all__ = ["PickledDataWDS", "Split", "WebDataModule", "safe_decoder", "size_aware_batched"]

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


def _untuple(source: Iterable[Any]) -> Iterator[Any]:
    for sample in source:
        yield sample[0] if isinstance(sample, tuple) and len(sample) == 1 else sample


def _stages(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class WebDataModule(pl.LightningDataModule):
    """A Lightning data module over WebDataset tar shards (bionemo's ``WebDataModule`` API).

    Args:
        dirs_tars_wds: Split -> directory of that split's shards.
        n_samples: Split -> number of samples; the epoch length is
            ``n_samples // global_batch_size`` batches.
        suffix_keys_wds: The sample field(s) to extract (e.g. ``"tensor.pth"``), as a tuple
            (a single key gives the field itself).
        global_batch_size: Batch size summed over ranks, used for the epoch length only:
            batching is a stage of ``pipeline_prebatch_wld`` (e.g. :func:`size_aware_batched`).
            It applies to the ``train`` split: its epochs are ``n_samples // global_batch_size``
            batches, as in bionemo (a pass that ends early is followed by a new one, a pass
            that runs longer is cut there, and the next epoch starts a new reshuffled pass).
            With size-aware batches a pass's batch count varies, so pick the count from the
            plan. The ``val``/``test`` splits run one full pass per epoch: every sample once.
        prefix_tars_wds: Shards are globbed as ``{dir}/{prefix}-*.tar``.
        pipeline_wds: Split -> stage(s) applied to the dataset, in its workers.
        pipeline_prebatch_wld: Split -> stage(s) applied to the loader's stream (batching).
        kwargs_wds: Split -> keyword arguments of ``webdataset.WebDataset`` (default: shards
            split by node and worker, shuffled for ``train``).
        kwargs_wld: Split -> keyword arguments of ``webdataset.WebLoader`` (``num_workers``).
        allow_pickle: Unpickle pickled fields (off by default; see :func:`safe_decoder`).

    Raises:
        ValueError: For a split without shards, or with fewer shards for a rank than
            loader workers (some workers would have nothing to read).
    """

    def __init__(
        self,
        dirs_tars_wds: Mapping[Any, str],
        n_samples: Mapping[Any, int],
        suffix_keys_wds: str | Iterable[str],
        global_batch_size: int,
        prefix_tars_wds: str = "wdshards",
        pipeline_wds: Mapping[Any, Any] | None = None,
        pipeline_prebatch_wld: Mapping[Any, Any] | None = None,
        kwargs_wds: Mapping[Any, dict[str, Any]] | None = None,
        kwargs_wld: Mapping[Any, dict[str, Any]] | None = None,
        *,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int("global_batch_size", global_batch_size)
        self.dirs_tars_wds = {Split(key): value for key, value in dirs_tars_wds.items()}
        self.n_samples = {Split(key): value for key, value in n_samples.items()}
        keys = [suffix_keys_wds] if isinstance(suffix_keys_wds, str) else list(suffix_keys_wds)
        self.suffix_keys_wds = keys
        self.global_batch_size = global_batch_size
        self.prefix_tars_wds = prefix_tars_wds
        self.pipeline_wds = {Split(key): value for key, value in (pipeline_wds or {}).items()}
        self.pipeline_prebatch_wld = {Split(key): value for key, value in (pipeline_prebatch_wld or {}).items()}
        self.kwargs_wds = {Split(key): dict(value) for key, value in (kwargs_wds or {}).items()}
        self.kwargs_wld = {Split(key): dict(value) for key, value in (kwargs_wld or {}).items()}
        self.decoder = safe_decoder(allow_pickle=allow_pickle)
        self._datasets: dict[Split, Any] = {}

    def shards(self, split: Split | str) -> list[str]:
        """The sorted shard paths of a split."""
        split = Split(split)
        if split not in self.dirs_tars_wds:
            raise ValueError(f"no shard directory is given for the {split.value} split.")
        pattern = os.path.join(self.dirs_tars_wds[split], f"{self.prefix_tars_wds}-*.tar")
        urls = sorted(glob.glob(pattern))
        if not urls:
            raise ValueError(f"no shards match {pattern!r} for the {split.value} split.")
        return urls

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets of the splits ``stage`` needs (all known splits when ``None``)."""
        needed = {
            "fit": [Split.train, Split.val],
            "validate": [Split.val],
            "test": [Split.test],
            "predict": [Split.test],
        }.get(stage or "", list(self.dirs_tars_wds))
        for split in needed:
            if split in self.dirs_tars_wds:
                self._datasets[split] = self._dataset(split)

    def _dataset(self, split: Split) -> Any:
        urls = self.shards(split)
        rank, world_size = resolve_rank(None, None, trainer=getattr(self, "trainer", None))
        workers = int(self.kwargs_wld.get(split, {}).get("num_workers", 0))
        mine = urls[rank::world_size]
        if len(mine) < max(workers, 1):
            raise ValueError(
                f"the {split.value} split has {len(urls)} shards, so rank {rank} of {world_size} gets {len(mine)}, "
                f"fewer than its {max(workers, 1)} loader workers; write more shards or use fewer workers."
            )
        options = {
            "shardshuffle": split == Split.train,
            "nodesplitter": wds.split_by_node,
            "workersplitter": wds.split_by_worker,
            "empty_check": False,
        }
        options.update(self.kwargs_wds.get(split, {}))
        if options.get("shardshuffle") is True:
            options["shardshuffle"] = len(urls)
        dataset = wds.WebDataset(urls, **options).map(self.decoder).to_tuple(*self.suffix_keys_wds)
        for stage in [_untuple, *_stages(self.pipeline_wds.get(split))]:
            dataset = dataset.compose(stage)
        return dataset

    def _loader(self, split: Split) -> Any:
        if split not in self._datasets:
            self._datasets[split] = self._dataset(split)
        loader = wds.WebLoader(self._datasets[split], batch_size=None, **self.kwargs_wld.get(split, {}))
        for stage in _stages(self.pipeline_prebatch_wld.get(split)):
            loader = loader.compose(stage)
        if split != Split.train:
            return loader  # evaluation sees every sample once: one full pass, never cut
        batches = self.n_samples[split] // self.global_batch_size
        return loader.with_epoch(batches) if batches else loader

    def train_dataloader(self) -> Any:
        return self._loader(Split.train)

    def val_dataloader(self) -> Any:
        return self._loader(Split.val)

    def test_dataloader(self) -> Any:
        return self._loader(Split.test)

    def predict_dataloader(self) -> Any:
        return self._loader(Split.test)


class PickledDataWDS(WebDataModule):
    """Turn a directory of pickled samples into shards, then serve them (bionemo's API).

    ``prepare_data`` reads ``{dir_pickles}/{name}.{suffix_pickles}`` for every name of each
    split (your own files: they are unpickled) and writes shards
    ``{prefix_dir_tars_wds}{split}/{prefix_tars_wds}-NNNNNN.tar`` in which each sample is
    ``{"__key__": name with dots as dashes, suffix_pickles + ".pth": torch.save(data)}``,
    so that reading the shards needs no unpickling (``torch.load(weights_only=True)``:
    tensors and plain containers of them).

    Args:
        dir_pickles: Directory of the pickled samples.
        suffix_pickles: Their file name suffix; also the field name (plus ``.pth``).
        names_subset: Split -> the sample names of that split.
        prefix_dir_tars_wds: Prefix of the shard directories (``"train"`` etc. is appended).
        *args: ``n_samples`` is derived from ``names_subset``; the remaining
            :class:`WebDataModule` arguments follow (``global_batch_size`` first).
        n_tars_wds: At least this many shards per split (default: one per 1000 samples).
        **kwargs: Passed on to :class:`WebDataModule`.
    """

    def __init__(
        self,
        dir_pickles: str,
        suffix_pickles: str,
        names_subset: Mapping[Any, Sequence[str]],
        prefix_dir_tars_wds: str,
        *args: Any,
        n_tars_wds: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.dir_pickles = dir_pickles
        self.suffix_pickles = suffix_pickles
        self.names_subset = {Split(key): list(value) for key, value in names_subset.items()}
        self.prefix_dir_tars_wds = prefix_dir_tars_wds
        self.n_tars_wds = check_optional_positive_int("n_tars_wds", n_tars_wds)
        dirs = {split: f"{prefix_dir_tars_wds}{split.value}" for split in self.names_subset}
        n_samples = {split: len(names) for split, names in self.names_subset.items()}
        super().__init__(dirs, n_samples, f"{suffix_pickles}.pth", *args, **kwargs)

    def prepare_data(self) -> None:
        """Write the shards of every split (run once, by the main process)."""
        for split, names in self.names_subset.items():
            directory = self.dirs_tars_wds[split]
            os.makedirs(directory, exist_ok=True)
            shards = self.n_tars_wds or max(1, -(-len(names) // 1000))
            per_shard = max(1, -(-len(names) // shards))
            pattern = os.path.join(directory, f"{self.prefix_tars_wds}-%06d.tar")
            with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0) as writer:
                for name in names:
                    with open(os.path.join(self.dir_pickles, f"{name}.{self.suffix_pickles}"), "rb") as file:
                        data = pickle.load(file)  # the user's own input files
                    buffer = io.BytesIO()
                    torch.save(data, buffer)
                    writer.write({"__key__": name.replace(".", "-"), f"{self.suffix_pickles}.pth": buffer.getvalue()})
