"""Grammar-constrained decoding on the tiny random model: always a valid answer, scores from the raw logits."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llguidance")

from logtoku_guard.backends.fake import ScriptedBackend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.tool_scores import score_tool_calls
from logtoku_guard.tools.constraints import JsonSchema, ToolCalls, call_spans
from logtoku_guard.types import DecodingOptions

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "transfer",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "integer"}, "to": {"type": "string", "maxLength": 8}},
                "required": ["amount", "to"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
PROMPTS = ["What is the capital of France?", "Count from one to ten.", "naïve café", "Send 5 to Bob."]


def _call(text: str) -> dict[str, Any]:
    assert text.startswith("<tool_call>[\n{") and text.endswith("}\n]</tool_call>"), text  # SmolLM2's list of calls
    ((start, end),) = call_spans(text)
    return json.loads(text[start:end])


@pytest.mark.parametrize("choice", ["required", "transfer", "ping"])
def test_a_random_model_always_emits_a_valid_call(tiny_backend: Any, choice: str) -> None:
    options = DecodingOptions(max_new_tokens=120, constraint=ToolCalls(TOOLS, choice))
    for g in tiny_backend.batch(PROMPTS, options):
        call = _call(g.text)
        assert g.finish_reason == "stop"
        assert call["name"] in (("transfer", "ping") if choice == "required" else (choice,))
        if call["name"] == "transfer":
            assert isinstance(call["arguments"]["amount"], int) and isinstance(call["arguments"]["to"], str)
        (scored,) = score_tool_calls(g.tokens)
        assert scored is not None and set(scored.arguments) == set(call["arguments"])
        assert all(a.tokens >= 1 and a.max_eu >= a.mean_eu for a in scored.arguments.values())


def test_a_json_schema_answer_parses_and_validates(tiny_backend: Any) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}, "required": ["ok", "n"]}
    for g in tiny_backend.batch(PROMPTS, DecodingOptions(max_new_tokens=60, constraint=JsonSchema(schema))):
        value = json.loads(g.text)
        assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)


def test_the_recorded_logits_are_the_unmasked_ones(tiny_backend: Any) -> None:
    """Same prompt, free and constrained: the first step's raw top-K (and the AU/EU read from it) are equal,
    although the grammar forces another token than the model's arg-max."""
    free = tiny_backend.generate(PROMPTS[0], DecodingOptions(max_new_tokens=1))
    forced = tiny_backend.generate(PROMPTS[0], DecodingOptions(max_new_tokens=3, constraint=ToolCalls(TOOLS, "ping")))
    a, b = free.tokens[0], forced.tokens[0]
    assert b.id != a.id  # the grammar chose '<' (the call's first byte), not the model's favourite
    assert a.id == a.top_ids[0]
    assert b.top_ids == a.top_ids and b.top_logits == pytest.approx(a.top_logits)
    assert (b.au, b.eu) == pytest.approx((a.au, a.eu))
    assert b.logprob < a.logprob  # the forced token's log p under the model's own softmax


def test_auto_lets_the_model_write_prose(tiny_backend: Any) -> None:
    g = tiny_backend.generate(PROMPTS[0], DecodingOptions(max_new_tokens=12, constraint=ToolCalls(TOOLS, "auto")))
    free = tiny_backend.generate(PROMPTS[0], DecodingOptions(max_new_tokens=12))
    assert g.text == free.text  # no call opened: nothing masked


def test_auto_constrains_the_call_once_opened(tiny_backend: Any) -> None:
    from logtoku_guard.tools.grammar import GrammarEngine

    engine = GrammarEngine.from_hf(tiny_backend.tokenizer, tiny_backend.vocab_size, [0])
    row = engine.start(ToolCalls(TOOLS, "auto"))
    tokenizer = tiny_backend.tokenizer
    for token in tokenizer("Sure <tool_call>", add_special_tokens=False)["input_ids"]:
        assert not row.advance(token)
    assert row.active
    import numpy as np

    bits = np.full((1, (tiny_backend.vocab_size + 31) // 32), -1, dtype=np.int32)
    row.fill(bits)
    allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[0, : tiny_backend.vocab_size]
    bracket, brace = tokenizer.convert_tokens_to_ids("["), tokenizer.convert_tokens_to_ids("{")
    assert allowed[bracket] and not allowed[brace] and allowed.sum() < tiny_backend.vocab_size / 4  # the list of calls opens


def test_call_spans_read_lists_of_calls_and_single_objects() -> None:
    listed = '<tool_call>[\n{"name": "a", "arguments": {}},\n{"name": "b", "arguments": {"x": [1, 2]}}\n]</tool_call>'
    assert [listed[a:b] for a, b in call_spans(listed)] == [
        '{"name": "a", "arguments": {}}',
        '{"name": "b", "arguments": {"x": [1, 2]}}',
    ]
    assert call_spans("<tool_call>[]</tool_call> no call") == []
    cut = '<tool_call>[\n{"name": "a", "arguments": {"x": "ab'
    assert [cut[a:b] for a, b in call_spans(cut)] == ['{"name": "a", "arguments": {"x": "ab']
    single = 'Sure. <tool_call> {"name": "a", "arguments": {}} </tool_call>'
    assert [single[a:b] for a, b in call_spans(single)] == ['{"name": "a", "arguments": {}}']


def test_bad_constraints_fail_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="tool name among"):
        ToolCalls(TOOLS, "delete")
    with pytest.raises(ConfigurationError, match="non-empty list"):
        ToolCalls([], "auto")
    with pytest.raises(ConfigurationError, match="JSON Schema dict"):
        JsonSchema("{}")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="constraint must be"):
        DecodingOptions(constraint={"type": "object"})  # type: ignore[arg-type]
    assert ToolCalls(TOOLS, "any") == ToolCalls(TOOLS, "required")
    assert hash(JsonSchema({"a": 1, "b": 2})) == hash(JsonSchema({"b": 2, "a": 1}))


