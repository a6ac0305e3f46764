"""The layout's promises, checked on the source: no import cycle (in the core, the harness and each
integration), small modules, one guard loop, public core names only across distributions.

Imports inside functions count (they still tie two modules together). Imports under ``if
TYPE_CHECKING:`` never run, but they still say one module's types depend on another's: the
layering holds with them too (:func:`test_no_import_cycle_even_through_type_checking_imports`).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "logtoku_guard"
INTEGRATIONS = ROOT / "integrations"
HARNESS = ROOT / "evaluation"
HARNESS_ROOT = "logtoku_eval"
MAX_LINES = 500
# The integrations are distributions of their own: folder -> (distribution, its package folder).
DISTRIBUTIONS = {
    "langchain": ("langchain-logtoku", "langchain_logtoku"),
    "llamaindex": ("llama-index-llms-logtoku", "llama_index/llms/logtoku"),
    "llamaindex-embeddings": ("llama-index-embeddings-logtoku-minilm", "llama_index/embeddings/logtoku_minilm"),
}


PACKAGES = {
    "logtoku_guard": ROOT,
    HARNESS_ROOT: HARNESS,
    "langchain_logtoku": INTEGRATIONS / "langchain",
    "llama_index.llms.logtoku": INTEGRATIONS / "llamaindex",
    "llama_index.embeddings.logtoku_minilm": INTEGRATIONS / "llamaindex-embeddings",
}
"""Each distribution's import root -> the folder its module names are relative to."""


def _integration_sources() -> list[Path]:
    """The integrations' package modules (their tests aside)."""
    return [p for p in INTEGRATIONS.rglob("*.py") if "tests" not in p.relative_to(INTEGRATIONS).parts[1:]]


