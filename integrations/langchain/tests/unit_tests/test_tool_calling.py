"""ChatLogTokU tool calling: the JSON tool-call prompt, parsing into tool_calls, ToolMessage input."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from langchain_logtoku import ChatLogTokU
from langchain_logtoku._convert import to_core_messages
from langchain_logtoku.tools import parse_tool_calls
from logtoku_guard import ConfigurationError, InvalidPromptError, ScriptedAnswer, ScriptedBackend

CALL = '<tool_call>{"name": "lookup", "arguments": {"name": "Elena"}}</tool_call>'


@tool
def lookup(name: str) -> str:
    """Look a name up in the company directory."""
    return f"{name}: no entry"


def test_parse_valid_invalid_and_unknown() -> None:
    content, calls, invalid = parse_tool_calls(f"Let me check.\n{CALL}", ["lookup"])
    assert content == "Let me check." and calls[0]["name"] == "lookup" and calls[0]["args"] == {"name": "Elena"}
    _, calls, invalid = parse_tool_calls('<tool_call>{"name": "lookup", "arguments": {"name": </tool_call>', ["lookup"])
    assert calls == [] and invalid[0]["error"].startswith("not JSON")
    _, calls, invalid = parse_tool_calls('<tool_call>{"name": "delete", "arguments": {}}</tool_call>', ["lookup"])
    assert calls == [] and "no tool named 'delete'" in invalid[0]["error"]
    _, calls, _ = parse_tool_calls('{"name": "lookup", "arguments": {"name": "Bo"}}', ["lookup"])  # untagged
    assert calls[0]["args"] == {"name": "Bo"}
    assert parse_tool_calls("Paris.", ["lookup"]) == ("Paris.", [], [])


def test_parse_lists_of_calls_as_smollm2_writes_them() -> None:
    elena, bo = '{"name": "lookup", "arguments": {"name": "Elena"}}', '{"name": "lookup", "arguments": {"name": "Bo"}}'
    text = f"<tool_call>[\n{elena},\n{bo}\n]</tool_call>"
    content, calls, invalid = parse_tool_calls(text, ["lookup"])
    assert content == "" and [c["args"]["name"] for c in calls] == ["Elena", "Bo"] and invalid == []
    assert parse_tool_calls("<tool_call>[]</tool_call>", ["lookup"]) == ("", [], [])  # the format's "no call needed"
    _, calls, invalid = parse_tool_calls('<tool_call>[\n{"name": "lookup", "arguments": {"name": "El', ["lookup"])
    assert calls == [] and invalid[0]["error"].startswith("not JSON")  # cut by the token limit


def _model(seen: list[Any]) -> ChatLogTokU:
    pieces = ["<tool_call>", '{"name": "lookup", ', '"arguments": {"name": "Elena"}}', "</tool_call>"]

    def answer(messages: list[Any]) -> ScriptedAnswer:
        seen.append(messages)
        if "<tool_response>" in messages[-1].content:
            return ScriptedAnswer(["No", " entry", "."], [[9.0, 0.1]] * 3)
        return ScriptedAnswer(pieces, [[9.0, 0.1], [1.0, 0.9], [2.0, 1.5], [9.0, 0.2]])

    return ChatLogTokU(backend=ScriptedBackend(answer), logtoku_profile=None)


def test_bound_tools_are_prompted_parsed_and_scored() -> None:
    seen: list[Any] = []
    message = _model(seen).bind_tools([lookup], tool_choice="any").invoke("Who is Elena?")
    system = seen[0][0]
    assert system.role == "system" and '"name": "lookup"' in system.content and "must call one of the tools" in system.content
    assert system.content.startswith("You are an expert in composing functions.") and "<tools>[{" in system.content
    assert message.tool_calls[0]["name"] == "lookup" and message.tool_calls[0]["args"] == {"name": "Elena"}
    tokens = message.response_metadata["logtoku"]["tokens"]
    assert len(tokens) == 4 and tokens[1]["eu"] > tokens[0]["eu"]  # the call's tokens are scored: an unsure argument


def test_tool_messages_are_accepted() -> None:
    seen: list[Any] = []
    model = _model(seen).bind_tools([lookup])
    first = model.invoke([HumanMessage("Who is Elena?")])
    history = [
        HumanMessage("Who is Elena?"),
        first,
        ToolMessage("Elena: no entry", tool_call_id=first.tool_calls[0]["id"], name="lookup"),
    ]
    answer = model.invoke(history)
    assert answer.content == "No entry." and answer.tool_calls == []
    turns = seen[-1]
    call = '<tool_call>[\n{"name": "lookup", "arguments": {"name": "Elena"}}\n]</tool_call>'  # SmolLM2's trained format
    assert turns[-2].role == "assistant" and turns[-2].content == call
    assert turns[-1].role == "user" and turns[-1].content == "<tool_response>\nElena: no entry\n</tool_response>"


def test_stream_with_tools_is_one_chunk() -> None:
    chunks = list(_model([]).bind_tools([lookup]).stream("Who is Elena?"))
    assert len(chunks) == 1 and chunks[0].tool_calls[0]["name"] == "lookup"


def test_tool_choice_must_name_a_bound_tool() -> None:
    with pytest.raises(ConfigurationError, match="names no bound tool"):
        _model([]).bind_tools([lookup], tool_choice="search")
    seen: list[Any] = []
    message = _model(seen).bind_tools([lookup], tool_choice="none").invoke("Who is Elena?")
    assert seen[0][0].role != "system" or "lookup" not in seen[0][0].content
    assert message.tool_calls == [] and isinstance(message, AIMessage)


def test_ai_message_tool_use_blocks_are_read_from_tool_calls() -> None:
    """Anthropic-style list content: the ``tool_use`` block is the same call as ``tool_calls``."""
    call = {"name": "magic_function", "args": {"input": 3}, "id": "call_1", "type": "tool_call"}
    ai = AIMessage(
        content=[
            {"type": "text", "text": "Let me call it."},
            {"type": "tool_use", "id": "call_1", "name": "magic_function", "input": {"input": 3}},
        ],
        tool_calls=[call],
    )
    turns = to_core_messages([HumanMessage("What is magic_function(3)?"), ai, ToolMessage("5", tool_call_id="call_1")])
    assert turns[1].role == "assistant"
    assert turns[1].content.startswith("Let me call it.")
    assert turns[1].content.count("magic_function") == 1  # rendered once, from tool_calls
    with pytest.raises(InvalidPromptError, match="'image_url' content block"):
        to_core_messages([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])])


def test_streamed_structured_output_parses_the_call() -> None:
    """``stream()`` with tools bound hands over the whole message: LangChain's parsers read its calls."""

    class Person(BaseModel):
        name: str

    pieces = ["<tool_call>[\n", '{"name": "Person", ', '"arguments": {"name": "Elena"}}', "\n]</tool_call>"]
    backend = ScriptedBackend(lambda _: ScriptedAnswer(pieces, [[9.0, 0.1]] * 4))
    llm = ChatLogTokU(backend=backend, logtoku_profile=None)
    assert list(llm.with_structured_output(Person).stream("Who?")) == [Person(name="Elena")]
    message = llm.bind_tools([Person]).invoke("Who?")
    (raw,) = message.additional_kwargs["tool_calls"]
    assert raw["id"] == message.tool_calls[0]["id"] and json.loads(raw["function"]["arguments"]) == {"name": "Elena"}
