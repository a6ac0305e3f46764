"""What the item page shows, computed once from a review item: released answer, heat-map, tooltips.

The answer is shown exactly as approval releases it (:attr:`ReviewItem.final_answer`'s rule:
the edited answer when a reviewer edited it, else the record's answer). Tokens are coloured by
quadrant only when they join to exactly that text; otherwise the text is shown plain, so the
page never shows words that would not be released.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup

from logtoku_guard.audit.records import AuditRecord, ReviewItem
from logtoku_guard.decision.tool_gate.call_review import arguments_json
from logtoku_guard.safe_text import safe_text
from logtoku_guard.scoring.quadrants import Quadrant

__all__ = [
    "QUADRANT_LEGEND",
    "AnswerView",
    "FormValue",
    "TokenSpan",
    "ToolArgumentView",
    "ToolCallView",
    "answer_view",
    "fmt_num",
    "fmt_time",
    "has_hidden",
    "history",
    "is_gated_call",
    "token_spans",
    "tool_call_views",
    "visible",
]

QUADRANT_LEGEND = [(q.value, q.description) for q in Quadrant]


@dataclass(frozen=True)
class TokenSpan:
    """One token of the heat-map: its text, CSS class (``q-I`` ... ``q-IV``, ``q-none``) and tooltip."""

    text: str
    css: str
    title: str


@dataclass(frozen=True)
class AnswerView:
    """The released answer; ``spans`` when the tokens join to it (else None: show ``text`` plain)."""

    text: str
    spans: list[TokenSpan] | None
    edited: bool
    original_spans: list[TokenSpan] | None


class FormValue(str):
    """Text that goes back to the server as it is (a form field's value, an edit box): :func:`visible`
    leaves it alone, autoescaping still escapes it."""

    __slots__ = ()


def visible(value: Any) -> Any:
    """What the page prints for ``value`` (every ``{{ ... }}`` goes through it): text with its control
    and invisible characters shown as escapes, exactly as the CLI prints them
    (:func:`~logtoku_guard.safe_text.safe_text`: U+202E as ``\\u202e``, a zero-width space as
    ``\\u200b``), so a stored question cannot reorder or hide what a reviewer reads.
    :class:`FormValue` and markup are left as they are; autoescaping happens after."""
    if isinstance(value, str) and not isinstance(value, (FormValue, Markup)):
        return safe_text(value).plain
    return value


def has_hidden(text: str) -> bool:
    """True when :func:`visible` would change ``text`` (it holds control or invisible characters)."""
    return safe_text(text).plain != text


def fmt_num(x: Any, digits: int = 4) -> str:
    """A number for people: ``None``/NaN as an em dash, floats with ``digits`` significant digits."""
    if x is None or isinstance(x, bool):
        return "—" if x is None else str(x)
    if isinstance(x, float):
        return "—" if not math.isfinite(x) else f"{x:.{digits}g}"
    return str(x)


def fmt_time(t: datetime | None) -> str:
    """A UTC time as ``2025-01-31 12:00:00 UTC``; None as an em dash."""
    return "—" if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tooltip(tok: dict[str, Any]) -> str:
    parts = [
        f"quadrant {tok.get('quadrant') or '—'}",
        f"AU {fmt_num(tok.get('au'))}",
        f"EU {fmt_num(tok.get('eu'))}",
        f"log p {fmt_num(tok.get('logprob'))}",
    ]
    alternatives = tok.get("top_tokens") or tok.get("alternatives")
    if isinstance(alternatives, list) and alternatives:
        parts.append("top alternatives " + ", ".join(repr(a) if isinstance(a, str) else fmt_num(a) for a in alternatives[:5]))
    logits = tok.get("top_logits")
    if isinstance(logits, list) and logits:
        parts.append("top logits " + ", ".join(fmt_num(v, 3) for v in logits[:5]))
    return " · ".join(parts)


def token_spans(tokens: list[dict[str, Any]], text: str) -> list[TokenSpan] | None:
    """The heat-map of ``text``, or None when the tokens do not join to exactly ``text``."""
    if not tokens or "".join(str(t.get("token", "")) for t in tokens) != text:
        return None
    spans = []
    for tok in tokens:
        q = tok.get("quadrant")
        css = f"q-{q}" if q in ("I", "II", "III", "IV") else "q-none"
        spans.append(TokenSpan(text=str(tok.get("token", "")), css=css, title=_tooltip(tok)))
    return spans


def answer_view(item: ReviewItem) -> AnswerView:
    """The answer as approval releases it, with its heat-map when the tokens match it."""
    rec = item.record
    edited = item.edited_answer is not None and item.edited_answer != rec.answer
    text = item.edited_answer if edited and item.edited_answer is not None else rec.answer
    original = token_spans(rec.tokens, rec.answer)
    return AnswerView(text=text, spans=None if edited else original, edited=edited, original_spans=original if edited else None)


@dataclass(frozen=True)
class ToolArgumentView:
    """One argument of a gated tool call: its value as JSON text, coloured like answer tokens
    (``css``: ``q-I`` ... ``q-IV``, ``q-none``), ``flagged`` when a rule fired on it."""

    name: str
    value: str
    css: str
    title: str
    flagged: bool


@dataclass(frozen=True)
class ToolCallView:
    """A tool call the record is about: the tool and its arguments."""

    id: str
    name: str
    arguments: list[ToolArgumentView]


def _argument_tooltip(scores: dict[str, Any]) -> str:
    parts = [
        f"quadrant {scores.get('quadrant') or '—'}",
        f"max AU {fmt_num(scores.get('max_au'))}",
        f"max EU {fmt_num(scores.get('max_eu'))}",
        f"mean AU {fmt_num(scores.get('mean_au'))}",
        f"mean EU {fmt_num(scores.get('mean_eu'))}",
        f"log p {fmt_num(scores.get('logprob'))}",
        f"{fmt_num(scores.get('tokens'))} tokens",
    ]
    return " · ".join(parts) if scores else "not scored"


def is_gated_call(rec: AuditRecord) -> bool:
    """True when ``rec`` is a tool call stopped before its tool ran (the tool gate's record: one
    call, whose arguments as JSON are the answer a verdict releases); False for an answer that
    holds calls (the guard decided on the whole answer, calls included)."""
    calls = rec.tool_calls
    return len(calls) == 1 and isinstance(calls[0].get("args"), dict) and rec.answer == arguments_json(calls[0]["args"])


def tool_call_views(calls: list[dict[str, Any]]) -> list[ToolCallView]:
    """The record's ``tool_calls`` for the page: every argument passed or scored, by name."""
    out = []
    for call in calls:
        raw_args, raw_scores = call.get("args"), call.get("arguments")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        scored: dict[str, Any] = raw_scores if isinstance(raw_scores, dict) else {}
        views = []
        for name in sorted({*args, *scored}):
            entry = scored.get(name)
            scores: dict[str, Any] = entry if isinstance(entry, dict) else {}
            q = scores.get("quadrant")
            value = json.dumps(args[name], ensure_ascii=False) if name in args else "(not passed)"
            css = f"q-{q}" if q in ("I", "II", "III", "IV") else "q-none"
            views.append(ToolArgumentView(str(name), value, css, _argument_tooltip(scores), bool(scores.get("flagged"))))
        out.append(ToolCallView(str(call.get("id", "")), str(call.get("name", "")), views))
    return out


def history(item: ReviewItem) -> list[tuple[str, str, str]]:
    """The item's events, oldest first: (time, what, who)."""
    events = [(fmt_time(item.record.created_at), f"answered ({item.record.action})", item.record.model)]
    events.append((fmt_time(item.created_at), "queued for review", "guard"))
    if item.claimed_at is not None and item.claimed_by is not None:
        events.append((fmt_time(item.claimed_at), "claimed", item.claimed_by))
    if item.decided and item.decided_at is not None:
        what = item.status + (" with an edited answer" if item.edited_answer is not None else "")
        events.append((fmt_time(item.decided_at), what, item.reviewer or "—"))
    return events
