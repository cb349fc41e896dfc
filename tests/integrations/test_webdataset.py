from __future__ import annotations

import io
import pickle

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import webdataset as wds

from fastsab.integrations.webdataset import PickledDataWDS, Split, WebDataModule, safe_decoder, size_aware_batched
from tests.reference import greedy_reference


def tensor_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def write_shards(directory, n_samples=40, n_shards=4, prefix="wdshards", pickled=False):
    directory.mkdir(parents=True, exist_ok=True)
    per_shard = n_samples // n_shards
    for shard in range(n_shards):
        with wds.TarWriter(str(directory / f"{prefix}-{shard:06d}.tar")) as writer:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                sample = {"__key__": f"s{i:05d}", "cls": str(i).encode()}
                if pickled:
                    sample["tensor.pyd"] = pickle.dumps(torch.full((i % 5 + 1,), i))
                else:
                    sample["tensor.pth"] = tensor_bytes(torch.full((i % 5 + 1,), i))
                writer.write(sample)


@pytest.mark.parametrize("max_batch_size", [None, 1, 3, 7])
@pytest.mark.parametrize("cap", [64, 29.5, 200])
def test_size_aware_stage_equals_the_greedy_loop(cap, max_batch_size):
    # invariant: the pipeline stage gives the batches of the plain greedy loop on the same stream
    rng = np.random.default_rng(0)
    samples = [torch.zeros(int(n)) for n in rng.integers(0, 70, 300)]
    sizes = [t.numel() for t in samples]
    expected, skipped = greedy_reference(sizes, cap, max_batch_size=max_batch_size)
    warnings: list[str] = []
    stage = size_aware_batched(lambda t: t.numel(), cap, max_batch_size=max_batch_size, warn_logger=warnings.append)
    got = list(stage(iter(samples)))
    assert [[id(s) for s in b] for b in got] == [[id(samples[p]) for p in b] for b in expected]
    assert len(warnings) == len(skipped) + (1 if skipped else 0)
    assert all(warning.startswith("Size of element tensor(") for warning in warnings[: len(skipped)])
    collated = list(
        size_aware_batched(len, cap, collate_fn=len, max_batch_size=max_batch_size, warn_logger=None)(samples)
    )
    assert collated == [len(b) for b in expected]


@pytest.mark.parametrize(
    ("size", "error", "message"),
    [
        (float("nan"), ValueError, r"sizeof must return a finite number >= 0, got nan for the element 'b'\."),
        (-4, ValueError, r"sizeof must return a finite number >= 0, got -4 for the element 'b'\."),
        ("5", TypeError, r"sizeof must return a real number, got '5' of type str for the element 'b'\."),
        (torch.ones(2), TypeError, r"sizeof must return a single number, got tensor\(\[1\., 1\.\]\) of shape \(2,\)"),
    ],
    ids=["nan", "negative", "str", "tensor-2"],
)
def test_size_aware_stage_refuses_bad_sizes(size, error, message):
    sizes = {"a": 2, "b": size, "c": 2}
    stage = size_aware_batched(sizes.__getitem__, 4, warn_logger=None)
    with pytest.raises(error, match=message):
        list(stage(iter(["a", "b", "c"])))


def test_stage_in_a_webdataset_pipeline(tmp_path):
    write_shards(tmp_path, n_samples=40, n_shards=4)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.tarfile_to_samples(),
        wds.map(safe_decoder()),
        wds.to_tuple("tensor.pth", "cls"),
        size_aware_batched(lambda s: s[0].numel(), 12, warn_logger=None),
    )
    batches = list(pipeline)
    assert sorted(label for batch in batches for _, label in batch) == list(range(40))
    assert all(sum(t.numel() for t, _ in batch) <= 12 for batch in batches)


