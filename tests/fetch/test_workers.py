from __future__ import annotations

import gc
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import optree
import psutil
import pytest
import torch
from torch.utils.data import dataloader

from fastsab import FastLoader, FastSizeAwareLoader, OutOfCoreDataset, adaptive
from fastsab.bench.workers import workers_rows
from fastsab.cli import main
from fastsab.fetch import sending, workers
from fastsab.loaders.options import LoaderOptions

pytestmark = pytest.mark.timeout(60)

N = 60
SIZES = (torch.arange(N) % 7 + 1).tolist()


class Items:
    """A dataset that fetches: one ``__getitems__`` per batch, a list of samples."""

    def __len__(self) -> int:
        return N

    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        return [{"x": torch.tensor([i, 10 * i]), "pid": torch.tensor(os.getpid())} for i in ids]


class Seeds(Items):
    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        return [{**item, "seed": torch.tensor(torch.initial_seed())} for item in super().__getitems__(ids)]


class Failing(Items):
    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        if 13 in ids:
            decode_broken_record(13)
        return super().__getitems__(ids)


class Slow(Items):
    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        time.sleep(0.02)
        return super().__getitems__(ids)


def decode_broken_record(index: int) -> None:
    raise ValueError(f"record {index} is broken")


def fixed(**options):
    return FastLoader(Items(), 8, seed=3, **options)


def sized(**options):
    return FastSizeAwareLoader(Items(), SIZES, 12, seed=3, **options)


def ids_of(batches) -> list[list[int]]:
    return [batch["x"][:, 0].tolist() for batch in batches]


