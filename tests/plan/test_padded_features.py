"""Padded features and fixed batch costs: the kernel against the plain loop of ``tests/reference.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, adaptive
from fastsab.memory import PolynomialRegression
from fastsab.plan.batching import split_with
from fastsab.plan.costs import BatchCost
from fastsab.position.fingerprint import plan_fingerprint
from tests.reference import Row, greedy_loop


def _area(rows: np.ndarray) -> np.ndarray:
    """An image's cost: height x width plus a constant (integers)."""
    return rows[:, 0] * rows[:, -1] + 3


def _wavy(rows: np.ndarray) -> np.ndarray:
    """A cost that does not grow with the features (integers)."""
    return (rows * np.array([7, 3, 5][: rows.shape[1]])).sum(axis=1) % 17


def _poly(rows: np.ndarray) -> np.ndarray:
    """A float polynomial of the features, elementwise."""
    x = rows.astype(np.float64)
    return 0.1 * x[:, 0] ** 2 + 1.5 * x[:, -1] + 0.3


def _total(rows: np.ndarray) -> np.ndarray:
    """The sum of an item's features plus one, for 1-D or 2-D features (integers)."""
    return rows.reshape(len(rows), -1).sum(axis=1) + 1


def _two_columns(rows: np.ndarray) -> np.ndarray:
    """Two costs per row (integers): the sum and the maximum of the features."""
    return np.stack([rows.sum(axis=1), rows.max(axis=1)], axis=1)


FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "area": _area,
    "wavy": _wavy,
    "poly": _poly,
    "two_columns": _two_columns,
}


def _row_cost(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Row], Row]:
    """The same function on one row of features, for the reference loop."""

    def cost(row: Row) -> Row:
        out = np.asarray(fn(np.array([row], dtype=np.int64))).reshape(1, -1)[0]
        return tuple(out.tolist())

    return cost


def _loop_split(rule: BatchCost, chunks: list[np.ndarray], oversize: str) -> tuple[list[list[int]], list[int]]:
    """Split the chunks one after the other with carries, as the planners do."""
    batches: list[list[int]] = []
    skipped: list[int] = []
    carry = None
    position = 0
    for number, chunk in enumerate(chunks):
        ids = np.arange(position, position + len(chunk))
        position += len(chunk)
        split = split_with(rule, chunk, ids=ids, carry=carry, final=number == len(chunks) - 1, oversize=oversize)
        batches += [batch.tolist() for batch in split.batches()]
        skipped += split.skipped.tolist()
        carry = split.carry
    return batches, skipped


@st.composite
def feature_cases(draw: Any) -> dict[str, Any]:
    """Features, a function, caps and a fixed cost (sometimes 0), options, and cut points."""
    name = draw(st.sampled_from(sorted(FUNCTIONS)))
    d = draw(st.integers(1, 3))
    n = draw(st.integers(0, 60))
    features = np.array(draw(st.lists(st.lists(st.integers(0, 20), min_size=d, max_size=d), min_size=n, max_size=n)))
    features = features.reshape(n, d).astype(np.int64)
    k = 2 if name == "two_columns" else 1
    caps = [draw(st.integers(0, 400)) for _ in range(k)]
    if name == "poly" and draw(st.booleans()):
        caps = [float(cap) + 0.5 for cap in caps]
    fixed = draw(st.sampled_from([0, 0, 1, 7, 25, 2.5]))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    return {
        "name": name,
        "features": features,
        "caps": caps,
        "fixed": fixed,
        "cuts": cuts,
        "max_batch_size": draw(st.sampled_from([None, None, 3, 7])),
        "multiple": draw(st.sampled_from([1, 1, 2, 4])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }


@settings(max_examples=300, deadline=None)
@given(case=feature_cases())
def test_padded_features_are_the_plain_loop(case: dict[str, Any]) -> None:
    fn = FUNCTIONS[case["name"]]
    caps, fixed = case["caps"], case["fixed"]
    rule = BatchCost(
        caps,
        cost="padded",
        feature_cost=fn,
        fixed_cost=fixed,
        max_batch_size=case["max_batch_size"],
        batch_size_multiple=case["multiple"],
    )
    features = case["features"]
    chunks = np.split(features, case["cuts"]) if len(features) else [features]
    got = _loop_split(rule, chunks, case["oversize"])
    rows = [tuple(row) for row in features.tolist()]
    expected = greedy_loop(
        range(len(rows)),
        rows,
        caps,
        cost="padded",
        max_batch_size=case["max_batch_size"],
        multiple=case["multiple"],
        oversize=case["oversize"],
        fixed=[fixed] * len(caps),
        feature_cost=_row_cost(fn),
    )
    assert got == expected


@st.composite
def fixed_cases(draw: Any) -> dict[str, Any]:
    """Per-item costs (integers or floats, one or two columns), caps and a fixed cost."""
    k = draw(st.integers(1, 2))
    floats = draw(st.booleans())
    values = st.floats(0, 30, allow_nan=False) if floats else st.integers(0, 30)
    n = draw(st.integers(0, 60))
    rows = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=n, max_size=n))
    caps = [draw(st.one_of(st.integers(0, 120), st.floats(0, 120, allow_nan=False))) for _ in range(k)]
    fixed = [draw(st.one_of(st.integers(0, 40), st.floats(0, 40, allow_nan=False))) for _ in range(k)]
    return {
        "costs": np.array(rows, dtype=np.float64 if floats else np.int64).reshape(n, k),
        "caps": caps,
        "fixed": fixed,
        "cost": draw(st.sampled_from(["sum", "padded"])),
        "cuts": sorted(draw(st.lists(st.integers(0, n), max_size=3))),
        "max_batch_size": draw(st.sampled_from([None, 4])),
        "oversize": draw(st.sampled_from(["skip", "own_batch"])),
    }


