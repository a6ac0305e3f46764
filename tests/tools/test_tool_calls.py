"""Tool calls as text (logtoku_guard.tools.tool_calls): the prompt, the history turns, the parser, the pairing with scores."""

from __future__ import annotations

import pytest

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.tools.constraints import JsonSchema
from logtoku_guard.tools.tool_calls import (
    add_tool_result,
    parse_tool_calls,
    render_call,
    render_tool_calls,
    render_tool_result,
    schema_prompt,
    tool_call_scores,
    tool_names,
    tool_prompt,
    with_system_text,
)
from logtoku_guard.types import ChatMessage, DecodingOptions

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def test_the_prompt_names_the_tools_and_the_rule() -> None:
    assert tool_names(TOOLS) == ["lookup"]
    with pytest.raises(ConfigurationError, match="a tool needs a name"):
        tool_names([{"type": "function", "function": {}}])
    assert tool_prompt(TOOLS, "none") is None and tool_prompt([], None) is None
    assert "must call one of the tools" in (tool_prompt(TOOLS, "any") or "")
    assert "must call the tool 'lookup'" in (tool_prompt(TOOLS, "lookup") or "")
    free = tool_prompt(TOOLS, None) or ""
    assert "must" not in free and '"name": "lookup"' in free
    turns = with_system_text([ChatMessage("system", "Be brief."), ChatMessage("user", "hi")], "EXTRA")
    assert turns[0] == ChatMessage("system", "Be brief.\n\nEXTRA") and len(turns) == 2
    assert with_system_text([ChatMessage("user", "hi")], "EXTRA")[0] == ChatMessage("system", "EXTRA")
    assert '"required": ["a"]' in schema_prompt(JsonSchema({"type": "object", "required": ["a"]}))


def test_history_turns_render_calls_and_group_results() -> None:
    assert render_call("lookup", {"q": "é"}) == '<tool_call>[\n{"name": "lookup", "arguments": {"q": "é"}}\n]</tool_call>'
    both = render_tool_calls("", [("a", {}), ("b", {})])  # one block listing the calls, as SmolLM2 was trained
    assert both == '<tool_call>[\n{"name": "a", "arguments": {}},\n{"name": "b", "arguments": {}}\n]</tool_call>'
    assert [(c.name, c.arguments) for c in parse_tool_calls(both, ["a", "b"]).calls] == [("a", {}), ("b", {})]
    assert render_tool_calls("Let me see.", [("a", {})]).startswith("Let me see.\n<tool_call>")
    turns = [ChatMessage("user", "q")]
    add_tool_result(turns, render_tool_result("one"))
    add_tool_result(turns, render_tool_result("two"))
    both_results = "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>"
    assert len(turns) == 2 and turns[1].content == both_results


def test_parse_splits_prose_calls_and_invalid_blocks() -> None:
    got = parse_tool_calls('Checking.\n<tool_call>{"name": "lookup", "arguments": {"q": 1}}</tool_call>', ["lookup"])
    assert got.content == "Checking." and [(c.name, c.arguments) for c in got.calls] == [("lookup", {"q": 1})]
    assert got.calls[0].id.startswith("call_") and len(got.calls[0].id) == 29
    bad = parse_tool_calls('<tool_call>{"name": "lookup", "arguments": {"q": </tool_call>', ["lookup"])
    assert bad.calls == () and bad.invalid[0].error.startswith("not JSON")
    other = parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', ["lookup"])
    assert other.invalid[0].name == "rm" and "no tool named 'rm'" in other.invalid[0].error
    assert parse_tool_calls('{"name": "lookup", "arguments": {}}', ["lookup"]).calls[0].arguments == {}
    assert parse_tool_calls('{"name": "x", "arguments": {}}', ["lookup"]).content == '{"name": "x", "arguments": {}}'


def test_scores_pair_with_parsed_calls_by_name_and_arguments() -> None:
    pieces = ["<tool_call>", '{"name": "lookup", "arguments": {"q": "', "Elena", '"}}', "</tool_call>"]
    backend = ScriptedBackend([ScriptedAnswer(pieces, [[9.0, 0.1], [9.0, 0.1], [1.0, 0.9], [9.0, 0.2], [9.0, 0.1]])])
    g = backend.generate("who?", DecodingOptions(max_new_tokens=10))
    parsed = parse_tool_calls(g.text, ["lookup"])
    (scores,) = tool_call_scores([(c.id, c.name, c.arguments) for c in parsed.calls], g.tokens)
    assert scores["id"] == parsed.calls[0].id and scores["name"] == "lookup"
    q = scores["arguments"]["q"]
    assert q["tokens"] == 1 and q["mean_eu"] == pytest.approx(g.tokens[2].eu)
    assert q["logprob"] == pytest.approx(g.tokens[2].logprob)
    assert tool_call_scores([("x", "lookup", {"other": 1})], g.tokens) == []  # different arguments: no pairing