def children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def no_children_left(wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not children()


@pytest.mark.parametrize("make", [fixed, sized])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_with_workers_are_those_of_one_process(make, shuffle):
    expected = ids_of(make(shuffle=shuffle))
    loader = make(shuffle=shuffle, num_workers=2)
    batches = list(loader)
    assert ids_of(batches) == expected
    assert {int(b["pid"][0]) for b in batches} - {os.getpid()}  # fetched elsewhere
    assert loader.stats.num_batches == len(expected) and loader.stats.num_items == N
    assert no_children_left()


@pytest.mark.parametrize("make", [fixed, sized])
def test_each_rank_gets_its_share_with_workers(make):
    for rank in range(2):
        alone = ids_of(make(rank=rank, world_size=2))
        assert ids_of(make(rank=rank, world_size=2, num_workers=2)) == alone


def test_workers_fetch_with_the_collate_fn_and_the_batches_are_moved_here():
    def pair(samples):
        return torch.stack([s["x"] for s in samples]), torch.stack([s["pid"] for s in samples])

    loader = FastLoader(Items(), 8, shuffle=False, collate_fn=pair, num_workers=2, device="cpu", prefetch=1)
    batches = list(loader)
    assert [x[:, 0].tolist() for x, _ in batches] == [list(range(i, min(i + 8, N))) for i in range(0, N, 8)]
    assert os.getpid() not in {int(pid[0]) for _, pid in batches}


def test_worker_seeds_follow_the_loader_seed_and_leave_the_global_generator_alone():
    def seeds(seed: int, epoch: int) -> set[int]:
        loader = FastLoader(Seeds(), 8, seed=seed, num_workers=2)
        loader.set_epoch(epoch)
        return {int(batch["seed"][0]) for batch in loader}

    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = seeds(0, 0)
    assert torch.equal(torch.get_rng_state(), state)  # the training loop's draws are its own
    assert len(first) == 2 and seeds(0, 0) == first
    assert seeds(0, 1) != first and seeds(1, 0) != first


def test_a_state_taken_mid_epoch_with_workers_counts_the_batches_received():
    expected = ids_of(sized())
    loader = sized(num_workers=2)
    batches = iter(loader)
    first = ids_of([next(batches) for _ in range(3)])
    state = loader.state_dict()  # the workers have fetched further ahead
    del batches
    assert no_children_left()
    resumed = sized(num_workers=2)
    resumed.load_state_dict(state)
    assert first + ids_of(resumed) == expected


@pytest.mark.parametrize("make", [fixed, sized])
def test_a_lowering_with_workers_gives_the_batches_of_one_process(make):
    def run(**options):
        loader = make(**options)
        seen: list[list[int]] = []

        def step(batch):
            ids = batch["x"][:, 0].tolist()
            if len(seen) == 2 and loader.stats.limit_changes == []:
                raise torch.OutOfMemoryError("CUDA out of memory.")
            seen.append(ids)

        list(adaptive.run(loader, step))
        return seen, loader.stats.limit_changes

    alone = run()
    assert run(num_workers=2) == alone
    assert alone[1] and sorted(i for ids in alone[0] for i in ids) == list(range(N))


def test_a_lowering_mid_epoch_with_workers_plans_the_batches_read_ahead_again():
    loader = FastLoader(Items(), 8, shuffle=False, num_workers=2)
    batches = iter(loader)
    seen = ids_of([next(batches), next(batches)])
    loader.lower_limit(3)
    seen += ids_of(batches)
    assert seen[:2] == [list(range(8)), list(range(8, 16))]
    assert seen[2:] == [list(range(i, min(i + 3, N))) for i in range(16, N, 3)]


@pytest.mark.parametrize("make", [fixed, sized])
def test_leaving_the_loop_leaves_no_worker_process(make):
    loader = make(num_workers=2)
    for _ in loader:
        assert children()
        break
    assert no_children_left()
    batches = iter(make(num_workers=2))
    next(batches)
    del batches  # collected
    assert no_children_left()
    with pytest.raises(KeyError):
        for _ in make(num_workers=2):
            raise KeyError("stop")
    assert no_children_left()
    with pytest.raises(KeyboardInterrupt):
        for _ in make(num_workers=2):
            raise KeyboardInterrupt
    assert no_children_left()


def test_a_worker_error_is_raised_in_the_loop_with_its_traceback():
    loader = FastLoader(Failing(), 4, shuffle=False, num_workers=2)
    with pytest.raises(ValueError, match=r"(?s)worker process.*in decode_broken_record.*record 13 is broken") as error:
        list(loader)
    assert "decode_broken_record" in str(error.value)
    assert no_children_left()


def test_a_killed_worker_raises_instead_of_hanging():
    loader = FastLoader(Slow(), 2, shuffle=False, num_workers=2)
    batches = iter(loader)
    next(batches)
    os.kill(children()[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        for _ in batches:
            pass
    assert no_children_left()


def test_a_connection_lost_to_a_worker_is_reported_as_a_worker_that_ended(monkeypatch):
    # (a worker killed while this process fetches the shared memory of a batch it sent)
    def lost(self):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(dataloader._MultiProcessingDataLoaderIter, "_next_data", lost)
    message = r"DataLoader worker \(pid\(s\) .*\) ended while a batch was being received \(ConnectionResetError"
    with pytest.raises(RuntimeError, match=message):
        list(FastLoader(Items(), 4, num_workers=1))
    assert no_children_left()


def test_in_memory_data_is_gathered_here_whatever_num_workers_says():
    loader = FastLoader(torch.arange(50), 8, seed=1, num_workers=2)
    assert loader.num_workers == 0 and loader.options.num_workers == 2
    batches = iter(loader)
    first = next(batches)
    assert not children()
    assert [first.tolist(), *[b.tolist() for b in batches]] == [
        b.tolist() for b in FastLoader(torch.arange(50), 8, seed=1)
    ]


def read_row(i: int) -> np.ndarray:
    return np.full(4, i, dtype=np.float32)


def test_a_dataset_read_in_chunks_is_read_here_once_per_epoch_whatever_num_workers_says():
    dataset = OutOfCoreDataset(range(200), read_row, cpu_memory_limit=1600)
    loader = FastLoader(dataset, 16, seed=1, num_workers=2)
    assert loader.num_workers == 0 and loader.options.num_workers == 2
    batches = iter(loader)
    first = next(batches)
    assert not children()
    rows = [first, *batches]
    assert sorted(int(v) for batch in rows for v in batch[:, 0]) == list(range(200))
    assert dataset.chunk_reads == dataset.num_chunks


def test_spawned_workers_give_the_same_batches():
    loader = sized(num_workers=1, multiprocessing_context="spawn")
    assert ids_of(loader) == ids_of(sized())


def test_worker_init_fn_runs_in_each_worker(tmp_path):
    loader = FastLoader(Items(), 8, num_workers=2, worker_init_fn=_InitMark(str(tmp_path)))
    assert len(list(loader)) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]


class _InitMark:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        open(os.path.join(self.folder, str(worker_id)), "w").close()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"num_workers": -1}, ValueError, r"num_workers must be a non-negative integer, got -1\."),
        ({"num_workers": 1.5}, TypeError, r"num_workers must be an integer, got 1\.5 of type float\."),
        (
            {"num_workers": 2, "prefetch": 0},
            ValueError,
            r"prefetch must be at least 1 with worker processes .* got prefetch=0 with num_workers=2",
        ),
        ({"num_workers": 1, "worker_init_fn": 3}, TypeError, r"worker_init_fn must be callable or None, got 3\."),
        (
            {"num_workers": 1, "multiprocessing_context": "fork2"},
            ValueError,
            r"multiprocessing_context must be one of .* got 'fork2'\.",
        ),
        (
            {"num_workers": 1, "multiprocessing_context": 7},
            TypeError,
            r"multiprocessing_context must be a start method name or a multiprocessing context, got 7\.",
        ),
        (
            {"multiprocessing_context": "spawn"},
            ValueError,
            r"multiprocessing_context='spawn' starts worker processes, so it needs num_workers of 1 or more",
        ),
    ],
)
def test_worker_options_are_checked(options, error, message):
    with pytest.raises(error, match=message):
        LoaderOptions(**options)
    with pytest.raises(error, match=message):
        FastLoader(Items(), 4, **options)


