"""``tools/mutants.py`` finds its default targets and tests where the package and the tests keep them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_targets_and_tests_exist():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mutants
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert [test for test in mutants.DEFAULT_TESTS if not (ROOT / test).is_file()] == []
    assert [target for target in mutants.DEFAULT_FILES if not (ROOT / target.partition(":")[0]).is_file()] == []


@pytest.mark.slow
def test_listing_the_default_mutants_finds_every_named_definition():
    out = subprocess.run(
        [sys.executable, "tools/mutants.py", "--list", "--max", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(" mutants, 1 chosen") == 9