def _module_name(path: Path, base: Path = ROOT) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, name: str, *, type_checking: bool = False, root: str = "logtoku_guard") -> set[str]:
    """Every ``root`` module that ``path`` imports at run time (any depth, any scope),
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
    return {m for m in found if m == root or m.startswith(root + ".")}


def _graph(root: str = "logtoku_guard", *, type_checking: bool = False) -> dict[str, set[str]]:
    """The import graph among the modules of the distribution whose import root is ``root``."""
    base = PACKAGES[root]
    paths = {_module_name(p, base): p for p in (base / root.replace(".", "/")).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        # ``from pkg import mod`` names a module; ``from mod import obj`` names the module only
        found = _imports(path, name, type_checking=type_checking, root=root)
        graph[name] = {m for m in found if m in paths and m != name}
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


@pytest.mark.parametrize("root", PACKAGES)
def test_no_import_cycle_among_a_distributions_modules(root: str) -> None:
    graph = _graph(root)
    assert len(graph) > 1, f"no modules found for {root}"
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("root", PACKAGES)
def test_no_import_cycle_even_through_type_checking_imports(root: str) -> None:
    """A module that names another's types sits above it: no loop back, not even for annotations
    (a serialiser imports the models, the models do not call the serialiser; a module that needs
    only part of another's object states it as a Protocol, as telemetry's ``Guarded``)."""
    cycle = _cycle(_graph(root, type_checking=True))
    assert cycle is None, "import cycle (type-checking imports included): " + " -> ".join(cycle or [])


def test_the_type_checking_graph_sees_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from logtoku_guard.guard.guard import Guard\n")
    assert _imports(source, "logtoku_guard.m") == set()
    assert "logtoku_guard.guard.guard" in _imports(source, "logtoku_guard.m", type_checking=True)
    # a relative import in another distribution resolves against that distribution's root
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .query_engine import Engine\n")
    root = "llama_index.llms.logtoku"
    assert _imports(source, f"{root}._live", root=root) == set()
    assert f"{root}.query_engine" in _imports(source, f"{root}._live", type_checking=True, root=root)


def _harness_sources() -> list[Path]:
    return list((HARNESS / HARNESS_ROOT).rglob("*.py"))


@pytest.mark.parametrize("root", [PACKAGE, INTEGRATIONS, HARNESS], ids=["logtoku_guard", "integrations", "evaluation"])
def test_no_source_file_over_500_lines(root: Path) -> None:
    sources = {PACKAGE: lambda: list(PACKAGE.rglob("*.py")), INTEGRATIONS: _integration_sources, HARNESS: _harness_sources}[
        root
    ]()
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these modules along their concepts (limit {MAX_LINES} lines): {long}"


def test_only_the_core_counts_retrieval_attempts() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _integration_sources() if "max_attempts" in p.read_text(encoding="utf-8")]
    assert not offenders, f"the guard loop belongs to logtoku_guard.guard.guard_steps; these adapters count attempts: {offenders}"


def test_the_guard_loop_is_written_once() -> None:
    """Only :func:`logtoku_guard.guard.guard_steps.guard_steps` decides what an attempt comes to, falls back
    or concludes: every other module (core or adapter) drives it."""
    steps = ("settle(", "give_up(", "unanswerable(", ".conclude(")
    owners = {PACKAGE / "guard" / "guard_steps.py", PACKAGE / "decision" / "decider.py"}
    offenders = {
        str(p.relative_to(ROOT)): [s for s in steps if s in text]
        for p in [*PACKAGE.rglob("*.py"), *_integration_sources()]
        if p not in owners and any(s in (text := p.read_text(encoding="utf-8")) for s in steps)
    }
    assert not offenders, f"these modules write their own guard loop; drive logtoku_guard.guard.guard_steps instead: {offenders}"


def test_the_guard_loop_has_one_driver() -> None:
    """Only :mod:`logtoku_guard.guard.driver` runs :func:`~logtoku_guard.guard.guard_steps.guard_steps` and watches
    ``early_stop`` rules: every entry point (core or adapter) hands the driver its generate and
    retrieve; none imports the loop, sends it answers or asks the decider about early stop."""
    driving = ("guard_steps(", ".send(", ".early_stop(", "watches_early_stop")
    owners = {PACKAGE / "guard" / "driver.py", PACKAGE / "guard" / "guard_steps.py", PACKAGE / "decision" / "decider.py"}
    owners.add(PACKAGE / "guard" / "tool_driver.py")  # the tool-call loop's one driver (it sends that loop its replies)
    offenders = {
        str(p.relative_to(ROOT)): [s for s in driving if s in text]
        for p in [*PACKAGE.rglob("*.py"), *_integration_sources()]
        if p not in owners and any(s in (text := p.read_text(encoding="utf-8")) for s in driving)
    }
    assert not offenders, f"these modules drive the guard loop themselves; hand logtoku_guard.guard.driver an I/O: {offenders}"
    imported = {
        str(p.relative_to(ROOT))
        for p in [*PACKAGE.rglob("*.py"), *_integration_sources()]
        if p not in owners
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").endswith("guard_steps")
        and any(a.name == "guard_steps" for a in node.names)
    }
    assert not imported, f"these modules import the step loop: {imported}"


def _sites(found: Callable[[ast.AST], bool]) -> dict[str, int]:
    """Per source file of the core and the integrations, how many nodes ``found`` accepts."""
    counts = {
        str(p.relative_to(ROOT)): sum(1 for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if found(node))
        for p in [*PACKAGE.rglob("*.py"), *_integration_sources()]
    }
    return {path: n for path, n in counts.items() if n}


def _makes_rejection(node: ast.AST) -> bool:
    """``GuardRejectedError(...)`` (or ``module.GuardRejectedError(...)``): the ``raise`` action taken."""
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "GuardRejectedError") or (
        isinstance(func, ast.Attribute) and func.attr == "GuardRejectedError"
    )


def _checks_human_review(node: ast.AST) -> bool:
    """``"human_review" in <actions>``: whether a policy can send something to human review."""
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and node.left.value == "human_review"
        and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
    )


def test_the_raise_action_and_the_human_review_store_check_are_written_once() -> None:
    """The policy's ``raise`` is taken in one place (:func:`logtoku_guard.guard.driver.raise_for_action`,
    which ``Guard``, its stream and the integrations call) and "human_review needs a store" is checked
    in one (:func:`logtoku_guard.decision.decider.require_review_store`, which ``Decider``, the server's
    settings and the integrations call)."""
    assert _sites(_makes_rejection) == {"logtoku_guard/guard/driver.py": 1}, (
        "raise the policy's GuardRejectedError through logtoku_guard.guard.driver.raise_for_action only"
    )
    assert _sites(_checks_human_review) == {"logtoku_guard/decision/decider.py": 1}, (
        "check that a policy's human_review has a store with logtoku_guard.decision.decider.require_review_store only"
    )


def test_the_written_once_finders_find_what_they_look_for() -> None:
    tree = ast.parse('raise GuardRejectedError(r)\nraise results.GuardRejectedError(r)\nif "human_review" in acts: pass\n')
    assert sum(map(_makes_rejection, ast.walk(tree))) == 2
    assert sum(map(_checks_human_review, ast.walk(tree))) == 1
    assert not any(map(_makes_rejection, ast.walk(ast.parse("class GuardRejectedError(LogTokUError): pass"))))


def test_the_logtoku_maths_is_written_once() -> None:
    """AU/EU (the Dirichlet's digamma terms) and the entropy's finishing arithmetic live only in
    :mod:`logtoku_guard.scoring.uncertainty`: backends, adapters and the harness call ``au_eu`` (or its
    wrappers) and ``lse_entropy_of``, never their own copy."""
    signs = ("digamma", "/ (alpha0", "k / (", "math.log(s")
    offenders = {
        str(p.relative_to(ROOT)): [s for s in signs if s in text]
        for p in [*PACKAGE.rglob("*.py"), *_integration_sources(), *(ROOT / "evaluation").rglob("*.py")]
        if p != PACKAGE / "scoring" / "uncertainty.py"
        and "/tests/" not in str(p)
        and any(s in (text := p.read_text(encoding="utf-8")) for s in signs)
    }
    assert not offenders, (
        f"these modules compute AU/EU or the entropy themselves; call logtoku_guard.scoring.uncertainty: {offenders}"
    )


TYPED_PARTS = {"backend", "policy", "profile", "store", "retriever", "sink"}


def _any_typed_parts(tree: ast.AST) -> list[str]:
    """``name: Any`` parameters and fields whose name is one of :data:`TYPED_PARTS`."""
    found = []
    for node in ast.walk(tree):
        params: list[ast.arg] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        named = [(a.arg, a.annotation, a.lineno) for a in params]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named.append((node.target.id, node.annotation, node.lineno))
        for name, annotation, line in named:
            if name in TYPED_PARTS and annotation is not None and "Any" in ast.unparse(annotation).replace("'", "").split(" | "):
                found.append(f"{name}:{line}")
    return found


def test_no_backend_policy_profile_store_or_retriever_is_typed_any() -> None:
    """A backend, policy, profile, store or retriever has a type (the ``Backend`` and ``RecordSink``
    protocols, ``RetrieverLike``...) wherever the core, an integration or the harness names one."""
    sources = [*PACKAGE.rglob("*.py"), *_integration_sources(), *(ROOT / "evaluation" / "logtoku_eval").rglob("*.py")]
    offenders = {
        str(p.relative_to(ROOT)): found for p in sources if (found := _any_typed_parts(ast.parse(p.read_text(encoding="utf-8"))))
    }
    assert not offenders, f"type these with the protocols instead of Any: {offenders}"
    assert _any_typed_parts(ast.parse("def f(backend: Any, store: 'Any | None' = None, n: Any = 1): pass")) == [
        "backend:1",
        "store:1",
    ]


def test_no_core_module_imports_the_evaluation_harness() -> None:
    """The harness (``logtoku_eval``, its own distribution) builds on the core, never the reverse:
    not at run time, not lazily inside a function, not for type annotations; the core CLI finds
    ``eval`` through an entry point instead."""
    offenders = {
        str(p.relative_to(ROOT)): sorted(found)
        for p in PACKAGE.rglob("*.py")
        if (found := _imports(p, _module_name(p), type_checking=True, root=HARNESS_ROOT))
    }
    assert not offenders, f"logtoku_guard must not import the evaluation harness: {offenders}"
    assert not (PACKAGE / "evaluation").exists(), "the evaluation harness lives in evaluation/logtoku_eval"


def _private(module: str) -> bool:
    """``module`` (or a name imported from it) is private: a dotted segment starts with ``_``
    (``__init__`` and ``__main__`` aside)."""
    return any(part.startswith("_") and part not in ("__init__", "__main__") for part in module.split("."))


def test_other_distributions_use_only_public_core_modules() -> None:
    """The harness and the integrations are distributions of their own: they may break on any
    release of the core if they reach into its private modules or names (``logtoku_guard.cli._common``,
    ``from logtoku_guard.x import _helper``). CLI plugins use :mod:`logtoku_guard.cli.toolkit`."""
    offenders = {
        str(p.relative_to(ROOT)): found
        for p in [*_harness_sources(), *_integration_sources()]
        if (found := sorted(m for m in _imports(p, _module_name(p), type_checking=True) if _private(m)))
    }
    assert not offenders, f"these modules import private logtoku_guard modules or names; use public ones: {offenders}"


def test_the_private_import_check_sees_private_modules_and_names(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from logtoku_guard.cli import _common\nfrom logtoku_guard.cli.toolkit import fail\n"
        "def f():\n    from logtoku_guard.audit._files import x\n    from logtoku_guard.wire.payloads import _hidden\n"
        "import logtoku_guard.__main__\n"
    )
    found = _imports(source, "logtoku_eval.m", type_checking=True)
    assert sorted(m for m in found if _private(m)) == [
        "logtoku_guard.audit._files",
        "logtoku_guard.audit._files.x",
        "logtoku_guard.cli._common",
        "logtoku_guard.wire.payloads._hidden",
    ]


def test_only_the_harness_tests_import_the_harness() -> None:
    """The core's tests (and the integrations') run without the ``logtoku-guard-eval``
    distribution: fixtures are built from core types; what needs the harness is tested in
    evaluation/tests, beside it."""
    tests = [ROOT / "conftest.py", *(ROOT / "tests").rglob("*.py"), *INTEGRATIONS.glob("*/tests/**/*.py")]
    offenders = {
        str(p.relative_to(ROOT)): sorted(found)
        for p in tests
        if (found := _imports(p, _module_name(p), type_checking=True, root=HARNESS_ROOT))
    }
    assert not offenders, f"only evaluation/tests may import the evaluation harness: {offenders}"
    assert (HARNESS / "tests" / "test_cli.py").is_file() and not (ROOT / "tests" / "evaluation").exists()


def test_the_harness_import_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from logtoku_eval.cache import JsonlCache\n"
        "def f():\n    import logtoku_eval.metrics\n"
    )
    assert _imports(source, "logtoku_guard.m", type_checking=True, root=HARNESS_ROOT) == {
        "logtoku_eval.cache",
        "logtoku_eval.cache.JsonlCache",
        "logtoku_eval.metrics",
    }


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_tests_are_grouped_by_unit_and_named_after_what_they_test() -> None:
    tests = ROOT / "tests"
    rounds = [str(p.relative_to(ROOT)) for p in tests.rglob("test_*.py") if p.stem.endswith(("_hardening", "_round", "_fixes"))]
    assert not rounds, f"name test files after what they test, not after a round of work: {rounds}"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    expected = ["test_architecture.py", "test_layers.py", "test_public_api.py"]
    assert flat == expected, f"put unit tests in a folder per unit: {flat}"


def test_every_first_party_import_names_a_module_that_exists() -> None:
    """mypy skips missing imports (ignore_missing_imports, for optional extras), so a renamed
    module would only fail at run time; this reads every import of the project's own modules,
    lazy ones inside functions included, and checks that each imported module exists."""
    import importlib.util

    roots = (
        "logtoku_guard",
        HARNESS_ROOT,
        "langchain_logtoku",
        "llama_index.llms.logtoku",
        "llama_index.embeddings.logtoku_minilm",
    )
    folders = (PACKAGE, HARNESS, INTEGRATIONS, ROOT / "tests", ROOT / "examples", ROOT / "benchmarks", ROOT / "scripts")
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


def _toml(path: Path) -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_each_integration_is_a_distribution_of_its_own() -> None:
    """langchain-ai and LlamaIndex ship each integration as its own distribution with its own
    pyproject, README and tests/unit_tests + tests/integration_tests, on a range of the core."""
    from packaging.requirements import Requirement

    core = _toml(ROOT / "pyproject.toml")
    wheel = core["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["logtoku_guard"], "the core wheel ships only the core"
    assert not {"langchain", "llamaindex"} & set(core["project"]["optional-dependencies"])
    testpaths = core["tool"]["pytest"]["ini_options"]["testpaths"]
    assert sorted(p.name for p in INTEGRATIONS.iterdir() if p.is_dir()) == sorted(DISTRIBUTIONS)
    for folder, (name, package) in DISTRIBUTIONS.items():
        root = INTEGRATIONS / folder
        project = _toml(root / "pyproject.toml")
        assert project["project"]["name"] == name
        assert project["build-system"]["build-backend"] == "hatchling.build"
        wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
        assert wheel.get("packages", wheel.get("include")) in ([package], [package + "/"]), wheel
        assert (root / package / "__init__.py").is_file() and (root / "README.md").is_file()
        needs = [Requirement(r) for r in project["project"]["dependencies"] if Requirement(r).name == "logtoku-guard"]
        assert len(needs) == 1 and needs[0].specifier.contains(core["project"]["version"]), f"{name}: {needs}"
        assert str(needs[0].specifier) != "", f"{name} must bound the core's version"
        for kind in ("unit_tests", "integration_tests"):
            assert any((root / "tests" / kind).glob("test_*.py")), f"{name} has no tests/{kind}"
        assert f"integrations/{folder}/tests" in testpaths, f"pytest's testpaths must run {name}'s tests"


@pytest.mark.slow  # builds five wheels into a fresh venv (scripts/check_wheels.sh does it in CI too)
def test_the_distributions_build_and_import_in_a_fresh_venv() -> None:
    """scripts/check_wheels.sh: the four wheels build offline, install with --no-index --no-deps into a
    fresh venv and import from there; the core wheel carries no integration."""
    try:
        import hatchling  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("hatchling (the dev extra) is needed to build the wheels offline")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_wheels.sh")], capture_output=True, text=True, env=env, check=False, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for name in [*(name for name, _ in DISTRIBUTIONS.values()), "logtoku-guard-eval"]:
        assert f"{name} 0.1.0:" in out.stdout, out.stdout
    assert "no integration modules" in out.stdout


def test_the_server_and_the_review_page_never_import_the_cli() -> None:
    """The CLI builds on the server (``serve``) and the review page (``review serve``), never the other way
    round: shared helpers (``safe_text``) live below all three."""
    for type_checking in (False, True):
        graph = _graph(type_checking=type_checking)
        upward = {
            module: sorted(m for m in imports if m == "logtoku_guard.cli" or m.startswith("logtoku_guard.cli."))
            for module, imports in graph.items()
            if module.startswith(("logtoku_guard.server", "logtoku_guard.review_web"))
        }
        assert not {m: found for m, found in upward.items() if found}, upward
    assert any(m.startswith("logtoku_guard.server") for m in graph["logtoku_guard.cli.serve"])  # the check sees edges


def test_the_architecture_map_names_every_core_package_and_module_and_nothing_that_is_gone() -> None:
    """docs/ARCHITECTURE.md stays true: each core subpackage and module is named in it (by its file
    name), and each core path it names (``backends/``, ``server/routes.py``...) exists."""
    import re

    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*(?:/[A-Za-z_][A-Za-z0-9_]*)*(?:\.py|/))`", doc))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name in ("__init__.py", "__main__.py") or "data" in rel.parts:
            continue
        if f"{rel.parent.name}/{rel.name}" not in named and rel.name not in named:
            missing.append(str(rel))
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        if f"{folder.name}/" not in named:
            missing.append(f"{folder.name}/")
    assert not missing, f"docs/ARCHITECTURE.md does not name: {missing}"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {str(Path(f).parent) + "/" for f in tracked}
    gone = [
        n
        for n in named
        if not any(f == n or f.endswith("/" + n) for f in tracked) and not any(d == n or d.endswith("/" + n) for d in folders)
    ]
    assert not gone, f"docs/ARCHITECTURE.md names paths that do not exist: {gone}"


def test_no_two_core_modules_share_a_file_name() -> None:
    """A reader (and a traceback) names a module by its file: each file name is one module in the core."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not repeated, f"module file names repeated inside logtoku_guard/: {repeated}"