@settings(max_examples=300, deadline=None)
@given(case=fixed_cases())
def test_fixed_cost_is_the_plain_loop(case: dict[str, Any]) -> None:
    costs, caps, fixed = case["costs"], case["caps"], case["fixed"]
    rule = BatchCost(caps, cost=case["cost"], fixed_cost=fixed, max_batch_size=case["max_batch_size"])
    chunks = np.split(costs, case["cuts"]) if len(costs) else [costs]
    got = _loop_split(rule, chunks, case["oversize"])
    rows = [tuple(row) for row in costs.tolist()]
    expected = greedy_loop(
        range(len(rows)),
        rows,
        caps,
        cost=case["cost"],
        max_batch_size=case["max_batch_size"],
        oversize=case["oversize"],
        fixed=fixed,
    )
    assert got == expected


def test_padding_features_charges_the_batch_its_padded_shape() -> None:
    # two images, 2 x 8 and 8 x 2: padded to 8 x 8, they cost 2 * 64, not 2 * 16
    images = np.array([[2, 8], [8, 2]])
    by_costs = split_with(BatchCost(100, cost="padded"), images[:, 0] * images[:, 1])
    by_features = split_with(BatchCost(100, cost="padded", feature_cost=lambda rows: rows[:, 0] * rows[:, 1]), images)
    assert [b.tolist() for b in by_costs.batches()] == [[0, 1]]
    assert [b.tolist() for b in by_features.batches()] == [[0], [1]]


def test_fixed_cost_is_paid_once_per_batch() -> None:
    # 10 + 3 * 30 = 100 fits; charging the 10 per item (3 * 40) would not
    rule = BatchCost(100, fixed_cost=10)
    assert [b.tolist() for b in split_with(rule, [30, 30, 30, 30]).batches()] == [[0, 1, 2], [3]]
    assert rule.per_batch(np.array([30, 30, 30, 30]), np.array([0, 3, 4])).tolist() == [[100], [40]]
    # an item whose cost plus the fixed cost exceeds the cap is oversize
    assert split_with(rule, [91, 90]).skipped.tolist() == [0]


def test_lowering_keeps_the_fixed_cost() -> None:
    rule = BatchCost(100, fixed_cost=40)
    # the batch spent 40 + 60; half of its variable part is 30: the cap becomes 70, not 50
    assert rule.smaller_caps(np.array([20, 20, 20]), rule.caps, 2) == [70.0]


def test_per_batch_pads_features() -> None:
    rule = BatchCost(1000, cost="padded", feature_cost=lambda rows: rows[:, 0] * rows[:, 1], fixed_cost=5)
    rows = np.array([[2, 8], [8, 2], [3, 3]])
    assert rule.per_batch(rows, np.array([0, 2, 3])).tolist() == [[5 + 2 * 64], [5 + 9]]


