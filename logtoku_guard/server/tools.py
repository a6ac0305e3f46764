"""Tool calls and structured output on the server: a chat request's ``tools`` / ``tool_choice`` /
``response_format`` as a decoding constraint and prompt, and the answer as ``message.tool_calls``.

- :func:`plan`: what a request asks for (:class:`ToolPlan`): the
  :class:`~logtoku_guard.tools.constraints.ToolCalls` or :class:`~logtoku_guard.tools.constraints.JsonSchema`
  constraint, the system-turn text describing the tools or the schema
  (:mod:`logtoku_guard.tools.tool_calls`), and which tools' calls to read back. A constraint needs a
  backend with constrained decoding (``constrained_decoding``: transformers, llama.cpp); on
  another backend ``tool_choice="auto"`` still works from the prompt alone, and anything that
  needs a constraint is refused (400).
- :func:`chat_turns`: the conversation, tool history included (an assistant turn's calls as
  ``<tool_call>`` blocks, each tool result as a ``<tool_response>`` user turn).
- :func:`reply`: the answer as content and calls, with each call's per-argument scores.
- :class:`ProseStream`: streams the prose before a call, holding back what may be the start of
  the call's tag; the call itself is sent whole, in one delta, once the answer ends.

An answer makes at most one call (the grammar ends the answer with it): ``parallel_tool_calls``
is accepted either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from logtoku_guard.backends.base import Backend
from logtoku_guard.server.wire import RequestError
from logtoku_guard.tools.constraints import TOOL_CALL_OPEN, Constraint, JsonSchema, ToolCalls
from logtoku_guard.tools.tool_calls import (
    add_tool_result,
    parse_tool_calls,
    render_tool_calls,
    render_tool_result,
    schema_prompt,
    tool_call_scores,
    tool_prompt,
    with_system_text,
)
from logtoku_guard.types import ChatMessage, Generation
from logtoku_guard.wire import openai_protocol as proto
from logtoku_guard.wire import openai_tools as tw
from logtoku_guard.wire.payloads import json_float

__all__ = ["NO_TOOLS", "ProseStream", "Reply", "ToolPlan", "chat_turns", "plan", "reply"]


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of the answer: its ``constraint``, the ``system_text`` telling the model
    (None: nothing), and the ``names`` of the tools whose calls are read back (empty: none)."""

    constraint: Constraint | None = None
    system_text: str | None = None
    names: tuple[str, ...] = ()


NO_TOOLS = ToolPlan()


def _cannot(backend: Backend, what: str, param: str, fix: str) -> RequestError:
    kind = type(backend).__name__
    msg = (
        f"{what} needs constrained decoding, which this server's backend ({kind}) cannot do; {fix}, or serve a model with "
        "the transformers or llama.cpp backend"
    )
    return RequestError(400, msg, param=param)


def plan(req: proto.ChatCompletionRequest, backend: Backend) -> ToolPlan:
    """The :class:`ToolPlan` of ``req`` on ``backend`` (raises :class:`RequestError` when it cannot be served)."""
    can = bool(getattr(backend, "constrained_decoding", False))
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if not can:
            raise _cannot(backend, f"response_format {fmt.type!r}", "response_format", "leave response_format out")
        if fmt.json_schema is not None:
            schema = JsonSchema(fmt.json_schema.json_schema, fmt.json_schema.name)
            return ToolPlan(schema, schema_prompt(schema))
        return ToolPlan(JsonSchema({"type": "object"}))  # json_object: the messages say what (as with OpenAI)
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    choice = req.tool_choice or ("auto" if tools else "none")
    if not tools or choice == "none":
        return NO_TOOLS
    names = tuple(t["function"]["name"] for t in tools)
    if isinstance(choice, tw.NamedToolChoice):
        core_choice, told = choice.function.name, choice.function.name
    elif choice == "required":
        core_choice, told = "required", "any"
    else:
        core_choice, told = "auto", None
    if not can and core_choice != "auto":
        shown = "a named function" if isinstance(choice, tw.NamedToolChoice) else repr(choice)
        fix = "send tool_choice 'auto' (the tools are then described to the model and a call read from its answer)"
        raise _cannot(backend, f"tool_choice {shown}", "tool_choice", fix)
    return ToolPlan(ToolCalls(tools, core_choice) if can else None, tool_prompt(tools, told), names)


