"""The memory budgets recipe (docs/recipes/memory-budgets.md): its code runs, and does what the page says."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from fastsab.memory import measure_batches
from tests.docs_pages import DOCS, page_script

# NOTE: the page measures a small model's steps on whole batches: tens of seconds on a loaded machine
pytestmark = pytest.mark.slow

PAGE = "recipes/memory-budgets.md"


@pytest.fixture(scope="module")
def run() -> tuple[dict[str, Any], str]:
    """The page's code run once, as one script: its names and what it printed."""
    import contextlib
    import io

    names: dict[str, Any] = {"__name__": "memory_budgets_page"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(page_script(PAGE), PAGE, "exec"), names)
    return names, printed.getvalue()


def test_the_batch_level_model_covers_every_measured_batch_and_says_so(run: tuple[dict[str, Any], str]) -> None:
    names, printed = run
    model, calibration, peaks = names["model"], names["calibration"], names["peaks"]
    assert len(calibration) == 12 and (model.predict(calibration.features) >= np.array(peaks)).all()
    assert model.advice in printed and model.advice.endswith("nothing to do.")


def test_no_planned_batch_goes_over_the_budget_and_they_fill_it(run: tuple[dict[str, Any], str]) -> None:
    names, _ = run
    step, lengths, budget = names["step"], names["lengths"], names["budget"]
    planned = [np.asarray(ids) for ids in names["loader"]]
    # every item once, in batches whose measured peak stays within the budget
    assert sorted(np.concatenate(planned).tolist()) == list(range(len(lengths)))
    used = np.array(measure_batches(lambda ids: step(lengths[ids]), planned)) / budget
    assert (used <= 1).all()
    # full batches (all but the last) fill most of it, and far more than the per-item model's
    assert np.median(used) >= 0.9
    assert names["used"].mean() > names["used_per_item"].mean() + 0.2


def test_the_figures_on_the_page_are_the_ones_the_run_printed(run: tuple[dict[str, Any], str]) -> None:
    _, printed = run
    page = (DOCS / PAGE).read_text()
    quoted = re.findall(r"`(\d+ batches; the first 10 use [^`]+)`", page)
    assert len(quoted) == 2
    assert all(line in printed.splitlines() for line in quoted), printed
