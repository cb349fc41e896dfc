from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch

from fastsab import FastLoader, FastSizeAwareLoader
from fastsab.loaders.options import DEFAULT_CHUNK_BYTES, LoaderKeywords, LoaderOptions

OWN_PARAMETERS = {
    FastLoader: ["dataset", "batch_size", "drop_last"],
    FastSizeAwareLoader: [
        "dataset",
        "sizeof",
        "max_total_size",
        "features",
        "cost",
        "max_batch_size",
        "batch_size_multiple",
        "last_batch",
        "oversize",
        "padding",
        "fixed_cost",
        "sort_window",
        "pad_to_multiple_of",
        "buckets",
        "partial",
    ],
}


def double(rows: torch.Tensor) -> torch.Tensor:
    return rows * 2


@pytest.mark.parametrize("loader_class", [FastLoader, FastSizeAwareLoader])
def test_each_loader_takes_every_option_with_its_default_as_an_explicit_keyword(loader_class):
    parameters = inspect.signature(loader_class).parameters
    fields = {field.name: field for field in dataclasses.fields(LoaderOptions)}
    assert sorted(set(parameters) - set(OWN_PARAMETERS[loader_class])) == sorted(fields)
    for name, field in fields.items():
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameters[name].default == field.default, name
        if name != "collate_fn":  # the loaders' names the batch type it returns
            assert parameters[name].annotation == field.type, name
    positional = [name for name, p in parameters.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == OWN_PARAMETERS[loader_class][: len(positional)] and len(positional) >= 2


@pytest.mark.parametrize("loader_class", [FastLoader, FastSizeAwareLoader])
def test_type_checkers_see_every_option_through_the_loader_keywords(loader_class):
    assert list(LoaderKeywords.__annotations__) == [field.name for field in dataclasses.fields(LoaderOptions)]
    assert LoaderKeywords.__optional_keys__ == frozenset(LoaderKeywords.__annotations__)
    assert loader_class.__init__.__annotations__["options"] == "Unpack[LoaderKeywords[T]]"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: FastLoader(torch.arange(4), 2, shufle=True),
            r"FastLoader\(\) got an unexpected keyword argument 'shufle' \(got shufle=True\)\.",
        ),
        (
            lambda: FastSizeAwareLoader(torch.arange(4), [1] * 4, 2, sed=3),
            r"FastSizeAwareLoader\(\) got an unexpected keyword argument 'sed' \(got sed=3\)\.",
        ),
    ],
)
def test_a_loader_names_itself_and_the_value_of_an_unknown_keyword(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_a_loader_keeps_its_options_as_given():
    loader = FastLoader(torch.arange(10), 3, shuffle=False, seed=5, prefetch=1, device="cpu", collate_fn=double)
    assert loader.options == LoaderOptions(shuffle=False, seed=5, prefetch=1, device="cpu", collate_fn=double)
    assert loader.options.device == "cpu" and loader.device == torch.device("cpu")
    assert loader.prefetch == 1 and loader.chunk_bytes == DEFAULT_CHUNK_BYTES
    same = FastSizeAwareLoader(torch.arange(10), [1] * 10, 3, **loader.options.keywords())
    assert same.options == loader.options
    assert [b.tolist() for b in same] == [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]


def test_options_are_frozen_and_keyword_only():
    options = LoaderOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        LoaderOptions(True)  # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle'"):
        LoaderOptions(shufle=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("prefetch", "error", "message"),
    [
        (-1, ValueError, r"prefetch must be a non-negative integer, got -1\."),
        (1.5, TypeError, r"prefetch must be an integer, got 1\.5 of type float\."),
        (True, TypeError, r"prefetch must be an integer, got True of type bool\."),
        ("2", TypeError, r"prefetch must be an integer, got '2' of type str\."),
    ],
)
def test_a_bad_prefetch_is_refused_by_the_options_and_the_loaders(prefetch, error, message):
    with pytest.raises(error, match=message):
        LoaderOptions(prefetch=prefetch)
    with pytest.raises(error, match=message):
        FastLoader(torch.arange(4), 2, prefetch=prefetch)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"chunk_bytes": -1}, ValueError, r"chunk_bytes must be a non-negative integer, got -1\."),
        ({"pin_memory": "yes"}, TypeError, r"pin_memory must be a bool, got 'yes'\."),
        ({"non_blocking": 1}, TypeError, r"non_blocking must be a bool, got 1\."),
        ({"even_batches": "even"}, ValueError, r"even_batches"),
        ({"balance": 1}, TypeError, r"balance must be a bool, got 1\."),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size=2\), got 2"),
        ({"group_size": 0}, ValueError, r"group_size must be a positive integer, got 0"),
    ],
)
def test_bad_options_are_named_when_a_loader_is_made(keywords, error, message):
    with pytest.raises(error, match=message):
        FastSizeAwareLoader(torch.arange(4), [1] * 4, 2, **keywords)
    with pytest.raises(error, match=message):
        FastLoader(torch.arange(4), 2, **keywords)


def test_options_and_loaders_pickle():
    options = LoaderOptions(shuffle=False, collate_fn=double, device=torch.device("cpu"), rank=0, world_size=1)
    assert pickle.loads(pickle.dumps(options)) == options
    loader = FastLoader(torch.arange(7), 3, **options.keywords())
    clone = pickle.loads(pickle.dumps(loader))
    assert clone.options == options
    assert [b.tolist() for b in clone] == [b.tolist() for b in loader] == [[0, 2, 4], [6, 8, 10], [12]]


def test_a_loader_subscripted_with_its_batch_type_takes_the_same_keywords():
    loader = FastLoader[torch.Tensor](torch.arange(4), 2, shuffle=False, timeout=0)
    assert isinstance(loader, FastLoader) and [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match=r"FastSizeAwareLoader does not take DataLoader's keyword timeout"):
        FastSizeAwareLoader[torch.Tensor](torch.arange(4), [1] * 4, 2, timeout=2)
