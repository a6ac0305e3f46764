"""Redaction: what of an end user's text the audit store keeps, applied before anything is written.

``keep`` (the default): the text as given. ``hash``: ``"sha256:"`` and the SHA-256 hex digest of
its UTF-8 bytes (equal texts stay matchable, the text itself is gone; short or guessable texts
can still be found by hashing guesses). ``drop``: the empty string. Or any callable ``str -> str``
(e.g. one that masks e-mail addresses). The default comes from ``$LOGTOKU_GUARD_REDACT``
(``keep``, ``hash`` or ``drop``), so the command line can be told too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any, Literal

from logtoku_guard.audit.records import AuditRecord
from logtoku_guard.errors import ConfigurationError

__all__ = ["ENV_VAR", "RedactMode", "Redactor", "redactor"]

RedactMode = Literal["keep", "hash", "drop"]
Redactor = Callable[[str], str]
ENV_VAR = "LOGTOKU_GUARD_REDACT"
_MODES = ("keep", "hash", "drop")


def _hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _drop(text: str) -> str:
    return ""


def redactor(redact: RedactMode | Redactor | None, name: str = "redact") -> Redactor | None:
    """The function for ``redact`` (None: ``$LOGTOKU_GUARD_REDACT``, else keep); None means keep."""
    where = name
    if redact is None:
        redact = os.environ.get(ENV_VAR, "").strip() or "keep"  # type: ignore[assignment]
        where = f"${ENV_VAR}"
    if callable(redact):
        return redact
    if redact not in _MODES:
        msg = f"{where} must be 'keep', 'hash', 'drop' or a function str -> str, got {redact!r}"
        raise ConfigurationError(msg)
    return None if redact == "keep" else _hash if redact == "hash" else _drop


def _apply(fn: Redactor, text: str, what: str) -> str:
    out = fn(text)
    if not isinstance(out, str):
        msg = f"the redaction function returned {type(out).__name__} for the {what}; it must return a str"
        raise ConfigurationError(msg)
    return out


def _redact_args(fn: Redactor, call: dict[str, Any]) -> dict[str, Any]:
    args = call.get("args")
    if not isinstance(args, dict):
        return dict(call)
    redacted = {k: _apply(fn, json.dumps(v, ensure_ascii=False, sort_keys=True), "tool call arguments") for k, v in args.items()}
    return {**call, "args": redacted}


def redact_record(rec: AuditRecord, prompt: Redactor | None, answer: Redactor | None) -> AuditRecord:
    """``rec`` with its prompt (and answer) redacted; a redacted answer also loses its token texts
    (the numbers stay), since the tokens spell the answer, and its tool calls' argument values
    (each value's JSON text redacted; names and scores stay)."""
    changes: dict[str, object] = {}
    if prompt is not None:
        changes["prompt"] = _apply(prompt, rec.prompt, "prompt")
    if answer is not None:
        changes["answer"] = _apply(answer, rec.answer, "answer")
        changes["tokens"] = [{**t, "token": ""} if "token" in t else dict(t) for t in rec.tokens]
        changes["tool_calls"] = [_redact_args(answer, call) for call in rec.tool_calls]
    return dataclasses.replace(rec, **changes) if changes else rec  # type: ignore[arg-type]
