"""The shapes suite at a tiny size: its structure, and figures equal to what the batches show (not its timings)."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch

from fastsab.bench import shapes
from fastsab.bench.shapes import (
    MaskedTokenModel,
    ShapesResult,
    TokenSequences,
    compiled_epochs,
    shapes_methods,
    shapes_results,
    shapes_workloads,
)
from fastsab.cli import main

SAMPLES, COMPILED, BUCKETS = 1_200, 160, (4,)
#: The recompile limit of these tests: one graph to build per method, and steps past the limit on most.
LIMIT = 1
METHODS = [
    "DataLoader(batch_size=32), padded per batch",
    "DataLoader(batch_size=32), padded to the longest item",
    'FastSizeAwareLoader(cost="padded", sort_window=1,024)',
    "FastSizeAwareLoader(buckets=4)",
]


@pytest.fixture(scope="module")
def results() -> list[ShapesResult]:
    with torch._dynamo.config.patch(recompile_limit=LIMIT):
        return shapes_results(SAMPLES, COMPILED, BUCKETS)


def epochs_of(loader, epochs):
    """The batches of ``epochs`` epochs of ``loader`` (``set_epoch`` where it has one), per epoch."""
    out = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        out.append(list(loader))
    return out


def test_every_method_runs_on_both_workloads(results):
    workloads = [w.name for w in shapes_workloads(SAMPLES)]
    assert [(r.workload, r.method) for r in results] == [(w, m) for w in workloads for m in METHODS]


def test_the_figures_are_what_an_epoch_of_the_batches_shows(results):
    by_name = {(r.workload, r.method): r for r in results}
    for workload in shapes_workloads(SAMPLES):
        data = TokenSequences(workload.lengths)
        for method, make in shapes_methods(workload.budget, BUCKETS):
            result = by_name[workload.name, method]
            (batches,) = epochs_of(make(data), 1)
            real_ids, shapes, real, padded, fillers, over = [], set(), 0, 0, 0, 0
            for batch in batches:
                rows, width = batch["input_ids"].shape
                keep = batch.get("sample_mask", torch.ones(rows, dtype=torch.bool))
                ids = batch["index"]
                # fillers: after the real rows, repeats of real rows of the same batch, with their tokens
                n_real = int(keep.sum())
                assert keep[:n_real].all() and not keep[n_real:].any()
                assert set(ids[n_real:].tolist()) <= set(ids[:n_real].tolist())
                for row in range(n_real, rows):
                    twin = int(torch.nonzero(ids[:n_real] == ids[row])[0])
                    assert torch.equal(batch["input_ids"][row], batch["input_ids"][twin])
                for row, index in enumerate(ids[:n_real].tolist()):  # each real row: its sequence, then padding
                    length = int(workload.lengths[index])
                    assert torch.equal(batch["input_ids"][row, :length], data[index]["input_ids"])
                    assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (width - length)
                real_ids += ids[:n_real].tolist()
                shapes.add((rows, width))
                real += int(workload.lengths[ids[:n_real].numpy()].sum())
                padded += rows * width
                fillers += rows - n_real
                over += rows * width > workload.budget
                if method.startswith("FastSizeAwareLoader"):
                    assert rows * width <= workload.budget
            # invariant: every sequence once per epoch, filler rows aside
            assert Counter(real_ids) == Counter(range(SAMPLES))
            epoch = result.epoch
            assert (epoch.shapes, epoch.steps, epoch.filler_rows) == (shapes, len(batches), fillers)
            assert (epoch.real_tokens, epoch.padded_tokens) == (real, padded)
            assert epoch.over_budget == over
            assert 0 < epoch.efficiency <= 1
            if method.startswith("FastSizeAwareLoader"):
                assert epoch.over_budget == 0
                assert result.stats_efficiency == pytest.approx(epoch.efficiency, rel=1e-12)
            else:
                assert result.stats_efficiency is None
        assert by_name[workload.name, METHODS[1]].epoch.shapes <= {
            (32, int(workload.lengths.max())),
            (SAMPLES % 32, int(workload.lengths.max())),
        }
        bucketed = by_name[workload.name, METHODS[3]].epoch
        assert len(bucketed.shapes) <= 4 and bucketed.filler_rows > 0


def test_the_compiled_epochs_count_a_graph_per_shape_up_to_the_limit(results):
    by_name = {(r.workload, r.method): r for r in results}
    for workload in shapes_workloads(SAMPLES, COMPILED):
        data = TokenSequences(workload.lengths[:COMPILED])
        for method, make in shapes_methods(workload.budget, BUCKETS):
            compiled = by_name[workload.name, method].compiled
            seen = [tuple(b["input_ids"].shape) for epoch in epochs_of(make(data), 2) for b in epoch]
            built = list(dict.fromkeys(seen))[:LIMIT]  # the first shapes seen get the graphs
            assert (compiled.steps, compiled.shapes) == (len(seen), len(set(seen)))
            assert compiled.graphs == len(built)
            assert compiled.eager_steps == sum(shape not in built for shape in seen)
            assert 0 < compiled.epoch_seconds < compiled.total_seconds
    # the limit is reached: some methods run steps eagerly, the bucketed ones within it do not
    assert any(r.compiled.eager_steps for r in results)


def test_compiled_epochs_build_one_graph_per_shape_and_no_more():
    batches = [
        {
            "input_ids": torch.zeros(rows, width, dtype=torch.int64),
            "attention_mask": torch.ones(rows, width, dtype=torch.int64),
        }
        for rows, width in [(2, 3), (2, 4), (2, 3), (3, 3)]
    ]
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled = compiled_epochs(batches)
    # two epochs of 4 steps: (2, 3) and (2, 4) get the two graphs, the two steps of (3, 3) run eagerly
    assert (compiled.graphs, compiled.eager_steps, compiled.steps, compiled.shapes) == (2, 2, 8, 3)


def test_masked_token_model_leaves_filler_rows_and_padding_out_of_the_loss():
    torch.manual_seed(0)
    model = MaskedTokenModel()
    ids = torch.randint(0, 32, (3, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    keep = torch.tensor([True, True, False])
    changed = ids.clone()
    changed[0, 3:] = (ids[0, 3:] + 1) % 32  # padding
    changed[2] = (ids[2] + 1) % 32  # a filler row
    assert torch.equal(model(ids, mask, keep), model(changed, mask, keep))
    assert not torch.equal(model(ids, mask, keep), model(ids, mask, torch.ones(3, dtype=torch.bool)))


def test_shapes_suite_runs_from_the_command_line(capsys, monkeypatch):
    # the command's wiring, on few sequences and one bucket count (the suite itself is tested above)
    monkeypatch.setattr(
        shapes, "shapes_results", functools.partial(shapes.shapes_results, compile_samples=64, bucket_counts=(8,))
    )
    with torch._dynamo.config.patch(recompile_limit=1):
        assert main(["bench", "--suite", "shapes", "--samples", "300", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Measured on ")
    assert "| workload | method | shapes an epoch | padded efficiency |" in out
    assert "| log-normal 1..512 | FastSizeAwareLoader(buckets=8) |" in out
    assert "| long tail 10..2000 | DataLoader(batch_size=32), padded per batch |" in out
