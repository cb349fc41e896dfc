"""Every loader and sampler a user can get, behind one interface, for ``tests/test_invariants.py``.

A :class:`Subject` builds one rank of a loader or sampler from drawn :class:`Inputs` (per-item
sizes, a cap, the options), iterates it as lists of dataset indices, and reads back what it
reports left out (skipped, dropped) or repeated (padded). Each subject says which invariants
apply to it; its ``lacks`` gives the reason where one does not. The data of every
subject is ``torch.arange(n)`` (or samples that are their own index, or a dict or tuple holding
``torch.arange(n)``), so a batch's content is its indices.
"""

from __future__ import annotations

import io
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, RandomSampler

from fastsab import (
    BucketBatchSampler,
    FastLoader,
    FastSizeAwareLoader,
    SizeAwareBatchSampler,
    size_aware_batching,
)

# -- inputs ---------------------------------------------------------------------------------------

#: Sizes: small, zero, and huge (summed over a whole epoch they stay far below 2**62).
SIZE = st.one_of(st.integers(0, 9), st.just(0), st.sampled_from([2**40, 2**40 + 1]))
#: Caps: small ones, zero (only items of size 0 fit), huge ones (``2**70`` means no cap).
CAP = st.one_of(st.integers(0, 20), st.sampled_from([2**40, 2**41, 2**70]))
MAX_N = 24


@dataclass(frozen=True)
class Inputs:
    """One drawn configuration: what every subject needs, each taking the options it has."""

    sizes: tuple[int, ...]
    cap: int = 0
    batch_size: int = 1
    max_batch_size: int | None = None
    oversize: str = "skip"
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    group_size: int | None = None
    world_size: int = 1
    even_batches: str = "pad"
    balance: bool = True

    @property
    def n(self) -> int:
        return len(self.sizes)


@st.composite
def inputs(draw: Any, min_n: int = 0) -> Inputs:
    """Inputs with sizes drawn freely or all equal, 0 to :data:`MAX_N` items."""
    equal = st.tuples(SIZE, st.integers(min_n, MAX_N)).map(lambda pair: [pair[0]] * pair[1])
    sizes = draw(st.one_of(st.lists(SIZE, min_size=min_n, max_size=MAX_N), equal))
    return Inputs(
        sizes=tuple(sizes),
        cap=draw(CAP),
        batch_size=draw(st.integers(1, 8)),
        max_batch_size=draw(st.one_of(st.none(), st.integers(1, 6))),
        oversize=draw(st.sampled_from(["skip", "own_batch"])),
        drop_last=draw(st.booleans()),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        epoch=draw(st.integers(0, 3)),
        group_size=draw(st.one_of(st.none(), st.integers(1, 9))),
        world_size=draw(st.sampled_from([1, 1, 2, 3])),
        even_batches=draw(st.sampled_from(["pad", "drop"])),
        balance=draw(st.booleans()),
    )


# -- reports and limits ---------------------------------------------------------------------------


@dataclass
class Report:
    """What one rank reports about its epoch: indices left out, and indices it yields twice."""

    skipped: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    padded: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Limit:
    """What a batch must respect: its cost (``"sum"``, ``"padded"`` or ``"count"``) within ``cap``.

    ``own_batch`` says that an item above the cap may come as a batch of its own.
    """

    cost: str
    cap: int
    max_batch_size: int | None = None
    own_batch: bool = False


def ids_of(item: Any) -> list[int]:
    """The dataset indices of a batch: a tensor of them, or a list of them."""
    if isinstance(item, torch.Tensor):
        assert item.ndim == 1, f"corrupted batch {item!r}"
        return [int(i) for i in item.tolist()]
    return [int(i) for i in item]


def stats_report(stats: Any) -> Report:
    """The report of a loader's or planned sampler's ``stats``."""
    if stats is None:
        return Report()
    return Report(list(stats.skipped), list(stats.dropped), list(stats.padded))


# -- subjects -------------------------------------------------------------------------------------

#: Capabilities a subject may have; the invariant tests are parametrized over them.
CAPABILITIES = ("length", "epochs", "state", "pickle", "world_change", "limit")


