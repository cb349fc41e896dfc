"""max_batch_sizes: each shape bucket's largest batch size, measured by running a step or predicted by a model."""

from __future__ import annotations

import gc
import math
import platform
import warnings
import weakref
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab.memory import fit_batch_memory, max_batch_sizes, padded_batch
from fastsab.memory.bucket_sizes import largest_fitting
from fastsab.plan.shape_buckets import ShapeBuckets
from tests.adaptive.test_adaptive import run_limited


class Device:
    """A made-up device that holds ``capacity[L]`` tokens of a ``(B, L)`` batch, and records the tries."""

    def __init__(self, capacity: dict[int, int], error: str = "typed") -> None:
        self.capacity, self.error, self.tried = capacity, error, []

    def __call__(self, batch: dict[str, torch.Tensor] | tuple[int, int]) -> None:
        rows, length = batch if isinstance(batch, tuple) else batch["input_ids"].shape
        self.tried.append((rows, length))
        if rows * length > self.capacity[length]:
            if self.error == "typed":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory")


def true_largest(capacity: int, length: int, multiple: int, limit: int) -> int:
    """The largest multiple of ``multiple`` up to ``limit`` whose ``(B, length)`` batch fits ``capacity``."""
    return min(capacity // length, limit) // multiple * multiple


@st.composite
def searches(draw: Any) -> dict[str, Any]:
    lengths = sorted(draw(st.sets(st.integers(1, 600), min_size=1, max_size=5)))
    # invariant under test: capacities need not shrink with the length (a longer bucket may hold more rows)
    capacity = {length: draw(st.integers(0, 3000)) * length + draw(st.integers(0, length - 1)) for length in lengths}
    limit = draw(st.one_of(st.just(2**16), st.integers(1, 5000)))
    multiple = draw(st.sampled_from([1, 1, 2, 8, 64]))
    return {
        "lengths": lengths,
        "capacity": capacity,
        "multiple": multiple,
        "limit": max(limit, multiple),
        "start": draw(st.integers(1, max(limit, multiple))),
        "gap": draw(st.sampled_from([0.05, 0.05, 0.01, 0.2, 0.5])),
        "error": draw(st.sampled_from(["typed", "message"])),
    }


@given(searches())
def test_measured_sizes_are_within_the_gap_below_the_largest_that_fits(case):
    device = Device(case["capacity"], case["error"])
    expected = {
        length: true_largest(case["capacity"][length], length, case["multiple"], case["limit"])
        for length in case["lengths"]
    }

    def measure() -> ShapeBuckets:
        return max_batch_sizes(
            device,
            case["lengths"],
            "cpu",
            make_batch=lambda rows, length: (rows, length),
            start=case["start"],
            max_batch_size=case["limit"],
            gap=case["gap"],
            batch_size_multiple=case["multiple"],
        )

    # NOTE: a full collection takes tens of milliseconds; what it frees is tested below
    with warnings.catch_warnings(record=True) as caught, mock.patch.object(gc, "collect", return_value=0):
        warnings.simplefilter("always")
        if min(expected.values()) == 0:
            # the longest bucket without a fitting batch is named
            failing = max(length for length, most in expected.items() if most == 0)
            with pytest.raises(ValueError, match=f"bucket length {failing} runs out of memory even with a batch of"):
                measure()
            return
        table = measure()
    assert table.lengths == tuple(case["lengths"])
    # invariant: never a batch above max_batch_size, always a multiple of batch_size_multiple
    assert all(rows <= case["limit"] and rows % case["multiple"] == 0 for rows, _ in device.tried)
    for length, found in zip(table.lengths, table.batch_sizes or ()):
        most = expected[length]
        # invariant: the size found ran, and is within the gap below the largest that fits
        assert found % case["multiple"] == 0 and found <= most
        assert found == most or found >= (1 - case["gap"]) * (most + case["multiple"])
        assert (found, length) in device.tried
    capped = [length for length, most in expected.items() if most + case["multiple"] > case["limit"]]
    messages = [str(w.message) for w in caught]
    if capped:
        assert messages == [
            f"max_batch_sizes reached max_batch_size={case['limit']} at bucket lengths {capped} with memory to "
            "spare: larger batches may fit there; raise max_batch_size to find them."
        ]
    else:
        assert messages == []


def test_the_longest_bucket_is_searched_first_and_bounds_the_next():
    device = Device({64: 4096, 128: 4096, 512: 4096})
    table = max_batch_sizes(device, [64, 128, 512], "cpu", gap=0.01)
    assert table.batch_sizes == (64, 32, 8)
    lengths = [length for _, length in device.tried]
    assert lengths == sorted(lengths, reverse=True)
    # the search of 128 starts at 512's result, that of 64 at 128's
    assert device.tried[lengths.index(128)] == (8, 128) and device.tried[lengths.index(64)] == (32, 64)


def test_the_default_batch_is_a_pad_collator_batch_of_full_rows(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # device=None: the CPU without CUDA
    shapes = []

    def step(batch: dict[str, torch.Tensor]) -> None:
        shapes.append({key: (tuple(value.shape), value.dtype, value.device.type) for key, value in batch.items()})
        assert batch["attention_mask"].all() and batch["sample_mask"].all() and not batch["input_ids"].any()
        if batch["input_ids"].numel() > 100:
            raise torch.OutOfMemoryError("CUDA out of memory.")

    table = max_batch_sizes(step, [10], start=4, gap=0.01)
    assert table.batch_sizes == (10,) and table.source.startswith("measured by max_batch_sizes on cpu (")
    assert shapes[0] == {
        "input_ids": ((4, 10), torch.int64, "cpu"),
        "attention_mask": ((4, 10), torch.int64, "cpu"),
        "sample_mask": ((4,), torch.bool, "cpu"),
    }
    assert padded_batch(3, 5)["input_ids"].shape == (3, 5)


def test_other_errors_propagate_and_stop_the_search():
    tried = []

    def step(batch: Any) -> None:
        tried.append(batch)
        if batch[0] * batch[1] > 1000:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        max_batch_sizes(step, [10], "cpu", make_batch=lambda rows, length: (rows, length), start=64)
    assert tried == [(64, 10), (128, 10)]
    for error in (RuntimeError("not enough memory in my cache"), KeyError("input_ids")):

        def failing(batch: Any, error: BaseException = error) -> None:
            raise error

        with pytest.raises(type(error)):
            max_batch_sizes(failing, [10], "cpu")


def test_memory_is_freed_between_tries():
    # invariant: a try's batch (held by the error's traceback after an out-of-memory error) is gone
    # before the next batch is made
    alive: list[weakref.ref[torch.Tensor]] = []

    def make(rows: int, length: int) -> torch.Tensor:
        assert all(ref() is None for ref in alive), "the previous try's batch is still held"
        tensor = torch.zeros(rows, length)
        alive.append(weakref.ref(tensor))
        return tensor

    def step(batch: torch.Tensor) -> None:
        held = [batch, batch * 2]  # the step's frame holds the batch when it raises
        if held[0].numel() > 500:
            raise torch.OutOfMemoryError("CUDA out of memory.")

    table = max_batch_sizes(step, [10, 20], "cpu", make_batch=make, gap=0.01)
    assert table.batch_sizes == (50, 25) and len(alive) > 4


def test_a_cuda_device_synchronizes_and_empties_the_cache_after_each_try(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(f"synchronize {device}"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Made-up GPU")
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append("collect") or 0)
    device = Device({8: 80})
    table = max_batch_sizes(
        device, [8], "cuda:0", make_batch=lambda rows, length: {"input_ids": torch.zeros(rows, length)}
    )
    assert table.batch_sizes == (10,)
    fits = sum(rows * 8 <= 80 for rows, _ in device.tried)
    assert calls.count("synchronize cuda:0") == fits  # after each step that ran
    assert calls.count("collect") == calls.count("empty_cache") == len(device.tried)
    assert table.source == f"measured by max_batch_sizes on cuda:0 (Made-up GPU), torch {torch.__version__}, gap 0.05"


def test_start_failing_halves_down_and_a_bucket_without_a_batch_is_named():
    device = Device({100: 350})
    assert max_batch_sizes(device, [100], "cpu", start=64, gap=0.01).batch_sizes == (3,)
    assert [rows for rows, _ in device.tried] == [64, 32, 16, 8, 4, 2, 3]
    with pytest.raises(ValueError, match=r"bucket length 100 runs out of memory even with a batch of 1 row\(s\) "):
        max_batch_sizes(Device({50: 1000, 100: 99}), [50, 100], "cpu")
    with pytest.raises(ValueError, match=r"bucket length 50 runs out of memory even with a batch of 8 row\(s\) "):
        max_batch_sizes(Device({50: 399, 100: 800}), [50, 100], "cpu", batch_size_multiple=8)


def test_largest_fitting_stops_at_the_gap_or_at_adjacent_sizes():
    found, message = largest_fitting(lambda n: None if n <= 1000 else "oom", 1, 10**6, 0.5)
    assert message == "oom" and 1000 >= found >= 0.5 * 1001
    assert largest_fitting(lambda n: None if n <= 2 else "oom", 1, 10, 0.01) == (2, "oom")
    assert largest_fitting(lambda n: "oom", 5, 10, 0.05) == (0, "oom")
    assert largest_fitting(lambda n: None, 5, 7, 0.05) == (7, None)


# --- real out-of-memory errors, in a process under an address-space limit ----------------------------


@pytest.mark.slow
def test_real_out_of_memory_in_a_limited_process():
    last = run_limited(
        """
        import warnings
        from fastsab.adaptive.oom import is_out_of_memory
        from fastsab.memory import max_batch_sizes
        torch.set_num_threads(1)
        k = 4 * 2**20

        def step(batch):
            rows, length = batch["input_ids"].shape
            torch.empty(rows * length * k, dtype=torch.uint8)  # rows * length * 4 MiB of address space

        def runs(rows, length):
            try:
                step({"input_ids": torch.zeros(rows, length)})
                return True
            except RuntimeError as error:
                assert is_out_of_memory(error), error
                return False

        table = max_batch_sizes(step, [1, 2, 5], "cpu", start=4, gap=0.05)
        largest = []
        for length, found in zip(table.lengths, table.batch_sizes):
            most = found
            while runs(most + 1, length):
                most += 1
            while not runs(most, length):
                most -= 1
            largest.append(most)
        print(list(table.batch_sizes), largest)
        """
    )
    found, largest = (list(map(int, part.strip(" []").split(","))) for part in last.split("] ["))
    assert largest[0] >= 50  # the limit leaves hundreds of MiB, so the search ran out of memory for real
    for got, most in zip(found, largest):
        # invariant: within the gap below the largest batch that runs
        # NOTE: give or take a row: the address space left moves by a few MiB between tries (the
        # allocator's own heap), and a row is 4 MiB per token
        assert most * (1 - 0.05) - 1 <= got <= most + 1


# --- predicted by a batch memory model ----------------------------------------------------------------


@st.composite
def models(draw: Any) -> dict[str, Any]:
    fixed = draw(st.integers(0, 10_000))
    per_token = draw(st.integers(1, 50))
    squared = draw(st.sampled_from([0.0, 0.01, 0.5]))
    cost = draw(st.sampled_from(["sum", "padded"]))
    batches = [[length] * rows for length in (8, 32, 64, 128) for rows in (1, 2, 4)]
    peaks = [fixed + len(b) * (per_token * b[0] + squared * b[0] ** 2) for b in batches]
    model = fit_batch_memory(batches, peaks, cost=cost, degree=1 if not squared else 2, held_out=0)
    lengths = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=4)))
    return {
        "model": model,
        "lengths": lengths,
        "budget": draw(st.integers(int(model.fixed) + 1, int(model.fixed) + 2_000_000)),
        "multiple": draw(st.sampled_from([1, 1, 3, 8])),
        "limit": draw(st.integers(8, 400)),
    }


