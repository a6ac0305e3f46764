"""Tool calling for ``ChatLogTokU``: the tool-call prompt and format SmolLM2 was trained on, and its parser.

The converted SmolLM2-135M-Instruct's chat template (ChatML, ``chat_template.jinja``) has no
tools section, and the core backends take plain chat turns; but the SmolLM2 instruct models
were tuned on function-calling data in one format (the model card's, and Ollama's SmolLM2
template), which is the one used here:

- the system turn gets :data:`TOOL_PROMPT`: "You are an expert in composing functions ...",
  the tools as a JSON list of OpenAI tool dicts between ``<tools>`` tags, and the answer
  format ``<tool_call>[\n{"name": ..., "arguments": {...}}\n]</tool_call>`` (the calls as one
  JSON list); the training prompt's rule "no call needed: an empty list" reads "answer
  normally" under ``tool_choice="auto"``, and a forced ``tool_choice`` adds "you must call a
  tool" / "you must call X"; ``"none"`` leaves the tools out;
- an assistant turn that called tools is rendered as that block, and each ``ToolMessage``
  becomes a user turn ``<tool_response>\n{content}\n</tool_response>``, as in training;
- the answer is parsed back (:func:`parse_tool_calls`): each call object in a block (a list of
  them, or one object) with a ``name`` and an object of ``arguments`` becomes an
  ``AIMessage.tool_calls`` item, any other an ``invalid_tool_calls`` item with the error; an
  empty list is no call; a whole answer that is one such JSON object naming a bound tool (no
  tags) counts too. The text outside the blocks is the content.

With a backend that supports constrained decoding (``constrained_decoding``, the transformers
and llama.cpp backends), a forced ``tool_choice`` makes the whole answer one call of this
format and ``"auto"`` constrains a call once the model opens one
(:mod:`langchain_logtoku._structured`). Each call's arguments are scored over their values'
tokens (:func:`tool_call_scores`, from :mod:`logtoku_guard.tool_scores`), so the guard and the
middleware can act on an uncertain argument.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall, invalid_tool_call, tool_call, tool_call_chunk

from logtoku_guard.constraints import call_spans
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.tool_scores import score_tool_calls
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import TokenScore

__all__ = [
    "TOOL_PROMPT",
    "as_last_chunk",
    "names",
    "openai_tool_calls",
    "parse_tool_calls",
    "render_tool_calls",
    "render_tool_result",
    "tool_call_scores",
    "tool_choice_name",
    "tool_prompt",
    "with_tool_prompt",
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

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of OpenAI-format tools (a tool without one is a configuration error)."""
    out = []
    for t in tools:
        function = t.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            msg = f"a tool needs a name: pass LangChain tools, functions or OpenAI tool dicts, got {t!r:.80}"
            raise ConfigurationError(msg)
        out.append(name)
    return out


def tool_choice_name(tool_choice: Any, names: Sequence[str]) -> str | None:
    """``tool_choice`` as ``None`` (model decides), ``"none"``, ``"any"`` or a tool name (validated)."""
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice in ("none", "any", "required") or tool_choice is True:
        return "any" if tool_choice in ("required", True) else str(tool_choice)
    name = tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
    if not isinstance(name, str) or name not in names:
        msg = f"tool_choice={tool_choice!r} names no bound tool; bound tools: {list(names)} (or use 'auto', 'any', 'none')"
        raise ConfigurationError(msg)
    return name


def tool_prompt(tools: Sequence[Mapping[str, Any]], tool_choice: str | None) -> str | None:
    """The system-turn text describing ``tools`` (OpenAI tool dicts); None when there are none or choice is ``"none"``."""
    if not tools or tool_choice == "none":
        return None
    if tool_choice == "any":
        rule = "You must call one of the tools."
    elif tool_choice is not None:
        rule = f"You must call the tool {tool_choice!r}."
    else:
        rule = _AUTO_RULE
    return TOOL_PROMPT.format(rule=rule, tools=json.dumps(list(tools), ensure_ascii=False))


def with_tool_prompt(messages: list[CoreMessage], prompt: str | None) -> list[CoreMessage]:
    """``messages`` with ``prompt`` appended to the system turn (or a system turn added)."""
    if prompt is None:
        return messages
    if messages and messages[0].role == "system":
        return [CoreMessage("system", f"{messages[0].content}\n\n{prompt}"), *messages[1:]]
    return [CoreMessage("system", prompt), *messages]


