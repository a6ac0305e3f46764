"""Thresholds stated as risk: the binomial bounds, their guarantee by simulation, and the policy route.

The guarantee tests draw many calibration sets from known score distributions, choose a threshold
on each, and measure the chosen threshold's true coverage (or selective risk) analytically: the
share of draws that miss the target must stay within ``1 - confidence`` (plus the simulation's
own noise). Picking the empirical quantile instead (no bound) misses about half the time, so
these tests fail for a method without a guarantee.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import calibrate
from logtoku_guard.calibration.guard_fit import shipped_guard
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.guard import Guard
from logtoku_guard.scoring.risk import binom_cdf, choose_threshold, clopper_pearson
from logtoku_guard.wire.payloads import result_payload


def test_binomial_cdf_and_clopper_pearson_match_known_values() -> None:
    assert binom_cdf(3, 10, 0.5) == pytest.approx(sum(math.comb(10, i) for i in range(4)) / 2**10)
    assert binom_cdf(-1, 5, 0.3) == 0.0 and binom_cdf(5, 5, 0.3) == 1.0
    # the 90% two-sided Clopper-Pearson interval of 5 in 10 is [0.2224, 0.7776]
    assert clopper_pearson(5, 10, 0.05, "lower") == pytest.approx(0.22244, abs=1e-4)
    assert clopper_pearson(5, 10, 0.05, "upper") == pytest.approx(0.77756, abs=1e-4)
    assert clopper_pearson(20, 20, 0.1, "lower") == pytest.approx(0.1 ** (1 / 20))
    assert clopper_pearson(0, 20, 0.1, "upper") == pytest.approx(1 - 0.1 ** (1 / 20))
    assert clopper_pearson(0, 20, 0.1, "lower") == 0.0 and clopper_pearson(20, 20, 0.1, "upper") == 1.0
    with pytest.raises(ValueError, match="successes <= n"):
        clopper_pearson(5, 4, 0.1, "upper")


def test_a_coverage_target_holds_with_the_stated_confidence() -> None:
    """Correct answers' scores ~ U(0, 1): a threshold t passes a share 1 - t of them."""
    rng = random.Random(0)
    misses, trials = 0, 300
    for _ in range(trials):
        correct = [rng.random() for _ in range(100)]
        wrong = [rng.random() * 0.5 for _ in range(50)]
        chosen = choose_threshold(correct, wrong, "coverage", 0.85, 0.9)
        assert chosen.met and chosen.bound >= 0.85
        misses += (1 - chosen.threshold) < 0.85
    assert misses / trials <= 0.1 + 0.05  # 3 standard errors of a 10% rate over 300 draws
    naive = sum(sorted(rng.random() for _ in range(100))[15] > 0.15 for _ in range(trials)) / trials
    assert naive > 0.3  # the bare empirical quantile misses far more often: the test can fail


@pytest.mark.slow
def test_a_selective_risk_target_holds_with_the_stated_confidence() -> None:
    """Half the answers right with scores ~ U(0.3, 1), half wrong with scores ~ U(0, 0.7): the
    passed wrong share at threshold t is known in closed form."""

    def true_risk(t: float) -> float:
        right = (1 - max(t, 0.3)) / 0.7
        wrong = max(0.7 - t, 0.0) / 0.7
        return wrong / (right + wrong) if right + wrong > 0 else 0.0

    rng = random.Random(1)
    misses, trials, met = 0, 200, 0
    for _ in range(trials):
        correct = [0.3 + 0.7 * rng.random() for _ in range(150)]
        wrong = [0.7 * rng.random() for _ in range(150)]
        chosen = choose_threshold(correct, wrong, "selective_risk", 0.2, 0.9)
        if chosen.met:
            met += 1
            assert chosen.bound <= 0.2
            misses += true_risk(chosen.threshold) > 0.2
    assert met > trials / 2
    assert misses / trials <= 0.1 + 0.06


