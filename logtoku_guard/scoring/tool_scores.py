"""Scored tool calls: the uncertainty of each argument's value, over its own tokens.

A tool call's JSON is mostly syntax the grammar dictates (braces, keys, quotes); what the
model decides is each argument's *value*. For every top-level argument this module finds the
character spans of its value's leaves (a string's characters between its quotes, escapes
included; a number; ``true``/``false``/``null``; inside a nested object or array, each leaf,
not the keys or punctuation) and scores the tokens whose text overlaps them
(:class:`ArgumentScore`: AU/EU mean and max, the sum of the chosen tokens' log p). A value
with no leaf characters (``""``, ``{}``, ``[]``) is scored over the tokens of its whole text.

:func:`value_spans` is the pure mapping on a JSON text (:func:`leaf_spans` per value);
:func:`score_tool_calls` applies it to every call (:func:`~logtoku_guard.tools.constraints.call_spans`)
of a generation. AU/EU: higher = more uncertain; ``logprob``: higher = more confident.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from logtoku_guard.errors import ConfigurationError, short_repr
from logtoku_guard.tools.constraints import call_spans
from logtoku_guard.types import TokenScore

__all__ = ["ARGUMENT_STATS", "ArgumentScore", "ArgumentStat", "ToolCallScore", "leaf_spans", "score_tool_calls", "value_spans"]

Span = tuple[int, int]
_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


class _Scanner:
    """A recursive-descent JSON scanner that records character spans instead of building values."""

    def __init__(self, text: str) -> None:
        self.text = text

    def ws(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in _WS:
            i += 1
        return i

    def value(self, i: int, leaves: list[Span]) -> int:
        """Scan the value at ``i``; append its leaf spans; the index after it."""
        t = self.text
        if i >= len(t):
            raise ValueError("unexpected end of JSON")
        c = t[i]
        if c == "{":
            return self.members(i, leaves, None)
        if c == "[":
            i = self.ws(i + 1)
            if i < len(t) and t[i] == "]":
                return i + 1
            while True:
                i = self.ws(self.value(self.ws(i), leaves))
                if i < len(t) and t[i] == ",":
                    i += 1
                    continue
                if i < len(t) and t[i] == "]":
                    return i + 1
                raise ValueError(f"expected ',' or ']' at {i}")
        if c == '"':
            end = self.string(i)
            leaves.append((i + 1, end - 1))
            return end
        j = i
        while j < len(t) and t[j] not in _WS + ",]}:":
            j += 1
        if j == i or (t[i:j] not in ("true", "false", "null") and not _is_number(t[i:j])):
            raise ValueError(f"not a JSON value at {i}: {t[i:j]!r}")
        leaves.append((i, j))
        return j

    def string(self, i: int) -> int:
        """The index after the string starting at ``i`` (escapes skipped)."""
        t = self.text
        j = i + 1
        while j < len(t):
            if t[j] == "\\":
                j += 2
                continue
            if t[j] == '"':
                return j + 1
            j += 1
        raise ValueError("unterminated string")

    def members(self, i: int, leaves: list[Span], top: dict[str, tuple[Span, list[Span]]] | None) -> int:
        """Scan the object at ``i``; with ``top``, record each member's whole span and leaves under its key."""
        t = self.text
        i = self.ws(i + 1)
        if i < len(t) and t[i] == "}":
            return i + 1
        while True:
            if i >= len(t) or t[i] != '"':
                raise ValueError(f"expected a key at {i}")
            end = self.string(i)
            key = json.loads(t[i:end])
            i = self.ws(end)
            if i >= len(t) or t[i] != ":":
                raise ValueError(f"expected ':' at {i}")
            start = self.ws(i + 1)
            own: list[Span] = []
            i = self.value(start, own)
            leaves.extend(own)
            if top is not None:
                top[key] = ((start, i), own)
            i = self.ws(i)
            if i < len(t) and t[i] == ",":
                i = self.ws(i + 1)
                continue
            if i < len(t) and t[i] == "}":
                return i + 1
            raise ValueError(f"expected ',' or '}}' at {i}")


def _is_number(s: str) -> bool:
    return _NUMBER.fullmatch(s) is not None


def leaf_spans(text: str, start: int = 0) -> tuple[int, list[Span]]:
    """The leaf spans of the JSON value at ``text[start:]`` (after whitespace) and the index after it.

    Raises ValueError on text that is not JSON there.
    """
    scanner = _Scanner(text)
    leaves: list[Span] = []
    end = scanner.value(scanner.ws(start), leaves)
    return end, leaves


def value_spans(text: str, start: int = 0, end: int | None = None) -> dict[str, tuple[Span, list[Span]]]:
    """For the JSON object in ``text[start:end]``: each key's ``(whole value span, leaf spans)``.

    Spans index ``text``. Raises ValueError when the text there is not one JSON object.
    """
    end = len(text) if end is None else end
    scanner = _Scanner(text[:end])
    i = scanner.ws(start)
    if i >= end or text[i] != "{":
        raise ValueError("not a JSON object")
    top: dict[str, tuple[Span, list[Span]]] = {}
    after = scanner.members(i, [], top)
    if scanner.ws(after) != end:
        raise ValueError("text after the JSON object")
    return top