def render_tool_calls(message: AIMessage) -> str:
    """An assistant turn that called tools, as text: its content, then one block listing the calls."""
    calls = ",\n".join(json.dumps({"name": c["name"], "arguments": c["args"]}, ensure_ascii=False) for c in message.tool_calls)
    block = f"<tool_call>[\n{calls}\n]</tool_call>"
    return f"{message.text}\n{block}" if message.text else block


def render_tool_result(message: ToolMessage) -> str:
    """A tool's result, as the text of a user turn (its content between ``<tool_response>`` tags)."""
    return f"<tool_response>\n{message.text}\n</tool_response>"


def _one(raw: str, data: Any) -> ToolCall | InvalidToolCall:
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    name = data.get("name") if isinstance(data, dict) else None
    args = data.get("arguments", data.get("parameters", {})) if isinstance(data, dict) else None
    if isinstance(args, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args)
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        why = "a tool call needs a 'name' string and an 'arguments' object"
        return invalid_tool_call(name=name if isinstance(name, str) else None, args=raw, id=call_id, error=why)
    return tool_call(name=name, args=args, id=call_id)


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split a model answer into ``(content, tool_calls, invalid_tool_calls)``.

    ``names``: the bound tools; a call naming another tool is invalid.
    """
    found = [text[a:b] for a, b in call_spans(text)]  # each call of each block (a list of calls, or one)
    content = _BLOCK.sub("", text).strip()
    stripped = text.strip()
    if not found and stripped.startswith("{") and stripped.endswith("}"):
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and whole.get("name") in names:
            found, content = [stripped], ""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in found:
        try:
            call = _one(raw, json.loads(raw))
        except json.JSONDecodeError as exc:
            call = invalid_tool_call(name=None, args=raw, id=f"call_{uuid.uuid4().hex[:24]}", error=f"not JSON: {exc}")
        if "error" in call:
            invalid.append(call)  # type: ignore[arg-type]
        elif call["name"] not in names:
            invalid.append(invalid_tool_call(name=call["name"], args=raw, id=call["id"], error=f"no tool named {call['name']!r}"))
        else:
            calls.append(call)
    return content, calls, invalid


def tool_call_scores(calls: Sequence[ToolCall], tokens: Sequence[TokenScore]) -> list[dict[str, Any]]:
    """``response_metadata["logtoku"]["tool_calls"]``: per call (its ``id`` and ``name``), each top-level
    argument's ``{tokens, mean_au, mean_eu, max_au, max_eu, logprob}`` over its value's tokens.

    The scored blocks of the answer are paired with ``calls`` in order, by name and argument
    names; a call whose block could not be scored (a bare JSON answer, string-encoded
    arguments) has no entry.
    """
    scored = [s for s in score_tool_calls(tokens) if s is not None]
    out: list[dict[str, Any]] = []
    for call in calls:
        match = next((s for s in scored if s.name == call["name"] and set(s.arguments) == set(call["args"])), None)
        if match is None:
            continue
        scored.remove(match)
        arguments = {name: score.as_dict() for name, score in match.arguments.items()}
        out.append({"id": call["id"], "name": call["name"], "arguments": arguments})
    return out


def openai_tool_calls(calls: Sequence[ToolCall]) -> dict[str, Any]:
    """``additional_kwargs`` holding ``calls`` in OpenAI's raw format (``{"tool_calls": [...]}``; empty: none).

    LangChain's tool parsers read them there when a stream hands over a whole ``AIMessage``
    (``disable_streaming``), which they turn into a plain chunk without ``tool_calls``.
    """
    if not calls:
        return {}
    raw = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["args"], ensure_ascii=False)},
        }
        for c in calls
    ]
    return {"tool_calls": raw}


def as_last_chunk(message: AIMessage) -> AIMessageChunk:
    """A whole answer (tool calls parsed) as the one, last chunk of a stream."""
    chunks = [
        tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i) for i, c in enumerate(message.tool_calls)
    ]
    return AIMessageChunk(
        content=message.content,
        response_metadata=message.response_metadata,
        usage_metadata=message.usage_metadata,
        tool_call_chunks=chunks,
        chunk_position="last",
    )
