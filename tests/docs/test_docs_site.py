"""The documentation site (mkdocs.yml, built by ``mkdocs build --strict`` in CI) covers what it should:
every page of docs/ is in the navigation, and the API reference (docs/API.md) documents every public
name of ``logtoku_guard`` and every public class of the integrations.

The build itself (broken links, anchors, docstrings griffe cannot read) is checked by
``mkdocs build --strict``; these tests catch what a build does not: a page or a public name left out.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API = DOCS / "API.md"


def _config() -> dict[str, Any]:
    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !ENV / !!python tags; none are read here
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def _nav_pages(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_the_navigation_lists_every_page_once() -> None:
    config = _config()
    assert config["docs_dir"] == "docs"
    pages = _nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), f"a page is listed twice: {pages}"
    # index.md and RESULTS.md are the repository's README.md and RESULTS.md (docs/mkdocs_hooks.py).
    on_disk = {p.name for p in DOCS.glob("*.md")} | {"index.md", "RESULTS.md"}
    assert set(pages) == on_disk, f"not in the nav: {sorted(on_disk - set(pages))}; no such page: {sorted(set(pages) - on_disk)}"
    assert pages[0] == "index.md", "the README is the home page"


def _documented() -> list[object]:
    """The objects docs/API.md renders: each ``::: module.Name`` and the ``members:`` listed under a module."""
    found: list[object] = []
    text = API.read_text(encoding="utf-8")
    for m in re.finditer(r"^::: (\S+)\n((?:[ \t]+.*\n)*)", text, re.M):
        path, options = m.group(1), m.group(2)
        members = re.findall(r"^\s+- (\w+)\s*$", options, re.M)
        if members:
            module = importlib.import_module(path)
            found += [getattr(module, name) for name in members]
            continue
        module_name, _, name = path.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"docs/API.md: ::: {path} does not resolve: {exc}")
    return found


def _same(a: object, b: object) -> bool:
    return a is b or (isinstance(a, str) and a == b)


def test_the_api_reference_documents_every_public_core_name() -> None:
    import logtoku_guard

    documented = _documented()
    public = [n for n in logtoku_guard.__all__ if n != "__version__"]
    missing = [n for n in public if not any(_same(getattr(logtoku_guard, n), d) for d in documented)]
    assert not missing, f"docs/API.md does not document: {missing}"


def _public(module: Any, name: str) -> object:
    try:
        return getattr(module, name)
    except ImportError:  # an optional dependency missing (langgraph for langchain_logtoku.graph): not checked here
        return None


@pytest.mark.parametrize("package", ["langchain_logtoku", "llama_index.llms.logtoku", "llama_index.embeddings.logtoku_minilm"])
def test_the_api_reference_documents_every_public_integration_class(package: str) -> None:
    module = pytest.importorskip(package)
    documented = _documented()
    classes = [n for n in module.__all__ if inspect.isclass(_public(module, n))]
    assert classes
    missing = [n for n in classes if not any(getattr(module, n) is d for d in documented)]
    assert not missing, f"docs/API.md does not document {package}'s {missing}"


def test_the_readme_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not unlinked, f"README.md's table of pages does not link {unlinked}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_module_and_path_a_page_names_exists(page: Path) -> None:
    """A name such as `logtoku_guard.scoring.risk` or a path such as `logtoku_guard/backends/embedded.py`
    in a page is still there (modules move: the pages must follow)."""
    text = page.read_text(encoding="utf-8")
    roots = r"(?:logtoku_guard|langchain_logtoku|llama_index\.(?:llms|embeddings)\.logtoku\w*)"
    names = set(re.findall(rf"`({roots}(?:\.\w+)+)", text))
    gone = [n for n in sorted(names) if not _resolves(n)]
    paths = set(re.findall(r"`((?:logtoku_guard|integrations|evaluation|benchmarks|examples|scripts)/[\w./*-]*[\w*/])", text))
    gone += [p for p in sorted(paths) if not any(ROOT.glob(p.rstrip("/")))]
    assert not gone, f"{page.name} names what does not exist (any more): {gone}"
