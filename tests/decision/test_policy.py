"""Policies: validation with clear errors, rule evaluation, quantile thresholds, calibration (stats: test_stats.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logtoku_guard import PolicyError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.stats import ResponseStats


def answer(*rows: tuple[str, float, float]) -> ScriptedAnswer:
    return ScriptedAnswer([r[0] for r in rows], [[r[1], r[2]] for r in rows])


def stats_of(*rows: tuple[str, float, float], quadrants: QuadrantThresholds | None = None) -> ResponseStats:
    g = ScriptedBackend([answer(*rows)]).generate("q")
    return ResponseStats.from_generation(g, quadrants, first_tokens=2)


def test_rules_fire_in_order_with_reasons_and_checks() -> None:
    policy = Policy.from_dict(
        {
            "name": "p",
            "version": "3",
            "rules": [
                {"name": "hi-eu", "when": {"stat": "max_eu", "op": ">", "value": 0.6}, "action": "abstain", "reason": "no idea"},
                {
                    "name": "combo",
                    "when": {
                        "all": [
                            {"stat": "mean_eu", "op": ">=", "value": 0.1},
                            {"not": {"stat": "n_tokens", "op": ">", "value": 5}},
                        ]
                    },
                    "action": "warn",
                },
                {
                    "name": "any",
                    "when": {"any": [{"stat": "max_au", "op": ">", "value": 9}, {"stat": "n_tokens", "op": ">", "value": 0}]},
                    "action": "human_review",
                },
            ],
        }
    )
    d = policy.decide(stats_of(("x", 0.5, 0.0)))  # EU = 2/2.5 = 0.8
    assert (d.action, d.rule, d.reason) == ("abstain", "hi-eu", "no idea")
    assert d.checks[0].observed == pytest.approx(0.8) and d.checks[0].threshold == 0.6 and d.checks[0].passed
    d = policy.decide(stats_of(("x", 10.0, 0.0)))  # EU = 2/12
    assert (d.action, d.rule) == ("warn", "combo")
    assert [c.stat for c in d.checks] == ["mean_eu", "n_tokens"]
    assert "mean_eu 0.1667 >= 0.1" in d.reason
    d = policy.decide(stats_of(*[("x", 30.0, 0.0)] * 7))
    assert (d.action, d.rule) == ("human_review", "any")
    d = Policy.from_dict({"name": "empty"}).decide(stats_of(("x", 3.0, 1.0)))
    assert (d.action, d.rule, d.reason) == ("pass", None, "no rule fired")


def test_undefined_statistics_count_as_least_reliable_unless_the_policy_says_never_fires() -> None:
    rules = [
        {"name": "unreliable", "when": {"stat": "reliability", "op": "<", "value": 0}, "action": "abstain"},
        {"name": "too-sure", "when": {"stat": "reliability", "op": ">", "value": 0}, "action": "warn"},
    ]
    empty = ResponseStats.from_tokens([])
    d = Policy.from_dict({"name": "p", "rules": rules}).decide(empty)
    assert (d.action, d.rule) == ("abstain", "unreliable")
    assert "undefined: empty answer" in d.reason and d.checks[0].observed is None and d.checks[0].undefined == "empty answer"
    d = Policy.from_dict({"name": "p", "rules": rules[1:]}).decide(empty)  # NaN is not "more reliable than"
    assert (d.action, d.reason) == ("pass", "no rule fired")
    d = Policy.from_dict({"name": "p", "rules": rules, "undefined": "never_fires"}).decide(empty)
    assert (d.action, d.reason) == ("pass", "no rule fired")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "p", "colour": "red"}, "colour: Extra inputs are not permitted"),
        (
            {"name": "p", "rules": [{"name": "r", "when": {"stat": "max_eu", "op": ">", "value": 1}, "action": "explode"}]},
            "'explode'",
        ),
        (
            {"name": "p", "rules": [{"name": "r", "when": {"stat": "max_euu", "op": ">", "value": 1}, "action": "pass"}]},
            "'max_euu'",
        ),
        ({"name": "p", "rules": [{"name": "r", "when": {"stat": "max_eu", "op": "!=", "value": 1}, "action": "pass"}]}, "'!='"),
        (
            {
                "name": "p",
                "rules": [{"name": "r", "when": {"stat": "max_eu", "op": ">", "value": {"quantile": 1.5}}, "action": "pass"}],
            },
            "1.5",
        ),
        ({"name": "p", "retrieve": {"max_attempts": 0}}, "retrieve.max_attempts"),
        ({"name": "p", "retrieve": {"context_template": "no placeholders"}}, "{context}"),
        (
            {
                "name": "p",
                "rules": [
                    {"name": "r", "when": {"stat": "mean_eu", "op": ">", "value": 1}, "action": "pass", "early_stop": True}
                ],
            },
            "early_stop",
        ),
        (
            {"name": "p", "rules": [{"name": "r", "when": {"stat": "max_eu", "op": ">", "value": 1}, "action": "pass"}] * 2},
            "unique",
        ),
    ],
)
def test_bad_policies_name_the_field_and_value(data: dict, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(data)
    assert needle in str(info.value)


def test_policy_files_yaml_and_json(tmp_path: Path) -> None:
    y = tmp_path / "p.yaml"
    y.write_text(
        "name: y\nversion: '2'\nrules:\n  - name: r\n"
        "    when: {stat: max_eu, op: '>', value: {quantile: 0.9}}\n    action: warn\n"
    )
    p = Policy.from_file(y)
    assert (p.name, p.version, p.uses_quantiles()) == ("y", "2", True)
    j = tmp_path / "p.json"
    j.write_text(json.dumps(p.model_dump(by_alias=True)))
    assert Policy.from_file(j) == p
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(PolicyError, match=r"bad\.yaml"):
        Policy.from_file(bad)
    with pytest.raises(PolicyError, match=r"missing\.json"):
        Policy.from_file(tmp_path / "missing.json")


def test_default_policy_is_calibrated() -> None:
    """One rule: guard_score below the threshold that passes a stated share of correct answers with a
    stated confidence, else (no fitted guard) a reliability quantile of the profile; retrieve, then abstain."""
    from logtoku_guard.decision.conditions import Compare, Quantile, Risk
    from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE, DEFAULT_FLAG_QUANTILE

    p = default_policy()
    assert p.uses_quantiles() and p.actions() == {"retrieve", "pass", "abstain"} and p.version == "4"
    (rule,) = p.rules
    c = rule.when
    assert isinstance(c, Compare) and (c.stat, c.fallback) == ("guard_score", "reliability")
    assert c.value == Risk(coverage=DEFAULT_COVERAGE, confidence=DEFAULT_CONFIDENCE)
    assert c.fallback_value == Quantile(quantile=DEFAULT_FLAG_QUANTILE)
    assert "passes at least 80% of correct answers with 90% confidence" in p.description


def test_the_default_threshold_on_the_embedded_guard_is_its_stated_guarantee() -> None:
    """On the shipped guard of the embedded model (fit on both question styles) the statement gives
    0.2797: at least 80% of correct answers pass, with 90% confidence, on its 216 labelled correct answers."""
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.calibration.profiles import shipped_profile_path
    from logtoku_guard.decision.conditions import resolve_threshold

    profile = ModelProfile.load(shipped_profile_path("smollm2-135m-instruct"))
    (rule,) = default_policy().rules
    threshold, _, guarantee = resolve_threshold(rule.when, profile)  # type: ignore[arg-type]
    assert threshold == pytest.approx(0.2797, abs=5e-5)
    assert guarantee is not None and "guaranteed lower bound 80.1%" in guarantee and "216 correct" in guarantee


def test_gemma_ships_a_profile_whose_guard_calibrate_fitted_alone() -> None:
    """``--backend llamacpp --model gemma3-270m`` finds a shipped profile: its guard was fit by
    ``calibrate`` on the shipped self-labelled questions (no user labels), and the default policy's
    statement holds on its 149 labelled correct answers (answers ended at the model's blank-line stop)."""
    from logtoku_guard.calibration import ModelProfile, find_profile_for
    from logtoku_guard.calibration.profiles import shipped_profile_path
    from logtoku_guard.decision.conditions import resolve_threshold

    path = shipped_profile_path("gemma-3-270m-q4_k_m@llamacpp")
    profile = ModelProfile.load(path)
    assert profile.model == "gemma-3-270m-q4_k_m@llamacpp" and profile.guard is not None
    assert profile.guard.datasets == ["traffic-tune + 712 ordinary-tune"] and profile.guard.n == 1535
    assert profile.guard.reference_labels == {"plausible": False, "real-correct": True, "real-wrong": False, "syllable": False}
    (rule,) = default_policy().rules
    threshold, _, guarantee = resolve_threshold(rule.when, profile)  # type: ignore[arg-type]
    assert threshold == pytest.approx(0.0812, abs=5e-5)
    assert guarantee is not None and "guaranteed lower bound 80.1%" in guarantee and "149 correct" in guarantee
    found = find_profile_for("gemma-3-270m-q4_k_m@llamacpp", cache_dir=None)
    assert found is not None and found[0].created_at == profile.created_at


def test_a_fallback_can_have_its_own_threshold() -> None:
    """guard_score 0.5 (absolute) when the profile has a guard; else reliability's q0.9 of the profile."""
    rule = {"stat": "guard_score", "op": "<", "value": 0.5, "fallback": "reliability", "fallback_value": {"quantile": 0.9}}
    policy = Policy.from_dict({"name": "p", "rules": [{"name": "r", "when": rule, "action": "warn"}]})
    assert policy.uses_quantiles()
    from logtoku_guard.calibration import build_profile

    backend = ScriptedBackend([answer(("t", v + 1.0, 1.0)) for v in range(10)], model_name="m")
    profile = build_profile([backend.generate("q") for _ in range(10)], "t")  # no fitted guard: guard_score is NaN
    no_guard = policy.decide(stats_of(("t", 4.0, 1.0)), profile)
    (check,) = no_guard.checks
    assert check.stat == "reliability" and check.quantile == 0.9 and check.threshold == profile.quantile("reliability", 0.9)
    with pytest.raises(PolicyError, match=r"fallback_value .* without a fallback"):
        Policy.from_dict({"name": "p", "rules": [{"name": "r", "when": {**rule, "fallback": None}, "action": "warn"}]})
    with pytest.raises(PolicyError, match="finite"):
        Policy.from_dict(
            {"name": "p", "rules": [{"name": "r", "when": {**rule, "fallback_value": float("nan")}, "action": "warn"}]}
        )


def test_stats_used_names_each_comparisons_fallback() -> None:
    assert {"guard_score", "reliability"} <= default_policy().stats_used()
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [
                {
                    "name": "shares",
                    "when": {"stat": "guard_score", "op": "<", "value": {"quantile": 0.2}, "fallback": "unreliable_share"},
                    "action": "warn",
                }
            ],
        }
    )
    assert policy.stats_used() == {"guard_score", "unreliable_share"}
