"""Tool calls as text: the JSON tool-call prompt, the history turns, and the parser of an answer.

The core backends take plain chat turns, and small chat templates (the embedded
SmolLM2-135M-Instruct's ChatML) have no tools section. So tools are described in the system
turn, in the Hermes/Qwen style many open models were trained on, and the model's calls are
read back from its text; the LangChain adapter and ``logtoku-guard serve`` both use this:

- :func:`tool_prompt`: :data:`TOOL_PROMPT` with the tools as OpenAI JSON schemas and the rule
  "to call a tool, answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``"
  (one block per call); a forced choice adds "you must call a tool" / "you must call X";
  :func:`schema_prompt` tells the model the JSON schema of a structured answer;
  :func:`with_system_text` adds either to the system turn;
- :func:`render_tool_calls`: an assistant turn that called tools, with the same blocks;
  :func:`render_tool_result`: a tool's result as ``<tool_response>{"name", "tool_call_id",
  "content"}</tool_response>`` (:func:`add_tool_result` puts consecutive results in one user turn);
- :func:`parse_tool_calls`: an answer split into its prose and its calls (:class:`ParsedCall`,
  :class:`InvalidCall`); a whole answer that is one such JSON object naming a known tool (no
  tags) counts too;
- :func:`tool_call_scores`: each parsed call's per-argument scores (over the tokens of each
  argument's value, :mod:`logtoku_guard.tool_scores`), as ``{"id", "name", "arguments"}``.

Under constrained decoding (:class:`~logtoku_guard.constraints.ToolCalls`) the model can only
write calls of this format, so every call parses.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_guard.constraints import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, JsonSchema
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.tool_scores import score_tool_calls
from logtoku_guard.types import ChatMessage, TokenScore

__all__ = [
    "TOOL_PROMPT",
    "TOOL_RESPONSE_OPEN",
    "InvalidCall",
    "ParsedAnswer",
    "ParsedCall",
    "add_tool_result",
    "new_call_id",
    "parse_tool_calls",
    "render_call",
    "render_tool_calls",
    "render_tool_result",
    "schema_prompt",
    "tool_call_scores",
    "tool_names",
    "tool_prompt",
    "with_system_text",
]

TOOL_PROMPT = (
    "You can call tools. To call a tool, answer with only a block\n"
    '<tool_call>{{"name": "<tool name>", "arguments": {{<the arguments as JSON>}}}}</tool_call>\n'
    "(one block per call). When you do not need a tool, answer normally.{rule}\n"
    "The tools, as JSON schemas:\n{tools}"
)
TOOL_RESPONSE_OPEN = "<tool_response>"

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of OpenAI-format tools (a tool without one is a configuration error)."""
    out = []
    for t in tools:
        function = t.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            shape = "{'type': 'function', 'function': {'name': ...}}"
            msg = f"a tool needs a name: pass OpenAI tool dicts {shape}, got {t!r:.80}"
            raise ConfigurationError(msg)
        out.append(name)
    return out


def tool_prompt(tools: Sequence[Mapping[str, Any]], choice: str | None) -> str | None:
    """The system-turn text describing ``tools`` (OpenAI tool dicts) under ``choice``.

    ``choice``: ``None`` (the model decides), ``"any"`` (it must call one), a tool's name (it
    must call that one) or ``"none"``. None when there are no tools or ``choice`` is ``"none"``.
    """
    if not tools or choice == "none":
        return None
    if choice == "any":
        rule = " You must call one of the tools."
    elif choice is not None:
        rule = f" You must call the tool {choice!r}."
    else:
        rule = ""
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return TOOL_PROMPT.format(rule=rule, tools=schemas)


def schema_prompt(constraint: JsonSchema) -> str:
    """The system-turn text that tells the model the JSON it must answer with."""
    return f"Answer with only a JSON value that follows this JSON schema:\n{json.dumps(constraint.schema, ensure_ascii=False)}"


