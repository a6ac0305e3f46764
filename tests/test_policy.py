"""Policies: validation with clear errors, rule evaluation, quantile thresholds, calibration (stats: test_stats.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from logtoku_guard import ConfigurationError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile, build_profile, fit_threshold, profile_path, read_prompts_file
from logtoku_guard.policy import Policy, PolicyError, default_policy
from logtoku_guard.stats import ResponseStats
from logtoku_guard.uncertainty import QuadrantThresholds


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


def test_nan_statistics_never_fire() -> None:
    policy = Policy.from_dict(
        {"name": "p", "rules": [{"name": "r", "when": {"stat": "reliability", "op": "<", "value": 0}, "action": "abstain"}]}
    )
    d = policy.decide(ResponseStats.from_tokens([]))
    assert d.action == "pass"


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


def _profile(values: list[float]) -> ModelProfile:
    answers = [answer(("t", v, 0.0)) for v in values]
    backend = ScriptedBackend(answers, model_name="m")
    return build_profile([backend.generate("q") for _ in values], source="test")


def test_percentile_inverts_quantile_on_the_profile_grid() -> None:
    profile = _profile([float(v) for v in range(100)])
    for q in (0.0, 0.05, 0.1, 0.37, 0.5, 0.9, 1.0):
        assert profile.percentile("max_eu", profile.quantile("max_eu", q)) == pytest.approx(q, abs=1e-9)
    grid = profile.stats["max_eu"]
    assert profile.percentile("max_eu", grid[0] - 1.0) == 0.0 and profile.percentile("max_eu", grid[-1] + 1.0) == 1.0
    assert math.isnan(profile.percentile("max_eu", math.nan))
    # a run of equal grid values: the middle of the run
    flat = _profile([5.0] * 60 + [float(v) for v in range(40)])
    value = 2 / (5.0 + 2)
    run = [i for i, v in enumerate(flat.stats["max_eu"]) if v == pytest.approx(value, abs=0)]
    assert len(run) > 1 and flat.percentile("max_eu", value) == pytest.approx((run[0] + run[-1]) / 2 / 100)
    with pytest.raises(ConfigurationError, match="no statistic 'nope'"):
        profile.percentile("nope", 0.5)


def test_quantile_thresholds_resolve_against_the_profile(tmp_path: Path) -> None:
    # One-token answers with evidence v: EU = 2 / (v + 2), for v = 0..99.
    profile = _profile([float(v) for v in range(100)])
    eus = sorted(2 / (v + 2) for v in range(100))
    assert profile.quantile("max_eu", 0.0) == pytest.approx(eus[0])
    assert profile.quantile("max_eu", 1.0) == pytest.approx(eus[-1])
    assert profile.quantile("max_eu", 0.5) == pytest.approx((eus[49] + eus[50]) / 2, rel=1e-6)
    policy = Policy.from_dict(
        {
            "name": "q",
            "rules": [{"name": "top10", "when": {"stat": "max_eu", "op": ">", "value": {"quantile": 0.9}}, "action": "abstain"}],
        }
    )
    flagged = sum(policy.decide(stats_of(("t", float(v), 0.0)), profile).action == "abstain" for v in range(100))
    assert flagged == 10
    with pytest.raises(ConfigurationError, match="no model profile"):
        policy.decide(stats_of(("t", 1.0, 0.0)))
    saved = profile.save(tmp_path / "prof.json")
    assert ModelProfile.load(saved) == profile
    with pytest.raises(ConfigurationError, match="run `logtoku-guard calibrate --model other"):
        profile.check_matches("other", 2, "clamped")
    assert profile_path("org/model name", 2, "clamped", tmp_path).name == "org_model_name-k2-clamped.json"


def test_default_policy_is_calibrated() -> None:
    p = default_policy()
    assert p.uses_quantiles() and {"retrieve", "warn", "pass", "abstain"} <= p.actions()


def test_fit_threshold_objectives_by_hand() -> None:
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    correct = [False, False, True, False, True, True, True, True]
    f1 = fit_threshold(scores, correct, "fbeta")
    # Flag < 0.5: 4 flagged, 3 incorrect -> precision 0.75, recall 1, F1 = 6/7; the best split.
    assert f1.threshold == 0.5 and f1.precision == 0.75 and f1.recall == 1.0 and f1.f_beta == pytest.approx(6 / 7)
    p = fit_threshold(scores, correct, "precision", target=1.0)
    assert p.threshold == 0.3 and p.recall == pytest.approx(2 / 3)
    c = fit_threshold(scores, correct, "coverage", target=0.75)
    assert c.threshold == 0.3 and c.coverage == 0.75
    with pytest.raises(ConfigurationError, match="target"):
        fit_threshold(scores, correct, "precision")
    with pytest.raises(ConfigurationError, match="equal length"):
        fit_threshold(scores, correct[:-1])


def test_prompts_files(tmp_path: Path) -> None:
    t = tmp_path / "p.txt"
    t.write_text("one?\n\ntwo?\n")
    assert read_prompts_file(t) == ["one?", "two?"]
    j = tmp_path / "p.jsonl"
    j.write_text('{"question": "a?"}\n{"prompt": "b?"}\n')
    assert read_prompts_file(j) == ["a?", "b?"]
    j.write_text('{"text": "a?"}\n')
    with pytest.raises(ConfigurationError, match=r"p\.jsonl:1"):
        read_prompts_file(j)
