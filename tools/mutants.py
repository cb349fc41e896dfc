"""Mutation testing of fastsab's planning, resuming and dealing code: do the tests notice a small bug?

Single-token mutants are generated with ``ast``: comparisons (``<``/``<=``, ``>``/``>=``, ``==``/``!=``,
``is``/``is not``, ``in``/``not in``), ``+``/``-``, removal of ``+ 1``/``- 1``, integer constants (0/1
swapped, n to n + 1), ``and``/``or``, removal of ``not``, slice bounds +/- 1, ``True``/``False``,
``min``/``max``, dropped statements (``self.x = ...`` outside ``__init__``, ``x += ...``, ``continue``);
mutants that unparse to the original or to another mutant are left out. Beyond ``--max`` per file a
seeded sample runs, comparisons and off-by-ones first. Each mutant is written over its file, the tests run
in a fresh process without bytecode cache (the test files likeliest to fail for the module first, ``-x``,
then the others and the module's doctests) and the file is restored, always (also on Ctrl-C or
SIGTERM); at the end ``git diff`` must be as before. Results: *killed* (the table names the failing
test), *survived*, *timeout*. The unmutated code must pass the same tests first. Usage::

    python tools/mutants.py                                    # the default targets, 60 per file
    python tools/mutants.py --files fastsab/position/stream.py:Stream --max 20  # path[:top-level names]
    python tools/mutants.py --files fastsab/plan/shuffle.py --list  # the mutants, without running them
    python tools/mutants.py --files fastsab/position/cursor.py --match "cursor.py:147 "  # one line's mutants
    python tools/mutants.py --tests tests/position/test_cursor.py -k "not real_ddp"
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [
    "fastsab/plan/epochs.py:EpochOrder",
    "fastsab/position/stats.py:EpochStats",
    "fastsab/plan/fixed_size.py:FixedSizePlanner,FixedSizeEpoch",
    "fastsab/plan/planners.py:SizeAwarePlanner,SizeAwareEpoch",
    "fastsab/plan/costs.py:BatchCost",
    "fastsab/plan/plans.py",
    "fastsab/position/cursor.py",
    "fastsab/position/distributed.py:assign_steps,_window_starts,step_spread",
    "fastsab/plan/shuffle.py:GroupedPermutation",
]
DEFAULT_TESTS = [
    f"tests/{name}.py"
    for name in (
        "plan/test_costs",
        "plan/test_planners",
        "position/test_cursor",
        "position/test_distributed",
        "loaders/test_loader",
        "plan/test_shuffle",
        "adaptive/test_adaptive",
    )
]
# NOTE: real DDP processes are slow, and of test_adaptive.py only the tests with a loader reach the planners
DEFAULT_KEYWORD = "not real_ddp and not (test_adaptive.py and not loader and not ranks_split and not lower_limit)"
# the test files that run first for a module (most likely to fail fast), then the others in the given order
FIRST = {"epochs": "loader cursor adaptive", "plans": "loader cursor distributed", "cursor": "cursor distributed"}
FIRST |= {"planners": "planners loader cursor adaptive", "distributed": "distributed cursor"}
FIRST |= {"fixed_size": "planners loader cursor adaptive", "stats": "loader cursor adaptive"}
FIRST |= {"shuffle": "shuffle loader", "costs": "costs planners loader"}
PAIRS = [("<", ast.Lt, "<=", ast.LtE), (">", ast.Gt, ">=", ast.GtE), ("==", ast.Eq, "!=", ast.NotEq)]
PAIRS += [("is", ast.Is, "is not", ast.IsNot), ("in", ast.In, "not in", ast.NotIn), ("+", ast.Add, "-", ast.Sub)]
PAIRS += [("and", ast.And, "or", ast.Or)]
SWAP = {a: (sa, b, sb) for sa, a, sb, b in PAIRS} | {b: (sb, a, sa) for sa, a, sb, b in PAIRS}
PRIORITY = {"compare": 0, "slice": 0, "off-by-one": 0, "constant": 1, "min/max": 1, "bool": 1, "not": 1}
PRIORITY |= {"arith": 2, "drop": 3}


def _in_scope(tree: ast.Module, names: list[str] | None) -> list[tuple[int, int]]:
    """Line ranges of the top-level definitions ``names`` (the whole file if ``None``)."""
    tops = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    if names is None:
        return [(1, 10**9)]
    if set(names) - set(tops):
        raise SystemExit(f"error: no top-level class or function {sorted(set(names) - set(tops))}.")
    return [(tops[name].lineno, tops[name].end_lineno or 10**9) for name in names]


def _sites(node: ast.AST) -> list[tuple[str, str, tuple]]:
    """``(kind, description, how)`` of every mutation of ``node`` itself."""
    if isinstance(node, ast.Compare):
        return [("compare", f"{SWAP[type(op)][0]} -> {SWAP[type(op)][2]}", ("op", i)) for i, op in enumerate(node.ops)]
    if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAP:
        old, _, new = SWAP[type(node.op)]
        out = [("arith" if isinstance(node, ast.BinOp) else "bool", f"{old} -> {new}", ("op", None))]
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant) and node.right.value == 1:
            out.append(("off-by-one", f"{ast.unparse(node)} -> {ast.unparse(node.left)}", ("replace", "left")))
        return out
    if isinstance(node, ast.Constant) and type(node.value) in (bool, int):
        new = (not node.value) if type(node.value) is bool else {0: 1, 1: 0}.get(node.value, node.value + 1)
        return [("bool" if type(new) is bool else "constant", f"{node.value} -> {new}", ("value", new))]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = ast.unparse(node.operand)
        return [("not", f"not {operand} -> {operand}", ("replace", "operand"))]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
        new = "max" if node.func.id == "min" else "min"
        return [("min/max", f"{node.func.id}(...) -> {new}(...)", ("func", new))]
    if isinstance(node, ast.Slice):
        bounds = [(b, getattr(node, b)) for b in ("lower", "upper") if getattr(node, b) is not None]
        bounds = [(b, v) for b, v in bounds if not isinstance(v, ast.Constant)]  # constants are mutated as such
        return [
            ("slice", f"[{b}: {ast.unparse(v)}] -> {ast.unparse(v)} {s} 1", ("bound", b, op))
            for b, v in bounds
            for s, op in (("+", ast.Add), ("-", ast.Sub))
        ]
    if isinstance(node, (ast.Continue, ast.AugAssign)) or (
        isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
    ):
        return [("drop", f"drop `{ast.unparse(node).splitlines()[0][:55]}`", ("replace", None))]
    return []


def _apply(tree: ast.Module, index: int, how: tuple) -> None:
    """Apply mutation ``how`` to the ``index``-th node (in ``ast.walk`` order) of ``tree``."""
    nodes = list(ast.walk(tree))
    node, action = nodes[index], how[0]
    if action == "op" and how[1] is None:
        node.op = SWAP[type(node.op)][1]()
    elif action == "op":
        node.ops[how[1]] = SWAP[type(node.ops[how[1]])][1]()
    elif action == "value":
        node.value = how[1]
    elif action == "func":
        node.func.id = how[1]
    elif action == "bound":
        setattr(node, how[1], ast.BinOp(getattr(node, how[1]), how[2](), ast.Constant(1)))
    else:  # replace the node by one of its fields, or a statement by `pass`
        new = getattr(node, how[1]) if how[1] else ast.Pass()
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, new)
                elif isinstance(value, list) and any(v is node for v in value):
                    value[[v is node for v in value].index(True)] = new


def mutants(path: str, names: list[str] | None, max_count: int, seed: int) -> tuple[list[dict], int]:
    """The (sampled) mutants of a file, in line order, and how many distinct ones there are."""
    source = (ROOT / path).read_text()
    tree = ast.parse(source)
    ranges = _in_scope(tree, names)
    # NOTE: the 1 of `x + 1` is not made 0 (that is the removal of `+ 1`), and __init__ keeps its
    # statements (an attribute never set fails every test at once)
    ones = {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))}
    inits = [(n.lineno, n.end_lineno or 0) for n in ast.walk(tree) if getattr(n, "name", "") == "__init__"]
    seen, found = {ast.unparse(tree)}, []
    for index, node in enumerate(ast.walk(tree)):
        line = getattr(node, "lineno", 0)
        if not any(a <= line <= b for a, b in ranges) or (id(node) in ones and getattr(node, "value", 0) == 1):
            continue
        for kind, text, how in _sites(node):
            if kind == "drop" and any(a <= line <= b for a, b in inits):
                continue
            mutated = ast.parse(source)
            _apply(mutated, index, how)
            code = ast.unparse(mutated)
            if code not in seen:
                seen.add(code)
                found.append({"path": path, "line": line, "kind": kind, "text": text, "source": code + "\n"})
    rng = random.Random(seed)
    ranked = sorted(found, key=lambda m: (PRIORITY[m["kind"]], rng.random()))
    return sorted(ranked[:max_count], key=lambda m: (m["line"], m["text"])), len(found)


def run_tests(modules: list[str], tests: list[str], keyword: str, timeout: float) -> tuple[str, str, float]:
    """``(result, failed test, seconds)`` of the tests, those of the first module first."""
    first = [f"test_{name}" for name in FIRST.get(Path(modules[0]).stem, Path(modules[0]).stem).split()]
    rank = {t: first.index(Path(t.split("::")[0]).stem) for t in tests if Path(t.split("::")[0]).stem in first}
    own = sorted(rank, key=rank.__getitem__)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "--timeout", "60"]
    command += ["-k", keyword] if keyword else []
    command += own + [t for t in tests if t not in own] + modules
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=tempfile.mkdtemp(prefix="mutants-"))
    start = time.monotonic()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **pipes)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.monotonic() - start
    finally:
        if process.poll() is None:  # timed out or interrupted: end the test run we started
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    result = "survived" if process.returncode == 0 else "timeout" if "+ Timeout +" in output else "killed"
    return result, failed.group(1) if failed else "", time.monotonic() - start


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so that the finally clauses restore the files


def _git_diff(paths: list[str]) -> str:
    return subprocess.run(["git", "diff", "--", *paths], cwd=ROOT, capture_output=True, text=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", nargs="+", default=DEFAULT_FILES, help="targets: path or path:Name,Name")
    parser.add_argument("--max", type=int, default=60, help="mutants per file at most (a sample beyond)")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="test files to run")
    parser.add_argument("-k", dest="keyword", default=DEFAULT_KEYWORD, help="pytest -k expression")
    parser.add_argument("--match", default="", help="only mutants whose 'file:line mutation' contains this")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test run")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args()
    chosen = []
    for target in args.files:
        path, _, names = target.partition(":")
        picked, total = mutants(path, names.split(",") if names else None, args.max, args.seed)
        picked = [m for m in picked if args.match in f"{Path(path).name}:{m['line']} {m['text']}"]
        print(f"{path}: {total} mutants, {len(picked)} chosen", flush=True)
        chosen += picked
    if args.list or not chosen:
        for m in chosen:
            print(f"{Path(m['path']).name}:{m['line']:<5} {m['kind']:<10} {m['text']}")
        return 0
    paths = list(dict.fromkeys(m["path"] for m in chosen))
    result, failed, elapsed = run_tests(paths, args.tests, args.keyword, args.timeout)
    print(f"baseline: {result} {failed} in {elapsed:.0f} s", flush=True)
    if result != "survived":
        raise SystemExit("error: the tests fail on the unmutated code; fix them or leave them out with -k.")
    signal.signal(signal.SIGTERM, _interrupt)
    counts: dict[str, int] = {}
    diff_before, originals = _git_diff(paths), {path: (ROOT / path).read_bytes() for path in paths}
    try:
        for number, m in enumerate(chosen, 1):
            (ROOT / m["path"]).write_text(m["source"])
            try:
                result, failed, elapsed = run_tests([m["path"]], args.tests, args.keyword, args.timeout)
            finally:
                (ROOT / m["path"]).write_bytes(originals[m["path"]])
            counts[result] = counts.get(result, 0) + 1
            where = f"{Path(m['path']).name}:{m['line']}"
            print(f"{number:>3}/{len(chosen)} {where:<17} {m['text'][:64]:<64} {result:<8} {elapsed:4.0f} s {failed}")
            sys.stdout.flush()
    finally:
        for path, data in originals.items():
            (ROOT / path).write_bytes(data)
        same = all((ROOT / p).read_bytes() == d for p, d in originals.items()) and _git_diff(paths) == diff_before
        print("restored: " + ("yes, git diff as before the run" if same else "NO: check git diff"), flush=True)
    print("summary: " + ", ".join(f"{count} {result}" for result, count in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)  # the files were restored on the way out