class Subject:
    """A loader or sampler of one kind, made fresh for each rank from :class:`Inputs`.

    Attributes:
        name: The test id.
        ranked: It takes ``rank`` and ``world_size`` (else one process).
        shuffles: ``shuffle=True`` gives each epoch (or pass) another order; a stream keeps its input's.
        lacks: Capability -> why the matching invariant does not apply to this kind.
    """

    name = ""
    ranked = False
    shuffles = True  # with ``shuffle=True`` its epochs (or passes) come in different orders
    lacks: dict[str, str]

    def accepts(self, inp: Inputs) -> bool:
        """Whether this kind takes ``inp`` (an empty dataset, say); the tests skip it otherwise."""
        return True

    def world(self, inp: Inputs) -> int:
        return inp.world_size if self.ranked else 1

    def make(self, inp: Inputs, rank: int, world: int) -> Any:
        raise NotImplementedError

    def ranks(self, inp: Inputs, world: int | None = None) -> list[Any]:
        """One fresh object per rank."""
        world = self.world(inp) if world is None else world
        return [self.make(inp, rank, world) for rank in range(world)]

    def iterate(self, obj: Any) -> Iterator[list[int]]:
        """The next epoch (or pass) as lists of dataset indices."""
        return (ids_of(item) for item in obj)

    def report(self, obj: Any) -> Report:
        return stats_report(obj.stats)

    def set_epoch(self, obj: Any, epoch: int) -> None:
        obj.set_epoch(epoch)

    def length(self, obj: Any) -> int:
        return len(obj)

    def state_dict(self, obj: Any) -> dict[str, Any]:
        return dict(obj.state_dict())

    def load_state_dict(self, obj: Any, state: dict[str, Any]) -> None:
        obj.load_state_dict(state)

    def resumed_length(self, total: int, steps: int) -> int:
        """``len()`` right after loading a state saved ``steps`` into an epoch of ``total``.

        The whole epoch's steps, as a trainer that restores its step count counts them.
        """
        return total

    def limit(self, inp: Inputs) -> Limit | None:
        return None

    def outside(self, inp: Inputs) -> set[int]:
        """Indices left out for another reason than the cap (a bucket sampler's outside its buckets)."""
        return set()

    def __repr__(self) -> str:
        return self.name


def loader_options(inp: Inputs, rank: int, world: int) -> dict[str, Any]:
    """The options the loaders (and the Lightning module, for its loaders) take from ``inp``, but the seed."""
    return {
        "shuffle": inp.shuffle,
        "group_size": inp.group_size,
        "rank": rank,
        "world_size": world,
        "even_batches": inp.even_batches,
        "balance": inp.balance,
    }


class LoaderSubject(Subject):
    """``FastLoader`` / ``FastSizeAwareLoader`` itself, its ``batch_sampler()`` or its ``data_loader()``."""

    ranked = True

    def __init__(
        self, kind: str, view: str = "loader", cost: str = "sum", data: str = "tensor", sort_window: int | None = None
    ) -> None:
        self.kind, self.view, self.cost, self.data, self.sort_window = kind, view, cost, data, sort_window
        self.lacks = {}  # every invariant applies
        window = "" if sort_window is None else f", sort_window={sort_window}"
        label = "FastLoader" if kind == "fixed" else f"FastSizeAwareLoader[{cost}{window}]"
        if data != "tensor":
            label += f"({data})"
        self.name = label if view == "loader" else f"{label}.{view}()"

    def dataset(self, n: int) -> Any:
        """``torch.arange(n)``, or a dict or tuple holding it (with its doubles, to catch mixed-up rows)."""
        ids = torch.arange(n)
        if self.data == "dict":
            return {"ids": ids, "doubles": ids * 2, "name": "ids"}
        if self.data == "tuple":
            return (ids, ids * 2)
        return ids

    def iterate(self, obj: Any) -> Iterator[list[int]]:
        for item in obj:
            if self.data == "tensor":
                yield ids_of(item)
                continue
            ids, doubles = (item["ids"], item["doubles"]) if self.data == "dict" else item
            assert torch.equal(doubles, ids * 2), f"corrupted batch {item!r}"
            assert self.data != "dict" or item["name"] == "ids", f"corrupted batch {item!r}"
            yield ids_of(ids)

    def loader(self, inp: Inputs, rank: int, world: int) -> FastLoader | FastSizeAwareLoader:
        common = {"seed": inp.seed, **loader_options(inp, rank, world)}
        data = self.dataset(inp.n)
        if self.kind == "fixed":
            return FastLoader(data, inp.batch_size, drop_last=inp.drop_last, **common)
        return FastSizeAwareLoader(
            data,
            np.array(inp.sizes, dtype=np.int64),
            inp.cap,
            cost=self.cost,
            max_batch_size=inp.max_batch_size,
            oversize=inp.oversize,
            sort_window=self.sort_window,
            **common,
        )

    def make(self, inp: Inputs, rank: int, world: int) -> Any:
        loader = self.loader(inp, rank, world)
        if self.view == "batch_sampler":
            return loader.batch_sampler()
        if self.view == "data_loader":
            return loader.data_loader()
        return loader

    def limit(self, inp: Inputs) -> Limit:
        if self.kind == "fixed":
            return Limit("count", inp.batch_size)
        return Limit(self.cost, inp.cap, inp.max_batch_size, inp.oversize == "own_batch")


