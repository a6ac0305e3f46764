"""``logtoku-guard eval ordinary`` end to end on a scripted backend, and its table's arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from logtoku_eval.ordinary import load_ordinary
from logtoku_eval.ordinary_eval import ALL, ScoredAnswer, read_answers, summarise

CONFIDENT = [9.0, 1.0, 0.5, 0.2, 0.1]
UNSURE = [1.2, 1.1, 1.0, 0.9, 0.8]


def _answer_function(asked: list[str]) -> Any:
    """Right and confident on sentence-case and paraphrased questions, wrong and unsure on lower-case ones."""
    from logtoku_guard.backends.fake import ScriptedAnswer

    refs = {it.question: (it.wording, it.answers[0]) for it in load_ordinary()}

    def answer(messages: Any) -> ScriptedAnswer:
        question = messages[-1].content
        asked.append(question)
        wording, ref = refs.get(question, ("traffic", "Nobody"))
        if wording in ("sentence", "paraphrase"):
            return ScriptedAnswer([f" {ref}", "."], [CONFIDENT, CONFIDENT])
        return ScriptedAnswer([" Nobody", " knows", "."], [UNSURE, UNSURE, UNSURE])

    return answer


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str, backends: list[str] | None = None) -> Any:
    from support.scripted_cli import scripted_loader
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.cli import toolkit

    asked: list[str] = []
    monkeypatch.setattr(toolkit, "load_backend", scripted_loader(_answer_function(asked), backends=backends))
    dirs = ["--gen-cache-dir", str(tmp_path / "gen"), "--out-dir", str(tmp_path / "out")]
    res = CliRunner().invoke(eval_app, ["ordinary", *dirs, "--n-boot", "20", *args])
    res.asked = asked
    return res


def test_eval_ordinary_answers_judges_and_applies_the_shipped_guard_per_wording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from logtoku_eval.fabricated_eval import generation_from_cached
    from logtoku_eval.generate import SERVING, SERVING_TEMPLATE, greedy_cache
    from logtoku_eval.ordinary import dataset_name
    from logtoku_guard.calibration.profiles import ModelProfile, shipped_profile_path
    from logtoku_guard.decision.decider import Decider
    from logtoku_guard.decision.policy import default_policy

    res = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--limit", "1", "--no-traffic")
    assert res.exit_code == 0, res.output
    test = load_ordinary(split="test")
    first = {next(it.question_id for it in test if it.category == c) for c in {it.category for it in test}}
    assert len(first) == 15  # --limit 1: the first question of each category, in its three wordings
    assert sorted(res.asked) == sorted(it.question for it in test if it.question_id in first)
    assert "| sentence | 15 | 15 (100.0%) | 0 |" in res.output and "| lower | 15 | 0 (0.0%) | 15 |" in res.output
    assert (
        "| all | 45 | 30 (66.7%) | 15 |" in res.output and "shipped (profile-smollm2-135m-instruct-k2-clamped.json)" in res.output
    )
    assert "| capital | 3 | 2 (66.7%) | 1 |" in res.output  # per category
    table = json.loads((tmp_path / "out" / "ordinary.json").read_text(encoding="utf-8"))
    rows = {r["label"]: r for r in table["rows"]}
    assert list(rows) == ["sentence", "lower", "paraphrase", ALL]
    assert rows[ALL]["n_correct"] == 30 and rows[ALL]["n_wrong"] == 15 and table["split"] == "test"
    assert rows["sentence"]["wrong_flagged"][0] is None  # no wrong answer there: undefined, not 0
    assert table["traffic"] == [] and table["threshold"] is not None
    answers = read_answers(tmp_path / "out" / "ordinary-answers.jsonl")
    assert len(answers) == 45 and {a.benchmark for a in answers} == {"ordinary"}
    assert all(a.correct == (a.group != "lower") for a in answers)
    # the decision is the shipped guard's, through the Decider `ask` uses, on the cached answer
    profile = ModelProfile.load(shipped_profile_path("smollm2-135m-instruct"))
    decider = Decider(default_policy(), profile)
    cache = greedy_cache(tmp_path / "gen", "smollm2-135m-instruct", dataset_name(), SERVING, template=SERVING_TEMPLATE)
    for a in answers:
        d = decider.decide(generation_from_cached(cache.get(a.id), "smollm2-135m-instruct"))
        assert (a.action, a.rule) == (d.action, d.rule)
        assert a.guard_score == pytest.approx(d.stats.guard_score, nan_ok=True)
        assert a.stats["reliability"] == pytest.approx(d.stats.reliability)
    wrong_flagged = np.mean([a.flagged for a in answers if not a.correct])
    assert rows[ALL]["wrong_flagged"][0] == pytest.approx(wrong_flagged)
    # a second run answers nothing again: everything comes from the generation cache
    again = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--limit", "1", "--no-traffic")
    assert again.exit_code == 0 and again.asked == []
    more = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--limit", "2", "--no-traffic")
    assert more.exit_code == 0 and len(more.asked) == 45  # a larger --limit asks only the new questions


def test_eval_ordinary_decides_with_the_policy_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that flags the unsure answers (high max_eu): every wrong answer flagged, every correct one passed."""
    policy = tmp_path / "strict.json"
    rule = {"name": "unsure", "when": {"stat": "max_eu", "op": ">", "value": 0.3}, "action": "abstain"}
    policy.write_text(json.dumps({"name": "strict", "rules": [rule], "default_action": "pass"}), encoding="utf-8")
    res = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--limit", "1", "--no-traffic", "--policy", str(policy))
    assert res.exit_code == 0, res.output
    assert "Policy: strict v1 (no guard_score threshold)" in res.output
    assert "| lower | 15 | 0 (0.0%) | 15 | 100.0 [100.0, 100.0] | n/a (n=0) |" in res.output
    assert "| all | 45 | 30 (66.7%) | 15 | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] |" in res.output
    answers = read_answers(tmp_path / "out" / "ordinary-answers.jsonl")
    assert {(a.group, a.action, a.rule) for a in answers} == {
        ("sentence", "pass", None),
        ("paraphrase", "pass", None),
        ("lower", "abstain", "unsure"),
    }
    assert all(a.threshold is None for a in answers)  # no guard_score comparison in this policy