_AT_EXIT = """
import sys, psutil, torch
sys.path.insert(0, {root!r})
from fastsab import FastLoader

class Items:
    def __len__(self):
        return 100

    def __getitems__(self, ids):
        return torch.tensor(ids)

{body}
print(" ".join(str(p.pid) for p in psutil.Process().children()))
"""


def workers_left_at_exit(body: str) -> list[int]:
    """The worker processes a new interpreter running ``body`` (a ``FastLoader`` over ``Items``) had at its exit.

    Also checks that it exited without error, and waits up to 5 s for those processes to end.
    """
    script = _AT_EXIT.format(root=str(Path(__file__).parents[2]), body=textwrap.dedent(body))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


@pytest.mark.slow
def test_a_loop_left_unfinished_at_exit_ends_without_error_or_orphans(tmp_path):
    # a loader iterator still referenced at exit: the interpreter exits cleanly and no worker outlives it
    pids = workers_left_at_exit(
        """
        batches = iter(FastLoader(Items(), 4, num_workers=2))
        next(batches)
        """
    )
    assert len(pids) == 2
    assert not any(psutil.pid_exists(pid) for pid in pids)


@pytest.mark.slow
def test_the_workers_bench_suite_runs(capsys):
    before = {p.pid for p in children()}
    assert main(["bench", "--suite", "workers", "--samples", "300", "--epochs", "2", "--quiet", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert "**workers**" in printed and "| fixed size, 300 texts, later epochs | FastLoader(num_workers=2) |" in printed
    assert (
        "| size-aware, 300 texts, first epoch | "
        "DataLoader(num_workers=2, persistent_workers=True, batch_sampler=FastSizeAwareLoader.batch_sampler())"
    ) in printed
    rows = workers_rows(samples=200, batch_size=16, epochs=2, rounds=1)
    methods = [
        "FastLoader(prefetch=2), one process",
        "FastLoader(num_workers=2)",
        "FastLoader(num_workers=2, persistent_workers=True)",
        "DataLoader(num_workers=2, persistent_workers=True, batch_sampler=FastLoader.batch_sampler())",
    ]
    assert [row.method for row in rows[:8]] == methods * 2
    assert [row.workload for row in rows[::4]] == [
        f"{kind}, 200 texts, {phase}"
        for kind in ("fixed size", "size-aware")
        for phase in ("first epoch", "later epochs")
    ]
    assert [row.ratio for row in rows][::4] == [1.0] * 4 and all(row.seconds > 0 for row in rows)
    assert [row.speedup for row in rows][3::4] == [1.0] * 4
    for group in range(0, 16, 4):  # the same batches
        assert len({row.note.split(";")[0] for row in rows[group : group + 4]}) == 1
    assert all(" ms CPU a batch in this process" in row.note for row in rows)
    deadline = time.monotonic() + 5
    while {p.pid for p in children()} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {p.pid for p in children()} - before  # the workers of every case shut down


# -- persistent workers --------------------------------------------------------------


class Draws(Items):
    """Each sample with what its worker draws from torch, numpy and random, and its worker's seed."""

    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        draws = [
            torch.initial_seed(),
            int(torch.randint(2**31, ())),
            int(np.random.randint(2**31)),
            random.getrandbits(31),
            info.seed if info is not None else -1,
        ]
        return [{**item, "draws": torch.tensor(draws)} for item in super().__getitems__(ids)]


def ended(pids: list[int], wait: float = 5.0) -> bool:
    """Whether the processes ``pids`` ended (within ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def alive(pids: list[int]) -> bool:
    return all(psutil.pid_exists(pid) for pid in pids) and set(pids) <= {p.pid for p in children()}


def epochs_of(loader, epochs: int = 3) -> tuple[list[list[list[int]]], list[list[int]]]:
    """The batch ids of ``epochs`` epochs (set_epoch each), and the worker processes that fetched each epoch."""
    batches, pids = [], []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        got = list(loader)
        batches.append(ids_of(got))
        pids.append(sorted({int(b["pid"][0]) for b in got}))
    return batches, pids


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [fixed, sized])
@pytest.mark.parametrize("shuffle", [False, True])
def test_persistent_workers_give_the_batches_of_one_process_in_the_same_workers(make, shuffle):
    expected, _ = epochs_of(make(shuffle=shuffle))
    loader = make(shuffle=shuffle, num_workers=2, persistent_workers=True)
    batches, pids = epochs_of(loader)
    assert batches == expected
    assert len(pids[0]) == 2 and os.getpid() not in pids[0] and pids == [pids[0]] * 3  # the same workers
    assert alive(pids[0])  # between epochs
    loader.close()
    assert ended(pids[0])
    assert epochs_of(loader, 1)[0] == expected[:1]  # new workers after close()
    pids = loader._workers.pids
    assert alive(pids) and len(pids) == 2
    del loader
    gc.collect()
    assert ended(pids)


@pytest.mark.timeout(20)
def test_persistent_workers_draw_what_workers_started_each_epoch_draw():
    def draws(**options):
        loader = FastLoader(Draws(), 8, seed=4, num_workers=2, **options)
        out = []
        for epoch in (0, 1, 1, 2):  # an epoch run again draws again what it drew
            loader.set_epoch(epoch)
            out.append([b["draws"][0].tolist() for b in loader])
        return out

    started = draws()
    assert draws(persistent_workers=True) == started
    assert len({tuple(map(tuple, epoch)) for epoch in started}) == 3 and started[1] == started[2]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [fixed, sized])
def test_a_lowering_with_persistent_workers_gives_the_batches_of_one_process_in_the_same_workers(make):
    def run(**options):
        loader = make(**options)
        seen: list[list[int]] = []
        pids: set[int] = set()

        def step(batch):
            if len(seen) % 9 == 2 and len(loader.stats.limit_changes) < 1:
                raise torch.OutOfMemoryError("CUDA out of memory.")
            seen.append(batch["x"][:, 0].tolist())
            pids.update(batch["pid"].tolist())

        for epoch in range(2):
            loader.set_epoch(epoch)
            list(adaptive.run(loader, step))
        return seen, pids

    alone, _ = run()
    seen, pids = run(num_workers=2, persistent_workers=True)
    assert seen == alone and len(pids) == 2
    loader = FastLoader(Items(), 8, shuffle=False, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    first = ids_of([next(batches), next(batches)])
    loader.lower_limit(3)
    rest = list(batches)
    assert first + ids_of(rest) == [list(range(0, 8)), list(range(8, 16))] + [
        list(range(i, min(i + 3, N))) for i in range(16, N, 3)
    ]
    assert {int(b["pid"][0]) for b in rest} == set(loader._workers.pids)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [fixed, sized])
def test_a_resume_with_persistent_workers_gives_the_rest_of_the_epoch(make):
    expected, _ = epochs_of(make(), 2)
    loader = make(num_workers=2, persistent_workers=True)
    loader.set_epoch(1)
    batches = iter(loader)
    first = ids_of([next(batches) for _ in range(3)])
    state = loader.state_dict()  # the workers have fetched further ahead
    del batches
    resumed = make(num_workers=2, persistent_workers=True)
    resumed.load_state_dict(state)
    assert first + ids_of(resumed) == expected[1]
    loader.load_state_dict(state)  # into the loader whose workers fetched ahead
    assert first + ids_of(loader) == expected[1]
    copy = pickle.loads(pickle.dumps(loader))  # a copy starts workers of its own
    copy.set_epoch(0)
    assert ids_of(copy) == expected[0]
    pids = [pid for each in (loader, resumed, copy) for pid in each._workers.pids]
    assert len(set(pids)) == 6
    for each in (loader, resumed, copy):
        each.close()
    assert ended(pids)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [fixed, sized])
def test_leaving_an_epoch_early_with_persistent_workers_keeps_the_next_epochs_exact(make):
    expected, _ = epochs_of(make(), 2)
    loader = make(num_workers=2, persistent_workers=True)
    for _ in loader:
        break
    pids = loader._workers.pids
    assert alive(pids) and len(pids) == 2
    loader.set_epoch(0)
    assert ids_of(loader) == expected[0]  # the epoch left, run again
    with pytest.raises(KeyError):
        for i, _ in enumerate(loader):
            if i == 3:
                raise KeyError("stop")
    loader.set_epoch(1)
    assert ids_of(loader) == expected[1]
    assert loader._workers.pids == pids and alive(pids)
    del loader
    gc.collect()
    assert ended(pids)


@pytest.mark.timeout(20)
def test_a_worker_error_with_persistent_workers_shuts_them_down_and_the_next_epoch_starts_new_ones():
    loader = FastLoader(Failing(), 4, shuffle=False, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    next(batches)
    pids = loader._workers.pids
    with pytest.raises(ValueError, match=r"record 13 is broken"):
        list(batches)
    assert ended(pids)
    with pytest.raises(ValueError, match=r"record 13 is broken"):
        list(loader)  # in new workers
    loader = FastLoader(Slow(), 2, shuffle=False, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    next(batches)
    pids = loader._workers.pids
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        for _ in batches:
            pass
    assert ended(pids)
    assert ids_of(loader) == [[i, i + 1] for i in range(0, N, 2)]
    loader.close()


@pytest.mark.timeout(30)
def test_a_persistent_worker_killed_between_epochs_is_replaced_for_the_next_epoch():
    loader = FastLoader(Slow(), 2, shuffle=False, num_workers=2, persistent_workers=True)
    expected = [[i, i + 1] for i in range(0, N, 2)]
    assert ids_of(loader) == expected
    pids = loader._workers.pids
    killed = loader._workers._processes()[0]
    os.kill(killed.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # NOTE: torch's handler of a child's end may raise in this thread while it waits (as
        # with DataLoader's persistent workers); the next epoch must not fail on the dead worker
        try:
            if not killed.is_alive():
                break
            time.sleep(0.02)
        except RuntimeError as error:
            assert "killed by signal" in str(error)
    assert not killed.is_alive()
    assert ids_of(loader) == expected
    assert not set(loader._workers.pids) & set(pids[:1])
    loader.close()
    assert ended(pids)


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_persistent_workers_end_with_the_interpreter(tmp_path):
    pids = workers_left_at_exit(
        """
        loader = FastLoader(Items(), 4, num_workers=2, persistent_workers=True)
        assert len(list(loader)) == 25
        batches = iter(loader)
        next(batches)
        """
    )
    assert len(pids) == 2
    assert not any(psutil.pid_exists(pid) for pid in pids)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"num_workers": 2, "persistent_workers": 1}, TypeError, r"persistent_workers must be True or False, got 1\."),
        (
            {"persistent_workers": True},
            ValueError,
            r"persistent_workers=True keeps worker processes across epochs, so it needs num_workers of 1 or more, "
            r"got num_workers=0\.",
        ),
    ],
)
def test_persistent_workers_is_checked(options, error, message):
    with pytest.raises(error, match=message):
        LoaderOptions(**options)
    with pytest.raises(error, match=message):
        FastSizeAwareLoader(Items(), SIZES, 12, **options)


def kinds(samples: list[dict[str, torch.Tensor]]) -> dict[str, object]:
    """A batch of tensors of many dtypes and layouts, and one above the in-band size."""
    ids = [int(sample["x"][0]) for sample in samples]
    first = ids[0]
    return {
        "ids": torch.tensor(ids),
        "bool": torch.tensor(ids) % 2 == 0,
        "bf16": torch.tensor(ids, dtype=torch.bfloat16) / 3,
        "half": torch.tensor(ids, dtype=torch.float16) / 7,
        "complex": torch.tensor(ids, dtype=torch.complex64) * 1j,
        "int8": torch.tensor(ids, dtype=torch.int8),
        "scalar": torch.tensor(first * 1.5),
        "empty": torch.zeros(0, 3, dtype=torch.int16),
        "columns": torch.arange(len(ids) * 3).reshape(3, len(ids)).t() + first,  # not contiguous
        "view": torch.arange(100)[first : first + 4],  # a view of a larger tensor
        "large": torch.full((sending.IN_BAND_BYTES // 8 + 1,), first, dtype=torch.int64),
        "pairs": [(torch.tensor([first]), "text", 3)],
    }


@pytest.mark.timeout(20)
@pytest.mark.parametrize("persistent", [False, True])
def test_batches_from_workers_keep_every_dtype_shape_and_value_and_small_tensors_come_with_them(persistent):
    def pieces(batch):
        flat = optree.tree_leaves(batch, none_is_leaf=True)
        return [(t.dtype, tuple(t.shape), t.tolist()) if isinstance(t, torch.Tensor) else t for t in flat]

    alone = [pieces(batch) for batch in FastLoader(Items(), 4, seed=2, collate_fn=kinds)]
    loader = FastLoader(Items(), 4, seed=2, collate_fn=kinds, num_workers=2, persistent_workers=persistent)
    batches = list(loader)
    assert [pieces(batch) for batch in batches] == alone
    for batch in batches:  # sent with the batch, not through shared memory; the large tensor shared
        assert not any(t.is_shared() for key, t in batch.items() if key not in ("large", "pairs"))
        assert batch["large"].is_shared() and not batch["pairs"][0][0].is_shared()
        batch["columns"] += 1  # writable


def layouts(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch of small tensors whose strides are not those of a contiguous tensor."""
    ids = torch.tensor([int(sample["x"][0]) for sample in samples])
    images = (ids[:, None, None, None] + torch.arange(3 * 4 * 5).reshape(1, 3, 4, 5)).float()
    return {
        "images": images.to(memory_format=torch.channels_last),
        "columns": (ids[None, :] + torch.arange(3)[:, None]).t(),  # (B, 3) with strides (1, B)
        "ids": ids,
    }


@pytest.mark.timeout(20)
@pytest.mark.parametrize("persistent", [False, True])
def test_small_tensors_from_workers_keep_their_strides(persistent):
    def pieces(batch):
        return {key: (t.dtype, tuple(t.shape), t.stride(), t.tolist()) for key, t in batch.items()}

    alone = [pieces(batch) for batch in FastLoader(Items(), 4, seed=2, collate_fn=layouts)]
    loader = FastLoader(Items(), 4, seed=2, collate_fn=layouts, num_workers=2, persistent_workers=persistent)
    batches = list(loader)
    loader.close()
    assert [pieces(batch) for batch in batches] == alone
    assert all(batch["images"].is_contiguous(memory_format=torch.channels_last) for batch in batches)
    assert not any(t.is_shared() for batch in batches for t in batch.values())  # sent with the batch


class SharedLabels(Items):
    """Each batch holds one tensor twice: its labels are its input ids."""

    def __getitems__(self, ids: list[int]) -> dict[str, torch.Tensor]:
        tokens = torch.tensor(ids)
        return {"input_ids": tokens, "labels": tokens}


@pytest.mark.timeout(20)
def test_a_tensor_at_two_places_of_a_batch_from_workers_stays_one_tensor():
    (alone,) = [batch for batch in FastLoader(SharedLabels(), N, shuffle=False)]
    (sent,) = [batch for batch in FastLoader(SharedLabels(), N, shuffle=False, num_workers=1)]
    assert alone["labels"] is alone["input_ids"]
    assert sent["labels"] is sent["input_ids"]
    assert sent["labels"].tolist() == alone["labels"].tolist()


class ShiftedLabels(Items):
    """Each batch's inputs and labels are two views of one tensor, shifted by one token."""

    def __getitems__(self, ids: list[int]) -> dict[str, torch.Tensor]:
        tokens = torch.tensor(ids)[:, None] + torch.arange(4)
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "alone": torch.tensor(ids)}


@pytest.mark.timeout(20)
def test_views_of_one_tensor_from_workers_still_share_their_memory():
    def shares(batch: dict[str, torch.Tensor]) -> bool:
        return batch["input_ids"].untyped_storage().data_ptr() == batch["labels"].untyped_storage().data_ptr()

    (alone,) = [batch for batch in FastLoader(ShiftedLabels(), N, shuffle=False)]
    (sent,) = [batch for batch in FastLoader(ShiftedLabels(), N, shuffle=False, num_workers=1)]
    assert shares(alone) and shares(sent)
    assert {key: value.tolist() for key, value in sent.items()} == {key: value.tolist() for key, value in alone.items()}
    sent["labels"][0, 0] = -1  # (an in-place write shows through the other view, as in one process)
    assert sent["input_ids"][0, 1] == -1
    assert not sent["alone"].is_shared()  # a tensor of its own still comes with the batch


def nested(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch holding a small nested tensor (one row per sample, of its own length)."""
    ids = [int(sample["x"][0]) for sample in samples]
    return {"rows": torch.nested.nested_tensor([torch.arange(i % 3 + 1) + i for i in ids])}


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_small_nested_tensor_comes_from_workers():
    def rows(batches):
        return [[row.tolist() for row in batch["rows"].unbind()] for batch in batches]

    expected = rows(FastLoader(Items(), 4, seed=2, collate_fn=nested))
    assert rows(FastLoader(Items(), 4, seed=2, collate_fn=nested, num_workers=2)) == expected


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_tensor_its_bytes_cannot_describe_is_pickled_as_torch_pickles_it():
    tensor = torch.nested.nested_tensor([torch.ones(2), torch.zeros(3)])
    again = pickle.loads(pickle.dumps(sending._InBand(tensor)))
    assert again.is_nested and [row.tolist() for row in again.unbind()] == [[1.0, 1.0], [0.0, 0.0, 0.0]]


@pytest.mark.timeout(20)
def test_an_iterator_left_behind_takes_no_batch_of_the_newer_one_with_persistent_workers():
    def run(**options):
        loader = fixed(**options)
        old = iter(loader)
        next(old)
        new = iter(loader)
        seen = ids_of([next(new), next(new)])
        with pytest.raises(RuntimeError, match=r"left behind"):
            next(old)
        return seen + ids_of(new), loader.stats.num_batches

    expected = run()
    assert run(num_workers=2, persistent_workers=True) == expected


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [fixed, sized])
def test_each_rank_gets_its_share_with_persistent_workers(make):
    for rank in range(2):
        alone = epochs_of(make(rank=rank, world_size=2), 2)[0]
        loader = make(rank=rank, world_size=2, num_workers=2, persistent_workers=True)
        assert epochs_of(loader, 2)[0] == alone
        loader.close()


@pytest.mark.timeout(20)
def test_closing_the_loader_mid_epoch_ends_the_iteration_and_the_next_one_is_exact():
    expected = ids_of(fixed())
    loader = fixed(num_workers=2, persistent_workers=True)
    batches = iter(loader)
    next(batches)
    pids = loader._workers.pids
    loader.close()
    assert ended(pids)
    with pytest.raises(RuntimeError, match=r"the loader was closed \(loader.close\(\)\) during this iteration"):
        next(batches)
    loader.set_epoch(0)
    assert ids_of(loader) == expected
    loader.close()


@pytest.mark.timeout(20)
def test_persistent_workers_end_with_their_loader_without_waiting_for_the_garbage_collector():
    # the loader of a training function that raised, and one left with `break`, freed by reference counting
    pids: list[int] = []

    def train():
        loader = fixed(num_workers=2, persistent_workers=True)
        for i, _ in enumerate(loader):
            if i == 2:
                pids.extend(loader._workers.pids)
                raise KeyError("step failed")

    gc.disable()
    try:
        try:
            train()
        except KeyError:
            pass
        assert len(pids) == 2 and ended(pids)
        loader = fixed(num_workers=2, persistent_workers=True)
        for _ in loader:
            break
        pids = loader._workers.pids
        del loader
        assert len(pids) == 2 and ended(pids)
    finally:
        gc.enable()


class Stuck(Items):
    """Fetching the batch of sample 13 never ends (a worker stuck reading)."""

    def __getitems__(self, ids: list[int]) -> list[dict[str, torch.Tensor]]:
        if 13 in ids:
            time.sleep(60)
        return super().__getitems__(ids)


def finished(run, limit: float = 20.0):
    """What ``run()`` returned or raised, run in a thread given ``limit`` seconds (a hang guard)."""
    outcome: list[object] = []

    def target():
        try:
            outcome.append(run())
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert outcome, f"still running after {limit} s"
    return outcome[0]


@pytest.mark.timeout(30)
def test_closing_the_loader_from_another_thread_ends_the_wait_for_a_batch(monkeypatch):
    # NOTE: torch waits 5 s for a worker to end before it terminates it (the stuck one here)
    monkeypatch.setattr(dataloader._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    loader = FastLoader(Stuck(), 4, shuffle=False, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    seen = ids_of([next(batches) for _ in range(3)])
    pids = loader._workers.pids
    closer = threading.Timer(0.3, loader.close)  # (while the loop waits for the batch of 12 to 15)
    closer.start()
    error = finished(lambda: ids_of(batches))
    assert isinstance(error, RuntimeError) and "the loader was closed (loader.close())" in str(error)
    assert seen == [list(range(i, i + 4)) for i in (0, 4, 8)]
    closer.join(20)
    assert ended(pids)


@pytest.mark.timeout(60)
def test_closing_the_loader_while_its_workers_start_shuts_them_down(monkeypatch):
    started, closed, iterators = threading.Event(), threading.Event(), []
    start = workers._WorkerIterator.__init__

    def starting(self, *args):
        start(self, *args)
        iterators.append(self)
        started.set()
        closed.wait(20)  # (the loader is closed after the workers started, before iter() returned them)

    monkeypatch.setattr(workers._WorkerIterator, "__init__", starting)
    loader = FastLoader(Items(), 4, shuffle=False, num_workers=2, persistent_workers=True)

    def close():
        started.wait(20)
        loader.close()
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    error = finished(lambda: ids_of(loader))  # (kept, with the frames of its traceback)
    closer.join(20)
    assert isinstance(error, RuntimeError) and "the loader was closed (loader.close())" in str(error)
    assert ended([worker.pid for worker in iterators[0]._workers])
    assert ids_of(loader) == [list(range(i, min(i + 4, N))) for i in range(0, N, 4)]  # new workers


@pytest.mark.timeout(90)
def test_closing_the_loader_from_a_signal_handler_ends_the_wait_for_a_batch():
    # a preemption handler (SIGTERM) closes the loader while the loop waits in the same thread
    pids = workers_left_at_exit(
        """
        import os, signal, threading, time
        from torch.utils.data import _utils

        _utils.MP_STATUS_CHECK_INTERVAL = 0.5  # (torch's wait for the stuck worker to end)

        class Stuck(Items):
            def __getitems__(self, ids):
                if 13 in ids:
                    time.sleep(60)
                return super().__getitems__(ids)

        loader = FastLoader(Stuck(), 4, shuffle=False, num_workers=2, persistent_workers=True)
        signal.signal(signal.SIGTERM, lambda *_: loader.close())
        batches = iter(loader)
        seen = [next(batches).tolist() for _ in range(3)]
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            next(batches)
        except RuntimeError as error:
            assert "the loader was closed (loader.close())" in str(error), error
        else:
            raise AssertionError("no error")
        assert seen == [list(range(i, i + 4)) for i in (0, 4, 8)], seen
        """
    )
    assert pids == []


def unpicklable(what: str):
    """A ``collate_fn`` whose batch of sample 13 holds ``what``, which does not pickle."""

    def collate(samples):
        ids = [int(sample["x"][0]) for sample in samples]
        extra = None
        if 13 in ids:
            extra = {
                "lock": threading.Lock(),
                "lambda": lambda: 0,
                "generator": (i for i in ids),
                "grad": torch.ones(2, requires_grad=True) * 2,
            }[what]
        return {"x": torch.stack([s["x"] for s in samples]), "pid": samples[0]["pid"], "meta": {"extra": extra}}

    return collate


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("what", "kind"), [("lock", "lock"), ("lambda", "function"), ("generator", "generator"), ("grad", "Tensor")]
)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_batch_that_does_not_pickle_raises_in_the_loop_with_the_worker_traceback(what, kind, persistent):
    loader = FastLoader(
        Items(), 4, shuffle=False, collate_fn=unpicklable(what), num_workers=2, persistent_workers=persistent
    )
    received: list[dict[str, torch.Tensor]] = []

    def run():
        for batch in loader:
            received.append(batch)

    error = finished(run)
    assert isinstance(error, TypeError), error
    message = str(error)
    assert "Caught TypeError in DataLoader worker process" in message and "Original Traceback" in message
    assert f"batch['meta']['extra'] ({kind}) does not pickle" in message
    assert ids_of(received) == [list(range(i, i + 4)) for i in (0, 4, 8)]  # the batches before it, in order
    pids = {int(batch["pid"]) for batch in received}
    assert len(pids) == 2 and ended(list(pids))  # the workers shut down
