"""The ``tool_calls`` policy section and the per-argument scores it reads: parsing, rules, errors."""

from __future__ import annotations

import math
from typing import Any

import pytest

from logtoku_guard import AuditRecord, AuditStore, ConfigurationError, Policy, PolicyError
from logtoku_guard.audit.redact import redact_record, redactor
from logtoku_guard.decision.tool_gate import ScoredToolCall, ToolCallPolicy, parse_tool_call_scores
from logtoku_guard.decision.tool_gate.call_review import ToolReviewResponse, tool_call_record
from logtoku_guard.scoring.quadrants import QuadrantThresholds


def scores(max_eu: float, *, tokens: int = 2, mean_au: float = 0.1, logprob: float = -1.0) -> dict[str, Any]:
    return {"tokens": tokens, "mean_au": mean_au, "mean_eu": max_eu / 2, "max_au": 0.2, "max_eu": max_eu, "logprob": logprob}


CALLS = [
    {"id": "c1", "name": "transfer", "args": {"to": "alice", "amount": 500}},
    {"id": "c2", "name": "lookup", "args": {"q": "x"}},
]


def metadata(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"logtoku": {"tool_calls": list(entries)}}


def transfer_scores(amount_eu: float, to_eu: float = 0.01) -> dict[str, Any]:
    return {"id": "c1", "name": "transfer", "arguments": {"to": scores(to_eu), "amount": scores(amount_eu)}}


def tool_policy(*rules: dict[str, Any], **extra: Any) -> Policy:
    return Policy.from_dict({"name": "tools", "tool_calls": {"rules": list(rules), **extra}})


AMOUNT = {"name": "unsure-amount", "when": {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3}}


