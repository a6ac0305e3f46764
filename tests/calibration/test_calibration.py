"""Calibration: model profiles (quantile grid, percentile, save/load, where they are kept),
quantile thresholds resolved against a profile, threshold fitting, prompts files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from logtoku_guard import ConfigurationError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile, build_profile, fit_threshold, profile_path, read_prompts_file
from logtoku_guard.decision.policy import Policy
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.stats import ResponseStats


def answer(*rows: tuple[str, float, float]) -> ScriptedAnswer:
    return ScriptedAnswer([r[0] for r in rows], [[r[1], r[2]] for r in rows])


def stats_of(*rows: tuple[str, float, float], quadrants: QuadrantThresholds | None = None) -> ResponseStats:
    g = ScriptedBackend([answer(*rows)]).generate("q")
    return ResponseStats.from_generation(g, quadrants, first_tokens=2)


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


def test_jsonl_files_that_are_not_json_name_the_line_and_the_fix(tmp_path: Path) -> None:
    """Prompts and labels files share one JSON Lines reader: blank lines skipped, a broken line named."""
    from logtoku_guard.calibration.guard_fit import read_labels

    j = tmp_path / "p.jsonl"
    j.write_text('{"question": "a?"}\n\n{"question": "b?\n')
    broken = r"p\.jsonl:3: not JSON \(.* at column \d+\); each JSONL line must be one JSON object"
    with pytest.raises(ConfigurationError, match=broken):
        read_prompts_file(j)
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"question": "a?", "correct": true}\n\n{"question": "b?", "correct": false}\n')
    assert read_labels(labels) == [("a?", True), ("b?", False)]
    labels.write_text('{"question": "a?", "correct": true}\nnot json\n')
    with pytest.raises(ConfigurationError, match=r'labels\.jsonl:2: not JSON \(.*\); each line must be \{"question"'):
        read_labels(labels)


def test_the_package_keeps_the_old_module_names() -> None:
    """``logtoku_guard.calibration`` was one module; its public names import from the package."""
    import logtoku_guard.calibration as cal
    from logtoku_guard.calibration import profiles, prompts, thresholds

    assert cal.ModelProfile is profiles.ModelProfile and cal.calibrate is profiles.calibrate
    assert cal.fit_threshold is thresholds.fit_threshold and cal.read_prompts_file is prompts.read_prompts_file
    for name in ("build_profile", "load_profile_for", "profile_path", "default_calibration_prompts", "find_profile_for"):
        assert callable(getattr(cal, name)), name


def test_the_default_calibration_set_ships_with_the_package_and_its_licences() -> None:
    """200 questions (100 TruthfulQA, 100 NQ-open) with their reference answers, read from the
    package alone: `calibrate` and the first `ask` need no datasets folder."""
    from logtoku_guard.calibration import CALIBRATION_QUESTIONS, default_calibration_prompts, shipped_calibration_questions

    shipped = shipped_calibration_questions()
    assert [q.source for q in shipped] == ["truthfulqa"] * 100 + ["nq_open"] * 100
    assert all(q.question.endswith("?") and q.answers and all(q.answers) for q in shipped)
    assert len({q.id for q in shipped}) == 200
    assert default_calibration_prompts() == [q.question for q in shipped]
    some = default_calibration_prompts(10)
    assert len(some) == 10 and set(some) <= {q.question for q in shipped}
    assert sum(q in {s.question for s in shipped if s.source == "nq_open"} for q in some) == 5
    data = CALIBRATION_QUESTIONS.parent
    assert (
        "Apache License" in (data / "LICENSE-TruthfulQA").read_text() and "CC BY-SA 3.0" in (data / "NOTICE-NQ-open").read_text()
    )
    with pytest.raises(ConfigurationError, match=r"has 200 questions.*--prompts FILE"):
        default_calibration_prompts(201)
    with pytest.raises(ConfigurationError, match="at least 1"):
        default_calibration_prompts(0)


def test_a_saved_profile_wins_over_the_shipped_one_and_the_shipped_one_is_found_in_an_empty_cache(tmp_path: Path) -> None:
    from logtoku_guard.backends.embedded import EMBEDDED_MODEL
    from logtoku_guard.calibration import find_profile_for, load_profile_for, shipped_profile_path
    from logtoku_guard.calibration.guard_fit import shipped_guard

    found = find_profile_for(EMBEDDED_MODEL, 2, "clamped", tmp_path / "empty-cache")
    assert found is not None, "the embedded model's profile must ship with the package"
    shipped, where = found
    assert where == shipped_profile_path(EMBEDDED_MODEL) and shipped.model == EMBEDDED_MODEL
    assert shipped.n_prompts == 200 and shipped.source.startswith("default")
    assert shipped.guard == shipped_guard(EMBEDDED_MODEL)  # made with the guard that ships beside it
    assert find_profile_for(EMBEDDED_MODEL, 3, "clamped", tmp_path) is None  # another K: none shipped
    assert load_profile_for("some/other-model", 2, "clamped", tmp_path) is None
    own = _profile([1.0, 2.0, 3.0]).model_copy(update={"model": EMBEDDED_MODEL})
    saved = own.save(profile_path(EMBEDDED_MODEL, 2, "clamped", tmp_path))
    assert find_profile_for(EMBEDDED_MODEL, 2, "clamped", tmp_path) == (own, saved)
    saved.write_text("{broken")  # a damaged saved profile is an error, never silently the shipped one
    with pytest.raises(ValueError):
        find_profile_for(EMBEDDED_MODEL, 2, "clamped", tmp_path)
