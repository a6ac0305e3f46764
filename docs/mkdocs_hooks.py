"""MkDocs hooks (``hooks:`` in mkdocs.yml): the README is the site's home page and RESULTS.md a page.

Both live at the repository's root, where GitHub shows them, and link to ``docs/X.md`` and to
files beside them (``examples/review.yaml``, ``results/traffic/traffic-trade-off.png``); the pages
of docs/ link to them as ``../RESULTS.md``. On the site the README becomes ``index.md`` and sits
beside the docs/ pages: its ``docs/`` links lose that prefix, the pages' ``../`` links lose theirs,
and every other repository file these pages link to is copied to the same path in the site, so
each link still leads somewhere and ``mkdocs build --strict`` checks them all.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ROOT_PAGES = {"index.md": ROOT / "README.md", "RESULTS.md": ROOT / "RESULTS.md"}
_LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _linked_files(page: Path) -> set[str]:
    """The repository files (outside docs/, not pages) that ``page`` links to, relative to the root."""
    found = set()
    for target, _ in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.endswith(".md"):
            continue
        path = (page.parent / target).resolve()
        if DOCS in path.parents:
            continue
        if not path.is_file() or ROOT not in path.parents:
            msg = f"{page.name} links to {target}, which is not a file of the repository"
            raise ValueError(msg)
        found.add(str(path.relative_to(ROOT)))
    return found


def on_files(files: Files, config: Any) -> Files:
    for uri, path in ROOT_PAGES.items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    for page in [*ROOT_PAGES.values(), *sorted(DOCS.glob("*.md"))]:
        for target in sorted(_linked_files(page)):
            if files.get_file_from_path(target) is None:
                files.append(File.generated(config, target, abs_src_path=str(ROOT / target)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri in ROOT_PAGES:
        return re.sub(r"\]\(docs/", "](", markdown)
    return re.sub(r"\]\(\.\./(README\.md)?", lambda m: "](index.md" if m.group(1) else "](", markdown)
