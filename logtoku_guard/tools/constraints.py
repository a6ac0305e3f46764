"""Constraints on what a backend may generate: a JSON schema, or tool calls.

A constraint rides on :class:`~logtoku_guard.types.DecodingOptions` (``constraint=``) and is
backend-agnostic: it only says *what* the answer must look like. A backend that supports
constrained decoding compiles it into a token grammar (:mod:`logtoku_guard.tools.grammar`, the
``tools`` extra) and masks, at every step, the tokens that would leave the grammar: the mask
is applied *after* the raw logits were recorded, so AU/EU and log p stay the model's.

- :class:`JsonSchema`: the whole answer is one JSON value valid against the schema
  (structured output, ``response_format={"type": "json_schema", ...}``).
- :class:`ToolCalls`: tool calls in the tool-call format SmolLM2 was trained on (its
  function-calling data): :data:`TOOL_CALL_OPEN` ``[`` then the calls as a JSON list
  ``{"name": ..., "arguments": {...}}`` (one per line) ``]`` :data:`TOOL_CALL_CLOSE`, for
  OpenAI-format tools; a constrained answer holds one call.
  ``choice="required"``: the whole answer is one call of any of the tools; a tool name: one
  call of that tool; ``"auto"``: the model may answer in prose, and once it writes
  :data:`TOOL_CALL_OPEN` the rest of the call is constrained (the answer ends with the call).

JSON is written with ``", "`` and ``": "`` separators and no other whitespace (the style of
``json.dumps``, which models have seen most), so an answer cannot run on in blank space.
A string value cannot run on either when it is bounded: a schema's own ``maxLength`` always
applies, and ``max_string_length=n`` (both constraints) gives every other string value of the
schema a ``maxLength`` of ``n`` characters (:func:`bounded_schema`; not strings with ``enum``,
``const`` or ``pattern``), so a small model that loops inside a string (``"and the cat was ...,
and the cat was ..."``) has the string closed after ``n`` characters and the JSON completed.
None (the default): strings as long as the schema allows.
Pure Python; no grammar engine is imported here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from logtoku_guard.errors import ConfigurationError

__all__ = [
    "CALL_BLOCK",
    "CALL_LIST_CLOSE",
    "CALL_LIST_OPEN",
    "DEFAULT_MAX_STRING_LENGTH",
    "JSON_STYLE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "Constraint",
    "JsonSchema",
    "ToolCalls",
    "bounded_schema",
    "call_spans",
    "refuse_constraint",
    "tool_call_schema",
]

DEFAULT_MAX_STRING_LENGTH = 128
"""The ``max_string_length`` a chat model uses under a grammar unless told otherwise (LangChain's
``ChatLogTokU``): a small model loops inside a string value (the 135M model, greedy: ``"I'm a cat,
I'm a cat, ..."``) until ``max_tokens`` cuts the JSON open; a cap closes the string so the object
ends, and 128 characters (about 30-40 tokens) leaves the default ``max_tokens=256`` room for a call
or an object of a few such strings. The schema's own ``maxLength`` always applies; None lifts it."""

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
CALL_LIST_OPEN = "[\n"
CALL_LIST_CLOSE = "\n]"
"""The list of calls inside a block, as SmolLM2's format lays it out: ``<tool_call>[\n{...}\n]</tool_call>``."""
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How constrained JSON is written (llguidance's JSON options): ``json.dumps`` separators, no free whitespace."""

CALL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL)
"""One ``<tool_call>`` block of an answer (group 1: its body); a block cut off by the token limit runs to the end."""


def _canonical(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        msg = f"{what} must be JSON (dicts, lists, strings, numbers, booleans, None): {exc}"
        raise ConfigurationError(msg) from exc


def _check_cap(cap: Any) -> int | None:
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        msg = f"max_string_length must be a positive number of characters or None (unbounded), got {cap!r}"
        raise ConfigurationError(msg)
    return cap


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def bounded_schema(schema: Any, cap: int | None) -> Any:
    """A copy of ``schema`` whose string values without a bound get ``maxLength: cap`` (None: ``schema`` as is).

    A string schema (``type`` ``"string"`` or a list holding it) already bounded by
    ``maxLength``, ``enum``, ``const`` or ``pattern`` is kept; sub-schemas (properties, items,
    ``anyOf``/``oneOf``/``allOf``, ``$defs``, ...) are bounded the same way.
    """
    if cap is None or not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    kind = out.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    if is_string and not any(key in out for key in ("maxLength", "enum", "const", "pattern")):
        out["maxLength"] = cap
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded_schema(item, cap) for item in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: bounded_schema(item, cap) for name, item in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), Mapping):
            out[key] = bounded_schema(out[key], cap)
    return out