def test_eval_ordinary_reports_the_traffic_half_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--limit", "1", "--split", "tune")
    assert res.exit_code == 0, res.output
    assert "The traffic benchmark's real questions, tune half" in res.output
    table = json.loads((tmp_path / "out" / "ordinary.json").read_text(encoding="utf-8"))
    assert [r["label"] for r in table["traffic"]] == ["cased", "lower", ALL]
    # --limit 1: the first known fact and the first NQ-open question of the half, both styles, all answered wrong
    assert table["traffic"][-1]["n"] == 4 and table["traffic"][-1]["n_correct"] == 0
    answers = read_answers(tmp_path / "out" / "ordinary-answers.jsonl")
    traffic = [a for a in answers if a.benchmark == "traffic"]
    assert len(traffic) == 4 and {a.split for a in answers} == {"tune"}
    assert {a.question_id for a in traffic} == {traffic[0].question_id, traffic[-1].question_id}
    assert {a.category for a in traffic} == {"known", "known-lower", "nq", "nq-cased"}


def test_eval_ordinary_uses_the_backend_and_profile_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.calibration.profiles import shipped_profile_path

    backends: list[str] = []
    common = ["--model", "m", "--backend", "llamacpp", "--limit", "1", "--no-traffic"]
    missing = _run(tmp_path, monkeypatch, *common, backends=backends)
    assert missing.exit_code == 2 and "none is shipped for the model 'm@llamacpp'" in " ".join(missing.output.split())
    assert "Traceback" not in missing.output and not backends  # refused before any model loads
    profile = shipped_profile_path("smollm2-135m-instruct@llamacpp")
    res = _run(tmp_path, monkeypatch, *common, "--profile", str(profile), backends=backends)
    assert res.exit_code == 0, res.output
    assert backends == ["llamacpp"] and str(profile) in " ".join(res.output.split())
    caches = [p.name for p in (tmp_path / "gen").rglob("*.jsonl")]
    assert caches and all("m@llamacpp" in p or "m_llamacpp" in p for p in caches), caches


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split", "dev"], "--split must be one of tune, test, all, got 'dev'"),
        (["--limit", "0"], "--limit"),
        (["--policy", "nowhere.yaml"], "nowhere.yaml"),
        (["--profile", __file__], "is not a profile saved by `logtoku-guard calibrate`"),
    ],
)
def test_eval_ordinary_refuses_bad_options_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    res = _run(tmp_path, monkeypatch, "--model", "smollm2-135m-instruct", "--no-traffic", *args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and res.asked == []


def _scored(question_id: str, correct: bool, score: float, flagged: bool, group: str = "sentence") -> ScoredAnswer:
    return ScoredAnswer(
        benchmark="ordinary",
        id=f"{question_id}-{group}",
        question_id=question_id,
        category="capital",
        split="test",
        group=group,
        question="q?",
        references=("a",),
        answer="a" if correct else "b",
        correct=correct,
        guard_score=score,
        action="retrieve" if flagged else "pass",
        rule="low-guard-score" if flagged else None,
        reason="",
        stats={"reliability": 1.0},
    )


def test_summarise_counts_flags_and_auroc_with_question_level_intervals() -> None:
    answers = [
        _scored("q1", True, 0.9, False),
        _scored("q2", True, 0.8, False),
        _scored("q3", True, 0.2, True),
        _scored("q4", False, 0.1, True),
        _scored("q5", False, 0.7, False),
        _scored("q6", False, math.nan, True),  # undefined scores rank lowest
    ]
    row = summarise("all", answers, n_boot=200, seed=1)
    assert (row.n, row.n_correct, row.n_wrong) == (6, 3, 3)
    assert row.wrong_flagged.value == pytest.approx(2 / 3) and row.correct_passed.value == pytest.approx(2 / 3)
    # pairs (correct, wrong) ranked right: 0.9 beats all 3, 0.8 beats all 3, 0.2 beats 0.1 and NaN: 8 of 9
    assert row.auroc.value == pytest.approx(8 / 9)
    for r in (row.wrong_flagged, row.correct_passed, row.auroc):
        assert r.low <= r.value <= r.high
    assert "| all | 6 | 3 (50.0%) | 3 | 66.7 [" in row.cells()
    # three wordings of one question move together: the interval is no narrower than
    # answers drawn alone would make it, and the same seed gives the same interval
    tripled = [
        _scored(a.question_id, a.correct, a.guard_score, a.flagged, g)
        for a in answers
        for g in ("sentence", "lower", "paraphrase")
    ]
    wide = summarise("all", tripled, n_boot=200, seed=1)
    assert wide.wrong_flagged.value == row.wrong_flagged.value
    assert wide.wrong_flagged.high - wide.wrong_flagged.low >= row.wrong_flagged.high - row.wrong_flagged.low - 1e-9
    assert summarise("all", tripled, n_boot=200, seed=1) == wide
    empty = summarise("none", [a for a in answers if a.correct], n_boot=10)
    assert math.isnan(empty.wrong_flagged.value) and math.isnan(empty.auroc.value) and "n/a" in empty.cells()


def test_scored_answers_round_trip_through_json() -> None:
    a = _scored("q6", False, math.nan, True)
    back = ScoredAnswer.from_json(json.loads(json.dumps(a.to_json(), allow_nan=False)))
    assert math.isnan(back.guard_score) and back.flagged and back.stats == a.stats and back.id == a.id
