"""docs/recipes/*.md: each recipe's code run as a user would, and what the page promises checked."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.docs_pages import DOCS, page_script

_TEXT = re.compile(r"^It prints:\n\n```text\n(.*?)^```", re.MULTILINE | re.DOTALL)


def run_page(
    page: str, directory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    """Run the page's code in ``directory``; its namespace and what it printed."""
    monkeypatch.chdir(directory)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    threads = torch.get_num_threads()
    # NOTE: one thread: the pages' tiny models run far slower with threads contending for shared cores
    torch.set_num_threads(1)
    try:
        exec(compile(page_script(page), str(DOCS / page), "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    return namespace, capsys.readouterr().out


def shown_output(page: str) -> list[str]:
    """The lines a page says its code prints (its ``It prints:`` blocks)."""
    return [line for block in _TEXT.findall((DOCS / page).read_text()) for line in block.splitlines()]


def assert_shows_what_it_prints(page: str, printed: str) -> None:
    shown = shown_output(page)
    assert shown, f"{page} shows no output"
    lines = printed.splitlines()
    assert all(line in lines for line in shown), f"shown:\n{shown}\nprinted:\n{lines}"


def rows_of(batch: dict[str, torch.Tensor]) -> list[tuple[tuple[int, ...], int]]:
    """The (real tokens, label) of each row of a padded batch."""
    tokens = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    return [(tuple(t), int(label)) for t, label in zip(tokens, batch["label"])]


def test_variable_length(tmp_path, monkeypatch, capsys):
    page = "recipes/variable-length.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    data, loader = ns["data"], ns["loader"]
    assert "epoch 0: 38 batches, 2000 sequences" in printed and "epoch 1: 38 batches, 2000 sequences" in printed
    # the figures on the page are this run's
    assert_shows_what_it_prints(page, printed)
    # invariant: every padded batch within the budget, every sequence once per epoch, with its label
    expected = sorted((tuple(seq.tolist()), int(label)) for seq, label in zip(ns["sequences"], ns["labels"]))
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert all(batch["input_ids"].numel() <= 8192 for batch in batches)
        assert sorted(row for batch in batches for row in rows_of(batch)) == expected
    # sorted windows cut the padding; the budget alone barely does
    efficiency = {
        name: ns["padded_efficiency"](each)
        for name, each in [("fixed", ns["fixed"]), ("budget", ns["budget_only"]), ("window", loader)]
    }
    assert efficiency["budget"] < efficiency["fixed"] + 0.1 and efficiency["window"] > 2 * efficiency["budget"]
    # the checkpoint holds the loader's position, which a new loader takes
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    assert set(checkpoint) == {"model", "optimizer", "loader"}
    fresh = ns["FastSizeAwareLoader"](data, data.lengths, max_total_size=8192, cost="padded", sort_window=512, seed=0)
    fresh.load_state_dict(checkpoint["loader"])
    assert fresh.epoch == 1 and len(fresh) == 38
    assert sum(1 for _ in fresh) == 38 - (60 - 38)  # saved at step 60, 22 steps into epoch 1
    # packed: every token once, no padding
    assert printed.splitlines()[-1] == "True True"


def logged_steps(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("save_every", "crash_at"), [(5, 48), (3, 34), (7, 2), (5, 99)])
def test_resume(tmp_path, monkeypatch, capsys, save_every, crash_at):
    # invariant: a job that died and was restarted trains, step by step, on the samples of the
    # job that never died, and ends with its weights
    page = "recipes/resume.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert_shows_what_it_prints(page, printed)
    whole = logged_steps(tmp_path / "runs" / "whole")
    for epoch in range(3):
        assert sorted(i for s in whole if s["epoch"] == epoch for i in s["indices"]) == list(range(1000))
    assert [s["step"] for s in whole] == list(range(1, len(whole) + 1))
    # the page's own crash at step 48: steps 46 to 48 ran twice, the same
    crashed = logged_steps(tmp_path / "runs" / "crashed")
    assert [s["step"] for s in crashed] == [*range(1, 49), *range(46, len(whole) + 1)]
    assert crashed == whole[:48] + whole[45:]
    # other checkpoints and crashes, one at an epoch's end (step 33 of 33 with save_every=3)
    ns["SAVE_EVERY"] = save_every
    with pytest.raises(RuntimeError, match=f"the job died at step {crash_at}"):
        ns["train"]("again", crash_at=crash_at)
    last_save = crash_at // save_every * save_every
    resumed = ns["train"]("again")
    again = logged_steps(tmp_path / "again")
    assert again == whole[:crash_at] + whole[last_save:]
    assert torch.equal(resumed.weight, ns["whole"].weight) and torch.equal(resumed.bias, ns["whole"].bias)
    # the page's len() after a resume: the whole epoch's steps, from the state's number of batches
    assert ns["state"]["batches"] == ns["steps"] == len(ns["counted"]) and ns["again"]._point is not None


def wait_for_children_to_end(seconds: float = 30) -> None:
    """Wait until this process has no child process left (a hang guard: at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_workers(tmp_path, monkeypatch, capsys):
    page = "recipes/workers.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert "same batches: True" in printed
    # NOTE: the page's own workers were closed; a closed worker is reaped a moment later (longer on
    # a loaded machine): wait for them, so that the count below is of this loader's workers
    wait_for_children_to_end()
    # workers give, epoch by epoch, the batches of the loop's own process, and stop when closed
    workers = ns["FastLoader"](ns["SlowDataset"](), batch_size=32, seed=0, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        workers.set_epoch(epoch)
        ns["in_process"].set_epoch(epoch)
        got = [batch["index"].tolist() for batch in workers]
        assert len(multiprocessing.active_children()) == 2
        assert got == [batch["index"].tolist() for batch in ns["in_process"]]
        assert sorted(i for batch in got for i in batch) == list(range(200))
    workers.close()
    wait_for_children_to_end()
    assert multiprocessing.active_children() == []
    # a RaggedDataset's batches are the same with and without workers
    ragged = [batch["input_ids"] for batch in ns["gather"]]
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(ragged, ns["gather_workers"], strict=True))
    ns["gather_workers"].close()


@pytest.mark.slow
def test_surviving_oom(tmp_path, monkeypatch, capsys):
    page = "recipes/surviving-oom.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert_shows_what_it_prints(page, printed)
    assert printed.splitlines()[-1] == "True"
    adaptive, make, step = ns["adaptive"], ns["FastSizeAwareLoader"], ns["train_step"]
    data, lengths = ns["data"], ns["lengths"]
    # invariant: every sample once, each batch within the memory; the next epoch starts at the configured limit
    loader = ns["loader"]
    batches = list(adaptive.run(loader, step))
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(int(lengths[b].sum()) <= ns["MEMORY"] for b in batches)
    assert loader.stats.epoch == 1 and loader.stats.limit_changes[0][1] == [4096]
    # a state saved between results resumes with the batches of the run never stopped
    whole = list(adaptive.run(make(data, lengths, max_total_size=4096, seed=0), step))
    first = make(data, lengths, max_total_size=4096, seed=0)
    results = adaptive.run(first, step)
    head = [next(results) for _ in range(5)]
    resumed = make(data, lengths, max_total_size=4096, seed=0)
    resumed.load_state_dict(first.state_dict())
    assert head + list(adaptive.run(resumed, step)) == whole
    # the decorated function tried 512, 256 and 128, then ran with 64
    tried: list[int] = []

    def recorded(batch_size: int, rows: torch.Tensor) -> torch.Tensor:
        tried.append(batch_size)
        return ns["embed"].__wrapped__(batch_size, rows)

    fresh = adaptive.batch(recorded, initial_batch_size=512)
    assert torch.equal(fresh(ns["rows"]), ns["rows"] * 2) and tried == [512, 256, 128, 64]


def test_huggingface_datasets(tmp_path, monkeypatch, capsys):
    page = "recipes/huggingface-datasets.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert "same batches: True" in printed
    tokenized = ns["tokenized"]
    expected = sorted((tuple(ids), label) for ids, label in zip(tokenized["input_ids"], tokenized["label"]))
    # invariant: both loaders give every row once per epoch, with its label, within the token budget
    for loader in (ns["loader"], ns["direct"]):
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            assert all(batch["input_ids"].numel() <= 2048 for batch in batches)
            assert sorted(row for batch in batches for row in rows_of(batch)) == expected
            assert loader.stats.num_skipped == 0


def test_webdataset(tmp_path, monkeypatch, capsys):
    page = "recipes/webdataset.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert "every sample once: True" in printed and "real tokens per batch at most 512: True" in printed
    lengths = ns["lengths"]
    # invariant: each worker's stream is cut by the greedy rule: a batch ends where its stream's
    # next sample would take it past the budget (worker w reads shards w and w + 2)
    by_worker: dict[int, list[list[int]]] = {0: [], 1: []}
    for batch in ns["batches"]:
        indices = batch["index"].tolist()
        assert batch["attention_mask"].sum(1).tolist() == lengths[indices].tolist()
        workers = {i // 50 % 2 for i in indices}
        assert len(workers) == 1
        by_worker[workers.pop()].append(indices)
    for batches in by_worker.values():
        for batch, after in itertools.pairwise(batches):
            assert int(lengths[batch].sum()) + int(lengths[after[0]]) > 512


def test_larger_than_ram(tmp_path, monkeypatch, capsys):
    page = "recipes/larger-than-ram.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert_shows_what_it_prints(page, printed)
    dataset, loader, plan = ns["dataset"], ns["loader"], ns["plan"]
    # the two chunks held fit the CPU budget the plan was made for
    assert 2 * dataset.chunk_size <= plan.samples_in_memory and dataset.chunk_size * 4096 == 4 * 2**20 // 2
    # invariant: every sample once per epoch, each row as it is in the file, batches within a chunk
    rows = torch.from_numpy(np.load(tmp_path / "samples.npy"))
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert all(torch.equal(batch, rows[batch[:, -1].long()]) for batch in batches)
        orders.append([int(i) for batch in batches for i in batch[:, -1]])
        assert sorted(orders[-1]) == list(range(4096))
        chunks = [i // dataset.chunk_size for i in orders[-1]]
        assert sum(a != b for a, b in itertools.pairwise(chunks)) == dataset.num_chunks - 1  # chunk by chunk
    assert orders[0] != orders[1]
    # the second epoch begins with a chunk of the two the first one ended with, still held
    ends = [chunk for chunk, _ in itertools.groupby(i // dataset.chunk_size for i in orders[0])][-2:]
    assert orders[1][0] // dataset.chunk_size in ends


def test_choosing_budget(tmp_path, monkeypatch, capsys):
    page = "recipes/choosing-budget.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    assert_shows_what_it_prints(page, printed)
    rows = [line.split() for line in printed.splitlines()[1:]]
    table = {(int(r[0]), r[1], int(r[2])): (float(r[3]), int(r[4]), float(r[5])) for r in rows}
    # invariant: a larger window pads less and takes fewer steps, and batches more pairs together again
    windows = [table[8192, window, 1] for window in ("-", "256", "512", "1024", "10000")]
    assert [w[0] for w in windows] == sorted(w[0] for w in windows)
    assert [w[1] for w in windows] == sorted((w[1] for w in windows), reverse=True)
    assert [w[2] for w in windows] == sorted(w[2] for w in windows)
    # every padded (B, L) batch, L rounded up to 8, within the budget; no sequence left out
    lengths = ns["lengths"]
    loader = ns["FastSizeAwareLoader"](
        torch.arange(len(lengths)), lengths, 16384, cost="padded", sort_window=512, pad_to_multiple_of=8, seed=0
    )
    batches = list(loader)
    assert all(len(b) * -(-int(lengths[b].max()) // 8) * 8 <= 16384 for b in batches)
    assert sorted(torch.cat(batches).tolist()) == list(range(len(lengths)))
    assert len(batches) == table[16384, "512", 8][1]


def test_index_lists_every_recipe():
    # the recipe pages, the memory-budgets recipe and the trainer pages, each once
    recipes = {path.name for path in (DOCS / "recipes").glob("*.md")} - {"index.md"}
    expected = {*recipes, "memory-budgets.md"} | {
        f"../trainers/{path.name}" for path in (DOCS / "trainers").glob("*.md")
    }
    links = re.findall(r"^- \[[^]]+\]\(([^)]+)\)", (DOCS / "recipes" / "index.md").read_text(), re.MULTILINE)
    assert sorted(links) == sorted(expected)


def test_static_shapes(tmp_path, monkeypatch, capsys):
    page = "recipes/static-shapes.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    # the figures on the page are this run's
    assert_shows_what_it_prints(page, printed)
    loader, lengths = ns["loader"], ns["lengths"]
    ladder, sizes = loader.buckets.lengths, loader.buckets.batch_sizes
    # invariant: at most K shapes and K compiled graphs over two epochs, every sequence once per
    # epoch, every padded batch within the budget
    assert len(ns["shapes"]) <= 8 and ns["counters"]["stats"]["unique_graphs"] <= 8
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for batch in loader:
            rows, width = batch["input_ids"].shape
            assert (rows, width) in set(zip(sizes, ladder)) and rows * width <= 16384
            real = batch["attention_mask"][batch["sample_mask"]].sum(1)
            seen += real.tolist()
        assert sorted(seen) == sorted(lengths.tolist())


def test_mixing(tmp_path, monkeypatch, capsys):
    page = "recipes/mixing.md"
    ns, printed = run_page(page, tmp_path, monkeypatch, capsys)
    # the figures on the page are this run's
    assert_shows_what_it_prints(page, printed)
    mixture, loader_of, sizeof = ns["Mixture"], ns["FastSizeAwareLoader"], ns["sizeof"]
    web, books = ns["web"], ns["books"]
    largest = max(int(lengths.max()) for lengths in sizeof.values())

    def make(weights: object, stop: object = "last", **options: Any) -> Any:
        mix = mixture({"web": web, "books": books}, weights=weights, stop=stop)
        return loader_of(mix, sizeof=sizeof, max_total_size=8192, seed=5, **options)

    # invariant: after every step, each source's tokens are within the largest item of its share
    loader = make({"web": 0.7, "books": 0.3})
    streams: dict[int, list[int]] = {0: [], 1: []}
    for epoch in range(3):
        loader.set_epoch(epoch)
        tokens = np.zeros(2)
        for batch in loader:
            np.add.at(tokens, batch["source"].numpy(), batch["length"].numpy())
            assert abs(tokens[1] - 0.3 * tokens.sum()) <= largest
            for source, index in zip(batch["source"].tolist(), batch["index"].tolist()):
                streams[source].append(index)
    # invariant: every item of a source once per source epoch, the passes running on across
    # epochs (above, under constant weights; here under every stop, through weights that change)
    schedule = [(0, {"web": 1}), (100_000, {"web": 1, "books": 1}, "linear"), (400_000, {"books": 1})]
    runs = [streams]
    for stop in ("first", {"cost": 150_000}, {"items": 1000}, "last"):
        loader = make(schedule, stop=stop)
        runs.append({0: [], 1: []})
        for epoch in range(4):
            loader.set_epoch(epoch)
            for batch in loader:
                for source, index in zip(batch["source"].tolist(), batch["index"].tolist()):
                    runs[-1][source].append(index)
    for run in runs:
        for source, n in ((0, 3000), (1, 300)):
            passes = [run[source][start : start + n] for start in range(0, len(run[source]), n)]
            assert all(len(set(items)) == len(items) for items in passes)
    # (every run passes over the books more than once, the first over the web too)
    assert len(runs[0][0]) > 3000 and all(len(run[1]) > 300 for run in runs)
    # invariant: with three sources too, after every item (the plan's order), within the largest item
    code_lengths = np.random.default_rng(1).integers(50, 600, 1000)
    three = {"web": web, "books": books, "code": {"index": torch.arange(1000)}}
    lengths = {**sizeof, "code": code_lengths}
    weights = {"web": 0.6, "books": 0.1, "code": 0.3}
    mix = mixture(three, weights=weights, stop="last")
    planned = loader_of(mix, sizeof=lengths, max_total_size=8192, seed=2)
    taken = dict.fromkeys(weights, 0.0)
    for ids in planned.batch_sampler():
        for name, index in mix.locate(ids):
            taken[name] += float(lengths[name][index])
            total = sum(taken.values())
            assert all(abs(taken[s] - weights[s] * total) <= largest + 1e-6 for s in weights)
    # (by items, where plain weighted fair queueing runs a heavy source ahead by more than an item)
    weights = {"web": 0.8, "books": 0.1, "code": 0.1}
    mix = mixture(three, weights=weights, stop="last", by="items")
    counts = dict.fromkeys(weights, 0)
    for ids in ns["FastLoader"](mix, batch_size=64, seed=2).batch_sampler():
        for name, _ in mix.locate(ids):
            counts[name] += 1
            total = sum(counts.values())
            assert all(abs(counts[s] - weights[s] * total) <= 1 + 1e-9 for s in weights)
    # invariant: the batches depend only on the seed and the epoch
    assert [b["index"].tolist() for b in make({"web": 0.7, "books": 0.3})] == [
        b["index"].tolist() for b in make({"web": 0.7, "books": 0.3})
    ]
    # invariant: a state saved at any step resumes, on 1, 2 or 3 ranks, with exactly the items not yet run
    uninterrupted = make({"web": 0.7, "books": 0.3})
    whole = [ns["rows"](batch) for batch in uninterrupted]
    uninterrupted.set_epoch(1)
    after = [ns["rows"](batch) for batch in uninterrupted]  # a state saved after the last step starts epoch 1
    names = ("web", "books")
    for step in (0, 1, 7, len(whole) - 1, len(whole)):
        rest = whole[step:] or after
        saved = make({"web": 0.7, "books": 0.3})
        batches = iter(saved)
        for _ in range(step):
            next(batches)
        state = saved.state_dict()
        for world in (1, 2, 3):
            seen: Counter[tuple[int, int]] = Counter()
            for rank in range(world):
                resumed = make({"web": 0.7, "books": 0.3}, rank=rank, world_size=world)
                resumed.load_state_dict(state)
                got = [ns["rows"](batch) for batch in resumed]
                if world == 1:
                    assert got == rest
                seen.update(row for batch in got for row in batch)
                padded = resumed.dataset.locate(resumed.stats.padded)
                seen.subtract((names.index(name), index) for name, index in padded)
            assert +seen == Counter(row for batch in rest for row in batch)
    # invariant: the state grows with the sources, not with their items
    small = {"web": {k: v[:300] for k, v in web.items()}, "books": {k: v[:30] for k, v in books.items()}}
    sizes = {"web": sizeof["web"][:300], "books": sizeof["books"][:30]}
    for data, lengths in (({"web": web, "books": books}, sizeof), (small, sizes)):
        few = loader_of(mixture(data, weights={"web": 0.7, "books": 0.3}), sizeof=lengths, max_total_size=8192)
        next(iter(few))
        entry = few.state_dict()["mixture"]
        assert len(json.dumps(entry["start"])) < 400 and len(entry["at"][1]["positions"]) == 2
