"""The one JSON schema: NaN -> None, quadrants of undefined tokens, shares over all tokens, the route."""

from __future__ import annotations

import json
import math

import pytest

from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds, quadrant_of, quadrant_shares
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.types import Generation, TokenScore
from logtoku_guard.wire.payloads import (
    decision_attributes,
    json_float,
    result_payload,
    summary_payload,
    token_payload,
)

TH = QuadrantThresholds(au=0.5, eu=0.5, source="test")


def tok(i: int, au: float, eu: float) -> TokenScore:
    return TokenScore(
        index=i, id=i, text=f"t{i}", top_logits=(2.0, math.nan), top_ids=(i, 0), au=au, eu=eu, logprob=-0.1, entropy=0.2
    )


def test_json_float_writes_every_non_finite_value_as_none() -> None:
    assert [json_float(x) for x in (1.5, math.nan, math.inf, -math.inf, None)] == [1.5, None, None, None, None]


def test_a_nan_token_has_no_quadrant_and_strict_json() -> None:
    p = token_payload(tok(3, math.nan, 0.9), TH)
    assert p["quadrant"] is None and p["au"] is None and p["eu"] == 0.9 and p["index"] == 3
    assert p["top_logits"] == [2.0, None]
    json.dumps(p, allow_nan=False)
    assert quadrant_of(tok(0, 0.9, 0.9), TH) is Quadrant.I
    assert quadrant_of(tok(0, 0.9, 0.9), None) is None


def test_quadrant_shares_divide_by_all_tokens() -> None:
    tokens = [tok(0, 0.9, 0.9), tok(1, math.nan, 0.9), tok(2, 0.1, 0.1), tok(3, 0.1, 0.9)]
    shares = quadrant_shares(tokens, TH)
    assert shares is not None
    assert shares["I"] == pytest.approx(0.25) and shares["II"] == pytest.approx(0.25)
    assert sum(shares.values()) == pytest.approx(0.75)  # the undefined token is in no quadrant
    assert quadrant_shares([], TH) is None and quadrant_shares(tokens, None) is None
    stats = ResponseStats.from_tokens(tokens, top_n=2, quadrants=TH)  # the policy reads the same shares
    assert (stats.quadrant_i_share, stats.quadrant_ii_share) == (shares["I"], shares["II"])
    g = Generation(model="m", prompt="q", text="", tokens=tuple(tokens), finish_reason="stop", top_n=2)
    assert summary_payload(g, TH)["quadrant_shares"] == shares


def test_result_payload_route_keeps_each_attempts_rule() -> None:
    unsure = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
    sure = ScriptedAnswer(["Elena", "."], [[9.0, 0.1], [9.5, 0.3]])
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"}],
        }
    )
    result = Guard(ScriptedBackend([unsure, sure]), policy, retriever=lambda q: ["Elena founded it."]).run("Who?")
    p = result_payload(result, TH)
    assert [(a["attempt"], a["action"], a["rule"]) for a in p["route"]] == [(1, "retrieve", "unsure"), (2, "pass", None)]
    assert p["route"][1]["passages"] == 1 and p["route"][1]["reason"] == "after retrieval: no rule fired"
    assert (p["action"], p["rule"], p["attempts"], p["draft"]) == ("pass", None, 2, "Elena.")
    assert p["policy"] == {"name": "p", "version": "1"}
    json.dumps(p, allow_nan=False)


def test_decision_attributes_are_one_flat_set_without_undefined_values() -> None:
    unsure = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"}],
        }
    )
    result = Guard(ScriptedBackend([unsure]), policy, retriever=lambda q: []).run("Who?")  # retrieval brings nothing
    a = decision_attributes(result.decision, result.attempts, result)
    assert a["logtoku.route"] == ["retrieve", "abstain"] and a["logtoku.rules"] == ["unsure"]
    assert (a["logtoku.action"], a["logtoku.attempts"], a["logtoku.trace_id"]) == ("abstain", 1, result.trace_id)
    assert a["logtoku.stopped_early"] is False and a["logtoku.reliability"] == result.reliability
    assert "logtoku.review_id" not in a and "logtoku.guard_score" not in a  # undefined: left out, never None
    assert all(v is not None for v in a.values())
    # before the conclusion (an adapter's in-progress tags): the decision so far, no trace id
    first = result.attempts[0]
    b = decision_attributes(first.decision, result.attempts)
    assert (b["logtoku.action"], b["logtoku.rule"], b["logtoku.route"]) == ("retrieve", "unsure", ["retrieve"])
    assert not {"logtoku.trace_id", "logtoku.stopped_early"} & set(b)
    nan = ScriptedAnswer(["x"], [[math.nan, math.nan]])  # NaN reliability: no reliability key; no rule fired: no rule key
    undefined = Guard(ScriptedBackend([nan]), Policy.from_dict({"name": "none", "rules": []})).run("Who?")
    c = decision_attributes(undefined.decision, undefined.attempts, undefined)
    assert math.isnan(undefined.reliability) and not {"logtoku.reliability", "logtoku.rule"} & set(c)
    assert c["logtoku.rules"] == [] and c["logtoku.route"] == ["pass"]