@settings(max_examples=40)
@given(models())
def test_predicted_sizes_equal_a_scan_of_the_model(case):
    model, budget, multiple, limit = case["model"], case["budget"], case["multiple"], case["limit"]
    expected = []
    for length in case["lengths"]:
        # invariant: the largest multiple whose predicted peak (the model's own predict) fits the budget
        fitting = [
            rows for rows in range(multiple, limit + 1, multiple) if model.predict([[length] * rows])[0] <= budget
        ]
        expected.append(max(fitting, default=0))
        assert fitting == list(range(multiple, max(fitting, default=0) + 1, multiple))
    if 0 in expected:
        with pytest.raises(ValueError, match="is predicted to need"):
            max_batch_sizes(
                None, case["lengths"], model=model, budget=budget, batch_size_multiple=multiple, max_batch_size=limit
            )
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = max_batch_sizes(
            None, case["lengths"], model=model, budget=budget, batch_size_multiple=multiple, max_batch_size=limit
        )
    assert list(table.batch_sizes or ()) == expected
    assert table.source.startswith(f"predicted by a BatchMemoryModel (cost {model.cost!r}")


def test_a_table_round_trips_through_a_json_file(tmp_path):
    buckets = ShapeBuckets([64, 128, 512], batch_sizes=[1, 1, 1], source="given")
    table = max_batch_sizes(Device({64: 4096, 128: 4096, 512: 4096}), buckets, "cpu", gap=0.01)
    assert table.lengths == buckets.lengths and table.batch_sizes == (64, 32, 8)
    assert (
        table.source
        == f"measured by max_batch_sizes on cpu ({platform.machine()}), torch {torch.__version__}, gap 0.01"
    )
    table.save(tmp_path / "buckets.json")
    loaded = ShapeBuckets.load(tmp_path / "buckets.json")
    assert loaded == table and loaded.source == table.source


