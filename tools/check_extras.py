"""Each extra gives the integration modules it promises, in an environment with only that extra installed.

:data:`EXTRAS` is the one table: integration module -> the extra (``pip install "fastsab[extra]"``) it
needs. For each extra this makes a virtual environment (``python -m venv``) with ``torch==2.13.0`` and
the fastsab wheel with that extra, and imports its modules there: every name of a module's ``__all__``
must import, and every name of its ``OTHER_EXTRAS`` (name -> the other extra it needs) must import or
raise an ``ImportError`` that says ``pip install "fastsab[that extra]"``. Anything else fails the check,
with the error and the output of the installs.

Installing torch is most of the time, so it is installed once, in a base environment whose packages
each extra's environment sees through a ``.pth`` file; the fastsab wheel is built once too. The
environments are made in memory (``/dev/shm``) where it has room. About a minute in all on two busy
cores for the two extras of today.

A new integration module needs one row in :data:`EXTRAS` (``tests/test_check_extras.py`` fails until
it has one), and nothing else. Usage::

    python tools/check_extras.py                      # every extra of the table
    python tools/check_extras.py --extra webdataset   # one extra (repeatable)
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Integration module -> the extra that must be enough to import it.
EXTRAS: dict[str, str] = {
    "fastsab.integrations.accelerate": "accelerate",
    "fastsab.integrations.lightning": "lightning",
    "fastsab.integrations.transformers": "transformers",
    "fastsab.integrations.webdataset": "webdataset",
}

#: Installed before the extra: a bare ``torch`` could pull a CUDA build of several GB.
TORCH = "torch==2.13.0"
ROOT = Path(__file__).resolve().parent.parent
INTEGRATIONS = ROOT / "fastsab" / "integrations"


def integration_modules(folder: Path = INTEGRATIONS) -> list[str]:
    """The public modules under ``folder`` (``fastsab/integrations``), by their dotted names.

    A module or package whose name starts with ``_`` is private: it is checked through the
    public modules that import it.
    """
    package = "fastsab.integrations"
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and not any(part.startswith("_") for part in parts):
            names.append(".".join((package, *parts)))
    return names


def missing_rows(folder: Path = INTEGRATIONS) -> list[str]:
    """The public integration modules under ``folder`` that :data:`EXTRAS` has no row for."""
    return [module for module in integration_modules(folder) if module not in EXTRAS]


def check_imports(modules: list[str]) -> list[str]:
    """Import ``modules`` and their names here; the problems found (printing what was checked)."""
    problems = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception as err:
            problems.append(f"import {module_name}: {type(err).__name__}: {err}")
            continue
        for name in getattr(module, "__all__", []):
            try:
                getattr(module, name)
            except Exception as err:
                problems.append(f"{module_name}.{name}: {type(err).__name__}: {err}")
        for name, extra in getattr(module, "OTHER_EXTRAS", {}).items():
            try:
                getattr(module, name)
            except ImportError as err:
                wanted = f'pip install "fastsab[{extra}]"'
                if wanted not in str(err):
                    problems.append(f"{module_name}.{name}: the ImportError does not say {wanted}: {err}")
                else:
                    print(f"  {module_name}.{name}: needs fastsab[{extra}], says so")
            except Exception as err:
                problems.append(f"{module_name}.{name}: {type(err).__name__}: {err}")
        print(f"  {module_name}: imported, names {sorted(getattr(module, '__all__', []))}")
    return problems


def _python(venv: Path) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / "python"


def _run(command: list[str | Path], what: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command``; exit with its output if it fails."""
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"check_extras: {what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def _pip(base: Path, venv: Path, *args: str | Path) -> list[str | Path]:
    """``pip install args`` into ``venv``, run by the pip of ``base`` (``venv`` has none of its own)."""
    # NOTE: --no-compile: byte-compiling every file of torch took two thirds of its install; the
    # check imports a few modules, compiled as they are imported
    return [
        _python(base),
        "-m",
        "pip",
        "--python",
        _python(venv),
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--no-compile",
        *args,
    ]