class _TrainerStandIn:
    """What ``FastDataModule`` reads of a Lightning trainer: ranks, the reload option, the stage."""

    def __init__(self, rank: int, world: int) -> None:
        self.global_rank, self.world_size = rank, world
        self.reload_dataloaders_every_n_epochs = 1
        self.training = True


class LightningSubject(Subject):
    """``FastDataModule``'s training loader, driven as Lightning's fit loop drives it.

    The loop sets the epoch through ``train_dataloader().sampler``, fetches one batch ahead
    of the step, calls ``on_before_batch_transfer`` for each batch it consumes, and saves
    and loads the module's ``state_dict``.
    """

    ranked = True

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"FastDataModule[{kind}]"

    def make(self, inp: Inputs, rank: int, world: int) -> Any:
        from fastsab.integrations.lightning import FastDataModule

        options = loader_options(inp, rank, world)
        data = torch.arange(inp.n)
        if self.kind == "fixed":
            module = FastDataModule(train=data, batch_size=inp.batch_size, seed=inp.seed, **options)
        else:
            sizes = {"train": np.array(inp.sizes, dtype=np.int64)}
            module = FastDataModule(train=data, sizeof=sizes, max_total_size=inp.cap, seed=inp.seed, **options)
        module.trainer = _TrainerStandIn(rank, world)
        return module

    def iterate(self, obj: Any) -> Iterator[list[int]]:
        source = iter(obj.train_dataloader())
        ahead = next(source, None)
        while ahead is not None:
            batch, ahead = ahead, next(source, None)  # Lightning fetches the next batch before the step
            obj.on_before_batch_transfer(batch, 0)
            yield ids_of(batch)

    def report(self, obj: Any) -> Report:
        return stats_report(obj.train_dataloader().loader.stats)

    def set_epoch(self, obj: Any, epoch: int) -> None:
        obj.train_dataloader().sampler.set_epoch(epoch)

    def length(self, obj: Any) -> int:
        return len(obj.train_dataloader())

    def limit(self, inp: Inputs) -> Limit:
        if self.kind == "fixed":
            return Limit("count", inp.batch_size)
        return Limit("sum", inp.cap)


class SizeAwareSamplerSubject(Subject):
    """``SizeAwareBatchSampler`` over a (seeded random, or sequential) index sampler."""

    name = "SizeAwareBatchSampler"

    def __init__(self, sizeof: str) -> None:
        self.sizeof = sizeof
        self.name = f"SizeAwareBatchSampler[{sizeof}]"

    def make(self, inp: Inputs, rank: int, world: int) -> Any:
        indices: Any = range(inp.n)
        if inp.shuffle and inp.n:  # (torch's RandomSampler refuses an empty dataset)
            indices = RandomSampler(indices, generator=torch.Generator().manual_seed(inp.seed))
        sizes: Any = np.array(inp.sizes, dtype=np.int64) if self.sizeof == "array" else list(inp.sizes).__getitem__
        return SizeAwareBatchSampler(indices, sizes, inp.cap, warn_logger=None)

    def report(self, obj: Any) -> Report:
        return Report(skipped=list(obj.skipped))

    def limit(self, inp: Inputs) -> Limit:
        return Limit("sum", inp.cap)


#: Bucket boundaries: sizes 10 and more lie outside every bucket (skipped, with a warning).
BOUNDARIES = (0, 3, 10)