class JsonSchema:
    """The answer is one JSON value valid against ``schema`` (a JSON Schema as a dict).

    Hashable and compared by the schema's canonical JSON (and ``max_string_length``); the schema
    is copied (a caller's later edit changes nothing). Whether the grammar engine implements
    every keyword is checked when a backend compiles it. ``max_string_length``: the
    ``maxLength`` of the schema's unbounded strings (:func:`bounded_schema`; None: unbounded).
    """

    __slots__ = ("_text", "max_string_length", "name")

    def __init__(self, schema: Mapping[str, Any], name: str | None = None, *, max_string_length: int | None = None) -> None:
        if not isinstance(schema, Mapping):
            msg = f"JsonSchema needs a JSON Schema dict, e.g. {{'type': 'object', 'properties': {{...}}}}; got {schema!r:.80}"
            raise ConfigurationError(msg)
        if name is not None and (not isinstance(name, str) or not name):
            msg = f"JsonSchema name must be a non-empty string or None, got {name!r}"
            raise ConfigurationError(msg)
        self._text = _canonical(dict(schema), "a JSON schema")
        self.name = name
        self.max_string_length = _check_cap(max_string_length)

    @property
    def schema(self) -> dict[str, Any]:
        """A fresh copy of the schema."""
        out: dict[str, Any] = json.loads(self._text)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonSchema) and (self._text, self.name, self.max_string_length) == (
            other._text,
            other.name,
            other.max_string_length,
        )

    def __hash__(self) -> int:
        return hash(("JsonSchema", self._text, self.name, self.max_string_length))

    def __repr__(self) -> str:
        return f"JsonSchema({self._text[:60]}{'...' if len(self._text) > 60 else ''})"


class ToolCalls:
    """Tool calls in the JSON tool-call format for ``tools`` (OpenAI format), as ``choice`` allows.

    Args:
        tools: OpenAI tool dicts ``{"type": "function", "function": {"name", "description",
            "parameters"}}`` (``parameters`` a JSON Schema object; missing: no arguments).
        choice: ``"required"`` (alias ``"any"``): one call of any tool; a tool's name: one call
            of that tool; ``"auto"``: prose, or prose then one call.
        max_string_length: the ``maxLength`` of the arguments' unbounded strings
            (:func:`bounded_schema`; None: unbounded).
    """

    __slots__ = ("_text", "choice", "max_string_length", "names")

    def __init__(
        self, tools: Sequence[Mapping[str, Any]], choice: str = "required", *, max_string_length: int | None = None
    ) -> None:
        if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence) or not tools:
            msg = f"ToolCalls needs a non-empty list of OpenAI tool dicts, got {tools!r:.80}"
            raise ConfigurationError(msg)
        names = []
        for t in tools:
            function = t.get("function") if isinstance(t, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            if not isinstance(name, str) or not name:
                msg = f"each tool must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}, got {t!r:.80}"
                raise ConfigurationError(msg)
            parameters = function.get("parameters", {})  # type: ignore[union-attr]
            if not isinstance(parameters, Mapping):
                msg = f"tool {name!r}: parameters must be a JSON Schema object, got {parameters!r:.80}"
                raise ConfigurationError(msg)
            names.append(name)
        if len(set(names)) != len(names):
            msg = f"tool names must be unique, got {names}"
            raise ConfigurationError(msg)
        if choice == "any":
            choice = "required"
        if not isinstance(choice, str) or (choice not in ("auto", "required") and choice not in names):
            msg = f"choice must be 'auto', 'required' (or 'any') or a tool name among {names}, got {choice!r}"
            raise ConfigurationError(msg)
        self._text = _canonical([dict(t) for t in tools], "tools")
        self.names = tuple(names)
        self.choice = choice
        self.max_string_length = _check_cap(max_string_length)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """A fresh copy of the tools."""
        out: list[dict[str, Any]] = json.loads(self._text)
        return out

    @property
    def forced(self) -> bool:
        """Whether the whole answer must be a call (``choice`` is not ``"auto"``)."""
        return self.choice != "auto"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCalls) and (self._text, self.choice, self.max_string_length) == (
            other._text,
            other.choice,
            other.max_string_length,
        )

    def __hash__(self) -> int:
        return hash(("ToolCalls", self._text, self.choice, self.max_string_length))

    def __repr__(self) -> str:
        return f"ToolCalls(names={list(self.names)}, choice={self.choice!r})"


