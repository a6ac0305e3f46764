"""Every Python code block in README.md and docs/*.md runs as written.

A page's blocks run in order in one namespace (a later block may use what an earlier one made), in
a fresh folder holding the repository's ``examples/`` (the blocks read ``examples/review.yaml``,
write ``audit.db``), on the real embedded model: ``slow``. The fast test compiles every block and
runs its imports, so a renamed or moved name fails without a model.

A block is left out only when the line above its fence says why, as an HTML comment the Markdown
shows and the site does not render::

    <!-- docs-test: not run: needs a PostgreSQL server (...) -->

``<!-- docs-test: needs MODULE: WHY -->`` runs the block only where MODULE is installed (an extra);
``<!-- docs-test: fast: WHY -->`` marks a block that needs no model, run whole in the fast test too.
Some pages' claims are checked after their blocks ran (``CHECKS``); REVIEW.md's reviewer, whom the
application waits for, is played by a thread that approves the queued answer.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_TAG = re.compile(r"^<!-- docs-test: (not run|needs ([\w.]+)|fast): (?P<reason>\S.*\S) -->$")


@dataclass
class Block:
    page: Path
    line: int  # the first code line
    code: str
    skip: str | None = None  # why it is not run
    needs: str | None = None  # the module it needs
    fast: bool = False  # needs no model: runs whole in the fast test too

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found = []
    i = 0
    while i < len(lines):
        if re.match(r"^```python\s*$", lines[i]):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            block = Block(page, i + 2, "\n".join(lines[i + 1 : j]))
            above = lines[i - 1] if i else ""
            if above.startswith("<!-- docs-test"):
                m = _TAG.match(above)
                want = "<!-- docs-test: not run: WHY -->, <!-- docs-test: needs MODULE: WHY --> or <!-- docs-test: fast: WHY -->"
                assert m, f"{page.relative_to(ROOT)}:{i}: write {want}"
                if m.group(2):
                    block.needs = m.group(2)
                elif m.group(1) == "fast":
                    block.fast = True
                else:
                    block.skip = m.group("reason")
            found.append(block)
            i = j
        i += 1
    return found


BLOCKS = [b for page in PAGES for b in _blocks(page)]


def test_the_pages_have_python_blocks_and_few_are_left_out() -> None:
    assert len(BLOCKS) >= 10 and len({b.page for b in BLOCKS}) >= 6
    left_out = [b.where() for b in BLOCKS if b.skip]
    assert len(left_out) <= 3, f"keep the blocks that are not run few: {left_out}"


@pytest.mark.parametrize("block", BLOCKS, ids=Block.where)
def test_each_block_compiles_and_its_imports_resolve(block: Block) -> None:
    try:
        tree = ast.parse(block.code, filename=block.where())
    except SyntaxError as exc:
        pytest.fail(f"{block.where()}: not Python: {exc}")
    if block.needs:
        pytest.importorskip(block.needs)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    code = compile(ast.Module(body=imports, type_ignores=[]), block.where(), "exec")
    exec(code, {})  # an ImportError names the import that broke
    if block.fast:  # no model: the whole block, its own asserts included
        exec(compile(tree, block.where(), "exec"), {"__name__": "__docs__"})


# -- run on the real model -------------------------------------------------------------------------------
def _readme_guard(scope: dict[str, Any]) -> None:
    result = scope["result"]
    assert result.attempts[0].decision.action == "retrieve", result.attempts
    assert "Marwick" in result.answer and result.action == "pass", (result.answer, result.action)


def _readme_langchain(scope: dict[str, Any]) -> None:
    message = scope["message"]
    assert "Paris" in message.content and message.response_metadata["logtoku_guard"]["action"] == "pass", message


def _library(scope: dict[str, Any]) -> None:
    assert "Paris" in scope["g"].text or "tool_call" in scope["g"].text
    assert scope["stream"].generation.tokens, "the stream yielded nothing"


def _integrations(scope: dict[str, Any]) -> None:
    route = [step["action"] for step in scope["message"].response_metadata["logtoku_guard"]["route"]]
    assert route[0] == "retrieve" and "Marwick" in scope["message"].content, (route, scope["message"].content)


def _review(scope: dict[str, Any]) -> None:
    assert scope["result"].action == "human_review", scope["result"].decision
    assert scope["answer"] == "Nobody: it is invented.", scope["answer"]


CHECKS: dict[str, list[Callable[[dict[str, Any]], None]]] = {
    "README.md": [_readme_guard, _readme_langchain],
    "POLICIES.md": [_readme_guard],
    "LIBRARY.md": [_library],
    "INTEGRATIONS.md": [_integrations],
    "REVIEW.md": [_review],
}


def _reviewer(folder: Path, stop: threading.Event, errors: list[BaseException]) -> None:
    """Approve, with an edit, the first answer queued in ``folder/audit.db`` (the reviewer the page waits for)."""
    from logtoku_guard.audit import AuditStore

    db = folder / "audit.db"
    try:
        while not stop.wait(0.2):
            if not db.exists():
                continue
            with AuditStore(db) as store:
                for item in store.pending():
                    store.approve(item.id, "alice", edited_answer="Nobody: it is invented.")
                    return
    except BaseException as exc:  # handed to the test, which fails with it
        errors.append(exc)


@pytest.fixture
def page_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedded_cache: Path) -> Iterator[Path]:
    pytest.importorskip("gguf")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(embedded_cache))
    monkeypatch.setenv("LOGTOKU_GUARD_REDACT", "keep")
    yield tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({b.page for b in BLOCKS if not b.skip}), ids=lambda p: p.name)
def test_the_pages_python_blocks_run_in_order(page: Path, page_folder: Path) -> None:
    scope: dict[str, Any] = {"__name__": "__docs__"}
    blocks = [b for b in BLOCKS if b.page == page and not b.skip]
    stop = threading.Event()
    reviewer, errors = None, []
    if any("wait_for_decision" in b.code for b in blocks):
        reviewer = threading.Thread(target=_reviewer, args=(page_folder, stop, errors), daemon=True)
        reviewer.start()
    try:
        for block in blocks:
            if block.needs:
                pytest.importorskip(block.needs)
            try:
                exec(compile(block.code, block.where(), "exec"), scope)
            except Exception as exc:
                why = f" (the reviewer thread failed first: {errors[0]!r})" if errors else ""
                raise AssertionError(f"{block.where()}: the block fails as written: {exc!r}{why}") from exc
    finally:
        stop.set()
        if reviewer is not None:
            reviewer.join(timeout=10)
    assert not errors, errors
    for check in CHECKS.get(page.name, []):
        check(scope)
    from logtoku_guard.audit import AuditStore

    for value in scope.values():  # the stores the blocks opened
        if isinstance(value, AuditStore):
            value.close()
