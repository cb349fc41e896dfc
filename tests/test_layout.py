"""The package's layout: imports run one way through the stages, with no circles, in small modules.

Every import of a ``fastsab`` module is read from the source (also those inside functions, under
``TYPE_CHECKING`` and by ``importlib.import_module`` of a literal name), so a wrong import fails here
whether or not it runs.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fastsab"
ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"

#: The stages from the bottom up: a module imports from its own stage or from those below it.
#: ``loaders -> fetch -> position -> plan`` is a batch's walk; the rest build on the loaders.
STAGES = (
    "_arrays",
    "_checks",
    "plan",
    "position",
    "fetch",
    "varlen",
    "loaders",
    "adaptive",
    "memory",
    "out_of_core",
    "bionemo",
    # on top: the core never imports them
    "integrations",
    "compat",
    "bench",
    "cli",
    "feeder",  # the former module paths: fastsab.feeder, fastsab.collate, fastsab.oom
    "collate",
    "oom",
    "__main__",
    "__init__",
)
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> str:
    """``fastsab.plan.costs`` -> ``plan``; ``fastsab`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(name: str) -> str:
    """The module that ``import name`` or ``from name import ...`` reads: the longest known prefix."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str, source: str | None = None) -> set[str]:
    """The fastsab modules ``module`` imports anywhere in its source."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{module} has a relative import; the package imports by absolute paths")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fastsab":
            found |= {resolve(f"{node.module}.{alias.name}") for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {resolve(alias.name) for alias in node.names if alias.name.split(".")[0] == "fastsab"}
        elif (name := imported_by_call(node)) is not None:
            found.add(resolve(name))
    return found - {module}


def imported_by_call(node: ast.AST) -> str | None:
    """The module that ``importlib.import_module("fastsab...")`` or ``__import__("fastsab...")`` imports."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    name = node.args[0]
    if function not in ("import_module", "__import__") or not isinstance(name, ast.Constant):
        return None
    return name.value if isinstance(name.value, str) and name.value.split(".")[0] == "fastsab" else None


def wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports that run up the stages (the core into what sits on top among them)."""
    return [
        f"{module} imports {target}: {stage(module)}/ sits below {stage(target)}/"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if STAGES.index(stage(target)) > STAGES.index(stage(module))
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (strongly connected parts of more than one module, or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while not part or part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {module: imports(module) for module in MODULES}


def test_every_module_belongs_to_a_stage():
    # invariant: a new folder or top-level module is placed in the order before it is used
    assert sorted({stage(module) for module in MODULES} - set(STAGES)) == []


def test_imports_run_down_the_stages_and_never_into_what_sits_on_top(graph):
    # invariant: loaders -> fetch -> position -> plan; integrations, compat, bench and the CLI on top
    assert wrong_imports(graph) == []


def test_integrations_are_imported_only_by_integrations(graph):
    outside = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if stage(target) == "integrations" and stage(module) != "integrations"
    ]
    assert outside == []


def test_there_are_no_import_circles(graph):
    assert cycles(graph) == []


def test_every_module_is_at_most_400_lines():
    long = {module: n for module, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        ("fastsab.plan.costs", "from fastsab.loaders.loader import FastLoader", "plan/ sits below loaders/"),
        ("fastsab.position.cursor", "import fastsab.fetch.fetcher", "position/ sits below fetch/"),
        ("fastsab.loaders.loader", "from fastsab.integrations import lightning", "sits below integrations/"),
        ("fastsab.memory.fit", "from fastsab.bench import report", "memory/ sits below bench/"),
        ("fastsab.plan.shuffle", "importlib.import_module('fastsab.loaders.loader')", "plan/ sits below loaders/"),
        ("fastsab.fetch.fetcher", "__import__('fastsab.varlen.ragged')", "fetch/ sits below varlen/"),
    ],
)
def test_a_wrong_import_is_named(graph, module, source, message):
    # the check itself: an import that breaks the direction, added to a module's source, is found
    wrong = wrong_imports({**graph, module: imports(module, MODULES[module].read_text() + "\n" + source + "\n")})
    assert len(wrong) == 1 and message in wrong[0]


def test_architecture_names_every_module_and_only_real_ones():
    # ARCHITECTURE.md names every module (by its path in the package or its file name), and no module that is gone
    text = ARCHITECTURE.read_text()
    files = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}
    unnamed = sorted(f for f in files if not f.endswith("__init__.py") and f.rpartition("/")[2] not in text)
    named = set(re.findall(r"(?<![\w*/])([\w/]+\.py)\b", text))
    unreal = sorted(
        name
        for name in named
        if not name.startswith(("tests/", "tools/", "test_"))
        and name.removeprefix("fastsab/") not in files
        and not any(f.rpartition("/")[2] == name for f in files)
    )
    assert (unnamed, unreal) == ([], [])


def names_nothing(reference: str) -> bool:
    """Whether ``fastsab.a.b.Name`` (a module, then attributes) names nothing the package has."""
    module = resolve(reference)
    target: object = importlib.import_module(module)
    for attribute in reference.removeprefix(module).split(".")[1:]:
        if not hasattr(target, attribute):
            return True
        target = getattr(target, attribute)
    return False


def test_every_cross_reference_of_the_docstrings_names_something_real():
    # a moved class leaves no ``fastsab.old.path.Name`` behind
    references = {
        (module, reference)
        for module, path in MODULES.items()
        for reference in re.findall(r"``(fastsab(?:\.\w+)+)``", path.read_text())
    }
    assert len(references) > 50  # the docstrings name the package's objects by their paths
    assert sorted(f"{module}: {reference}" for module, reference in references if names_nothing(reference)) == []


def defined_names(tree: ast.Module) -> list[str]:
    """The names a module's top level defines (functions, classes, assigned names)."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_no_private_name_is_left_unused():
    # invariant: a move leaves no old alias or helper behind; a private name is used somewhere in the package
    sources = {module: path.read_text() for module, path in MODULES.items()}
    words = Counter(re.findall(r"\w+", "\n".join(sources.values())))
    unused = [
        f"{module}.{name}"
        for module, source in sorted(sources.items())
        for name in defined_names(ast.parse(source))
        if name.startswith("_") and not name.startswith("__") and words[name] == 1
    ]
    assert unused == []


def test_a_circle_is_found():
    graph = {
        "fastsab.plan.a": {"fastsab.plan.b"},
        "fastsab.plan.b": {"fastsab.plan.c"},
        "fastsab.plan.c": {"fastsab.plan.a"},
    }
    assert cycles(graph) == [["fastsab.plan.a", "fastsab.plan.b", "fastsab.plan.c"]]