def test_a_target_the_data_cannot_support_says_so_with_the_best_bound() -> None:
    chosen = choose_threshold([0.9, 0.8, 0.7], [0.1, 0.2], "coverage", 0.95, 0.9)
    assert not chosen.met and chosen.bound == pytest.approx(0.1 ** (1 / 3))
    assert "NOT met; best lower bound" in chosen.describe() and "3 correct and 2 wrong" in chosen.describe()
    risk = choose_threshold([0.5] * 10, [0.5] * 10, "selective_risk", 0.1, 0.9)
    assert not risk.met and risk.bound > 0.5 and "NOT met" in risk.describe()
    with pytest.raises(ConfigurationError, match="strictly between 0 and 1"):
        choose_threshold([0.5], [0.4], "coverage", 1.0, 0.9)


# -- in a policy ----------------------------------------------------------------------------------
def risk_policy(value: Any, stat: str = "guard_score", op: str = "<", always: bool = False) -> Policy:
    """A rule on ``stat op value``; ``always``: or'ed with a comparison every answer meets, so the rule
    fires and its checks (which record only for a rule that fires) are seen."""
    when: dict[str, Any] = {"stat": stat, "op": op, "value": value}
    if always:
        when = {"any": [when, {"stat": "n_tokens", "op": ">=", "value": 0}]}
    return Policy.from_dict({"name": "risk", "rules": [{"name": "low", "when": when, "action": "abstain"}]})


def guarded_profile() -> Any:
    """A profile of the scripted backend with the embedded model's shipped guard (labelled reference scores)."""
    rng = random.Random(0)
    answers = [ScriptedAnswer(["w"] * 4, [[rng.uniform(0, 12) for _ in range(2)] for _ in range(4)]) for _ in range(8)]
    backend = ScriptedBackend(answers, model_name="scripted")  # 6 answers calibrate, the rest are asked
    guard = shipped_guard("smollm2-135m-instruct")
    assert guard is not None and all(guard.labelled_scores())
    return calibrate(backend, [f"q{i}?" for i in range(6)], guard=guard), backend, guard


def test_a_policy_states_its_threshold_as_coverage_and_every_check_carries_the_guarantee() -> None:
    profile, backend, guard = guarded_profile()
    policy = risk_policy({"coverage": 0.85, "confidence": 0.9}, always=True)
    assert policy.uses_quantiles()
    result = Guard(backend, policy=policy, profile=profile).run("q0?")
    check = result.decision.checks[0]
    correct, wrong = guard.labelled_scores()
    expected = choose_threshold(correct, wrong, "coverage", 0.85, 0.9)
    assert check.threshold == expected.threshold and check.guarantee == expected.describe()
    assert "passes at least 85% of correct answers at 90% confidence: guaranteed lower bound" in check.guarantee
    assert f"{len(correct)} correct and {len(wrong)} wrong labelled answers" in check.guarantee
    payload = result_payload(result)
    assert payload["checks"][0]["guarantee"] == expected.describe()
    assert "chosen so that it passes at least 85%" in check.describe()


def test_a_policy_whose_target_the_data_cannot_meet_is_refused_with_the_best_bound() -> None:
    profile, _, _ = guarded_profile()
    with pytest.raises(ConfigurationError, match=r"cannot support this target: .*NOT met; best upper bound"):
        Decider(risk_policy({"selective_risk": 0.05, "confidence": 0.95}), profile)


