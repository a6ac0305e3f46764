"""Tool calling for ``ChatLogTokU``: the core's tool-call prompt, format and parser, in LangChain's types.

The embedded SmolLM2-135M-Instruct's chat template (ChatML) has no tools section, and the core
backends take plain chat turns; the SmolLM2 instruct models were tuned on function-calling data
in one format, which :mod:`logtoku_guard.tools.tool_calls` writes and reads (``logtoku-guard serve``
uses the same):

- the system turn gets :data:`TOOL_PROMPT` (the tools as a JSON list between ``<tools>`` tags,
  the answer format ``<tool_call>[\n{"name": ..., "arguments": {...}}\n]</tool_call>``);
  ``tool_choice`` adds "you must call a tool" / "you must call X", ``"none"`` leaves the tools out;
- an assistant turn that called tools is rendered as that block, and each ``ToolMessage``
  becomes a user turn ``<tool_response>\n{content}\n</tool_response>``;
- the answer is parsed back (:func:`parse_tool_calls`): each call object in a block (a list of
  them, or one object) with a ``name`` and an object of ``arguments`` becomes an
  ``AIMessage.tool_calls`` item, any other an ``invalid_tool_calls`` item with the error; an
  empty list is no call; a whole answer that is one such JSON object naming a bound tool (no
  tags) counts too. The text outside the blocks is the content. The calls are also given in
  OpenAI's raw form (:func:`openai_tool_calls`, ``additional_kwargs``), where LangChain's tool
  parsers read them.

With a backend that supports constrained decoding (``constrained_decoding``: the transformers
and llama.cpp backends), a forced ``tool_choice`` makes the whole answer one call of this
format and ``"auto"`` constrains a call once the model opens one
(:mod:`langchain_logtoku._structured`). Each call's arguments are scored over their values'
tokens (:func:`tool_call_scores`, from :mod:`logtoku_guard.scoring.tool_scores`), so the guard and the
middleware can act on an uncertain argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall, invalid_tool_call, tool_call, tool_call_chunk

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.tools import tool_calls as core
from logtoku_guard.tools.tool_calls import TOOL_PROMPT, tool_prompt
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


def names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of OpenAI-format tools (a tool without one is a configuration error)."""
    return core.tool_names(tools)


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


def with_tool_prompt(messages: list[CoreMessage], prompt: str | None) -> list[CoreMessage]:
    """``messages`` with ``prompt`` appended to the system turn (or a system turn added)."""
    return core.with_system_text(messages, prompt)


def render_tool_calls(message: AIMessage) -> str:
    """An assistant turn that called tools, as text: its content, then one block per call."""
    return core.render_tool_calls(message.text, [(c["name"], c["args"]) for c in message.tool_calls])


def render_tool_result(message: ToolMessage) -> str:
    """A tool's result, as the text of a user turn."""
    return core.render_tool_result(message.text)


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split a model answer into ``(content, tool_calls, invalid_tool_calls)``.

    ``names``: the bound tools; a call naming another tool is invalid.
    """
    parsed = core.parse_tool_calls(text, names)
    calls = [tool_call(name=c.name, args=c.arguments, id=c.id) for c in parsed.calls]
    invalid = [invalid_tool_call(name=c.name, args=c.raw, id=c.id, error=c.error) for c in parsed.invalid]
    return parsed.content, calls, invalid


def tool_call_scores(calls: Sequence[ToolCall], tokens: Sequence[TokenScore]) -> list[dict[str, Any]]:
    """``response_metadata["logtoku"]["tool_calls"]``: per call (its ``id`` and ``name``), each top-level
    argument's ``{tokens, mean_au, mean_eu, max_au, max_eu, logprob}`` over its value's tokens
    (:func:`logtoku_guard.tools.tool_calls.tool_call_scores`)."""
    return core.tool_call_scores([(c["id"], c["name"], c["args"]) for c in calls], tokens)


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