Constraint = JsonSchema | ToolCalls


def tool_call_schema(constraint: ToolCalls) -> dict[str, Any]:
    """The JSON Schema of one call's object ``{"name": ..., "arguments": {...}}`` under ``constraint``'s choice.

    Several allowed tools: an ``anyOf`` of one exact-name branch per tool. Arguments are the
    declared parameters only (``additionalProperties: false`` unless the tool says otherwise),
    their strings bounded by ``constraint.max_string_length``.
    """
    branches = []
    for tool in constraint.tools:
        function = tool["function"]
        if constraint.choice not in ("auto", "required") and function["name"] != constraint.choice:
            continue
        parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
        parameters.setdefault("type", "object")
        parameters.setdefault("additionalProperties", False)  # the declared parameters only, as OpenAI's strict mode
        parameters = bounded_schema(parameters, constraint.max_string_length)
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _listed(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The spans of the items of the JSON list at ``text[start:end]``; a cut item runs to ``end``."""
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    i = start + 1  # after "["
    while True:
        i, _ = _strip(text, i, end)
        if i >= end or text[i] == "]":
            return spans
        try:
            _, after = decoder.raw_decode(text[:end], i)
        except json.JSONDecodeError:
            spans.append(_strip(text, i, end))
            return spans
        spans.append((i, after))
        i, _ = _strip(text, after, end)
        if i < end and text[i] == ",":
            i += 1
        elif i >= end or text[i] != "]":
            if i < end:
                spans.append(_strip(text, i, end))
            return spans


def call_spans(text: str) -> list[tuple[int, int]]:
    """The character spans ``(start, end)`` of each call's JSON object in ``text``, in order.

    A block between the tags holds a JSON list of calls (each item is a span; ``[]``: none) or
    one call object; an unclosed last block, or a call cut short, runs to the end of ``text``.
    Surrounding whitespace is left out.
    """
    spans = []
    for m in CALL_BLOCK.finditer(text):
        start, end = _strip(text, *m.span(1))
        if start < end and text[start] == "[":
            spans.extend(_listed(text, start, end))
        elif start < end:
            spans.append((start, end))
    return spans


def refuse_constraint(constraint: Constraint | None, backend: str, why: str) -> None:
    """Raise a :class:`ConfigurationError` when a backend without constrained decoding is given a constraint."""
    if constraint is not None:
        msg = (
            f"the {backend} backend cannot apply constraint={constraint!r}: {why}; "
            "use the transformers or llama.cpp backend (TransformersBackend, LlamaCppBackend) for tool calls and JSON schemas"
        )
        raise ConfigurationError(msg)
