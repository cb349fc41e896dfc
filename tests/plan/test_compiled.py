"""The compiled walks of padded and sum splits (``fastsab.plan.compiled``): the numpy walks' batches, never waited for."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import FastSizeAwareLoader, split_batches
from fastsab.plan import compiled
from fastsab.plan.batching import split_with
from fastsab.plan.compiled import _walk_lengths, _walk_sums, use_compiled
from fastsab.plan.costs import BatchCost
from tests.reference import greedy_reference

pytestmark = pytest.mark.filterwarnings("ignore:.*larger than max_total_size:UserWarning")


@pytest.fixture(scope="module")
def walk_compiled():
    """The compiled walk, compiled; the numpy walk again after the test. Skipped without numba."""
    pytest.importorskip("numba")
    assert use_compiled(wait=True)
    yield
    use_compiled(False)


def both_walks(*args, split=split_batches, **kwargs):
    """The split of ``split(*args, **kwargs)`` by the numpy walks, then by the compiled ones."""
    use_compiled(False)
    numpy_split = split(*args, **kwargs)
    assert use_compiled(wait=True) and compiled.compiled_walk() is not None
    assert compiled.compiled_sum_walk() is not None
    return numpy_split, split(*args, **kwargs)


def assert_same_split(a, b):
    """``a`` and ``b`` have the same batches, skipped and dropped items and open batch."""
    assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()
    assert a.skipped.tolist() == b.skipped.tolist() and a.dropped.tolist() == b.dropped.tolist()
    assert (a.carry is None) == (b.carry is None)
    if a.carry is not None and b.carry is not None:
        assert a.carry.ids.tolist() == b.carry.ids.tolist() and a.carry.costs.tolist() == b.carry.costs.tolist()


# NOTE: costs of 1000 are above every cap drawn: oversize items, skipped or in batches of their own
ints = st.one_of(st.integers(0, 60), st.integers(0, 60), st.just(1000))
costs = st.one_of(
    st.lists(ints, max_size=300).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.one_of(st.floats(0.0, 60.0), st.just(1000.0)), max_size=300).map(
        lambda v: np.array(v, dtype=np.float64)
    ),
    st.lists(st.tuples(ints, st.integers(0, 9)), max_size=300).map(
        lambda v: np.array(v, dtype=np.int64).reshape(-1, 2)
    ),
)


@settings(max_examples=150)
@given(
    costs=costs,
    cap=st.integers(0, 200),
    max_batch_size=st.one_of(st.none(), st.integers(1, 30)),
    multiple=st.sampled_from([1, 1, 2, 3, 8]),
    oversize=st.sampled_from(["skip", "own_batch"]),
    last_batch=st.sampled_from(["keep", "round_down"]),
    cut=st.integers(0, 300),
)
def test_the_compiled_walk_gives_the_numpy_walks_batches(
    walk_compiled, costs, cap, max_batch_size, multiple, oversize, last_batch, cut
):
    # invariant: whichever walk runs, a split (whole, or in two chunks with a carry) has the same
    # batches, skipped and dropped items and open batch
    caps = cap if costs.ndim == 1 else [cap, 12]
    options = {
        "cost": "padded",
        "max_batch_size": max_batch_size,
        "batch_size_multiple": multiple,
        "oversize": oversize,
        "last_batch": last_batch,
    }
    cut = min(cut, len(costs))
    for final in (True, False):
        assert_same_split(*both_walks(costs, caps, final=final, **options))
    first, _ = both_walks(costs[:cut], caps, final=False, **options)
    a, b = both_walks(costs[cut:], caps, ids=np.arange(cut, len(costs)), carry=first.carry, **options)
    assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()


# NOTE: float costs near the caps' fractions, so that batches end where rounding decides them
floats = st.one_of(st.floats(0.0, 60.0), st.sampled_from([0.1, 0.2, 0.3, 1 / 3, 7.7]), st.just(1000.0))


def drawn_costs(seed: int, n: int, high: int, columns: int, as_float: bool) -> np.ndarray:
    """``n`` costs below ``high`` (1000 above every cap), from a seed: long arrays hypothesis lists seldom reach."""
    rng = np.random.default_rng(seed)
    values = rng.random((n, columns)) * high if as_float else rng.integers(0, high, (n, columns))
    values[rng.random(n) < 0.02] = 1000
    return values[:, 0] if columns == 1 else values


# long arrays of small costs: long batches, closed by max_batch_size and cut to the multiple
long_costs = st.builds(
    drawn_costs,
    st.integers(0, 2**32),
    st.integers(30, 300),
    st.sampled_from([2, 4, 60]),
    st.sampled_from([1, 2]),
    st.booleans(),
)
# NOTE: twice, to draw long arrays more often than the lists (short, as hypothesis draws them)
sum_costs = st.one_of(
    long_costs,
    long_costs,
    costs,
    st.lists(floats, max_size=300).map(lambda v: np.array(v, dtype=np.float64)),
    st.lists(st.tuples(floats, st.floats(0.0, 9.0)), max_size=300).map(
        lambda v: np.array(v, dtype=np.float64).reshape(-1, 2)
    ),
)


@settings(max_examples=200)
@given(
    costs=sum_costs,
    cap=st.one_of(st.integers(0, 200), st.floats(0.0, 200.0), st.sampled_from([0.3, 2**70])),
    max_batch_size=st.one_of(st.none(), st.integers(1, 30)),
    multiple=st.sampled_from([1, 1, 2, 3, 8]),
    oversize=st.sampled_from(["skip", "own_batch"]),
    last_batch=st.sampled_from(["keep", "round_down"]),
    fixed_cost=st.sampled_from([0, 0, 5, 0.1]),
    cut=st.integers(0, 300),
)
def test_the_compiled_sum_walk_gives_the_numpy_walks_batches(
    walk_compiled, costs, cap, max_batch_size, multiple, oversize, last_batch, fixed_cost, cut
):
    # invariant: whichever walk runs, a sum split (whole, or in two chunks with a carry) has the
    # same batches, skipped and dropped items and open batch, for integer and float costs, one or
    # two columns, every option of the rule and caps past int64 (which the numpy walk keeps)
    caps = cap if costs.ndim == 1 else [cap, 12]
    rule = BatchCost(
        caps,
        max_batch_size=max_batch_size,
        batch_size_multiple=multiple,
        last_batch=last_batch,
        fixed_cost=fixed_cost,
    )
    cut = min(cut, len(costs))
    for final in (True, False):
        assert_same_split(*both_walks(rule, costs, oversize=oversize, final=final, split=split_with))
    first, first_compiled = both_walks(rule, costs[:cut], oversize=oversize, final=False, split=split_with)
    assert_same_split(first, first_compiled)
    a, b = both_walks(
        rule, costs[cut:], oversize=oversize, ids=np.arange(cut, len(costs)), carry=first.carry, split=split_with
    )
    assert_same_split(a, b)


@settings(max_examples=150)
@given(
    costs=sum_costs,
    cap=st.one_of(st.integers(0, 200), st.floats(0.0, 200.0)),
    max_batch_size=st.one_of(st.none(), st.integers(1, 30)),
    multiple=st.sampled_from([1, 1, 2, 3, 8]),
    oversize=st.sampled_from(["skip", "own_batch"]),
)
def test_the_compiled_sum_walk_gives_the_greedy_loops_batches(
    walk_compiled, costs, cap, max_batch_size, multiple, oversize
):
    # invariant: the compiled sum walk makes the batches of the plain greedy loop, item by item
    caps = cap if costs.ndim == 1 else [cap, 12]
    assert compiled.compiled_sum_walk() is not None
    split = split_batches(costs, caps, max_batch_size=max_batch_size, batch_size_multiple=multiple, oversize=oversize)
    expected, skipped = greedy_reference(
        costs.tolist(), caps, max_batch_size=max_batch_size, multiple=multiple, oversize=oversize
    )
    assert [batch.tolist() for batch in split.batches()] == expected
    assert split.skipped.tolist() == skipped


# NOTE: "no cap" values: at and past int64's edge, where i + max_batch_size once wrapped around
huge = st.sampled_from([2**31, 2**62, sys.maxsize - 1, sys.maxsize, 2**63, 2**63 + 1, 2**64, 2**100])


@settings(max_examples=150)
@given(
    costs=sum_costs,
    cost=st.sampled_from(["sum", "padded"]),
    cap=st.one_of(st.integers(0, 200), huge),
    max_batch_size=st.one_of(huge, st.none(), st.integers(1, 30)),
    multiple=st.one_of(st.sampled_from([1, 2, 3, 8]), huge),
    oversize=st.sampled_from(["skip", "own_batch"]),
    last_batch=st.sampled_from(["keep", "round_down"]),
    cut=st.integers(0, 300),
)
def test_huge_caps_and_batch_sizes_give_the_numpy_walks_batches(
    walk_compiled, costs, cost, cap, max_batch_size, multiple, oversize, last_batch, cut
):
    # invariant: a max_batch_size, batch_size_multiple or max_total_size at or past int64 splits
    # as in Python's integers: both walks give the plain greedy loop's batches, whole or in two
    # chunks with a carry
    caps = cap if costs.ndim == 1 else [cap, 12]
    options = {
        "cost": cost,
        "max_batch_size": max_batch_size,
        "batch_size_multiple": multiple,
        "oversize": oversize,
        "last_batch": last_batch,
    }
    for final in (True, False):
        assert_same_split(*both_walks(costs, caps, final=final, **options))
    split, _ = both_walks(costs, caps, **options)
    if last_batch == "keep":
        expected, skipped = greedy_reference(
            costs.tolist(), caps, max_batch_size=max_batch_size, cost=cost, multiple=multiple, oversize=oversize
        )
        assert [batch.tolist() for batch in split.batches()] == expected and split.skipped.tolist() == skipped
    cut = min(cut, len(costs))
    first, first_compiled = both_walks(costs[:cut], caps, final=False, **options)
    assert_same_split(first, first_compiled)
    a, b = both_walks(costs[cut:], caps, ids=np.arange(cut, len(costs)), carry=first.carry, **options)
    assert_same_split(a, b)
    assert a.ids.tolist() == b.ids.tolist() == split.ids[len(first.ids) :].tolist()


@settings(max_examples=60)
@given(
    costs=costs,
    cost=st.sampled_from(["sum", "padded"]),
    cap=st.one_of(st.integers(0, 200), huge),
    fixed_cost=st.one_of(huge, st.sampled_from([1e30, 2.0**64])),
    oversize=st.sampled_from(["skip", "own_batch"]),
)
def test_a_fixed_cost_past_int64_gives_the_numpy_walks_batches(walk_compiled, costs, cost, cap, fixed_cost, oversize):
    # invariant: a fixed cost above the cap makes every item oversize (skipped, or a batch each),
    # whatever its size; below it, the caps less it are those of the greedy loop
    caps = cap if costs.ndim == 1 else [cap, 12]
    rule = BatchCost(caps, cost=cost, fixed_cost=fixed_cost)
    a, b = both_walks(rule, costs, oversize=oversize, split=split_with)
    assert_same_split(a, b)
    if fixed_cost > (cap if costs.ndim == 1 else min(cap, 12)):
        assert len(a.skipped) == (len(costs) if oversize == "skip" else 0)
        assert np.diff(a.offsets).tolist() == [1] * (0 if oversize == "skip" else len(costs))


def test_a_loader_with_no_cap_on_its_batch_size_walks_compiled(walk_compiled):
    # sys.maxsize, a common "no cap": i + max_batch_size passed int64 and refused an item as stuck
    lengths = np.arange(1, 3001) % 97 + 1
    for max_batch_size in (sys.maxsize, 2**63 + 1):
        for cost in ("sum", "padded"):
            use_compiled(False)
            loader = FastSizeAwareLoader(torch.arange(3000), lengths, 500, cost=cost, max_batch_size=max_batch_size)
            expected = [batch.tolist() for batch in loader]
            assert use_compiled(wait=True)
            loader.set_epoch(0)
            assert len(loader) == len(expected)
            assert [batch.tolist() for batch in loader] == expected


def test_the_compiled_sum_walk_takes_max_items_up_to_int64s_largest(walk_compiled):
    # the walk itself, called past split_with's clip: max_items + i must not wrap around
    walk = compiled.compiled_sum_walk()
    assert walk is not None
    ones, ends = np.ones((9, 1), dtype=np.int64), np.empty(9, dtype=np.int64)
    count = walk(ones, np.array([4]), False, sys.maxsize, 1, np.zeros(0, dtype=np.bool_), True, ends)
    assert ends[:count].tolist() == [4, 8, 9]


def test_the_compiled_sum_walk_refuses_a_carry_above_a_smaller_cap(walk_compiled):
    carry = split_batches([50, 50], 200, final=False).carry
    with pytest.raises(ValueError, match="item at position 0 of this split costs more than max_total_size"):
        split_batches([1], 10, carry=carry)


@pytest.mark.parametrize("cost", ["padded", "sum"])
def test_the_compiled_walk_at_scale_is_the_numpy_walk(walk_compiled, cost):
    from fastsab.bench import lognormal_lengths

    lengths = lognormal_lengths(200_000, seed=1)
    for multiple in (1, 8):
        a, b = both_walks(lengths, 300 * 150, cost=cost, batch_size_multiple=multiple, max_batch_size=400)
        assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.ids, b.ids)
    # float sums over many items: the numpy walk's tolerance bracket against the compiled running sums
    a, b = both_walks(lengths / 7.0, 300 * 150 / 7.0, cost=cost)
    assert np.array_equal(a.offsets, b.offsets)


def test_the_walk_in_plain_python_is_the_rule():
    # lengths bounds: a batch from i grows while its length stays within its items' bounds
    lengths = np.array([3, 3, 3, 1, 2, 2, 5, 5, 5, 5, 5], dtype=np.int64)
    over = np.zeros(len(lengths), dtype=np.bool_)
    over[3] = True
    ends = np.empty(len(lengths), dtype=np.int64)
    count = _walk_lengths(lengths, over, 1, ends)
    assert ends[:count].tolist() == [3, 4, 6, 11]
    # a full batch longer than the multiple is cut down to it; the rest opens the next one
    count = _walk_lengths(np.full(7, 5, dtype=np.int64), np.zeros(7, dtype=np.bool_), 2, ends)
    assert ends[:count].tolist() == [4, 7]


def test_the_sum_walk_in_plain_python_is_the_rule():
    costs = np.array([[3], [3], [3], [20], [1], [5], [1], [1]], dtype=np.int64)
    caps = np.array([6], dtype=np.int64)
    over = (costs[:, 0] > 6).copy()
    ends = np.empty(len(costs), dtype=np.int64)
    # an oversize item has a batch of its own; a batch grows while its sum stays within the cap
    count = _walk_sums(costs, caps, False, 0, 1, over, True, ends)
    assert ends[:count].tolist() == [2, 3, 4, 6, 8]
    # not final: the batch that reaches the last item stays open
    count = _walk_sums(costs, caps, False, 0, 1, over, False, ends)
    assert ends[:count].tolist() == [2, 3, 4, 6]
    # max_items closes a batch, and a full batch longer than the multiple is cut down to it
    count = _walk_sums(np.ones((7, 1), dtype=np.int64), caps, False, 5, 2, np.zeros(0, dtype=np.bool_), True, ends)
    assert ends[:count].tolist() == [4, 7]
    # float sums are added in item order before the test: 0.1 + 0.2 + 0.3 > 0.6
    tenths = np.array([[0.1], [0.2], [0.3]])
    count = _walk_sums(tenths, np.array([0.6]), True, 0, 1, np.zeros(0, dtype=np.bool_), True, ends)
    assert ends[:count].tolist() == [2, 3]
    # an item that fits in no batch (from a carry) is refused by its position
    assert _walk_sums(costs, caps, False, 0, 1, np.zeros(0, dtype=np.bool_), True, ends) == -1 - 3


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run in a fresh process (a hang guard of 240 s)."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False)


def run_ok(script: str) -> None:
    """Run ``script`` in a fresh process; it must exit with 0."""
    done = run_python(script)
    assert done.returncode == 0, done.stderr


def test_import_fastsab_does_not_import_numba():
    script = "import sys, fastsab, fastsab.plan.compiled; assert 'numba' not in sys.modules, 'numba imported'"
    run_ok(script)


def test_splits_right_after_use_compiled_need_no_compile():
    # a fresh process: use_compiled() returns without waiting, and the splits that follow are
    # exact whichever walk they take (the numpy one until the compile ends)
    pytest.importorskip("numba")
    script = (
        "import numpy as np\n"
        "from fastsab import split_batches\n"
        "from fastsab.plan.compiled import use_compiled\n"
        "lengths = np.arange(1, 3001) % 97 + 1\n"
        "costs = ('padded', 'sum')\n"
        "expected = [split_batches(lengths, 500, cost=cost).offsets.tolist() for cost in costs]\n"
        "assert use_compiled()\n"
        "for _ in range(50):\n"
        "    assert [split_batches(lengths, 500, cost=cost).offsets.tolist() for cost in costs] == expected\n"
        "use_compiled(wait=True)\n"
        "assert [split_batches(lengths, 500, cost=cost).offsets.tolist() for cost in costs] == expected\n"
    )
    run_ok(script)


def test_a_loaders_first_batch_never_waits_for_the_compile():
    # a fresh process whose compile is held until the loaders' epochs are over: they run (on the
    # numpy walks) while it is held, and give the same batches before, during and after it
    pytest.importorskip("numba")
    script = (
        "import threading\n"
        "import numpy as np, torch\n"
        "from fastsab import FastSizeAwareLoader\n"
        "from fastsab.plan import compiled\n"
        "release, real = threading.Event(), compiled._compile\n"
        "def held():\n"
        "    release.wait()\n"
        "    real()\n"
        "compiled._compile = held\n"
        "lengths = np.arange(1, 3001) % 97 + 1\n"
        "loaders = [FastSizeAwareLoader(torch.arange(3000), lengths, 500, cost=cost) for cost in ('sum', 'padded')]\n"
        "expected = [[b.tolist() for b in loader] for loader in loaders]\n"
        "for loader in loaders:\n"
        "    loader.set_epoch(0)\n"
        "assert compiled.use_compiled()\n"
        "assert [[b.tolist() for b in loader] for loader in loaders] == expected\n"
        "assert compiled.compiled_sum_walk() is None and compiled.compiled_walk() is None, 'not held'\n"
        "release.set()\n"
        "assert compiled.use_compiled(wait=True) and compiled.compiled_sum_walk() is not None\n"
        "for loader in loaders:\n"
        "    loader.set_epoch(0)\n"
        "assert [[b.tolist() for b in loader] for loader in loaders] == expected\n"
    )
    run_ok(script)


def test_a_process_that_exits_during_the_compile_exits_cleanly():
    # the compile runs in a daemon thread: an exit while it runs neither waits for it nor crashes
    pytest.importorskip("numba")
    script = "from fastsab.plan.compiled import use_compiled\nassert use_compiled()\nraise SystemExit(3)\n"
    for _ in range(3):
        done = run_python(script)
        assert (done.returncode, done.stderr) == (3, "")


def test_use_compiled_refuses_what_is_not_a_bool():
    with pytest.raises(TypeError, match="enabled must be a bool, got 'yes'"):
        use_compiled("yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait must be a bool, got 1"):
        use_compiled(True, wait=1)  # type: ignore[arg-type]


def test_without_numba_the_numpy_walk_stays(monkeypatch):
    monkeypatch.setattr(compiled.importlib.util, "find_spec", lambda name: None)
    assert use_compiled() is False and compiled.compiled_walk() is None