# --- arguments ----------------------------------------------------------------------------------------

_MODEL = fit_batch_memory([[8], [8, 8], [16], [16, 16]], [108, 116, 116, 132], degree=1, held_out=0)


def _step(batch: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gap": 0}, ValueError, r"gap must be a number in \(0, 1\), got 0: "),
        ({"gap": 1.0}, ValueError, r"gap must be a number in \(0, 1\), got 1.0: "),
        ({"gap": -0.1}, ValueError, r"gap must be a number in \(0, 1\), got -0.1: "),
        ({"gap": "5%"}, TypeError, "gap must be a real number, got '5%'"),
        ({"lengths": []}, ValueError, r"lengths must hold at least one positive integer, got \[\]"),
        ({"lengths": [64, 32]}, ValueError, r"lengths must be strictly increasing, got \[64, 32\]"),
        ({"start": 0}, ValueError, "start must be a positive integer, got 0."),
        ({"start": 2.5}, TypeError, "start must be an integer, got 2.5"),
        ({"max_batch_size": 4, "batch_size_multiple": 8}, ValueError, r"max_batch_size must be at least batch_size"),
        ({"batch_size_multiple": 0}, ValueError, "batch_size_multiple must be a positive integer, got 0."),
        ({"step": None}, TypeError, "step must be a callable that runs one training step on a batch, got None."),
        ({"step": "train"}, TypeError, "step must be a callable that runs one training step on a batch, got 'train'."),
        ({"make_batch": 3}, TypeError, r"make_batch must be a callable \(batch_size, length\) -> batch, got 3."),
        ({"device": 0}, TypeError, "device must be a torch.device, a string or None, got 0."),
        ({"step": None, "model": _MODEL}, ValueError, "budget must be given with model"),
        ({"step": None, "budget": 1000}, ValueError, "budget is given without model"),
        ({"model": _MODEL, "budget": 1000}, ValueError, "pass either step .* or model and budget"),
        ({"step": None, "model": _MODEL, "budget": 1000, "device": "cpu"}, ValueError, "not both: .*device='cpu'"),
        ({"step": None, "model": "model", "budget": 1000}, TypeError, "model must be a fitted BatchMemoryModel"),
        ({"step": None, "model": _MODEL, "budget": math.nan}, ValueError, "budget must be a finite number above"),
        ({"step": None, "model": _MODEL, "budget": 10}, ValueError, r"above the model's fixed cost \(100\), got 10."),
        ({"step": None, "model": _MODEL, "budget": "1GB"}, TypeError, "budget must be a real number, got '1GB'"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    arguments: dict[str, Any] = {"step": _step, "lengths": [8, 16]} | kwargs
    step, lengths = arguments.pop("step"), arguments.pop("lengths")
    with pytest.raises(error, match=message):
        max_batch_sizes(step, lengths, **arguments)


def test_a_model_of_several_features_is_refused():
    model = fit_batch_memory(
        [[[8, 1]], [[8, 1], [8, 1]], [[16, 2]], [[16, 2], [16, 2]]], [108, 116, 116, 132], degree=1, held_out=0
    )
    with pytest.raises(ValueError, match="model must predict from one feature per item, its length, got a model of 2"):
        max_batch_sizes(None, [8], model=model, budget=1000)


def test_reaching_max_batch_size_warns_at_the_callers_line():
    with pytest.warns(
        UserWarning, match=r"reached max_batch_size=40 at bucket lengths \[8, 16\] with memory to spare"
    ) as caught:
        table = max_batch_sizes(Device({8: 800, 16: 800, 32: 800}), [8, 16, 32], "cpu", max_batch_size=40)
    assert table.batch_sizes == (40, 40, 25) and caught[0].filename == __file__
