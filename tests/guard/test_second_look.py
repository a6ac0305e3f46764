"""Second looks: measured only where a policy rule reaches them, through the guard loop's Measure request.

Scripted logits for the loop (sampling and paraphrase agreement, what is recorded, what never
leaves), the tiny random transformers model for the self-check's verdict logits, and the real
embedded model in a slow test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.decision.conditions import settled
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy
from logtoku_guard.decision.rules import RuleContext
from logtoku_guard.errors import PolicyError, UsageError
from logtoku_guard.guard.driver import drive
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.guard_steps import Answer, Generate, Retrieve, Retrieved
from logtoku_guard.scoring.second_look import LookedStats, Measurement, SecondLooks, agreement, claim_key, verdict
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.scoring.uncertainty import au_eu
from logtoku_guard.types import TokenScore
from logtoku_guard.wire.payloads import result_payload, served_decision_payload

SHAKY = [[4.0, 3.0], [3.0, 2.0]]  # max EU ~ 0.22
SURE = [[30.0, 5.0], [25.0, 2.0]]  # max EU ~ 0.06


def said(text: str, logits: list[list[float]] = SHAKY) -> ScriptedAnswer:
    return ScriptedAnswer([text, "."], logits)


def cascade(**extra: Any) -> Policy:
    """Shaky answers (max_eu > 0.1) take a second look: samples first, then reworded questions."""
    return Policy.from_dict(
        {
            "name": "cascade-test",
            "rules": [
                {
                    "name": "unstable-samples",
                    "when": {
                        "all": [
                            {"stat": "max_eu", "op": ">", "value": 0.1},
                            {"stat": "sampling_agreement", "op": "<", "value": 0.5},
                        ]
                    },
                    "action": "abstain",
                },
                {
                    "name": "unstable-wording",
                    "when": {
                        "all": [
                            {"stat": "max_eu", "op": ">", "value": 0.1},
                            {"stat": "paraphrase_agreement", "op": "<", "value": 0.5},
                        ]
                    },
                    "action": "abstain",
                },
            ],
            "second_look": {"sampling": {"n": 3, "temperature": 0.7}, "paraphrase": {"templates": ["Asked again: {question}"]}},
            **extra,
        }
    )


def test_a_confident_answer_passes_after_one_pass_without_a_second_look() -> None:
    backend = ScriptedBackend([said("Lyon", SURE)])
    r = Guard(backend, cascade()).run("What is the largest city in France?")
    assert (r.action, r.answer, len(backend.calls), r.second_looks) == ("pass", "Lyon.", 1, ())
    assert r.timings.second_look_s == 0.0 and "sampling_agreement" not in result_payload(r)["stats"]


def test_unstable_samples_withhold_the_draft_and_no_sample_reaches_the_client(tmp_path: Path) -> None:
    from logtoku_guard.audit import AuditStore

    backend = ScriptedBackend([said("Lyon"), said("Marseille"), said("Nice"), said("Lyon")])
    store = AuditStore(tmp_path / "audit.db")
    r = Guard(backend, cascade(), store=store).run("What is the largest city in France?")
    assert (r.action, r.answer, r.decision.rule) == ("abstain", "I don't know.", "unstable-samples")
    assert len(backend.calls) == 4  # one pass and three samples; the paraphrase was never needed
    (m,) = r.second_looks
    assert m.look == "sampling" and m.values["sampling_agreement"] == pytest.approx(1 / 3)
    assert m.tokens == 6 and dict(m.inputs) == {"n": 3, "temperature": 0.7, "max_new_tokens": 48, "seed": 0}
    assert r.timings.second_look_s > 0 and r.second_look_tokens == 6
    check = r.decision.checks[1]
    assert (check.stat, check.observed) == ("sampling_agreement", pytest.approx(1 / 3))
    served = json.dumps(served_decision_payload(r))
    assert "Marseille" not in served and "Nice" not in served and "Lyon" not in served
    assert "Marseille" not in json.dumps(result_payload(r)) and "Nice" not in json.dumps(result_payload(r))
    record = store.get(r.trace_id)
    assert record.stats["sampling_agreement"] == pytest.approx(1 / 3)
    assert record.stats["second_look.sampling.tokens"] == 6 and record.stats["second_look.sampling.n"] == 3
    assert (record.timings["second_look_s"] or 0) > 0 and "Marseille" not in json.dumps(record.to_dict())


def test_stable_samples_go_on_to_the_next_rule_s_look_then_pass() -> None:
    backend = ScriptedBackend([said("Lyon"), said("Lyon"), said("It is Lyon"), said("Paris"), said("Lyon")])
    r = Guard(backend, cascade()).run("What is the largest city in France?")
    assert (r.action, r.answer) == ("pass", "Lyon.")
    assert [m.look for m in r.second_looks] == ["sampling", "paraphrase"]
    assert r.second_looks[1].values["paraphrase_agreement"] == 1.0
    assert backend.calls[-1][-1].content == "Asked again: What is the largest city in France?"
    assert len(backend.calls) == 5


def test_an_entry_point_that_cannot_measure_is_refused_before_anything_is_generated() -> None:
    class NoMeasure:
        generated = 0

        def generate(self, request: Generate, watch: Any) -> Answer:
            self.generated += 1
            raise AssertionError("must not generate")

        def retrieve(self, request: Retrieve) -> Retrieved:
            return Retrieved()

    io = NoMeasure()
    with pytest.raises(UsageError, match=r"second-look statistics \['paraphrase_agreement', 'sampling_agreement'\].*NoMeasure"):
        drive(Decider(cascade()), "q?", io)
    assert io.generated == 0


def test_a_policy_without_second_look_rules_never_measures() -> None:
    policy = Policy.from_dict(
        {"name": "plain", "rules": [{"name": "r", "when": {"stat": "max_eu", "op": ">", "value": 0.1}, "action": "warn"}]}
    )
    assert policy.second_look_stats() == set()
    stats = ResponseStats.from_generation(ScriptedBackend([said("Lyon")]).generate("q"))
    assert Decider(policy).looks_needed(ScriptedBackend([said("Lyon")]).generate("q")) == ()
    assert not isinstance(Decider(policy)._stats(ScriptedBackend([said("Lyon")]).generate("q")), LookedStats)
    assert policy.looks_needed(stats) == ()


def three_valued(when: dict[str, Any], looks: SecondLooks | None = None) -> bool | None:
    policy = Policy.from_dict({"name": "t", "rules": [{"name": "r", "when": when, "action": "warn"}]})
    stats = LookedStats.of(ResponseStats.from_generation(ScriptedBackend([said("Lyon")]).generate("q")), looks or SecondLooks())
    return settled(policy.rules[0].when, stats, RuleContext())


def test_a_rule_reaches_a_second_look_only_where_its_outcome_depends_on_it() -> None:
    shaky, sure = {"stat": "max_eu", "op": ">", "value": 0.1}, {"stat": "max_eu", "op": "<", "value": 0.1}
    look = {"stat": "self_check_yes", "op": "<", "value": 0.5}
    assert three_valued({"all": [sure, look]}) is False  # settled by its first part: no look
    assert three_valued({"any": [shaky, look]}) is True
    assert three_valued({"all": [shaky, look]}) is None
    assert three_valued({"not": {"all": [shaky, look]}}) is None
    measured = SecondLooks(
        (Measurement("self_check", {"self_check_yes": 0.2, "self_check_au": 0.1, "self_check_eu": 0.3}, 9, 0.01),)
    )
    assert three_valued({"all": [shaky, look]}, measured) is True
    assert three_valued({"not": {"all": [shaky, look]}}, measured) is False


def test_looks_are_asked_for_rule_by_rule_in_order() -> None:
    policy = cascade()
    stats = LookedStats.of(ResponseStats.from_generation(ScriptedBackend([said("Lyon")]).generate("q")))
    assert policy.looks_needed(stats) == ("sampling",)
    sampled = SecondLooks((Measurement("sampling", {"sampling_agreement": 0.9}, 6, 0.01),))
    assert policy.looks_needed(LookedStats.of(stats, sampled)) == ("paraphrase",)
    unstable = SecondLooks((Measurement("sampling", {"sampling_agreement": 0.1}, 6, 0.01),))
    assert policy.looks_needed(LookedStats.of(stats, unstable)) == ()  # the first rule fires: nothing more to measure


def test_second_look_thresholds_are_absolute_and_named_in_the_error() -> None:
    bad = {"name": "r", "when": {"stat": "sampling_agreement", "op": "<", "value": {"quantile": 0.2}}, "action": "warn"}
    with pytest.raises(PolicyError, match="sampling_agreement is a second-look statistic"):
        Policy.from_dict({"name": "t", "rules": [bad]})
    typo = {"name": "r", "when": {"stat": "sampling_agrement", "op": "<", "value": 0.2}, "action": "warn"}
    with pytest.raises(PolicyError, match="did you mean 'sampling_agreement'"):
        Policy.from_dict({"name": "t", "rules": [typo]})
    with pytest.raises(PolicyError, match="must contain"):
        Policy.from_dict({"name": "t", "second_look": {"paraphrase": {"templates": ["no placeholder"]}}})


def test_a_second_look_statistic_never_measured_counts_as_least_reliable_and_says_why() -> None:
    decision = Decider(cascade()).decide(ScriptedBackend([said("Lyon")]).generate("q"))
    assert decision.rule == "unstable-samples" and (decision.checks[1].undefined or "").startswith("not measured")


def test_verdict_reads_yes_and_no_among_the_kept_logits() -> None:
    texts = {1: " Yes", 2: "No", 3: " yes", 4: "The"}
    token = TokenScore(
        0, 4, "The", (9.0, 6.0), (4, 1), 0.1, 0.1, -0.1, 0.5, alt_logits=(9.0, 6.0, 5.0, 2.0), alt_ids=(4, 1, 2, 3)
    )
    values, why = verdict(token, texts.__getitem__)
    z_yes = math.log(math.exp(6.0) + math.exp(2.0))
    assert why is None and values["self_check_yes"] == pytest.approx(1 / (1 + math.exp(5.0 - z_yes)))
    au, eu = au_eu(np.array([[6.0, 5.0]]))
    assert (values["self_check_au"], values["self_check_eu"]) == (pytest.approx(au[0]), pytest.approx(eu[0]))
    only_yes = TokenScore(0, 1, " Yes", (9.0, 4.0), (1, 4), 0.1, 0.1, -0.1, 0.5)
    bound, _ = verdict(only_yes, texts.__getitem__)  # "no" is at most the smallest kept logit: a bound
    assert bound["self_check_yes"] == pytest.approx(1 / (1 + math.exp(4.0 - 9.0)))
    none, why = verdict(TokenScore(0, 4, "The", (9.0, 4.0), (4, 4), 0.1, 0.1, -0.1, 0.5), texts.__getitem__)
    assert math.isnan(none["self_check_yes"]) and "neither a yes nor a no" in (why or "")


def test_the_key_claim_and_its_agreement() -> None:
    tokens = (
        ScriptedBackend([ScriptedAnswer(["The", " answer", " is", " Neil", " Armstrong", "."], [[3, 1]] * 6)])
        .generate("q")
        .tokens
    )
    key = claim_key(tokens, "Who was the first person on the moon?")
    assert key == ("neil", "armstrong")
    assert agreement(key, ["Neil Armstrong.", "Buzz Aldrin", "Armstrong, in 1969"]) == pytest.approx((1 + 0 + 0.5) / 3)
    assert math.isnan(agreement((), ["x"]))
    said_it = ScriptedBackend([ScriptedAnswer(["Lithuania", " is", " Vilnius", "."], [[3, 1]] * 4)]).generate("q").tokens
    assert claim_key(said_it, "Which city is Lithuania's capital?") == ("vilnius",)  # a possessive is the question's word


def _single_token(tokenizer: Any, words: list[str]) -> tuple[str, int]:
    for word in words:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) == 1:
            return word.strip(), ids[0]
    raise AssertionError(f"none of {words} is one token of the tiny tokenizer")


def test_self_check_reads_the_verdict_logits_of_a_real_backend(tiny_backend: Any, tiny_tokenizer: Any) -> None:
    yes, yes_id = _single_token(tiny_tokenizer, [" one", " Paris"])
    no, no_id = _single_token(tiny_tokenizer, [" two", " France"])
    model = tiny_backend._model if hasattr(tiny_backend, "_model") else None
    assert model is not None
    forward = model.forward

    def forced(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        out.logits[:, -1, yes_id] = 50.0
        out.logits[:, -1, no_id] = 48.0
        return out

    model.forward = forced
    policy = Policy.from_dict(
        {
            "name": "self-check",
            "rules": [{"name": "doubt", "when": {"stat": "self_check_yes", "op": "<", "value": 0.9}, "action": "abstain"}],
            "second_look": {"self_check": {"yes": [yes], "no": [no]}},
        }
    )
    from logtoku_guard.types import DecodingOptions

    r = Guard(tiny_backend, policy, options=DecodingOptions(max_new_tokens=3)).run("What is the capital of France?")
    (m,) = r.second_looks
    assert m.look == "self_check" and m.why is None
    assert m.values["self_check_yes"] == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-4)
    au, eu = au_eu(np.array([[50.0, 48.0]]))
    assert m.values["self_check_eu"] == pytest.approx(eu[0], rel=1e-4) and m.values["self_check_au"] == pytest.approx(
        au[0], rel=1e-3
    )
    assert m.tokens > 10 and r.action == "abstain"  # 0.88 < 0.9


@pytest.mark.slow
def test_every_look_on_the_real_model(embedded_backend: Any) -> None:
    policy = Policy.from_dict(
        {
            "name": "all-looks",
            "rules": [
                {
                    "name": "any-doubt",
                    "when": {
                        "any": [
                            {"stat": "self_check_yes", "op": "<", "value": 0.0},
                            {"stat": "sampling_agreement", "op": "<", "value": 0.0},
                            {"stat": "paraphrase_agreement", "op": "<", "value": 0.0},
                        ]
                    },
                    "action": "abstain",
                }
            ],
        }
    )
    r = Guard(embedded_backend, policy).run("What is the capital of France?")
    assert r.action == "pass" and "Paris" in r.answer
    assert [m.look for m in r.second_looks] == ["self_check", "sampling", "paraphrase"]
    values = {k: v for m in r.second_looks for k, v in m.values.items()}
    assert all(math.isfinite(v) for v in values.values()), values
    assert values["sampling_agreement"] >= 0.5 and values["paraphrase_agreement"] >= 0.5  # Paris, however asked
    assert all(m.tokens > 0 and m.seconds > 0 for m in r.second_looks)


def test_the_shipped_cascade_loads_by_name_and_looks_only_inside_its_band() -> None:
    import dataclasses

    from logtoku_guard.calibration.profiles import load_profile_for
    from logtoku_guard.decision.policy import shipped_policies

    assert "cascade" in shipped_policies()
    policy = Policy.named("cascade")
    profile = load_profile_for("smollm2-135m-instruct")
    assert profile is not None
    Decider(policy, profile)  # every risk threshold is placed on the shipped profile
    base = ResponseStats.from_generation(ScriptedBackend([said("Lyon")]).generate("q"))

    def looks_at(guard_score: float) -> tuple[str, ...]:
        return policy.looks_needed(LookedStats.of(dataclasses.replace(base, guard_score=guard_score)), profile)

    assert looks_at(0.99) == ()  # clearly confident: one pass
    assert looks_at(0.01) == ()  # clearly unsure: flagged without a look
    inside = [g for g in np.linspace(0.02, 0.98, 49) if looks_at(float(g))]
    assert inside and looks_at(float(inside[0])) == ("sampling",)
    with pytest.raises(PolicyError, match="no shipped policy named 'nope'; shipped: default, cascade"):
        Policy.named("nope")
    assert Policy.named("default").name == "default"
