"""The errors and warnings users run into first: each names the argument and the value and says the fix."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset

import fastsab
from fastsab import (
    FastLoader,
    FastSizeAwareLoader,
    OutOfCoreDataset,
    SizeAwareBatchSampler,
    size_aware_batching,
    split_batches,
)
from fastsab._checks import short_repr, user_stacklevel
from fastsab.adaptive import run
from tests.docs_pages import page_script

LENGTHS = [53, 126, 7, 40, 90, 12]


class Sequences(Dataset[torch.Tensor]):
    """Variable-length samples read one at a time, as a user's first dataset often is."""

    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(LENGTHS[index])


def quiet(make: object) -> object:
    """``make()`` with fastsab's advice about slow reads silenced (not what a test is about)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()  # type: ignore[operator]


# -- 1. samples of different lengths without a collate_fn ---------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: FastLoader(Sequences(), batch_size=2, shuffle=False),
        lambda: FastSizeAwareLoader(Sequences(), np.array(LENGTHS), 300, shuffle=False),
        lambda: FastLoader([{"input_ids": torch.arange(n)} for n in LENGTHS], batch_size=2, shuffle=False),
    ],
    ids=["dataset", "size-aware", "list-of-dicts"],
)
def test_unequal_samples_keep_torchs_text_and_name_the_collators(make):
    loader = quiet(make)
    with pytest.raises(ValueError, match=r"default collate_fn") as caught:
        next(iter(loader))
    message = str(caught.value)
    assert "stack expects each tensor to be equal size, but got [53] at entry 0 and [126] at entry 1" in message
    fixes = ('a dict of per-token values (e.g. {"input_ids": tensor})', "collate_fn=fastsab.PadCollator()")
    for fix in (*fixes, "collate_fn=fastsab.PackCollator()", "fastsab.RaggedDataset"):
        assert fix in message
    # code written for torch's error still catches it
    assert isinstance(caught.value, RuntimeError)


def test_unequal_samples_in_a_worker_process_raise_the_same_error():
    samples = [{"input_ids": torch.arange(n)} for n in LENGTHS]
    loader = quiet(lambda: FastLoader(samples, batch_size=2, shuffle=False, num_workers=1))
    try:
        with pytest.raises(ValueError, match=r"stack expects each tensor to be equal size.*PadCollator") as caught:
            next(iter(loader))
        assert isinstance(caught.value, RuntimeError)
    finally:
        loader.close()


def test_unequal_samples_with_a_collator_make_batches():
    samples = [{"input_ids": torch.arange(n)} for n in LENGTHS]
    loader = quiet(lambda: FastLoader(samples, batch_size=2, shuffle=False, collate_fn=fastsab.PadCollator()))
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (2, 126) and batch["attention_mask"].sum(1).tolist() == [53, 126]


# -- 2. a per-item sizeof of a sample ----------------------------------------------------------


def test_sizeof_len_says_it_gets_an_index():
    index = r"sizeof is called with a dataset index \(got \d+\), not a sample"
    with pytest.raises(TypeError, match=index) as caught:
        quiet(lambda: list(FastSizeAwareLoader(Sequences(), sizeof=len, max_total_size=300)))
    message = str(caught.value)
    assert "object of type 'int' has no len()" in message
    assert "sizeof=lambda i: len(dataset[i])" in message and "sizes as an array" in message


def test_a_per_item_sizeof_of_the_index_still_works():
    data = Sequences()
    by_index = quiet(lambda: FastSizeAwareLoader(torch.arange(6), lambda i: len(data[i]), 300, seed=2))
    by_array = FastSizeAwareLoader(torch.arange(6), np.array(LENGTHS), 300, seed=2)
    assert [b.tolist() for b in by_index] == [b.tolist() for b in by_array]


# -- 3. a state saved with other settings -------------------------------------------------------


def sized(max_total_size: int = 100, n: int = 40, **options: object) -> FastSizeAwareLoader:
    sizes = (np.arange(n) % 7 + 1) * 5
    return FastSizeAwareLoader(torch.arange(n), options.pop("sizes", sizes), max_total_size, seed=3, **options)


def saved_state(loader: FastSizeAwareLoader, steps: int = 2) -> dict[str, object]:
    iterator = iter(loader)
    for _ in range(steps):
        next(iterator)
    return loader.state_dict()


def test_a_state_of_another_max_total_size_names_both_values():
    state = saved_state(sized(100))
    with pytest.raises(ValueError, match="max_total_size was 100 when the state was saved and is 120 here"):
        sized(120).load_state_dict(state)


def test_a_state_of_other_options_names_each():
    state = saved_state(sized(100))
    with pytest.raises(ValueError, match="cost was 'sum' when the state was saved and is 'padded' here") as caught:
        sized(100, cost="padded", sort_window=8).load_state_dict(state)
    assert "sort_window was None when the state was saved and is 8 here" in str(caught.value)


def test_a_state_saved_without_a_fixed_cost_names_the_default_zero():
    state = saved_state(sized(100))
    with pytest.raises(ValueError, match="fixed_cost was 0 when the state was saved and is 2 here"):
        sized(100, fixed_cost=2).load_state_dict(state)
    state = saved_state(sized(100, fixed_cost=2))
    with pytest.raises(ValueError, match="fixed_cost was 2 when the state was saved and is 0 here"):
        sized(100).load_state_dict(state)


def test_a_state_of_another_dataset_names_its_length_or_the_sizes():
    state = saved_state(sized(100, n=40))
    with pytest.raises(ValueError, match="the dataset had 40 items when the state was saved and has 41 here"):
        sized(100, n=41).load_state_dict(state)
    with pytest.raises(ValueError, match="the sizes differ"):
        sized(100, sizes=np.full(40, 9)).load_state_dict(state)


def test_a_state_without_settings_is_refused_as_before():
    state = saved_state(sized(100))
    del state["plan"]  # as an older fastsab saved it
    with pytest.raises(ValueError, match=re.escape("(a state saved by an older fastsab names no setting)")):
        sized(120).load_state_dict(state)


def test_the_fingerprint_decides_not_the_settings():
    # invariant: the settings only explain a refusal; a state is refused exactly when its fingerprint differs
    state = saved_state(sized(100))
    claimed = dict(state, plan=sized(120).state_dict()["plan"])
    with pytest.raises(ValueError, match="the sizes differ"):  # settings equal: the fingerprint still differs
        sized(120).load_state_dict(claimed)
    old = dict(state)
    del old["plan"]
    resumed = sized(100)
    resumed.load_state_dict(old)  # a state saved before the settings were kept still resumes
    assert [b.tolist() for b in resumed] == [b.tolist() for b in list(sized(100))[2:]]


def test_an_unchanged_configuration_resumes_exactly():
    whole = [b.tolist() for b in sized(100)]
    state = saved_state(sized(100), steps=3)
    resumed = sized(100)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == whole[3:]


# -- 4. oversize items skipped -------------------------------------------------------------------


def test_skipped_items_name_the_largest_size_the_cap_and_the_fixes():
    sizes = np.ones(20, dtype=np.int64)
    sizes[[3, 8, 11]] = [150, 230, 101]
    with pytest.warns(UserWarning, match="3 items were larger than max_total_size") as caught:
        batches = list(FastSizeAwareLoader(torch.arange(20), sizes, 100, shuffle=False))
    assert sorted(i for b in batches for i in b.tolist()) == sorted(set(range(20)) - {3, 8, 11})
    message = str(caught[0].message)
    assert "The largest has size 230 and max_total_size is 100." in message
    assert "oversize='own_batch'" in message and "oversize='error'" in message
    assert message.endswith("or max_total_size >= 230.")


def test_skipped_items_count_the_fixed_cost_in_the_cap_they_need():
    sizes = np.array([5, 40, 5, 5])
    with pytest.warns(UserWarning, match=re.escape("max_total_size >= 50 (the size plus fixed_cost).")):
        list(FastSizeAwareLoader(torch.arange(4), sizes, 30, fixed_cost=10, shuffle=False))


# -- 5. warnings point at the user's line ----------------------------------------------------------


def test_the_per_item_read_warning_points_here_and_names_the_fast_forms():
    with pytest.warns(UserWarning, match="is read item by item") as caught:
        FastLoader(Sequences(), batch_size=2)
    (warning,) = [w for w in caught if "item by item" in str(w.message)]
    assert warning.filename == __file__
    message = str(warning.message)
    assert "fastsab.RaggedDataset" in message and "Tensors, numpy arrays" in message
    assert "helps only if it reads the whole batch at once" in message


def test_warnings_raised_deep_in_iteration_point_here():
    sizes = np.array([1, 500, 1])
    with pytest.warns(UserWarning) as caught:
        FastSizeAwareLoader(torch.arange(3), lambda i: int(sizes[i]), 10)  # a per-item sizeof
        list(FastSizeAwareLoader(torch.arange(3), sizes, 10))  # skipped at the epoch's end
        list(SizeAwareBatchSampler(range(3), lambda i: int(sizes[i]), 10))  # bionemo's per-item warning
    assert len(caught) >= 3
    assert [w.filename for w in caught] == [__file__] * len(caught)


def test_a_warning_from_a_planned_data_loader_points_at_the_users_loop():
    loader = FastSizeAwareLoader(torch.arange(4), torch.tensor([3, 40, 2, 5]), 10)
    with pytest.warns(UserWarning, match="larger than max_total_size") as caught:
        batches = [batch.tolist() for batch in loader.data_loader()]
    assert sorted(index for batch in batches for index in batch) == [0, 2, 3]
    assert [w.filename for w in caught] == [__file__]


def test_user_stacklevel_skips_the_package_frames():
    def warn_here() -> None:
        warnings.warn("from a test", stacklevel=user_stacklevel())

    with pytest.warns(UserWarning) as caught:
        warn_here()
    assert caught[0].filename == __file__ and caught[0].lineno == warn_here.__code__.co_firstlineno + 1


# -- 6. a dataset without a length -----------------------------------------------------------------


class Stream(IterableDataset[int]):
    def __iter__(self):
        return iter(range(3))


def test_an_iterable_dataset_is_pointed_at_the_streaming_api():
    with pytest.raises(TypeError, match="dataset must have a length") as caught:
        FastLoader(Stream(), batch_size=2)
    message = str(caught.value)
    assert "got Stream without one" in message and "plan whole epochs by index" in message
    assert "fastsab.size_aware_batching" in message and "fastsab.integrations.webdataset" in message


# -- 6b. an empty container is no dataset; arrays of 0 rows are a dataset of 0 items ----------------


def both_loaders(dataset):
    """``dataset`` in each loader (size-aware: every item of size 1)."""
    return [FastLoader(dataset, 2), FastSizeAwareLoader(dataset, lambda x: torch.ones(len(x)), 4)]


# hypothesis: containers that nest only empty ones (a list is a sequence of samples: empty, or a leaf);
# [] itself is a list of 0 samples, a dataset of 0 items
EMPTY_TREES = st.recursive(
    st.sampled_from([{}, (), []]),
    lambda inner: st.one_of(
        st.dictionaries(st.text(max_size=2), inner, min_size=1, max_size=3),
        st.lists(inner, min_size=1, max_size=3).map(tuple),
    ),
    max_leaves=6,
)


@settings(max_examples=40, deadline=None)
@given(EMPTY_TREES, st.sampled_from(["fixed", "size-aware"]))
def test_an_empty_container_is_refused_with_what_a_dataset_is(tree, kind):
    # invariant: nothing holding neither an array nor a sample is taken as a dataset (of 0 items or 1)
    assume(tree != [])
    with pytest.raises(ValueError, match="holds no tensor, array or sample") as caught:
        if kind == "fixed":
            FastLoader(tree, 2)
        else:
            FastSizeAwareLoader(tree, lambda x: torch.ones(len(x)), 4)
    message = str(caught.value)
    assert f"got {short_repr(tree)}" in message and "read item by item" not in message
    assert "tensor or a numpy array" in message and "__getitem__" in message


@pytest.mark.parametrize("dataset", [{}, {"a": {}}, (), ({}, ()), {"a": []}, ([], [])], ids=repr)
def test_the_empty_containers_users_pass_are_refused_without_a_warning(dataset):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "read item by item" advice for what is no dataset
        for make in (lambda: FastLoader(dataset, 2), lambda: FastSizeAwareLoader(dataset, [], 4)):
            with pytest.raises(ValueError, match=rf"dataset must hold data, got {re.escape(repr(dataset))}"):
                make()


@pytest.mark.parametrize(
    "dataset",
    [torch.zeros(0), {"a": torch.zeros(0)}, {"a": torch.zeros(0, 3), "b": np.zeros(0), "name": "x", "c": {}}],
    ids=["tensor", "dict", "dict-with-an-empty-one"],
)
def test_arrays_of_no_rows_are_a_dataset_of_no_items(dataset):
    for loader in both_loaders(dataset):
        assert len(loader) == 0 and list(loader) == []


def test_an_empty_list_of_samples_is_a_dataset_of_no_items_read_without_a_warning():
    # a list is a sequence of samples (as DataLoader takes it): one filtered down to none is 0 items
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is read item by item: no advice about slow reads
        for loader in (FastLoader([], 2), FastSizeAwareLoader([], [], 4)):
            assert len(loader) == 0 and list(loader) == []


def test_a_list_of_empty_samples_is_a_dataset_of_samples():
    loader = quiet(lambda: FastLoader([{}, {}, {}], 2, shuffle=False))
    assert len(loader) == 2 and list(loader) == [{}, {}]  # (default_collate of empty dicts)


# -- 7. bfloat16 sizes work as float16 sizes do ----------------------------------------------------

HALF = [3.0, 5.0, 2.0, 7.0, 1.0, 4.0, 6.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sizes_give_the_float32_batches(dtype):
    sizes = torch.tensor(HALF, dtype=dtype)
    expected = [b.tolist() for b in FastSizeAwareLoader(torch.arange(8), torch.tensor(HALF), 8, seed=1)]
    assert [b.tolist() for b in FastSizeAwareLoader(torch.arange(8), sizes, 8, seed=1)] == expected
    double = FastSizeAwareLoader(torch.arange(8), lambda x: 2 * x, 16, features=sizes, seed=1)
    assert [b.tolist() for b in double] == expected
    assert [b.tolist() for b in split_batches(sizes, 8).batches()] == [[0, 1], [2], [3, 4], [5], [6, 7]]
    streamed = size_aware_batching(list(range(8)), lambda i: sizes[i], 8, collate_fn=list, warn_logger=None)
    assert list(streamed) == [[0, 1], [2], [3, 4], [5], [6, 7]]
    assert list(SizeAwareBatchSampler(range(8), sizes, 8)) == [[0, 1], [2], [3, 4], [5], [6, 7]]


def test_bfloat16_samples_out_of_core_say_what_to_return():
    def read(i: int) -> torch.Tensor:
        return torch.full((2,), float(i), dtype=torch.bfloat16)

    bfloat16 = r"read_input\(0\) gave a sample with a tensor of dtype torch.bfloat16"
    with pytest.raises(TypeError, match=bfloat16) as caught:
        OutOfCoreDataset(range(4), read, cpu_memory_limit=2**20).__getitems__([0, 1])
    assert "Return it as float32" in str(caught.value)


# -- 8. adaptive.run given what is not a loader ------------------------------------------------------


def test_adaptive_run_names_what_it_takes():
    with pytest.raises(
        TypeError, match=r"loader must be a fastsab.FastLoader or fastsab.FastSizeAwareLoader"
    ) as caught:
        run([1, 2, 3], lambda batch: None)  # raised at the call, before any batch
    assert "got [1, 2, 3] of type list" in str(caught.value)
    with pytest.raises(TypeError, match="step must be a callable taking a batch, got 3 of type int"):
        run(FastLoader(torch.arange(4), batch_size=2), 3)


# -- 9. a mixture's sources, weights and stop ----------------------------------------------------


def test_a_mixtures_refusals_name_the_source_and_the_value():
    data = {"web": torch.arange(6), "code": torch.arange(100, 104)}
    with pytest.raises(ValueError, match=re.escape("weights' points must increase in their 'at': point 1 is at 500.0")):
        fastsab.Mixture(data, weights=[(1000, {"web": 1}), (500, {"code": 1})])
    with pytest.raises(ValueError, match="weights' first point cannot be 'linear'"):
        fastsab.Mixture(data, weights=[(0, {"web": 1}, "linear")])
    with pytest.raises(ValueError, match="source 'code' has no items: leave it out of the mixture, or give it data"):
        fastsab.Mixture({"web": data["web"], "code": torch.arange(0)})
    with pytest.raises(ValueError, match=re.escape("stop={'items': 0} needs a positive integer")):
        fastsab.Mixture(data, stop={"items": 0})
    with pytest.raises(TypeError, match=re.escape("stop must be 'first', 'last', {'cost': total} or {'items': count}")):
        fastsab.Mixture(data, stop=100)
    free = fastsab.Mixture(data, stop={"cost": 100})
    with pytest.raises(ValueError, match=r"source 'code' costs nothing: each of its 4 items has cost 0.*by='items'"):
        list(FastSizeAwareLoader(free, sizeof={"web": np.ones(6), "code": np.zeros(4)}, max_total_size=8))
    unequal = fastsab.Mixture({"a": {"x": torch.zeros(3, 2)}, "b": {"x": torch.zeros(3, 5)}})
    with pytest.raises(ValueError, match=r"the samples of sources \['a', 'b'\] cannot share a batch") as caught:
        next(iter(FastLoader(unequal, batch_size=6, shuffle=False)))
    assert type(caught.value).__name__ == "MixtureSamplesError"


# -- the page docs/errors.md ------------------------------------------------------------------------


def test_the_errors_page_runs_and_shows_what_it_says(tmp_path):
    script = tmp_path / "errors_page.py"
    script.write_text(page_script("errors.md"))
    out = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == [
        "UnequalSamplesError names PadCollator: True",
        "padded: (2, 126) [53, 126]",
        "ragged batches: [[53, 126, 7], [40]]",
        "sizes per batch: [186, 40]",
        "state was saved for another dataset, sizes or batching configuration: "
        "max_total_size was 20 when the state was saved and is 24 here",
        "resumed with the same settings: True",
        "skip: [[0, 2, 3]] skipped: [1]",
        "warned: 1 items were larger than max_total_size and were skipped in epoch 0",
        "own_batch: [[0], [1], [2, 3]]",
        "gathered: (100, 16)",
        "streamed: [[3, 5], [2], [7, 1]]",
        "dataset must hold data, got {}",
        "0 items: 0 []",
        "0 samples: 0 []",
        "loader must be a fastsab.FastLoader or fastsab.FastSizeAwareLoader",
        "run: [[0, 1, 2], [3, 4, 5]]",
        "first part: [0, 1] parts left: 1",
        "state_dict() was called between the parts of a split step",
        "last part: [2, 3] parts left: 0 steps: 1",
        "buckets: [[1, 3], [0, 2, 4]]",
        "refused: batch_sizes must be at most 2**63 - 1 (int64's largest), got 100000000000000000000 at position 1",
        "collate_fn PadCollator(pad_value=0, pad_to_multiple_of=8) rounds every batch's length up to a multiple "
        "of 8, but pad_to_multiple_of=4 charges lengths rounded up to a multiple of 4",
        "charged: [(2, 16), (1, 16)]",
        "bfloat16 sizes: [[0, 1], [2], [3]]",
        "peaks must not all be 0, got 9 peaks of 0",
        "two items of 100: 204800",
        "weights['web'] must be a finite number >= 0, got -1.",
        "weights gives every source weight 0: give at least one source a positive weight.",
        "weights names source 'books', which the mixture does not have: it has ['web', 'code'].",
        "stop's key must be one of 'cost', 'items', got 'steps'.",
        "sizeof must give the values of every source of the mixture and of no other: missing ['code'], unknown [].",
        "source 'free' costs nothing",
        "by items: 11 items",
        "the samples of sources ['text', 'longer'] cannot share a batch",
        "padded: [(4, 9)]",
    ]