def _site_packages(venv: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(_run([_python(venv), "-c", code], "reading site-packages", venv).stdout.strip())


def check_extra(extra: str, modules: list[str], base: Path, wheel: Path, work: Path) -> bool:
    """Install ``extra`` in a new environment over ``base`` and check its ``modules`` there; whether they passed."""
    start = time.perf_counter()
    venv = work / f"venv-{extra}"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "python -m venv", work)
    # NOTE: the environment sees the packages of the one with torch through a .pth file (pip
    # counts them as installed, and installs into this one what the extra needs, an upgrade
    # there included, ahead of them on sys.path): installing torch takes a minute, copying
    # its environment (a GB of small files) as long on a busy disk
    (_site_packages(venv) / "fastsab-torch.pth").write_text(f"{_site_packages(base)}\n")
    _run(_pip(base, venv, f"{wheel}[{extra}]"), f'pip install "fastsab[{extra}]"', work)
    print(f"fastsab[{extra}]: {', '.join(modules)}")
    # NOTE: run from the work folder, so that fastsab is the installed wheel and not the checkout
    done = subprocess.run(
        [str(_python(venv)), str(Path(__file__).resolve()), "--imports", *modules],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    print(done.stdout + done.stderr, end="")
    print(f"fastsab[{extra}]: {'ok' if done.returncode == 0 else 'FAILED'} ({time.perf_counter() - start:.0f} s)")
    return done.returncode == 0


def _memory_folder(needed_bytes: int = 4 * 2**30) -> str | None:
    """``/dev/shm`` where it is a memory file system with room and allows programs, else ``None`` (the default)."""
    # NOTE: the environments are a GB of small files: on a disk mounted with `discard`, removing
    # them took a minute; in memory it takes no time
    try:
        stats = os.statvfs("/dev/shm")
    except (AttributeError, OSError):
        return None
    roomy = stats.f_bavail * stats.f_frsize >= needed_bytes
    return "/dev/shm" if roomy and not stats.f_flag & getattr(os, "ST_NOEXEC", 0) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", action="append", help="check only this extra (repeatable)")
    parser.add_argument("--imports", nargs="+", help=argparse.SUPPRESS)  # run inside an extra's environment
    args = parser.parse_args(argv)
    if args.imports:
        problems = check_imports(args.imports)
        for problem in problems:
            print(f"  FAILED: {problem}")
        return 1 if problems else 0
    by_extra: dict[str, list[str]] = {}
    for module, extra in EXTRAS.items():
        by_extra.setdefault(extra, []).append(module)
    unknown = sorted(set(args.extra or ()) - set(by_extra))
    if unknown:
        parser.error(f"--extra must be one of {sorted(by_extra)}, got {unknown}")
    chosen = {extra: modules for extra, modules in by_extra.items() if not args.extra or extra in args.extra}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastsab-extras-", dir=_memory_folder()) as folder:
        work = Path(folder)
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", work, ROOT], "building fastsab", work)
        (wheel,) = work.glob("fastsab-*.whl")
        base = work / "venv-torch"
        _run([sys.executable, "-m", "venv", base], "python -m venv", work)
        _run(_pip(base, base, TORCH), f"pip install {TORCH}", work)
        print(f"base environment with {TORCH}: {time.perf_counter() - start:.0f} s")
        failed = [extra for extra, modules in chosen.items() if not check_extra(extra, modules, base, wheel, work)]
        print(f"checks done: {time.perf_counter() - start:.0f} s; removing the environments")
    print(f"check_extras: {len(chosen) - len(failed)} of {len(chosen)} extras ok ({time.perf_counter() - start:.0f} s)")
    if failed:
        print(f"check_extras: FAILED: {', '.join(f'fastsab[{extra}]' for extra in failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
