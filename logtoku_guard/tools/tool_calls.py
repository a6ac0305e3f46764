"""Tool calls as text: the tool-call prompt and format SmolLM2 was trained on, the history turns, and the parser.

The core backends take plain chat turns, and the converted SmolLM2-135M-Instruct's chat
template (ChatML) has no tools section; but the SmolLM2 instruct models were tuned on
function-calling data in one format (the model card's, and Ollama's SmolLM2 template), which
is the one used here; the LangChain adapter and ``logtoku-guard serve`` both use it:

- :func:`tool_prompt`: :data:`TOOL_PROMPT` ("You are an expert in composing functions ...",
  the tools as a JSON list of OpenAI tool dicts between ``<tools>`` tags, and the answer format
  ``<tool_call>[\n{"name": ..., "arguments": {...}}\n]</tool_call>``, the calls as one JSON
  list); the training prompt's rule "no call needed: an empty list" reads "answer normally"
  when the model decides, and a forced choice adds "you must call a tool" / "you must call X";
  :func:`schema_prompt` tells the model the JSON schema of a structured answer;
  :func:`with_system_text` adds either to the system turn;
- :func:`render_tool_calls`: an assistant turn that called tools, as that block;
  :func:`render_tool_result`: a tool's result as ``<tool_response>\n{content}\n</tool_response>``,
  as in training (:func:`add_tool_result` puts consecutive results in one user turn);
- :func:`parse_tool_calls`: an answer split into its prose and its calls (:class:`ParsedCall`,
  :class:`InvalidCall`): each call object of a block (a list of them, or one object;
  :func:`~logtoku_guard.tools.constraints.call_spans`); an empty list is no call; a whole answer that
  is one such JSON object naming a known tool (no tags) counts too;
- :func:`tool_call_scores`: each parsed call's per-argument scores (over the tokens of each
  argument's value, :mod:`logtoku_guard.scoring.tool_scores`), as ``{"id", "name", "arguments"}``.

Under constrained decoding (:class:`~logtoku_guard.tools.constraints.ToolCalls`) the model can only
write calls of this format, so every call parses.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.tool_scores import score_tool_calls
from logtoku_guard.tools.constraints import (
    CALL_BLOCK,
    CALL_LIST_CLOSE,
    CALL_LIST_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    JsonSchema,
    call_spans,
)
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
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. {rule}\n"
    "<tool_call>[\n"
    '{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},\n'
    "... (more tool calls as required)\n"
    "]</tool_call>"
)
"""SmolLM2's function-calling system prompt (``{tools}``: the JSON list of tools; ``{rule}``: when to call)."""
_AUTO_RULE = "If no function call is needed, answer normally."
TOOL_RESPONSE_OPEN = "<tool_response>"


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
        rule = "You must call one of the tools."
    elif choice is not None:
        rule = f"You must call the tool {choice!r}."
    else:
        rule = _AUTO_RULE
    return TOOL_PROMPT.format(rule=rule, tools=json.dumps(list(tools), ensure_ascii=False))


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
    """One call as the model writes it: ``<tool_call>[\n{"name": ..., "arguments": {...}}\n]</tool_call>``."""
    return _block([(name, arguments)])


def _block(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    body = ",\n".join(json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False) for name, arguments in calls)
    return f"{TOOL_CALL_OPEN}{CALL_LIST_OPEN}{body}{CALL_LIST_CLOSE}{TOOL_CALL_CLOSE}"


def render_tool_calls(content: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """An assistant turn that called tools, as text: its ``content``, then one block listing the ``(name, arguments)`` calls."""
    block = _block(calls)
    return f"{content}\n{block}" if content else block


def render_tool_result(content: str) -> str:
    """A tool's result, as the text the model reads (in a user turn): its content between
    ``<tool_response>`` tags, as in SmolLM2's training format (which carries no tool name or call id)."""
    return f"{TOOL_RESPONSE_OPEN}\n{content}\n</tool_response>"


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
    found = [text[a:b] for a, b in call_spans(text)]  # each call of each block (a list of calls, or one)
    content = CALL_BLOCK.sub("", text).strip()
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
