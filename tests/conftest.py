"""Hypothesis profiles of the test suite, and the import path of the processes it starts.

``default`` is the one CI runs (loaded unless another is chosen); ``long`` runs ten times as
many examples per property (minutes each, past the default per-test timeout):
``python -m pytest tests/test_differential.py --hypothesis-profile=long --timeout=3600``.
Tests scale their own ``max_examples`` by the loaded profile's ``max_examples / 100``.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.reaper import TOKEN_VARIABLE

# NOTE: processes the tests start (DDP workers and scripts run by path, notebook kernels) import
# this checkout's fastsab, as the tests themselves do, whether or not it is installed
_ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))


def _start_reaper() -> None:
    """Mark this run's processes, and leave none behind when it ends (see tests/reaper.py)."""
    if TOKEN_VARIABLE in os.environ:  # a test run started by a test: the outer run's reaper covers it
        return
    token = uuid.uuid4().hex
    reaper = [sys.executable, str(Path(__file__).with_name("reaper.py")), "--detach", token, str(os.getpid())]
    subprocess.run(reaper, check=True, stdin=subprocess.DEVNULL)
    os.environ[TOKEN_VARIABLE] = token


_start_reaper()

# NOTE: no deadline (a loader's first epoch pays for planning, and the machine is shared);
# random seeds, printed with the falsifying example and its reproduction blob on failure.
# No explain phase: its line tracer runs inside the code under test, where the hang guard
# of tests/test_differential.py may raise.
_COMMON = {
    "deadline": None,
    "derandomize": False,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
}

settings.register_profile("default", max_examples=100, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
settings.load_profile("default")


_BENCH = (Path(_ROOT) / "fastsab" / "bench", Path(_ROOT) / "tests" / "bench")


_GPU = Path(_ROOT) / "tests" / "gpu"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The bench's suites and their doctests are benchmarks: they run with ``-m slow``.

    The GPU tests share one device (real out-of-memory errors, peaks): under pytest-xdist they run
    one after another in one worker (``--dist loadgroup``).
    """
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in _BENCH):
            item.add_marker(pytest.mark.slow)
        if item.path.is_relative_to(_GPU):
            item.add_marker(pytest.mark.xdist_group("gpu"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what was imported and collected out of every later garbage collection.

    NOTE: torch, transformers, Lightning and the collected tests are some 500,000 objects, and a full
    ``gc.collect()`` walks them all (0.2 s and more a call). The code under test collects after
    every out-of-memory error (``adaptive``'s retries, ``max_batch_sizes``' search); frozen, those
    collections walk only what the tests made. Nothing frozen was ever garbage.
    """
    gc.freeze()
