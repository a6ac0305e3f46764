"""A griffe extension for the API reference (mkdocs.yml): the docstrings' Sphinx roles as code.

The code's docstrings cross-reference with Sphinx roles (``:class:`~logtoku_guard.audit.AuditStore```),
which Markdown would show as they are typed. Each role becomes a code span of the name a reader
would see in Sphinx: the last part after ``~``, the given text of ``text <target>``, else the
whole target.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const|ref|doc):`([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    shown = re.fullmatch(r"(.+?)\s*<[^>]+>", target)
    if shown:
        return f"`{shown.group(1)}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def plain_roles(text: str) -> str:
    return _ROLE.sub(_as_code, text)


class SphinxRolesAsCode(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None:
                obj.docstring.value = plain_roles(obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