def test_a_risk_threshold_needs_a_guard_with_labelled_scores() -> None:
    rng = random.Random(0)
    answers = [ScriptedAnswer(["w"] * 4, [[rng.uniform(0, 12) for _ in range(2)] for _ in range(4)]) for _ in range(6)]
    plain = calibrate(ScriptedBackend(answers, model_name="scripted"), [f"q{i}?" for i in range(6)])
    with pytest.raises(ConfigurationError, match="calibrate --labels"):
        Decider(risk_policy({"coverage": 0.85}), plain)
    # with a fallback, a profile without a guard compares the fallback statistic instead
    policy = Policy.from_dict(
        {
            "name": "risk",
            "rules": [
                {
                    "name": "low",
                    "when": {
                        "stat": "guard_score",
                        "op": "<",
                        "value": {"coverage": 0.85},
                        "fallback": "reliability",
                        "fallback_value": {"quantile": 0.5},
                    },
                    "action": "abstain",
                }
            ],
        }
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no guard at all: the documented fallback, without a warning
        Decider(policy, plain)
    from logtoku_guard.decision.conditions import RiskTargetWarning

    profile, _, guard = guarded_profile()
    unlabelled = profile.model_copy(update={"guard": guard.model_copy(update={"reference_labels": {}})})
    with pytest.warns(RiskTargetWarning, match="keeps no labelled reference scores; re-run `logtoku-guard calibrate`"):
        Decider(policy, unlabelled)  # an older guard: the fallback, said aloud


@pytest.mark.parametrize(
    ("value", "stat", "op", "needle"),
    [
        ({"coverage": 0.85}, "reliability", "<", "sets when guard_score flags"),
        ({"coverage": 0.85}, "guard_score", ">", "sets when guard_score flags"),
        ({"coverage": 0.85, "selective_risk": 0.2}, "guard_score", "<", "states one target"),
        ({"confidence": 0.9}, "guard_score", "<", "states one target"),
        ({"coverage": "0.85"}, "guard_score", "<", "write it unquoted"),
        ({"coverage": True}, "guard_score", "<", "write it unquoted"),
        ({"coverage": 1.5}, "guard_score", "<", "less than 1"),
        ({"coverage": 0.85, "confidence": 0}, "guard_score", "<", "greater than 0"),
        ({"coverage": 0.85, "alpha": 0.1}, "guard_score", "<", "alpha"),
    ],
)
def test_a_bad_risk_threshold_is_refused_naming_it(value: Any, stat: str, op: str, needle: str) -> None:
    with pytest.raises((ConfigurationError, ValidationError), match=needle):
        risk_policy(value, stat, op)


def test_a_risk_policy_loads_from_yaml_and_its_check_reaches_ask_json(tmp_path: Path) -> None:
    profile, backend, _ = guarded_profile()
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: risk\nrules:\n  - name: low\n    when:\n      any:\n"
        "        - {stat: guard_score, op: '<', value: {coverage: 0.9, confidence: 0.95}}\n"
        "        - {stat: n_tokens, op: '>=', value: 0}\n"
        "    action: abstain\n"
    )
    policy = Policy.from_file(path)
    result = Guard(backend, policy=policy, profile=profile).run("q1?")
    data = json.loads(json.dumps(result_payload(result)))
    assert "passes at least 90% of correct answers at 95% confidence" in data["checks"][0]["guarantee"]
    assert np.isfinite(data["checks"][0]["threshold"])


def test_an_unsupported_target_with_a_fallback_warns_and_compares_the_fallback() -> None:
    """The default policy's form: too few labelled correct answers for its coverage statement make
    it say so (RiskTargetWarning, with the best bound) and flag on reliability's quantile instead."""
    from logtoku_guard.decision.conditions import RiskTargetWarning
    from logtoku_guard.scoring.guard_score import GuardModel

    profile, backend, guard = guarded_profile()
    few = guard.model_copy(update={"reference_scores": {"real-correct": [0.9] * 5, "real-wrong": [0.1] * 5}})
    assert isinstance(few, GuardModel)
    small = profile.model_copy(update={"guard": few})
    when = {
        "stat": "guard_score",
        "op": "<",
        "value": {"coverage": 0.8, "confidence": 0.9},
        "fallback": "reliability",
        "fallback_value": {"quantile": 0.5},
    }
    policy = Policy.from_dict({"name": "p", "rules": [{"name": "low", "when": {"any": [when, ALWAYS]}, "action": "abstain"}]})
    with pytest.warns(RiskTargetWarning, match=r"cannot support it: .*NOT met; best lower bound 63\.1%.*compares reliability"):
        result = Guard(backend, policy=policy, profile=small).run("q2?")
    assert result.decision.checks[0].stat == "reliability" and result.decision.checks[0].quantile == 0.5


ALWAYS = {"stat": "n_tokens", "op": ">=", "value": 0}
