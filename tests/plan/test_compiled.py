"""The compiled walk of padded splits (``fastsab.plan.compiled``): the numpy walk's batches, never waited for."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsab import split_batches
from fastsab.plan import compiled
from fastsab.plan.compiled import _walk_lengths, use_compiled

pytestmark = pytest.mark.filterwarnings("ignore:.*larger than max_total_size:UserWarning")


@pytest.fixture(scope="module")
def walk_compiled():
    """The compiled walk, compiled; the numpy walk again after the test. Skipped without numba."""
    pytest.importorskip("numba")
    assert use_compiled(wait=True)
    yield
    use_compiled(False)


def both_walks(*args, **kwargs):
    """The split of ``split_batches(*args, **kwargs)`` by the numpy walk, then by the compiled one."""
    use_compiled(False)
    numpy_split = split_batches(*args, **kwargs)
    assert use_compiled(wait=True) and compiled.compiled_walk() is not None
    return numpy_split, split_batches(*args, **kwargs)


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
        a, b = both_walks(costs, caps, final=final, **options)
        assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()
        assert a.skipped.tolist() == b.skipped.tolist() and a.dropped.tolist() == b.dropped.tolist()
        assert (a.carry is None) == (b.carry is None)
        if a.carry is not None and b.carry is not None:
            assert a.carry.ids.tolist() == b.carry.ids.tolist()
    first, _ = both_walks(costs[:cut], caps, final=False, **options)
    a, b = both_walks(costs[cut:], caps, ids=np.arange(cut, len(costs)), carry=first.carry, **options)
    assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()


def test_the_compiled_walk_at_scale_is_the_numpy_walk(walk_compiled):
    from fastsab.bench import lognormal_lengths

    lengths = lognormal_lengths(200_000, seed=1)
    for multiple in (1, 8):
        a, b = both_walks(lengths, 300 * 150, cost="padded", batch_size_multiple=multiple, max_batch_size=400)
        assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.ids, b.ids)


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


def test_import_fastsab_does_not_import_numba():
    script = "import sys, fastsab, fastsab.plan.compiled; assert 'numba' not in sys.modules, 'numba imported'"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_splits_right_after_use_compiled_need_no_compile():
    # a fresh process: use_compiled() returns without waiting, and the splits that follow are
    # exact whichever walk they take (the numpy one until the compile ends)
    pytest.importorskip("numba")
    script = (
        "import numpy as np\n"
        "from fastsab import split_batches\n"
        "from fastsab.plan.compiled import use_compiled\n"
        "lengths = np.arange(1, 3001) % 97 + 1\n"
        "expected = split_batches(lengths, 500, cost='padded').offsets.tolist()\n"
        "assert use_compiled()\n"
        "for _ in range(50):\n"
        "    assert split_batches(lengths, 500, cost='padded').offsets.tolist() == expected\n"
        "use_compiled(wait=True)\n"
        "assert split_batches(lengths, 500, cost='padded').offsets.tolist() == expected\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr


def test_a_process_that_exits_during_the_compile_exits_cleanly():
    # the compile runs in a daemon thread: an exit while it runs neither waits for it nor crashes
    pytest.importorskip("numba")
    script = "from fastsab.plan.compiled import use_compiled\nassert use_compiled()\nraise SystemExit(3)\n"
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False)
        assert (done.returncode, done.stderr) == (3, "")


def test_use_compiled_refuses_what_is_not_a_bool():
    with pytest.raises(TypeError, match="enabled must be a bool, got 'yes'"):
        use_compiled("yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait must be a bool, got 1"):
        use_compiled(True, wait=1)  # type: ignore[arg-type]


def test_without_numba_the_numpy_walk_stays(monkeypatch):
    monkeypatch.setattr(compiled.importlib.util, "find_spec", lambda name: None)
    assert use_compiled() is False and compiled.compiled_walk() is None