def test_options_name_a_fixed_cost_and_padded_features_only_when_set() -> None:
    assert "fixed_cost" not in BatchCost(10).options() and "padding" not in BatchCost(10).options()
    options = BatchCost(10, cost="padded", fixed_cost=2, feature_cost=_area).options()
    assert options["fixed_cost"] == 2 and options["padding"] == "features"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fixed_cost": -1}, ValueError, r"fixed_cost must be a finite number >= 0, got -1\."),
        ({"fixed_cost": "a"}, TypeError, r"fixed_cost must be a real number, got 'a'"),
        ({"fixed_cost": [1, 2]}, ValueError, r"fixed_cost must be one number or one per cap \(1\), got \[1, 2\]\."),
        ({"feature_cost": 3, "cost": "padded"}, TypeError, r"feature_cost must be a callable or None, got 3\."),
        (
            {"feature_cost": _area},
            ValueError,
            r"feature_cost pads features, so it needs cost='padded', got cost='sum'\.",
        ),
    ],
)
def test_bad_fixed_or_feature_cost(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        BatchCost(10, **kwargs)


# -- the loader ---------------------------------------------------------------------------


def _images(n: int, seed: int = 0) -> np.ndarray:
    """Heights and widths of ``n`` images (integers)."""
    return np.random.default_rng(seed).integers(1, 30, size=(n, 2))


def _loader_batches(loader: FastSizeAwareLoader[Any]) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("fixed", [0, 40])
def test_loader_pads_features_with_a_callable_and_features(fixed: int) -> None:
    features = _images(200)
    loader = FastSizeAwareLoader(
        torch.arange(200), _area, 2000, features=features, cost="padded", fixed_cost=fixed, shuffle=False
    )
    rows = [tuple(row) for row in features.tolist()]
    expected, skipped = greedy_loop(
        range(200), rows, [2000], cost="padded", fixed=[fixed], feature_cost=_row_cost(_area)
    )
    assert _loader_batches(loader) == expected and not skipped
    for batch in expected:
        top = features[batch].max(axis=0)
        assert fixed + len(batch) * (top[0] * top[1] + 3) <= 2000


def test_loader_pads_costs_when_given_costs() -> None:
    # per-item costs with cost="padded": len * max(cost), as always
    features = _images(100)
    loader = FastSizeAwareLoader(torch.arange(100), _area(features), 2000, cost="padded", shuffle=False)
    expected, _ = greedy_loop(range(100), [(c,) for c in _area(features).tolist()], [2000], cost="padded")
    assert _loader_batches(loader) == expected
    pads_costs = FastSizeAwareLoader(
        torch.arange(100), _area, 2000, features=features, cost="padded", padding="costs", shuffle=False
    )
    assert _loader_batches(pads_costs) == expected


def test_loader_pads_the_features_of_a_memory_model() -> None:
    model = PolynomialRegression(2, num_features=2)
    grid = torch.tensor([[h, w] for h in range(1, 30, 4) for w in range(1, 30, 4)], dtype=torch.float64)
    model.fit(grid, 100 + 4.0 * grid[:, 0] * grid[:, 1])
    features = torch.as_tensor(_images(150, seed=1))
    loader = FastSizeAwareLoader(torch.arange(150), model, 30000.0, features=features, cost="padded", fixed_cost=500)
    seen = []
    for batch in loader:
        rows = features[batch]
        top = rows.max(dim=0).values[None]
        assert 500 + len(batch) * float(model(top)[0]) <= 30000.0
        seen += batch.tolist()
    assert sorted(seen) == list(range(150))


def test_loader_charges_the_fixed_cost_once_per_batch() -> None:
    sizes = np.random.default_rng(2).integers(1, 50, size=300)
    loader = FastSizeAwareLoader(torch.arange(300), sizes, 400, fixed_cost=100, shuffle=False)
    expected, skipped = greedy_loop(range(300), [(s,) for s in sizes.tolist()], [400], fixed=[100])
    assert _loader_batches(loader) == expected and not skipped
    assert max(100 + sizes[batch].sum() for batch in expected) <= 400


def test_adaptive_run_lowers_padded_features_with_a_fixed_cost() -> None:
    features = _images(120, seed=3)
    loader = FastSizeAwareLoader(
        torch.arange(120), _area, 4000, features=features, cost="padded", fixed_cost=300, shuffle=False
    )

    def step(batch: torch.Tensor) -> list[int]:
        top = features[batch.numpy()].max(axis=0)
        if 300 + len(batch) * (top[0] * top[1] + 3) > 1500:  # the device holds less than planned
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return batch.tolist()

    done = [index for part in adaptive.run(loader, step) for index in part]
    assert sorted(done) == list(range(120))
    assert loader.stats.limit_changes
    # the lowered caps keep the fixed cost whole: fixed + spent / factor, above the fixed cost
    assert all(new[0] > 300 for _, _, new in loader.stats.limit_changes)


def test_fingerprint_names_a_fixed_cost_and_padded_features() -> None:
    features = _images(50)

    def fingerprint(**kwargs: Any) -> str:
        loader = FastSizeAwareLoader(torch.arange(50), _area, 2000, features=features, **kwargs)
        return plan_fingerprint(loader.planner)

    plain = fingerprint(cost="padded", padding="costs")
    assert fingerprint(cost="padded") != plain
    assert fingerprint(cost="padded", padding="costs", fixed_cost=5) != plain


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"padding": "rows", "cost": "padded"}, ValueError, r"padding must be one of .*got 'rows'"),
        ({"padding": "features"}, ValueError, r"padding='features' .* needs cost='padded', got 'sum'\."),
        ({"fixed_cost": -2}, ValueError, r"fixed_cost must be a finite number >= 0, got -2\."),
    ],
)
def test_loader_refuses_bad_padding_or_fixed_cost(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FastSizeAwareLoader(torch.arange(5), _area, 100, features=_images(5), **kwargs)


def test_padding_features_needs_features() -> None:
    with pytest.raises(ValueError, match=r"padding='features' pads the features of a callable sizeof"):
        FastSizeAwareLoader(torch.arange(5), np.ones(5), 100, cost="padded", padding="features")


@pytest.mark.parametrize("balance", [True, False])
def test_ranks_share_padded_features_with_a_fixed_cost(balance: bool) -> None:
    features = _images(90, seed=4)
    dealt = []
    for rank in (0, 1):
        loader = FastSizeAwareLoader(
            torch.arange(90),
            _area,
            3000,
            features=features,
            cost="padded",
            fixed_cost=100,
            rank=rank,
            world_size=2,
            balance=balance,
        )
        for batch in loader:
            top = features[batch.numpy()].max(axis=0)
            assert 100 + len(batch) * (top[0] * top[1] + 3) <= 3000
            dealt += batch.tolist()
    assert set(dealt) == set(range(90))


@pytest.mark.parametrize("shape", [(0,), (0, 2)])
def test_loader_pads_the_features_of_an_empty_dataset(shape: tuple[int, ...]) -> None:
    loader = FastSizeAwareLoader(
        torch.arange(0), _total, 10, features=np.zeros(shape, dtype=np.int64), cost="padded", fixed_cost=2
    )
    assert len(loader) == 0
    assert list(loader) == []


def _length_costs(rows: np.ndarray) -> np.ndarray:
    """Two costs of a sequence length (1-D features): the length and three times it plus one."""
    lengths = rows.reshape(len(rows), -1)[:, 0]
    return np.stack([lengths, 3 * lengths + 1], axis=1)


@pytest.mark.parametrize("caps", [[60, 200], 100])
@pytest.mark.parametrize("group_size", [None, 7])
def test_loader_pads_features_into_other_cost_columns(caps: list[int] | int, group_size: int | None) -> None:
    # one feature column, two cost columns: the caps are checked against the costs, not the features
    lengths = np.random.default_rng(1).integers(1, 20, size=60)
    loader = FastSizeAwareLoader(
        torch.arange(60), _length_costs, caps, features=lengths, cost="padded", shuffle=False, group_size=group_size
    )
    rows = [(int(length),) for length in lengths]
    expected, skipped = greedy_loop(
        range(60),
        rows,
        caps if isinstance(caps, list) else [caps] * 2,
        cost="padded",
        feature_cost=_row_cost(_length_costs),
    )
    assert _loader_batches(loader) == expected and len(loader) == len(expected) and not skipped


def test_oversize_error_names_the_fixed_cost() -> None:
    loader = FastSizeAwareLoader(
        torch.arange(3), torch.tensor([1, 4, 2]), 10, fixed_cost=8, oversize="error", shuffle=False
    )
    with pytest.raises(ValueError, match=r"item 1 has cost 4 \(plus fixed_cost 8\) above max_total_size 10"):
        len(loader)