def test_a_schema_the_engine_rejects_fails_before_generating(tiny_backend: Any) -> None:
    with pytest.raises(ConfigurationError, match="cannot be compiled"):
        tiny_backend.generate("hi", DecodingOptions(constraint=JsonSchema({"type": "object", "$ref": "#/nowhere"})))


def test_backends_without_grammars_refuse_a_constraint() -> None:
    with pytest.raises(ConfigurationError, match=r"scripted backend cannot apply.*transformers or llama.cpp backend"):
        ScriptedBackend(["hi"]).generate("q", DecodingOptions(constraint=ToolCalls(TOOLS)))


def test_max_string_length_closes_a_string_the_schema_leaves_unbounded(tiny_backend: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string"}, "t": {"type": "string", "maxLength": 3}},
        "required": ["s", "t"],
        "additionalProperties": False,
    }
    options = DecodingOptions(max_new_tokens=120, constraint=JsonSchema(schema, max_string_length=5))
    for g in tiny_backend.batch(PROMPTS, options):
        value = json.loads(g.text)
        assert g.finish_reason == "stop" and len(value["s"]) <= 5 and len(value["t"]) <= 3, g.text
    note = {
        "type": "function",
        "function": {"name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
    }
    calls = DecodingOptions(max_new_tokens=120, constraint=ToolCalls([note, *TOOLS], max_string_length=2))
    for g in tiny_backend.batch(PROMPTS, calls):
        call = _call(g.text)  # the cap bounds "text"; transfer's "to" keeps its own maxLength (8)
        assert g.finish_reason == "stop" and all(
            len(v) <= (8 if k == "to" else 2) for k, v in call["arguments"].items() if isinstance(v, str)
        )


def test_bounded_schema_bounds_only_unbounded_strings() -> None:
    from logtoku_guard.tools.constraints import bounded_schema

    schema = {
        "type": "object",
        "properties": {
            "free": {"type": ["string", "null"]},
            "short": {"type": "string", "maxLength": 3},
            "pick": {"type": "string", "enum": ["a", "b"]},
            "code": {"type": "string", "pattern": "^[A-Z]+$"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "ref": {"$ref": "#/$defs/Name"},
        },
        "$defs": {"Name": {"type": "string"}},
    }
    out = bounded_schema(schema, 9)
    props = out["properties"]
    assert props["free"]["maxLength"] == 9 and props["short"]["maxLength"] == 3
    assert "maxLength" not in props["pick"] and "maxLength" not in props["code"]
    assert props["tags"]["items"]["maxLength"] == 9 and props["either"]["anyOf"][0]["maxLength"] == 9
    assert out["$defs"]["Name"]["maxLength"] == 9 and "maxLength" not in props["either"]["anyOf"][1]
    assert "maxLength" not in schema["properties"]["free"]  # the caller's schema is not changed
    assert bounded_schema(schema, None) is schema
    with pytest.raises(ConfigurationError, match="max_string_length must be a positive number"):
        JsonSchema(schema, max_string_length=0)
    assert JsonSchema(schema, max_string_length=4) != JsonSchema(schema)


def test_a_call_opened_with_bytes_its_grammar_rejects_runs_unconstrained_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """An "auto" row whose token carries the opening tag *and* bytes the call's grammar refuses
    cannot be constrained any more: it goes on unmasked, and a warning says so (never silently)."""
    from logtoku_guard.tools.constraints import ToolCalls
    from logtoku_guard.tools.grammar import RowGrammar

    class Matcher:
        def consume_tokens(self, tokens: list[int]) -> bool:
            return False

    class Tokenizer:
        def decode_bytes(self, ids: list[int]) -> bytes:
            return b"Sure <tool_call>}"

        def tokenize_bytes(self, data: bytes) -> list[int]:
            return list(data)

    class Engine:
        tokenizer = Tokenizer()

        def matcher(self, grammar: str) -> Matcher:
            return Matcher()

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    row = RowGrammar(Engine(), None, ToolCalls(tools, "auto"))  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="logtoku_guard.tools.grammar"):
        assert row.advance(7) is False
    assert row.broken and not row.active
    assert "not constrained" in caplog.text and "b'}'" in caplog.text
