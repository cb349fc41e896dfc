"""The extras check: its table covers every integration module, and each module imports with only its extra."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.check_extras import EXTRAS, ROOT, check_imports, integration_modules, missing_rows


def test_the_table_has_a_row_for_every_integration_module():
    # invariant: a new module under fastsab/integrations fails this test until EXTRAS names its extra
    assert missing_rows() == []
    assert set(integration_modules()) >= {"fastsab.integrations.lightning", "fastsab.integrations.webdataset"}


def test_a_module_missing_from_the_table_is_found(tmp_path: Path):
    for name in ("__init__.py", "_private.py", "lightning.py", "webdataset.py", "ray.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "keras.py").write_text("")
    (tmp_path / "_helpers").mkdir()
    (tmp_path / "_helpers" / "ray.py").write_text("")
    assert missing_rows(tmp_path) == [
        "fastsab.integrations.ray",
        "fastsab.integrations.tools",
        "fastsab.integrations.tools.keras",
    ]


def test_every_extra_of_the_table_is_an_extra_of_the_package():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras)


def test_the_core_imports_at_module_level_only_what_the_package_requires():
    # fastsab alone (no extra) must import: each third-party module the core imports as it is
    # imported is one of the package's dependencies (imports inside functions are optional ones)
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {
        re.split(r"[<>=!~\[;\s]", dep, maxsplit=1)[0].lower().replace("-", "_") for dep in project["dependencies"]
    }
    undeclared = {}
    for path in sorted((ROOT / "fastsab").rglob("*.py")):
        if "integrations" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {"fastsab"}:
                if top.lower() not in required:
                    undeclared.setdefault(top, path.relative_to(ROOT).as_posix())
    assert undeclared == {}


def test_every_promised_name_imports_where_every_extra_is_installed():
    assert check_imports(sorted(EXTRAS)) == []


def _printed(script: str) -> str:
    """What ``script`` printed, run by a new interpreter with the checkout's root as its argument."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_webdataset_stages_import_without_lightning():
    # lightning made unimportable, as in an environment with only fastsab[webdataset]
    script = textwrap.dedent(
        """
        import sys
        sys.modules["lightning"] = None
        sys.path.insert(0, sys.argv[1])
        from fastsab.integrations.webdataset import safe_decoder, size_aware_batched
        from tools.check_extras import check_imports

        assert list(size_aware_batched(len, 4)(iter(["ab", "c", "de", "fghij", "k"]))) == [["ab", "c"], ["de", "k"]]
        assert safe_decoder()({"__key__": "a", "y.cls": b"7"}) == {"__key__": "a", "y.cls": 7}
        try:
            from fastsab.integrations.webdataset import WebDataModule
        except ImportError as err:
            print(err)
        assert check_imports(["fastsab.integrations.webdataset"]) == []
        assert check_imports(["fastsab.integrations.lightning"])  # which does need lightning
        """
    )
    assert (
        'WebDataModule is a Lightning data module and needs lightning, which is not installed: pip install "fastsab[lightning]".'
        in _printed(script)
    )


@pytest.mark.slow
def test_the_data_modules_without_webdataset_say_which_extra_they_need():
    # webdataset made unimportable, as in an environment with only fastsab[lightning]
    script = textwrap.dedent(
        """
        import sys
        sys.modules["webdataset"] = None
        sys.path.insert(0, sys.argv[1])
        try:
            from fastsab.integrations.webdataset import PickledDataWDS
        except ImportError as err:
            print(err)
        """
    )
    assert (
        'PickledDataWDS is a Lightning data module and needs webdataset, which is not installed: pip install "fastsab[webdataset]".'
        in _printed(script)
    )