class BucketSubject(Subject):
    """``BucketBatchSampler`` with ``BatchSampler`` or ``SizeAwareBatchSampler`` buckets, seeded."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.name = f"BucketBatchSampler[{base}]"

    def accepts(self, inp: Inputs) -> bool:
        # NOTE: it refuses sizes that all lie outside the buckets (an empty dataset too)
        return any(BOUNDARIES[0] <= s < BOUNDARIES[-1] for s in inp.sizes)

    def make(self, inp: Inputs, rank: int, world: int) -> Any:
        generator = torch.Generator().manual_seed(inp.seed)
        sizes = torch.tensor(inp.sizes, dtype=torch.int64)
        if self.base == "BatchSampler":
            return BucketBatchSampler(
                sizes,
                torch.tensor(BOUNDARIES),
                BatchSampler,
                {"drop_last": False},
                {"batch_size": [inp.batch_size, inp.batch_size + 1]},
                shuffle=inp.shuffle,
                generator=generator,
            )
        return BucketBatchSampler(
            sizes,
            torch.tensor(BOUNDARIES),
            SizeAwareBatchSampler,
            {"sizeof": list(inp.sizes).__getitem__, "max_total_size": inp.cap, "warn_logger": None},
            shuffle=inp.shuffle,
            generator=generator,
        )

    def report(self, obj: Any) -> Report:
        inside = {i for bucket in obj.bucket_element_indices for i in bucket}
        outside = [i for i in range(len(obj.sizes)) if i not in inside]
        assert len(outside) == obj.num_skipped, "num_skipped is not the number of elements outside the buckets"
        for base in obj.base_batch_samplers:
            outside += list(getattr(base, "skipped", []))
        return Report(skipped=outside)

    def outside(self, inp: Inputs) -> set[int]:
        return {i for i, size in enumerate(inp.sizes) if not BOUNDARIES[0] <= size < BOUNDARIES[-1]}

    def limit(self, inp: Inputs) -> Limit:
        if self.base == "BatchSampler":
            return Limit("count", inp.batch_size + 1)
        return Limit("sum", inp.cap)


_SKIP_MESSAGE = re.compile(r"^Size of element (\d+) exceeds max_total_size")


class Streamed:
    """A streaming batcher over ``range(n)`` made anew per pass; it records the skip warnings."""

    def __init__(self, make: Callable[[Callable[[str], None]], Iterator[Any]]) -> None:
        self._make = make
        self.skipped: list[int] = []

    def __iter__(self) -> Iterator[Any]:
        self.skipped = []
        return self._make(self.warn)

    def warn(self, message: str) -> None:
        match = _SKIP_MESSAGE.match(message)
        if match:
            self.skipped.append(int(match.group(1)))


class StreamingSubject(Subject):
    """``size_aware_batching`` and the WebDataset stage ``size_aware_batched`` over ``range(n)``."""

    shuffles = False

    def __init__(self, form: str) -> None:
        self.form = form
        self.name = form

    def make(self, inp: Inputs, rank: int, world: int) -> Streamed:
        sizeof = list(inp.sizes).__getitem__
        if self.form == "size_aware_batching":
            return Streamed(
                lambda warn: size_aware_batching(
                    range(inp.n), sizeof, inp.cap, warn_logger=warn, max_batch_size=inp.max_batch_size
                )
            )
        from fastsab.integrations.webdataset import size_aware_batched

        return Streamed(
            lambda warn: size_aware_batched(sizeof, inp.cap, max_batch_size=inp.max_batch_size, warn_logger=warn)(
                iter(range(inp.n))
            )
        )

    def report(self, obj: Any) -> Report:
        return Report(skipped=list(obj.skipped))

    def limit(self, inp: Inputs) -> Limit:
        return Limit("sum", inp.cap, inp.max_batch_size)


def write_shard(path: str, n: int) -> None:
    """A tar shard whose samples ``000000``... hold their own index as ``index.cls``."""
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            payload = str(i).encode()
            info = tarfile.TarInfo(f"{i:06d}.index.cls")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


class WebDataSubject(StreamingSubject):
    """``WebDataModule``'s validation split over a tar shard, batched by ``size_aware_batched``."""

    def __init__(self) -> None:
        super().__init__("WebDataModule[val]")
        self._directories: list[tempfile.TemporaryDirectory[str]] = []

    def make(self, inp: Inputs, rank: int, world: int) -> Streamed:
        from fastsab.integrations.webdataset import WebDataModule, size_aware_batched

        directory = tempfile.TemporaryDirectory()
        self._directories.append(directory)  # NOTE: removed with the subject, at the end of the session
        write_shard(f"{directory.name}/wdshards-000000.tar", inp.n)
        streamed = Streamed(lambda warn: iter(module.val_dataloader()))
        stage = size_aware_batched(
            list(inp.sizes).__getitem__, inp.cap, max_batch_size=inp.max_batch_size, warn_logger=streamed.warn
        )
        module = WebDataModule(
            {"val": directory.name}, {"val": inp.n}, "index.cls", 1, pipeline_prebatch_wld={"val": stage}
        )
        return streamed


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