def chat_turns(req: proto.ChatCompletionRequest, tool_plan: ToolPlan) -> list[ChatMessage]:
    """The conversation to answer: tool history rendered as text, the plan's system text added."""
    turns: list[ChatMessage] = []
    called: dict[str, str] = {}  # call id -> function name
    for i, m in enumerate(req.messages):
        if m.role == "tool":
            name = called.get(m.tool_call_id or "")
            if name is None:
                msg = (
                    f"messages[{i}] answers tool_call_id {m.tool_call_id!r}, which no earlier assistant message's tool_calls "
                    "has; send the assistant message with that call before the tool's result"
                )
                raise RequestError(400, msg, param="messages")
            add_tool_result(turns, render_tool_result(m.text))
        elif m.tool_calls:
            called.update((c.id, c.function.name) for c in m.tool_calls)
            calls = [(c.function.name, c.parsed_arguments) for c in m.tool_calls]
            turns.append(ChatMessage("assistant", render_tool_calls(m.text, calls)))
        elif m.role == "developer":  # what current OpenAI clients send for system instructions
            turns.append(ChatMessage("system", m.text))
        else:
            turns.append(ChatMessage(m.role, m.text))
    return with_system_text(turns, tool_plan.system_text)


@dataclass(frozen=True)
class Reply:
    """The answer as the client gets it: ``content`` (None when only calls), ``tool_calls`` and their ``scores``."""

    content: str | None
    tool_calls: list[tw.ToolCall] = field(default_factory=list)
    scores: list[tw.ToolCallScoresPayload] = field(default_factory=list)


def reply(tool_plan: ToolPlan, text: str, generation: Generation) -> Reply:
    """``text`` (the answer the client gets: the generation's, or the guard's) as content and tool calls.

    A call is read only from a ``<tool_call>`` block naming one of the plan's tools; an answer
    cut by ``max_tokens`` (even before its closing tag, the call's JSON whole) or whose
    block does not parse is returned whole as content. Scores are read from ``generation``'s tokens.
    """
    if not tool_plan.names or TOOL_CALL_OPEN not in text or generation.finish_reason == "length":
        return Reply(text)
    parsed = parse_tool_calls(text, tool_plan.names)
    if parsed.invalid or not parsed.calls:
        return Reply(text)
    calls = [
        tw.ToolCall(
            id=c.id, type="function", function=tw.FunctionCall(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
        )
        for c in parsed.calls
    ]
    scored = tool_call_scores([(c.id, c.name, c.arguments) for c in parsed.calls], generation.tokens)
    scores = [
        tw.ToolCallScoresPayload(id=str(s["id"]), name=s["name"], arguments={k: _argument(v) for k, v in s["arguments"].items()})
        for s in scored
    ]
    return Reply(parsed.content or None, calls, scores)


def _argument(score: dict[str, Any]) -> tw.ArgumentScorePayload:
    return tw.ArgumentScorePayload(
        tokens=int(score["tokens"]),
        mean_au=json_float(score["mean_au"]),
        mean_eu=json_float(score["mean_eu"]),
        max_au=json_float(score["max_au"]),
        max_eu=json_float(score["max_eu"]),
        logprob=json_float(score["logprob"]),
    )


def call_deltas(calls: list[tw.ToolCall]) -> list[tw.ToolCallDelta]:
    """Each call whole, as one stream delta (``index`` its place in ``tool_calls``)."""
    return [
        tw.ToolCallDelta(
            index=i,
            id=c.id,
            type="function",
            function=tw.FunctionCallDelta(name=c.function.name, arguments=c.function.arguments),
        )
        for i, c in enumerate(calls)
    ]


def _partial_open(text: str) -> int:
    """How many characters at the end of ``text`` could begin :data:`TOOL_CALL_OPEN`."""
    for n in range(min(len(text), len(TOOL_CALL_OPEN) - 1), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:n]):
            return n
    return 0


class ProseStream:
    """Releases an answer's prose as its tokens come, never the call: text that may begin the
    call's tag waits for the next token, and nothing from the tag on is released."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0
        self.opened = False

    def feed(self, piece: str) -> str:
        """Add a token's text; the prose it releases (possibly ``""``)."""
        self.text += piece
        if self.opened:
            return ""
        at = self.text.find(TOOL_CALL_OPEN)
        if at >= 0:
            self.opened = True
            end = at
        else:
            end = len(self.text) - _partial_open(self.text)
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out
