"""The Lightning data modules over WebDataset tar shards, imported by ``fastsab.integrations.webdataset``.

``WebDataModule`` and ``PickledDataWDS`` need ``lightning`` (``fastsab[lightning]``),
which the pipeline stages of ``fastsab.integrations.webdataset`` do not: that module imports
this one when one of them is first used.
"""

from __future__ import annotations

import glob
import io
import os
import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import webdataset as wds

from fastsab._checks import check_optional_positive_int, check_positive_int
from fastsab.integrations._decoder import safe_decoder
from fastsab.integrations._splits import Split
from fastsab.position.distributed import resolve_rank

__all__ = ["PickledDataWDS", "WebDataModule"]


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
            batching is a stage of ``pipeline_prebatch_wld`` (e.g. ``size_aware_batched``).
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
        allow_pickle: Unpickle pickled fields (off by default; see ``safe_decoder``).

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
            ``WebDataModule`` arguments follow (``global_batch_size`` first).
        n_tars_wds: At least this many shards per split (default: one per 1000 samples).
        **kwargs: Passed on to ``WebDataModule``.
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
