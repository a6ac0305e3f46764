"""The layout's promises, checked on the source: no import cycle, small modules, one guard loop.

Imports inside functions count (they still tie two modules together). Imports under ``if
TYPE_CHECKING:`` never run, but they still say one module's types depend on another's: the
layering holds with them too (:func:`test_no_import_cycle_even_through_type_checking_imports`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "logtoku_guard"
INTEGRATIONS = ROOT / "integrations"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, name: str, *, type_checking: bool = False) -> set[str]:
    """Every ``logtoku_guard`` module that ``path`` imports at run time (any depth, any scope),
    and with ``type_checking`` also those imported under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m == "logtoku_guard" or m.startswith("logtoku_guard.")}


def _graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        # ``from pkg import mod`` names a module; ``from mod import obj`` names the module only
        graph[name] = {m for m in _imports(path, name, type_checking=type_checking) if m in paths and m != name}
    # a package's __init__ re-exports its submodules lazily or eagerly; an edge into a package
    # __init__ from its own submodule is the usual parent import, not a design cycle
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_no_import_cycle_among_core_modules() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_even_through_type_checking_imports() -> None:
    """A module that names another's types sits above it: no loop back, not even for annotations
    (a serialiser imports the models, the models do not call the serialiser; a module that needs
    only part of another's object states it as a Protocol, as telemetry's ``Guarded``)."""
    cycle = _cycle(_graph(type_checking=True))
    assert cycle is None, "import cycle (type-checking imports included): " + " -> ".join(cycle or [])


def test_the_type_checking_graph_sees_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from logtoku_guard.guard import Guard\n")
    assert _imports(source, "logtoku_guard.m") == set()
    assert "logtoku_guard.guard" in _imports(source, "logtoku_guard.m", type_checking=True)


@pytest.mark.parametrize("root", [PACKAGE, INTEGRATIONS], ids=["logtoku_guard", "integrations"])
def test_no_source_file_over_500_lines(root: Path) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in root.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules along their concepts (limit {MAX_LINES} lines): {long}"


def test_only_the_core_counts_retrieval_attempts() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in INTEGRATIONS.rglob("*.py") if "max_attempts" in p.read_text(encoding="utf-8")]
    assert not offenders, f"the guard loop belongs to logtoku_guard.guard_steps; these adapters count attempts: {offenders}"


def test_the_guard_loop_is_written_once() -> None:
    """Only :func:`logtoku_guard.guard_steps.guard_steps` decides what an attempt comes to, falls back
    or concludes: every other module (core or adapter) drives it."""
    steps = ("settle(", "give_up(", "unanswerable(", ".conclude(")
    owners = {PACKAGE / "guard_steps.py", PACKAGE / "decider.py"}
    offenders = {
        str(p.relative_to(ROOT)): [s for s in steps if s in text]
        for root in (PACKAGE, INTEGRATIONS)
        for p in root.rglob("*.py")
        if p not in owners and any(s in (text := p.read_text(encoding="utf-8")) for s in steps)
    }
    assert not offenders, f"these modules write their own guard loop; drive logtoku_guard.guard_steps instead: {offenders}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_tests_are_grouped_by_unit_and_named_after_what_they_test() -> None:
    tests = ROOT / "tests"
    rounds = [str(p.relative_to(ROOT)) for p in tests.rglob("test_*.py") if p.stem.endswith(("_hardening", "_round", "_fixes"))]
    assert not rounds, f"name test files after what they test, not after a round of work: {rounds}"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    assert flat == ["test_architecture.py", "test_fabricated.py", "test_public_api.py"], (
        f"put unit tests in a folder per unit: {flat}"
    )


def test_every_first_party_import_names_a_module_that_exists() -> None:
    """mypy skips missing imports (ignore_missing_imports, for optional extras), so a renamed
    module would only fail at run time; this reads every import of the project's own modules,
    lazy ones inside functions included, and checks that each imported module exists."""
    import importlib.util

    roots = ("logtoku_guard", "langchain_logtoku", "llama_index.llms.logtoku", "llama_index.embeddings.logtoku_minilm")
    folders = (PACKAGE, INTEGRATIONS, ROOT / "tests", ROOT / "examples", ROOT / "benchmarks", ROOT / "scripts")
    sources = [p for folder in folders for p in folder.rglob("*.py")]
    missing = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            missing += [
                f"{path.relative_to(ROOT)}: {m}" for m in modules if m.startswith(roots) and importlib.util.find_spec(m) is None
            ]
    assert not missing, missing