def with_system_text(messages: list[ChatMessage], text: str | None) -> list[ChatMessage]:
    """``messages`` with ``text`` appended to the system turn (or a system turn added first); a new list."""
    if text is None:
        return messages
    if messages and messages[0].role == "system":
        return [ChatMessage("system", f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [ChatMessage("system", text), *messages]


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call as the model writes it: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def render_tool_calls(content: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """An assistant turn that called tools, as text: its ``content``, then one block per ``(name, arguments)``."""
    blocks = [render_call(name, arguments) for name, arguments in calls]
    return "\n".join([content, *blocks] if content else blocks)


def render_tool_result(name: str | None, call_id: str | None, content: str) -> str:
    """A tool's result, as the text the model reads (in a user turn)."""
    body = {"name": name, "tool_call_id": call_id, "content": content}
    return f"{TOOL_RESPONSE_OPEN}{json.dumps(body, ensure_ascii=False)}</tool_response>"


def add_tool_result(turns: list[ChatMessage], text: str) -> None:
    """Append a rendered tool result to ``turns``: to the last user turn when it holds tool results, else as a new one."""
    if turns and turns[-1].role == "user" and turns[-1].content.startswith(TOOL_RESPONSE_OPEN):
        turns[-1] = ChatMessage("user", f"{turns[-1].content}\n{text}")
    else:
        turns.append(ChatMessage("user", text))


def new_call_id() -> str:
    """A fresh call id in OpenAI's style (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ParsedCall:
    """A well-formed call of a known tool: its ``id`` (fresh), ``name``, ``arguments`` and the block's JSON text ``raw``."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True)
class InvalidCall:
    """A block that is not a call of a known tool: ``raw`` its text, ``error`` why (``name`` when it had one)."""

    id: str
    name: str | None
    raw: str
    error: str


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer split into its ``content`` (the text outside the call blocks), ``calls`` and ``invalid`` blocks."""

    content: str
    calls: tuple[ParsedCall, ...] = ()
    invalid: tuple[InvalidCall, ...] = ()


def _one(raw: str) -> ParsedCall | InvalidCall:
    call_id = new_call_id()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return InvalidCall(call_id, None, raw, f"not JSON: {exc}")
    name = data.get("name") if isinstance(data, dict) else None
    args = data.get("arguments", data.get("parameters", {})) if isinstance(data, dict) else None
    if isinstance(args, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args)
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        why = "a tool call needs a 'name' string and an 'arguments' object"
        return InvalidCall(call_id, name if isinstance(name, str) else None, raw, why)
    return ParsedCall(call_id, name, args, raw)


def parse_tool_calls(text: str, names: Sequence[str]) -> ParsedAnswer:
    """Split a model answer into its prose and its calls; ``names``: the known tools (a call of another is invalid)."""
    found = [m.group(1).strip() for m in _BLOCK.finditer(text)]
    content = _BLOCK.sub("", text).strip()
    stripped = text.strip()
    if not found and stripped.startswith("{") and stripped.endswith("}"):
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and whole.get("name") in names:
            found, content = [stripped], ""
    calls: list[ParsedCall] = []
    invalid: list[InvalidCall] = []
    for raw in found:
        call = _one(raw)
        if isinstance(call, InvalidCall):
            invalid.append(call)
        elif call.name not in names:
            invalid.append(InvalidCall(call.id, call.name, raw, f"no tool named {call.name!r}"))
        else:
            calls.append(call)
    return ParsedAnswer(content, tuple(calls), tuple(invalid))


def tool_call_scores(
    calls: Sequence[tuple[str | None, str, Mapping[str, Any]]], tokens: Sequence[TokenScore]
) -> list[dict[str, Any]]:
    """Per call ``(id, name, arguments)``: ``{"id", "name", "arguments": {arg: {tokens, mean_au, mean_eu,
    max_au, max_eu, logprob}}}``, each top-level argument scored over its value's ``tokens``.

    The scored blocks of the answer are paired with ``calls`` in order, by name and argument
    names; a call whose block could not be scored (a bare JSON answer, string-encoded
    arguments) has no entry.
    """
    scored = [s for s in score_tool_calls(tokens) if s is not None]
    out: list[dict[str, Any]] = []
    for call_id, name, arguments in calls:
        match = next((s for s in scored if s.name == name and set(s.arguments) == set(arguments)), None)
        if match is None:
            continue
        scored.remove(match)
        out.append({"id": call_id, "name": name, "arguments": {k: v.as_dict() for k, v in match.arguments.items()}})
    return out
