"""The code of the pages under ``docs/``, for the tests that run it.

A page's examples are its fenced ``python`` blocks. A block that starts with a comment line
``# file: NAME`` is a script to be written as ``NAME`` and run as a process (by
``torchrun`` or ``python``): ``page_files`` gives those. The other blocks are run in order
as one script: ``page_script`` joins them.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_FILE = re.compile(r"\A# file: (\S+)\n")


def python_blocks(page: str) -> list[str]:
    """The fenced ``python`` blocks of ``docs/<page>``, in order."""
    return _BLOCK.findall((DOCS / page).read_text())


def page_files(page: str) -> dict[str, str]:
    """The blocks of ``page`` that name a file (``# file: NAME``), by name."""
    files = {}
    for block in python_blocks(page):
        match = _FILE.match(block)
        if match:
            files[match.group(1)] = block
    return files


def page_script(page: str) -> str:
    """The blocks of ``page`` that name no file, joined into one script."""
    return "\n".join(block for block in python_blocks(page) if not _FILE.match(block))