# -- the scores contract -------------------------------------------------------------------------
def test_scores_are_parsed_per_call_in_the_calls_order() -> None:
    transfer, lookup = parse_tool_call_scores(metadata(transfer_scores(0.9)), CALLS)
    assert transfer.id == "c1" and transfer.scored and transfer.args == {"to": "alice", "amount": 500}
    assert transfer.scores["amount"].max_eu == 0.9 and transfer.scores["amount"].get("mean_eu") == 0.45
    assert lookup.id == "c2" and not lookup.scored and lookup.scores == {}


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ("nope", r"must be a list of \{id, name, arguments\}"),
        ([{"id": "c1", "name": "transfer"}], "exactly id, name and arguments"),
        ([{"id": 3, "name": "transfer", "arguments": {}}], r"\.id must be the tool call's id"),
        ([transfer_scores(0.1), transfer_scores(0.2)], "'c1' is given twice"),
        ([{**transfer_scores(0.1), "id": "zz"}], r"scores tool call id\(s\) \['zz'\] that the answer does not make"),
        ([{**transfer_scores(0.1), "name": "delete"}], "name is 'delete' but the call with that id is to 'transfer'"),
        ([{**transfer_scores(0.1), "arguments": [1]}], "arguments must map argument names to scores"),
        ([{**transfer_scores(0.1), "arguments": {"amount": {"tokens": 1}}}], r"arguments\['amount'\]: missing mean_au"),
        ([{**transfer_scores(0.1), "arguments": {"amount": {**scores(0.1), "eu": 1}}}], "unknown eu"),
        (
            [{**transfer_scores(0.1), "arguments": {"amount": {**scores(0.1), "tokens": -1}}}],
            "tokens must be a non-negative integer, got -1",
        ),
        (
            [{**transfer_scores(0.1), "arguments": {"amount": {**scores(0.1), "max_eu": "high"}}}],
            r"max_eu must be a number, got 'high'",
        ),
        ([{**transfer_scores(0.1), "arguments": {"amount": {**scores(0.1), "max_au": math.inf}}}], "max_au is inf"),
    ],
)
def test_malformed_scores_are_refused_with_the_bad_value(entries: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_tool_call_scores({"logtoku": {"tool_calls": entries}}, CALLS)


# -- the rules -------------------------------------------------------------------------------------
def decide(policy: Policy, meta: dict[str, Any], index: int = 0) -> Any:
    call = parse_tool_call_scores(meta, CALLS)[index]
    return policy.tool_calls.decide(call, policy.undefined)


def test_a_rule_names_a_tool_and_an_argument() -> None:
    policy = tool_policy({**AMOUNT, "action": "human_review"})
    unsure = decide(policy, metadata(transfer_scores(0.9)))
    assert (unsure.action, unsure.rule, unsure.reason) == ("human_review", "unsure-amount", "transfer.amount max_eu 0.9 > 0.3")
    assert unsure.flagged_arguments == ["amount"]
    sure = decide(policy, metadata(transfer_scores(0.1, to_eu=0.9)))  # only `to` is unsure: the rule reads `amount`
    assert (sure.action, sure.rule, sure.reason) == ("run", None, "no tool rule fired")
    other_tool = decide(
        policy, metadata(transfer_scores(0.9), {"id": "c2", "name": "lookup", "arguments": {"q": scores(0.9)}}), 1
    )
    assert other_tool.action == "run"


def test_any_tool_and_any_argument_and_combinations() -> None:
    star = tool_policy(
        {"name": "any", "when": {"tool": "*", "argument": "*", "stat": "max_eu", "op": ">", "value": 0.3}, "action": "refuse"}
    )
    fired = decide(star, metadata(transfer_scores(0.1, to_eu=0.8)))
    assert fired.action == "refuse" and fired.flagged_arguments == ["to"] and len(fired.checks) == 2
    both = {"all": [{**AMOUNT["when"]}, {"not": {"argument": "to", "stat": "logprob", "op": "<", "value": -5}}]}
    policy = tool_policy({"name": "both", "when": both, "action": "reask"})
    assert decide(policy, metadata(transfer_scores(0.9))).action == "reask"
    assert (
        decide(
            policy, metadata({**transfer_scores(0.9), "arguments": {"amount": scores(0.9), "to": scores(0.1, logprob=-9)}})
        ).action
        == "run"
    )


def test_undefined_scores_count_as_least_reliable_unless_never_fires() -> None:
    policy = tool_policy({**AMOUNT, "action": "human_review"})
    unscored = decide(policy, {})  # the answer carries no scores at all
    assert unscored.action == "human_review" and "undefined: the answer carries no scores for this call" in unscored.reason
    empty = decide(policy, metadata({**transfer_scores(0.1), "arguments": {"amount": scores(math.nan, tokens=0)}}))
    assert empty.action == "human_review" and "undefined: empty value" in empty.reason
    lenient = Policy.from_dict(
        {"name": "t", "undefined": "never_fires", "tool_calls": {"rules": [{**AMOUNT, "action": "refuse"}]}}
    )
    assert decide(lenient, {}).action == "run"
    absent = parse_tool_call_scores({}, [{"id": "c1", "name": "transfer", "args": {"to": "bob"}}])[0]  # no `amount` passed
    assert policy.tool_calls.decide(absent).action == "run"


def test_answer_and_tool_rules_run_on_the_one_rule_engine() -> None:
    """The same combinators, undefined-value meaning and first-rule-fires decision serve both kinds of
    rules: a ``never_fires`` policy fires on no infinite value, an argument's logprob of -inf included
    (before the engine was shared, the tool rules compared it), and ``not`` of an undefined value
    fires under ``least_reliable`` for neither kind."""
    from logtoku_guard.decision.conditions import AllOf, NotOf
    from logtoku_guard.decision.rules import Combinator, Negation, RuleContext, compare
    from logtoku_guard.decision.tool_gate.call_conditions import ToolAllOf, ToolNotOf
    from logtoku_guard.scoring.stats import ResponseStats

    assert issubclass(AllOf, Combinator) and issubclass(ToolAllOf, Combinator)
    assert issubclass(NotOf, Negation) and issubclass(ToolNotOf, Negation)
    strict, lenient = RuleContext("least_reliable"), RuleContext("never_fires")
    assert compare(None, "<", 0.5, strict, -math.inf) and not compare(None, "<", 0.5, lenient, -math.inf)
    assert compare(-math.inf, "<", -3.0, strict, -math.inf) and not compare(-math.inf, "<", -3.0, lenient, -math.inf)
    low = {"tool": "transfer", "argument": "amount", "stat": "logprob", "op": "<", "value": -3.0}
    call = parse_tool_call_scores(
        metadata(transfer_scores(0.1) | {"arguments": {"amount": scores(0.1, logprob=-math.inf)}}), CALLS
    )[0]
    for mode, fires in (("least_reliable", True), ("never_fires", False)):
        policy = Policy.from_dict(
            {"name": "t", "undefined": mode, "tool_calls": {"rules": [{"name": "lp", "when": low, "action": "refuse"}]}}
        )
        assert (policy.tool_calls.decide(call, policy.undefined).action == "refuse") is fires
    empty = ResponseStats.from_tokens([])
    answer = Policy.from_dict(
        {"name": "a", "rules": [{"name": "n", "when": {"not": {"stat": "max_eu", "op": ">", "value": 0.5}}, "action": "warn"}]}
    )
    tool = tool_policy({"name": "n", "when": {"not": AMOUNT["when"]}, "action": "refuse"})
    assert answer.decide(empty).action == "pass"  # undefined max_eu counts as +inf: "> 0.5" holds, "not" does not
    assert decide(tool, {}).action == "run"  # likewise for the unscored argument


@pytest.mark.parametrize(
    ("section", "match"),
    [
        (
            {"rules": [{**AMOUNT, "when": {**AMOUNT["when"], "stat": "max_eux"}, "action": "refuse"}]},
            "'max_eux' is not allowed; did you mean 'max_eu'",
        ),
        ({"rules": [{**AMOUNT, "action": "reaks"}]}, "'reaks' is not allowed; did you mean 'reask'"),
        (
            {"rules": [{**AMOUNT, "when": {**AMOUNT["when"], "value": {"quantile": 0.9}}, "action": "refuse"}]},
            "take absolute thresholds",
        ),
        ({"rules": [{**AMOUNT, "when": {**AMOUNT["when"], "value": math.nan}, "action": "refuse"}]}, "threshold must be finite"),
        ({"rules": [{**AMOUNT, "when": {**AMOUNT["when"], "argument": ""}, "action": "refuse"}]}, "argument"),
        (
            {"rules": [{**AMOUNT, "action": "refuse"}, {**AMOUNT, "action": "run"}]},
            r"rule names must be unique, repeated: \['unsure-amount'\]",
        ),
        ({"default_action": "reask"}, "default_action cannot be 'reask'"),
        ({"reask": {"max_attempts": 9}}, "max_attempts"),
        ({"reask": {"fallback": "run"}}, "'run' is not allowed"),
        ({"refuse": {"message": "no {amount}"}}, r"may only use \{reason\}, \{tool\}"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_tool_sections_name_the_value_and_the_fix(section: dict[str, Any], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        Policy.from_dict({"name": "bad", "tool_calls": section})


def test_the_section_loads_from_yaml(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: gated\nrules: []\ntool_calls:\n  rules:\n    - name: unsure-amount\n"
        '      when: {tool: transfer, argument: amount, stat: max_eu, op: ">", value: 0.3}\n'
        "      action: human_review\n  reask: {max_attempts: 2, fallback: human_review}\n",
        encoding="utf-8",
    )
    policy = Policy.from_file(path)
    assert policy.tool_calls.actions() == {"human_review", "run"} and policy.tool_calls.reask.max_attempts == 2
    assert not ToolCallPolicy().gates and policy.tool_calls.gates


# -- the record of a gated call and the verdict ----------------------------------------------------
def test_a_gated_call_is_recorded_with_its_scores_and_read_back(tmp_path: Any) -> None:
    policy = tool_policy({**AMOUNT, "action": "human_review"})
    call = parse_tool_call_scores(metadata(transfer_scores(0.9)), CALLS)[0]
    decision = policy.tool_calls.decide(call)
    rec = tool_call_record(
        call,
        decision,
        question="pay alice",
        model="m",
        policy_name="tools",
        policy_version="1",
        quadrants=QuadrantThresholds(0.05, 0.2),
    )
    store = AuditStore(tmp_path / "a.db")
    item = store.record_for_review(rec)
    back = store.review_item(item.id).record
    (entry,) = back.tool_calls
    assert entry["name"] == "transfer" and entry["args"] == {"to": "alice", "amount": 500}
    assert entry["arguments"]["amount"]["quadrant"] == "I" and entry["arguments"]["amount"]["flagged"] is True
    assert entry["arguments"]["to"]["quadrant"] == "IV" and entry["arguments"]["to"]["flagged"] is False
    assert back.answer == '{\n  "amount": 500,\n  "to": "alice"\n}' and back.action == "human_review"
    store.approve(item.id, "ann", edited_answer='{"amount": 50, "to": "alice"}')
    assert ToolReviewResponse.from_item(store.review_item(item.id)) == ToolReviewResponse(
        type="edit", args={"amount": 50, "to": "alice"}, reviewer="ann"
    )
    hashed = redact_record(back, None, redactor("hash"))
    assert (
        hashed.tool_calls[0]["args"]["amount"].startswith("sha256:") and hashed.tool_calls[0]["arguments"] == entry["arguments"]
    )


def test_records_without_tool_calls_and_bad_tool_calls() -> None:
    plain = AuditRecord(
        model="m", policy_name="p", policy_version="1", prompt="q", answer="a", action="pass", reason="", reliability=0.1
    )
    assert plain.tool_calls == []
    with pytest.raises(ConfigurationError, match="tool_calls must be a list of dicts"):
        AuditRecord(
            model="m",
            policy_name="p",
            policy_version="1",
            prompt="q",
            answer="a",
            action="pass",
            reason="",
            reliability=0.1,
            tool_calls="x",
        )  # type: ignore[arg-type]


def test_verdicts_are_validated() -> None:
    with pytest.raises(ValueError, match="an edit needs the new arguments"):
        ToolReviewResponse(type="edit")
    with pytest.raises(ValueError, match="a rejection needs a note"):
        ToolReviewResponse(type="reject")
    with pytest.raises(ValueError, match="only an edit takes args"):
        ToolReviewResponse(type="approve", args={"a": 1})


def test_a_scored_call_is_frozen() -> None:
    call = ScoredToolCall(id="c", name="t", args={}, scores={})
    with pytest.raises(AttributeError):
        call.name = "u"  # type: ignore[misc]
