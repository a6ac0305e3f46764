"""The wire models of tool calls and structured output (OpenAI's ``tools``, ``tool_choice``, ``response_format``).

Requests: :class:`ToolParam` (a function: ``name``, ``description``, ``parameters`` as a JSON
Schema object), a ``tool_choice`` (``"none"`` | ``"auto"`` | ``"required"`` |
:class:`NamedToolChoice`), a :class:`ResponseFormat` (text, a JSON object, or a JSON
schema's value), and the history's
:class:`ToolCall` items of an assistant turn. Schemas are bounded (:data:`MAX_TOOLS`,
:data:`MAX_SCHEMA_DEPTH`, :data:`MAX_SCHEMA_CHARS`): a grammar is compiled from each per request.
:func:`check_tool_fields` checks how the fields combine (the request model calls it).

Responses: ``message.tool_calls`` items are :class:`ToolCall` (``arguments`` a JSON string),
a stream sends :class:`ToolCallDelta` items; the choice's ``logtoku`` extra gains
``tool_calls`` (:class:`ToolCallScoresPayload`: per call, per argument, the AU/EU and log p of
the argument value's tokens). No web framework is imported here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator
from typing_extensions import NotRequired, TypedDict

from logtoku_guard.errors import short_repr
from logtoku_guard.wire.openai_errors import WireValueError
from logtoku_guard.wire.payloads import SummaryPayload, TokenPayload

__all__ = [
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_DEPTH",
    "MAX_TOOLS",
    "ArgumentScorePayload",
    "ChoiceScoresPayload",
    "FunctionCall",
    "FunctionCallDelta",
    "FunctionDefinition",
    "JsonSchemaSpec",
    "LogTokUToken",
    "NamedFunction",
    "NamedToolChoice",
    "ResponseFormat",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallScoresPayload",
    "ToolChoice",
    "ToolParam",
    "check_tool_fields",
]

MAX_TOOLS = 128
"""Most tools one request may declare (OpenAI's limit)."""
MAX_SCHEMA_DEPTH = 32
"""Deepest nesting of objects/arrays in one tool's parameters or one response schema."""
MAX_SCHEMA_CHARS = 65_536
"""Longest JSON text of one tool's parameters or one response schema."""

_REQUEST = ConfigDict(strict=True, extra="ignore")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))


def json_depth(raw: bytes, stop_above: int | None = None) -> int:
    """How deep ``raw`` nests JSON arrays and objects (brackets inside strings do not count).

    Counting stops once the depth passes ``stop_above``. For text that is not valid JSON the
    count is an upper bound up to the first error, all a parser would read.
    """
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for b in brackets:
        if b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    break
        else:
            depth -= 1
    return deepest


MAX_ARGUMENT_DEPTH = 64
"""Deepest nesting of a tool call's ``arguments`` JSON read from a request's history."""


