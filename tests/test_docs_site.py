"""The documentation site: every page's code runs and prints what the page says, the site builds.

A page promises a result by a comment ``# -> OUTPUT`` on the line of a ``print`` (or on the line
after it, for a long output): the tests run the page's ``python`` blocks as one script and compare
its printed lines with those comments, in order.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import DOCS, page_script

ROOT = DOCS.parent
_PROMISE = re.compile(r"#\s->\s(.*)$")

# NOTE: the pages of the site that this suite runs; the recipes and the trainer pages have tests of their own
PAGES = [
    "index.md",
    "getting-started.md",
    "concepts.md",
    "coming-from/dataloader.md",
    "coming-from/bionemo.md",
    "coming-from/toma.md",
    "coming-from/fairseq.md",
    "coming-from/lhotse.md",
    "coming-from/megatron.md",
    "coming-from/mosaic-streaming.md",
    "coming-from/interleave-datasets.md",
]


def promised_lines(script: str) -> list[str]:
    """The outputs a script promises, in order: the ``# -> OUTPUT`` comments of its lines."""
    return [match.group(1).rstrip() for line in script.splitlines() if (match := _PROMISE.search(line))]


def run_script(script: str, cwd: Path) -> list[str]:
    """The lines ``script`` prints, run as a process in ``cwd``."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    return [line.rstrip() for line in done.stdout.splitlines()]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_prints_what_it_promises(page, tmp_path):
    script = page_script(page)
    promised = promised_lines(script)
    assert promised, f"{page} promises no output"
    assert run_script(script, tmp_path) == promised


def test_promises_are_read_from_the_print_lines():
    script = 'print(1 + 1)  # -> 2\nx = 3  # a comment\nprint("a", x)\n# -> a 3\n'
    assert promised_lines(script) == ["2", "a 3"]
    assert run_script(script, ROOT) == ["2", "a 3"]


def nav_pages(entries: list[object]) -> list[str]:
    """The page paths of a ``nav`` of mkdocs.yml, in order."""
    pages: list[str] = []
    for entry in entries:
        values = list(entry.values()) if isinstance(entry, dict) else [entry]
        for value in values:
            pages += nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_every_page_of_the_nav_exists_and_every_page_is_in_the_nav():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed))
    assert [page for page in listed if not (DOCS / page).is_file()] == []
    assert sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")) == sorted(listed)


def test_readme_is_short_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / page).is_file(), page


def update_readme():
    """The module of ``benchmarks/update_readme.py``."""
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "benchmarks" / "update_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_headline_is_generated_from_the_tables_of_the_docs():
    tables = update_readme()
    page = (DOCS / "benchmarks.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for markers in (tables.BENCH, tables.VARLEN, tables.FIDELITY, tables.SHAPES, tables.WORKERS):
        assert "|---|" in tables.section(page, markers, "benchmarks.md")
    headline = tables.headline(tables.section(page, tables.BENCH, "benchmarks.md"))
    assert headline in tables.section(readme, tables.HEADLINE, "README.md")
    rows = headline.splitlines()
    assert rows[0].startswith("Measured on ") and "torch" in rows[0]
    methods = [row.split("|")[2].strip() for row in rows[4:]]
    assert methods[:6] == [
        "numpy permutation+reshape (floor)",
        "DataLoader, __getitem__ per item",
        "DataLoader + __getitems__",
        "FastLoader",
        "SizeAwareBatchSampler(callable) + DataLoader",
        "FastSizeAwareLoader",
    ]
    # the compiled split's row is there when the machine that measured had numba
    assert methods[6:] in ([], ["FastSizeAwareLoader (use_compiled)"])


def test_the_headline_keeps_the_ratios_of_the_loaders_table():
    bench = (
        "Measured on a machine.\n\n**loaders** (x baseline = ...)\n\n"
        "| workload | method | ms | x baseline | speed-up | note |\n|---|---|---:|---:|---:|---|\n"
        "| seed loop | floor | 4 | 1 | 100x | 10 batches |\n| seed loop | FastLoader | 5 | 1.25 | 80x | 10 batches |\n"
        "\n**per-batch** (...)\n\n| workload | method | ms | x baseline | speed-up | note |\n"
    )
    assert update_readme().headline(bench).splitlines()[2:] == [
        "| workload | method | x numpy floor | speed-up over DataLoader |",
        "|---|---|---:|---:|",
        "| seed loop | floor | 1 | 100x |",
        "| seed loop | FastLoader | 1.25 | 80x |",
    ]


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    done = subprocess.run(
        # NOTE: not -q, which hides the warnings that --strict fails on
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "api" / "fastsab" / "index.html").is_file()


def _quickstart(text: str) -> list[str]:
    """The command lines of the ``bash`` block between a page's quickstart markers (as .ci/run reads them)."""
    block = text.split("<!-- quickstart:start -->\n", 1)[1].split("<!-- quickstart:end -->", 1)[0]
    return [line for line in block.splitlines() if not line.startswith("```")]


def test_the_quickstart_is_two_lines_and_the_install_page_gives_the_same():
    readme = _quickstart((ROOT / "README.md").read_text())
    assert len(readme) == 2 and "fastsab bench" in readme[0] and readme[1].startswith("python -m pytest")
    page = (DOCS / "getting-started.md").read_text()
    install = page.split("## Install\n\n```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert install == readme


def test_the_test_extra_installs_every_extra_and_the_peers_the_tests_import():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [own, *peers] = extras["test"]
    # invariant: a new extra (or one the tests come to need) is in the test extra, or named here as left out
    assert set(own.removeprefix("fastsab[").removesuffix("]").split(",")) == set(extras) - {"test", "bench"}
    assert set(extras["bench"]) <= set(extras["dev"])
    imported = {"toma": "toma", "bionemo-size-aware-batching": "bionemo.size_aware_batching"}
    for peer in peers:
        name = peer.split("==")[0]
        assert importlib.util.find_spec(imported[name]) is not None, f"the test extra's {name} is not installed"