ArgumentStat = Literal["tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob"]
"""The statistics of one argument value; ``logprob`` is the only one where higher = more reliable."""

ARGUMENT_STATS: tuple[str, ...] = ("tokens", "mean_au", "mean_eu", "max_au", "max_eu", "logprob")


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"{where} must be a number, got {short_repr(value)}; the scorer writes floats (NaN for an empty value)"
        raise ConfigurationError(msg)
    return float(value)


@dataclass(frozen=True)
class ArgumentScore:
    """The uncertainty of one argument value, over the tokens of that value.

    ``tokens``: how many tokens the value took. ``mean_au``/``mean_eu``/``max_au``/``max_eu``:
    aleatoric and epistemic uncertainty (higher = more uncertain), NaN for a value of no
    tokens. ``logprob``: the summed natural-log probability of the value's chosen tokens
    (higher = more likely; 0 for no tokens).
    """

    tokens: int
    mean_au: float
    mean_eu: float
    max_au: float
    max_eu: float
    logprob: float

    def get(self, stat: str) -> float:
        """The statistic ``stat`` (one of :data:`ARGUMENT_STATS`) as a float."""
        if stat not in ARGUMENT_STATS:
            msg = f"unknown argument statistic {stat!r}; use one of {', '.join(ARGUMENT_STATS)}"
            raise ConfigurationError(msg)
        return float(getattr(self, stat))

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ArgumentScore:
        """Validate one argument's entry of the :meth:`as_dict` form; ``where`` names it in errors."""
        if not isinstance(data, Mapping):
            msg = f"{where} must be a mapping of {', '.join(ARGUMENT_STATS)}, got {short_repr(data)}"
            raise ConfigurationError(msg)
        missing = [s for s in ARGUMENT_STATS if s not in data]
        extra = sorted(str(k) for k in data if k not in ARGUMENT_STATS)
        if missing or extra:
            parts = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(extra)}" if extra else ""]
            msg = f"{where}: {'; '.join(p for p in parts if p)}; an argument's scores are exactly {', '.join(ARGUMENT_STATS)}"
            raise ConfigurationError(msg)
        tokens = data["tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or int(tokens) < 0:
            msg = f"{where}.tokens must be a non-negative integer, got {short_repr(tokens)}"
            raise ConfigurationError(msg)
        values = {s: _number(data[s], f"{where}.{s}") for s in ARGUMENT_STATS[1:]}
        for s, v in values.items():
            if math.isinf(v) and s != "logprob":
                msg = f"{where}.{s} is {v}; AU/EU are finite (NaN when undefined): check the scorer"
                raise ConfigurationError(msg)
        return cls(tokens=int(tokens), **values)

    def as_dict(self) -> dict[str, float | int]:
        """``{tokens, mean_au, mean_eu, max_au, max_eu, logprob}`` (NaN kept; the audit record and
        the server's JSON turn it into null)."""
        return {s: getattr(self, s) for s in ARGUMENT_STATS}


@dataclass(frozen=True)
class ToolCallScore:
    """One well-formed call of a generation: its tool's ``name``, its ``args`` (the argument values
    as parsed) and each top-level argument's score."""

    name: str
    arguments: dict[str, ArgumentScore]
    args: dict[str, Any] = field(default_factory=dict)


def _score(tokens: Sequence[TokenScore]) -> ArgumentScore:
    au = [t.au for t in tokens]
    eu = [t.eu for t in tokens]
    return ArgumentScore(
        tokens=len(tokens),
        mean_au=math.fsum(au) / len(au),
        mean_eu=math.fsum(eu) / len(eu),
        max_au=max(au),
        max_eu=max(eu),
        logprob=math.fsum(t.logprob for t in tokens),
    )


def _overlapping(bounds: Sequence[Span], spans: Sequence[Span]) -> list[int]:
    """Indexes of the tokens (character ``bounds``) that overlap any non-empty span."""
    return [i for i, (a, b) in enumerate(bounds) if any(a < e and s < b for s, e in spans if s < e)]


def score_tool_calls(tokens: Sequence[TokenScore]) -> list[ToolCallScore | None]:
    """Per call of the answer ``tokens`` spell (in order): its scored arguments, or None when the
    call is not a JSON object with a ``name`` string and an ``arguments`` object."""
    text = "".join(t.text for t in tokens)
    bounds: list[Span] = []
    offset = 0
    for t in tokens:
        bounds.append((offset, offset + len(t.text)))
        offset += len(t.text)
    out: list[ToolCallScore | None] = []
    for start, end in call_spans(text):
        try:
            members = value_spans(text, start, end)
            (name_span, _), (args_span, _) = members["name"], members["arguments"]
        except (ValueError, KeyError):
            out.append(None)
            continue
        name = json.loads(text[name_span[0] : name_span[1]])
        if not isinstance(name, str) or text[args_span[0]] != "{":
            out.append(None)
            continue
        arguments = {}
        for key, (whole, leaves) in value_spans(text, *args_span).items():
            picked = _overlapping(bounds, leaves) or _overlapping(bounds, [whole])
            arguments[key] = _score([tokens[i] for i in picked])
        args = json.loads(text[args_span[0] : args_span[1]])
        out.append(ToolCallScore(name, arguments, args))
    return out
