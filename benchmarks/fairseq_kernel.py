"""Build fairseq's compiled batching kernel for the bench, from fairseq's own source.

Usage: ``python benchmarks/fairseq_kernel.py`` downloads fairseq's source distribution with
pip (``fairseq==0.12.2``, no dependencies installed), compiles its
``fairseq/data/data_utils_fast.pyx`` with Cython as the module ``fairseq_data_utils_fast`` into
``benchmarks/_build/`` and prints that folder. ``fastsab bench`` finds the module there when
the folder is on ``PYTHONPATH`` (``benchmarks/update_readme.py`` puts it there); nothing of
fairseq is copied into fastsab. Needs Cython, numpy's headers and a C++ compiler; where the
build fails the bench has no fairseq row.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

BUILD = Path(__file__).resolve().parent / "_build"
MODULE = "fairseq_data_utils_fast"
SOURCE = "fairseq==0.12.2"
PYX = "fairseq/data/data_utils_fast.pyx"


def built() -> bool:
    """Whether the module is built in ``BUILD``."""
    return any(BUILD.glob(f"{MODULE}*.so")) or any(BUILD.glob(f"{MODULE}*.pyd"))


def build() -> Path:
    """Build the module into ``BUILD`` (once) and return ``BUILD``; raises ``RuntimeError`` where it cannot."""
    if built():
        return BUILD
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # NOTE: no build isolation: pip reads the source's metadata with the build tools at hand
        # (Cython, numpy, torch) instead of installing them apart
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", SOURCE, "-d", tmp]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode or not archives:
            raise RuntimeError(f"pip could not download {SOURCE}: {done.stderr.strip()[-500:]}")
        with tarfile.open(archives[0]) as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith(PYX)), None)
            if member is None:
                raise RuntimeError(f"{archives[0].name} has no {PYX}")
            source = archive.extractfile(member)
            assert source is not None  # a regular file of the archive
            (BUILD / f"{MODULE}.pyx").write_bytes(source.read())
    setup = (
        "import numpy; from setuptools import Extension, setup; from Cython.Build import cythonize; "
        f"setup(ext_modules=cythonize([Extension({MODULE!r}, [{MODULE + '.pyx'!r}], "
        "include_dirs=[numpy.get_include()], language='c++')], quiet=True), "
        "script_args=['build_ext', '--inplace'])"
    )
    done = subprocess.run([sys.executable, "-c", setup], cwd=BUILD, capture_output=True, text=True, check=False)
    if done.returncode or not built():
        raise RuntimeError(f"could not compile {PYX}: {done.stderr.strip()[-500:]}")
    return BUILD


if __name__ == "__main__":
    print(build())
