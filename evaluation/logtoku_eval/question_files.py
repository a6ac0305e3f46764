"""The shipped question files' common reading: where they live, their content name, their splits
and records (JSON Lines, one question a line, unique ids), with errors that name the file, the
line and the fix. Each benchmark module (:mod:`~logtoku_eval.ordinary`, :mod:`~logtoku_eval.traffic`)
supplies only its record's own checks.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.jsonl import json_lines

__all__ = ["SPLITS", "check_split", "content_name", "read_items", "record_fields", "resolve", "shipped_path"]

SPLITS = ("tune", "test", "all")


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_HasId)


def shipped_path(data_file: str) -> Path:
    """The shipped benchmark file ``data_file`` inside the installed package."""
    from logtoku_guard.calibration.profiles import SHIPPED_DIR

    return SHIPPED_DIR / data_file


def resolve(path: str | os.PathLike[str] | None, data_file: str) -> Path:
    """``path``, or the shipped ``data_file`` when it is ``None``."""
    return Path(path) if path is not None else shipped_path(data_file)


def content_name(prefix: str, path: Path) -> str:
    """``"<prefix>-<first 8 hex of the file's SHA-256>"``: a cache name that changes with the content."""
    return f"{prefix}-{hashlib.sha256(path.read_bytes()).hexdigest()[:8]}"


def check_split(split: str) -> None:
    """``split`` is one of :data:`SPLITS`, else a :class:`ConfigurationError` naming it."""
    if split not in SPLITS:
        msg = f"split must be one of {SPLITS}, got {split!r}; report on 'test', tune on 'tune'"
        raise ConfigurationError(msg)


def record_fields(
    obj: object, where: str, *, record: str, text_fields: tuple[str, ...], other_fields: tuple[str, ...], fix: str
) -> dict[str, Any]:
    """``obj`` as a record: a JSON object that has every field, ``text_fields`` non-empty texts.

    ``record`` names it in errors with its article (``"a traffic record"``); ``where`` is ``"<file>:<line>"``.
    """
    noun = record.partition(" ")[2]
    if not isinstance(obj, dict):
        msg = f"{where}: not {record} (a JSON object), got {type(obj).__name__}; {fix}"
        raise ConfigurationError(msg)
    missing = [k for k in (*text_fields, *other_fields) if k not in obj]
    if missing:
        msg = f"{where}: the {noun} lacks {', '.join(map(repr, missing))}; {fix}"
        raise ConfigurationError(msg)
    for k in text_fields:
        if not isinstance(obj[k], str) or not obj[k].strip():
            msg = f"{where}: {k!r} must be a non-empty text, got {obj[k]!r}; {fix}"
            raise ConfigurationError(msg)
    return obj


def read_items(path: Path, what: str, fix: str, item: Callable[[object, str], ItemT]) -> list[ItemT]:
    """Every record of the file at ``path`` (``what`` names it in errors: ``"the traffic benchmark
    file"``), in file order, each made by ``item(value, "<path>:<line>")``; ids are unique."""
    if not path.is_file():
        msg = f"{what} {str(path)!r} does not exist; pass an existing path"
        raise ConfigurationError(msg)
    items: list[ItemT] = []
    seen: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for n, _line, obj in json_lines(path, fh, fix):
                it = item(obj, f"{path}:{n}")
                if it.id in seen:
                    msg = f"{path}:{n}: the id {it.id!r} was already used on line {seen[it.id]}; {fix}"
                    raise ConfigurationError(msg)
                seen[it.id] = n
                items.append(it)
    except UnicodeDecodeError as exc:
        msg = f"{what} {str(path)!r} is not UTF-8 (byte {exc.start}); {fix}"
        raise ConfigurationError(msg) from exc
    return items