def test_safe_decoder_refuses_pickle_unless_allowed():
    sample = {"__key__": "a", "x.pyd": pickle.dumps([1, 2]), "y.npy": b"", "z.json": b'{"k": 1}', "t.txt": b"hi"}
    buffer = io.BytesIO()
    np.save(buffer, np.arange(3))
    sample["y.npy"] = buffer.getvalue()
    with pytest.raises(ValueError, match=r"field 'x.pyd' of sample 'a' is pickled; refusing to unpickle it"):
        safe_decoder()(sample)
    with pytest.warns(UserWarning, match="allow_pickle=True: pickled fields of the shards will be unpickled"):
        decode = safe_decoder(allow_pickle=True)
    out = decode(sample)
    assert (
        out["x.pyd"] == [1, 2]
        and out["y.npy"].tolist() == [0, 1, 2]
        and out["z.json"] == {"k": 1}
        and out["t.txt"] == "hi"
    )
    pickled_npy = io.BytesIO()
    np.save(pickled_npy, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Object arrays cannot be loaded when allow_pickle=False"):
        safe_decoder()({"__key__": "b", "o.npy": pickled_npy.getvalue()})


def make_module(tmp_path, workers=2, batch=5, **options):
    return WebDataModule(
        {Split.train: str(tmp_path / "train"), Split.val: str(tmp_path / "val")},
        {Split.train: 40, Split.val: 20},
        ["tensor.pth", "cls"],
        global_batch_size=batch,
        pipeline_prebatch_wld={split: wds.batched(batch, collation_fn=list) for split in Split},
        kwargs_wld={Split.train: {"num_workers": workers}, Split.val: {"num_workers": 0}},
        **options,
    )


def test_web_data_module_reads_every_sample_with_workers(tmp_path):
    write_shards(tmp_path / "train", 40, 4)
    write_shards(tmp_path / "val", 20, 2)
    module = make_module(tmp_path, workers=2, batch=5)  # an epoch of 40 // 5 batches: one pass
    module.setup("fit")
    train = list(module.train_dataloader())
    assert len(train) == 8
    labels = sorted(label for batch in train for _, label in batch)
    assert labels == list(range(40))  # 2 workers, 4 shards: each sample exactly once
    val = list(module.val_dataloader())
    assert sorted(label for batch in val for _, label in batch) == list(range(20))


def test_epoch_length_from_global_batch_size(tmp_path):
    write_shards(tmp_path / "train", 40, 4)
    write_shards(tmp_path / "val", 20, 2)
    module = make_module(tmp_path, workers=0, batch=8)
    module.setup("fit")
    assert len(list(module.train_dataloader())) == 40 // 8  # the training epoch length
    val = list(module.val_dataloader())  # 8 + 8 + 4: a full pass, not cut at 20 // 8 batches
    assert [len(batch) for batch in val] == [8, 8, 4]
    assert sorted(label for batch in val for _, label in batch) == list(range(20))


def test_fewer_shards_than_workers_is_an_error(tmp_path):
    write_shards(tmp_path / "train", 40, 2)
    write_shards(tmp_path / "val", 20, 2)
    with pytest.raises(
        ValueError, match=r"the train split has 2 shards, so rank 0 of 1 gets 2, fewer than its 3 loader workers"
    ):
        make_module(tmp_path, workers=3).setup("fit")
    with pytest.raises(ValueError, match="no shards match"):
        WebDataModule({"train": str(tmp_path / "none")}, {"train": 1}, "cls", 1).setup("fit")


def test_pickled_shards_are_refused_by_default(tmp_path):
    write_shards(tmp_path / "train", 10, 2, pickled=True)
    module = WebDataModule({"train": str(tmp_path / "train")}, {"train": 10}, ["tensor.pyd", "cls"], 1)
    module.setup("fit")
    with pytest.raises(ValueError, match="is pickled; refusing to unpickle it"):
        list(module.train_dataloader())
    with pytest.warns(UserWarning, match="allow_pickle=True"):
        trusted = WebDataModule(
            {"train": str(tmp_path / "train")}, {"train": 10}, ["tensor.pyd", "cls"], 1, allow_pickle=True
        )
    trusted.setup("fit")
    assert sorted(label for _, label in trusted.train_dataloader()) == list(range(10))


def test_pickled_data_wds_writes_safe_shards_and_trains(tmp_path):
    pickles = tmp_path / "pickles"
    pickles.mkdir()
    names = [f"sample{i}" for i in range(12)]
    for i, name in enumerate(names):
        with open(pickles / f"{name}.mydata.pt", "wb") as file:
            pickle.dump(torch.full((3,), float(i)), file)
    module = PickledDataWDS(
        str(pickles),
        "mydata.pt",
        {Split.train: names[:8], Split.val: names[8:]},
        str(tmp_path / "tars_"),
        2,  # global_batch_size
        n_tars_wds=2,
        pipeline_prebatch_wld={split: wds.batched(2, collation_fn=torch.stack) for split in Split},
    )
    module.prepare_data()
    assert len(list((tmp_path / "tars_train").glob("wdshards-*.tar"))) == 2

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen += batch[:, 0].tolist()
            return self.layer(batch).mean()

        def validation_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    model = Model()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=module)
    assert sorted(model.seen) == [float(i) for i in range(8)]
