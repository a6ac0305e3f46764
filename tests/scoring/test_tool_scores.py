"""Argument value spans of a tool call's JSON, and per-argument scores over their tokens."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from logtoku_guard.scoring.tool_scores import leaf_spans, score_tool_calls, value_spans
from logtoku_guard.types import TokenScore

_leaf = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_json = st.recursive(
    _leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8
)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _decode_leaf(text: str, span: tuple[int, int], value: Any) -> Any:
    raw = text[span[0] : span[1]]
    return json.loads(f'"{raw}"') if isinstance(value, str) else json.loads(raw)


@given(_json, st.booleans(), st.sampled_from([(",", ":"), (", ", ": "), (" , ", " :  ")]))
def test_leaf_spans_cover_exactly_each_leaf_escapes_included(value: Any, ascii_only: bool, seps: tuple[str, str]) -> None:
    text = "  " + json.dumps(value, ensure_ascii=ascii_only, separators=seps) + " "
    end, spans = leaf_spans(text)
    assert text[end:].strip() == ""
    expected = _leaves(value)
    assert len(spans) == len(expected)
    for span, leaf in zip(spans, expected, strict=True):
        assert _decode_leaf(text, span, leaf) == leaf


@given(st.dictionaries(st.text(max_size=6), _json, max_size=4), st.booleans())
def test_value_spans_give_each_top_level_argument(arguments: dict[str, Any], ascii_only: bool) -> None:
    text = "x" + json.dumps(arguments, ensure_ascii=ascii_only) + "y"
    spans = value_spans(text, 1, len(text) - 1)
    assert list(spans) == list(arguments)
    for key, ((a, b), leaves) in spans.items():
        assert json.loads(text[a:b]) == arguments[key]
        assert all(a <= s <= e <= b for s, e in leaves)


def _tokens(pieces: list[str]) -> list[TokenScore]:
    # token i: au = i, eu = i / 10, logprob = -i
    return [
        TokenScore(
            index=i, id=i, text=p, top_logits=(1.0, 0.0), top_ids=(i, 0), au=float(i), eu=i / 10, logprob=-float(i), entropy=0.0
        )
        for i, p in enumerate(pieces)
    ]


def test_scores_read_only_the_value_tokens_not_the_json_syntax() -> None:
    pieces = ['<tool_call>{"', "name", '": "', "transfer", '", "', "arguments", '": {"', "amount", '": ', "12", "0"]
    pieces += [', "', "to", '": "', "A\\", '"b', '", "', "opts", '": {"', "k", '": ', "true", "}, ", '"note": ', '""']
    pieces += ["}}</tool_call>"]
    text = "".join(pieces)
    payload = json.loads(text[len("<tool_call>") : -len("</tool_call>")])
    assert payload["arguments"] == {"amount": 120, "to": 'A"b', "opts": {"k": True}, "note": ""}
    (call,) = score_tool_calls(_tokens(pieces))
    assert call is not None and call.name == "transfer"
    amount, to, opts, note = (call.arguments[k] for k in ("amount", "to", "opts", "note"))
    assert (amount.tokens, amount.mean_au, amount.max_au, amount.logprob) == (2, 9.5, 10.0, -19.0)
    assert math.isclose(amount.mean_eu, 0.95) and math.isclose(amount.max_eu, 1.0)
    assert (to.tokens, to.max_au) == (2, 15.0)  # 'A\' and '"b': the escaped quote belongs to the value
    assert (opts.tokens, opts.max_au) == (1, 21.0)  # only 'true': the nested key and braces are syntax
    assert (note.tokens, note.max_au) == (1, 24.0)  # an empty string: scored over its own '""'


def test_a_malformed_call_scores_none_and_the_others_still_count() -> None:
    pieces = [
        '<tool_call>{"name": 3}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"x": ',
        "1",
        "}}</tool_call>",
        "<tool_call>{oops",
    ]
    first, second, third = score_tool_calls(_tokens(pieces))
    assert first is None and third is None
    assert second is not None and second.name == "f" and second.arguments["x"].tokens == 1


def test_the_scorer_and_the_tool_gate_share_one_argument_score() -> None:
    """The scores a generation's calls get are the type the tool gate reads back from metadata:
    written with ``as_dict`` and parsed with ``parse_tool_call_scores``, they come back equal."""
    from logtoku_guard.decision.tool_gate import ArgumentScore as GateArgumentScore
    from logtoku_guard.decision.tool_gate import parse_tool_call_scores
    from logtoku_guard.scoring.tool_scores import ArgumentScore

    assert GateArgumentScore is ArgumentScore
    pieces = ['<tool_call>{"name": "f", "arguments": {"x": ', "1", ', "y": "', "ab", '"}}</tool_call>']
    (call,) = score_tool_calls(_tokens(pieces))
    assert call is not None
    metadata = {
        "logtoku": {"tool_calls": [{"id": "c1", "name": "f", "arguments": {k: v.as_dict() for k, v in call.arguments.items()}}]}
    }
    (parsed,) = parse_tool_call_scores(metadata, [{"id": "c1", "name": "f", "args": call.args}])
    assert parsed.scores == call.arguments
    assert parsed.scores["y"].get("max_au") == call.arguments["y"].max_au