NO_STATE_BIONEMO = "the bionemo samplers have no state_dict: a pass is resumed by the index sampler they wrap"
NO_EPOCH_BIONEMO = "no set_epoch: each pass draws on from its generator (determinism is checked pass by pass)"
NO_WORLD = "one process: it takes no rank or world size (shard the index sampler instead)"
GENERATOR = "a generator function, consumed once per pass; there is nothing to size, save or resume"
SHARDS = "WebDataset owns the shard order, the position and the ranks; the split is read once per pass"


def subjects() -> list[Subject]:
    """Every loader and sampler kind, with the reasons where an invariant does not apply."""
    out: list[Subject] = [
        LoaderSubject("fixed"),
        LoaderSubject("sized", cost="sum"),
        LoaderSubject("sized", cost="padded"),
        LoaderSubject("fixed", "batch_sampler"),
        LoaderSubject("sized", "batch_sampler"),
        LoaderSubject("sized", "batch_sampler", cost="padded"),
        LoaderSubject("fixed", "data_loader"),
        LoaderSubject("sized", "data_loader"),
        LoaderSubject("fixed", "data_loader", data="dict"),
        LoaderSubject("sized", "data_loader", data="tuple"),
        LoaderSubject("sized", data="dict"),
        LoaderSubject("sized", cost="sum", sort_window=3),
        LoaderSubject("sized", cost="padded", sort_window=4),
        LoaderSubject("sized", "batch_sampler", sort_window=2),
        LoaderSubject("sized", "data_loader", cost="padded", sort_window=5),
    ]
    sampler = {"epochs": NO_EPOCH_BIONEMO, "state": NO_STATE_BIONEMO, "world_change": NO_WORLD}
    unsized = "no __len__, as in bionemo: the number of batches is known only after a pass"
    streaming = {"epochs": GENERATOR, "state": GENERATOR, "world_change": NO_WORLD, "length": GENERATOR}
    out += [
        _lacking(SizeAwareSamplerSubject("array"), {**sampler, "length": unsized}),
        _lacking(
            SizeAwareSamplerSubject("callable"),
            {
                **sampler,
                "length": unsized,
                "pickle": "sizeof is a bound method of a list here (the array form pickles)",
            },
        ),
        _lacking(BucketSubject("BatchSampler"), sampler),
        _lacking(
            BucketSubject("SizeAwareBatchSampler"),
            {**sampler, "length": "its base samplers have no __len__, so neither has it (as in bionemo)"},
        ),
        _lacking(StreamingSubject("size_aware_batching"), {**streaming, "pickle": GENERATOR}),
        _lacking(StreamingSubject("size_aware_batched"), {**streaming, "pickle": GENERATOR}, extra="webdataset"),
        _lacking(
            WebDataSubject(),
            {
                "epochs": SHARDS,
                "state": SHARDS,
                "world_change": SHARDS,
                "length": "an evaluation split is one full pass of unknown length (no __len__)",
                "pickle": SHARDS,
            },
            extra="webdataset",
        ),
    ]
    world = "the ranks come from the trainer of each run; another world size is the loaders' resume (checked there)"
    out += [
        _lacking(LightningSubject("fixed"), {"world_change": world}, extra="lightning"),
        _lacking(LightningSubject("sized"), {"world_change": world}, extra="lightning"),
    ]
    return out


def _lacking(subject: Subject, lacks: dict[str, str], extra: str | None = None) -> Subject:
    """``subject`` with the reasons it lacks capabilities; all of them if ``extra`` is not installed."""
    subject.lacks = dict(lacks)
    if extra is not None and not _has(extra):
        subject.lacks = {name: f"the {extra} extra is not installed" for name in ("", *CAPABILITIES)}
    return subject


SUBJECTS = subjects()


def applicable(capability: str = "") -> list[Any]:
    """A ``pytest.param`` per subject, marked skipped with the reason where ``capability`` does not apply."""
    import pytest

    params = []
    for subject in SUBJECTS:
        reason = subject.lacks.get(capability, subject.lacks.get(""))
        marks = [pytest.mark.skip(reason=f"{subject.name}: {reason}")] if reason is not None else []
        params.append(pytest.param(subject, id=subject.name, marks=marks))
    return params


def flat(batches: Sequence[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in batch]
