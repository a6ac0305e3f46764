"""JSON Lines read with errors that name the file, the line and the fix (no other I/O here)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = ["json_lines"]


def json_lines(path: str | os.PathLike[str], lines: Iterable[str], fix: str) -> Iterator[tuple[int, str, Any]]:
    """``(line number, line, parsed value)`` for each non-blank line of ``lines`` (read from ``path``).

    A line that is not JSON raises :class:`~logtoku_guard.errors.ConfigurationError`
    ``"<path>:<n>: not JSON (<why> at column <c>); <fix>"``; what each value must be is the caller's check.
    """
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            msg = f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno}); {fix}"
            raise ConfigurationError(msg) from exc
        yield n, line, value