def _depth(value: Any) -> int:
    if isinstance(value, Mapping):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _refs(node: Any, path: tuple[str, ...]) -> Any:
    """Every ``$ref`` string under ``node`` as ``(its location, its target)``."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield path, ref
        for key, value in node.items():
            yield from _refs(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, (*path, str(i)))


def _pointer(ref: str) -> tuple[str, ...] | None:
    """A local JSON pointer (``#``, ``#/$defs/a``) as its path; None for any other reference."""
    if ref == "#":
        return ()
    if not ref.startswith("#/"):
        return None
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/"))


def _resolve(schema: Any, path: tuple[str, ...]) -> Any:
    node = schema
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def recursive_ref(schema: dict[str, Any]) -> str | None:
    """The first ``$ref`` that makes ``schema`` recursive (or is not a local pointer to a part of it), else None.

    A recursive schema has no bound on the JSON it describes, so no grammar compiled from it has a
    bound on its work per token: a request's schema must not be one (the served grammar limits)."""
    checked: set[tuple[str, ...]] = set()

    def visit(target: tuple[str, ...], chain: tuple[tuple[str, ...], ...]) -> str | None:
        if target in chain:
            return "#/" + "/".join(target) if target else "#"
        if target in checked:
            return None
        node = _resolve(schema, target)
        if node is None:
            return "#/" + "/".join(target)
        for location, ref in _refs(node, target):
            pointer = _pointer(ref)
            if pointer is None or location[: len(pointer)] == pointer:  # remote, or pointing to its own ancestor
                return ref
            found = visit(pointer, (*chain, target))
            if found is not None:
                return found
        checked.add(target)
        return None

    return visit((), ())


def _check_schema(schema: dict[str, Any], where: str, param: str) -> None:
    text = json.dumps(schema, ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        msg = f"{where} is {len(text)} characters of JSON, over this server's limit of {MAX_SCHEMA_CHARS}; send a smaller schema"
        raise WireValueError(msg, param)
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        msg = f"{where} nests objects/arrays deeper than {MAX_SCHEMA_DEPTH} levels; send a flatter schema"
        raise WireValueError(msg, param)
    ref = recursive_ref(schema)
    if ref is not None:
        msg = (
            f"{where} has the $ref {short_repr(ref)}, which is recursive or does not point to a part of the schema: "
            "a recursive schema's JSON and grammar are unbounded; use local $refs (#/$defs/...) without cycles, "
            "or inline the definition to a fixed depth"
        )
        raise WireValueError(msg, param)


def _check_name(name: str, what: str, param: str) -> str:
    if _NAME.fullmatch(name) is None:
        msg = f"{what} {short_repr(name)} must be 1 to 64 letters, digits, '_' or '-'"
        raise WireValueError(msg, param)
    return name


# -- requests ----------------------------------------------------------------------------------
class FunctionDefinition(BaseModel):
    """A callable function: ``parameters`` is the JSON Schema of its arguments object (left out: no arguments)."""

    model_config = _REQUEST
    name: StrictStr = Field(description="The function's name: 1 to 64 letters, digits, '_' or '-'.")
    description: StrictStr | None = Field(default=None, description="What the function does (shown to the model).")
    parameters: dict[str, Any] | None = Field(default=None, description="JSON Schema of the arguments (an object).")
    strict: StrictBool | None = Field(default=None, description="Accepted; calls are always decoded under the schema.")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return _check_name(name, "a tool's function.name", "tools")

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is None:
            return None
        if parameters.get("type", "object") != "object":
            msg = (
                f"a tool's function.parameters must be a JSON Schema of an object ({{'type': 'object', 'properties': "
                f"{{...}}}}), got type {short_repr(parameters.get('type'))}"
            )
            raise WireValueError(msg, "tools")
        _check_schema(parameters, "a tool's function.parameters", "tools")
        return parameters


class ToolParam(BaseModel):
    """One tool: ``{"type": "function", "function": {...}}``."""

    model_config = _REQUEST
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _REQUEST
    name: StrictStr


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: the answer is one call of that tool."""

    model_config = _REQUEST
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaSpec(BaseModel):
    """``response_format.json_schema``: the answer is one JSON value valid against ``schema``."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: StrictStr = Field(description="The schema's name: 1 to 64 letters, digits, '_' or '-'.")
    description: StrictStr | None = None
    json_schema: dict[str, Any] = Field(alias="schema", description="The JSON Schema the answer follows.")
    strict: StrictBool | None = Field(default=None, description="Accepted; the answer is always decoded under the schema.")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return _check_name(name, "response_format.json_schema.name", "response_format")

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        _check_schema(schema, "response_format.json_schema.schema", "response_format")
        return schema


class ResponseFormat(BaseModel):
    """``{"type": "text"}`` (free text), ``{"type": "json_object"}`` (one JSON object) or
    ``{"type": "json_schema", "json_schema": {"name", "schema"}}`` (one JSON value valid against the schema)."""

    model_config = _REQUEST
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = Field(default=None, description="With type 'json_schema': the schema.")

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            msg = (
                "response_format {'type': 'json_schema'} needs 'json_schema': {'name': ..., 'schema': {...}}, "
                f"and only that type takes one (got type {self.type!r})"
            )
            raise WireValueError(msg, "response_format")
        return self


# -- tool calls (an assistant turn of the history, and the response) -----------------------------
class FunctionCall(BaseModel):
    """The function a call names and its ``arguments`` as a JSON string (of an object)."""

    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str


class ToolCall(BaseModel):
    """One call: ``{"id", "type": "function", "function": {"name", "arguments"}}``."""

    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @property
    def parsed_arguments(self) -> Any:
        """``function.arguments`` read as JSON (raises ``ValueError`` when it is not JSON, or nests
        deeper than :data:`MAX_ARGUMENT_DEPTH`: the parser recurses per level)."""
        text = self.function.arguments
        if json_depth(text.encode("utf-8", "surrogatepass"), MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            msg = f"the arguments nest JSON deeper than {MAX_ARGUMENT_DEPTH} levels"
            raise ValueError(msg)
        return json.loads(text)


class FunctionCallDelta(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """What a stream's chunk adds to call ``index`` (the first delta of a call has its ``id``, ``type`` and name)."""

    model_config = ConfigDict(extra="ignore")
    index: StrictInt
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


# -- the scores extra --------------------------------------------------------------------------
class ArgumentScorePayload(TypedDict):
    """One argument value's scores over its ``tokens``: AU/EU (higher = more uncertain) and the sum of
    the chosen tokens' raw log p (higher = more confident)."""

    tokens: int
    mean_au: float | None
    mean_eu: float | None
    max_au: float | None
    max_eu: float | None
    logprob: float | None


class ToolCallScoresPayload(TypedDict):
    """One call of ``message.tool_calls`` (same ``id``): each top-level argument's scores."""

    id: str
    name: str
    arguments: dict[str, ArgumentScorePayload]


class LogTokUToken(TokenPayload):
    """The per-token ``logtoku`` extension: the token's payload plus the ids of its top-K logits."""

    top_ids: list[int]


class ChoiceScoresPayload(SummaryPayload):
    """A choice's ``logtoku`` extra: the answer's summary and, when it called tools, each call's scores.

    ``prompt_scores``: the question's own tokens scored at the prefill (what the guard's prompt-side
    statistics are computed from), so a remote guard decides as a local one.
    """

    tool_calls: NotRequired[list[ToolCallScoresPayload]]
    prompt_scores: NotRequired[list[LogTokUToken]]


# -- how the fields combine --------------------------------------------------------------------
def check_tool_fields(
    tools: Sequence[ToolParam] | None,
    tool_choice: ToolChoice | None,
    response_format: ResponseFormat | None,
) -> None:
    """Raise :class:`WireValueError` (naming the field and the fix) for a combination this server cannot serve."""
    names = [t.function.name for t in tools or ()]
    if len(names) > MAX_TOOLS:
        raise WireValueError(f"tools has {len(names)} tools, over the limit of {MAX_TOOLS}; send at most {MAX_TOOLS}", "tools")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise WireValueError(f"tool names must be unique, got {twice} more than once; rename or drop the duplicates", "tools")
    if tool_choice not in (None, "none") and not names:
        msg = f"tool_choice={short_repr(_plain(tool_choice))} needs tools: send the tools, or leave tool_choice out"
        raise WireValueError(msg, "tool_choice")
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        msg = (
            f"tool_choice names the function {tool_choice.function.name!r}, which is not among the tools {names}; "
            "name one of them, or send 'auto' or 'required'"
        )
        raise WireValueError(msg, "tool_choice")
    kind = "text" if response_format is None else response_format.type
    if kind != "text" and names and tool_choice != "none":
        msg = (
            f"response_format {kind!r} and tools cannot both shape one answer here: send tool_choice='none' "
            "for a JSON answer with the tools left out, or leave response_format out (or {'type': 'text'}) to call tools"
        )
        raise WireValueError(msg, "response_format")


def _plain(choice: Any) -> Any:
    return choice.model_dump() if isinstance(choice, BaseModel) else choice
