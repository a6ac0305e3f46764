"""``calibrate --fit-guard``: a guard for any model with no labels from the user.

The shipped questions judge their own answers: real questions against their references
(nq-match), invented ones wrong by construction. A scripted model that answers known facts with
their reference, confidently, and everything else with a shaky guess gets a guard that separates
the two, a risk-stated default threshold and per-group expected rates with intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.scripted_cli import scripted_loader
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.self_labels import GROUPS, answer_matches, labelled_questions, normalize_answer, outcome_of
from logtoku_guard.cli import _common, app

TUNE = labelled_questions("tune")
REFERENCE = {q.question: q.answers[0] for q in TUNE if q.group == "real"}
SHAKY = ScriptedAnswer(["Some", " town", " maybe", "."], [[1.3, 1.2, 1.1], [1.1, 1.0, 0.9], [1.0, 1.0, 0.9], [0.9, 0.8, 0.7]])


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def answer(messages: Any) -> ScriptedAnswer:
    """Known facts (every other real question) answered with their reference, the rest a shaky guess."""
    question = messages[-1].content
    ref = REFERENCE.get(question)
    if ref is not None and hash(question) % 2 == 0:
        words = ref.split()
        return ScriptedAnswer([words[0], *(" " + w for w in words[1:])], [[15.0, 1.0, 0.5]] * len(words))
    return SHAKY


def test_the_shipped_questions_split_into_halves_and_groups() -> None:
    every = labelled_questions("all")
    # 160 plausible, 116 syllable and 547 real questions (each real one asked in both wording styles)
    assert len(every) == len(TUNE) + len(labelled_questions("test")) and len(TUNE) == 823
    assert {q.group for q in TUNE} == {"real", "plausible", "syllable"}
    assert all(q.answers for q in TUNE if q.group == "real") and not any(q.answers for q in TUNE if q.group != "real")
    assert not {q.id for q in TUNE} & {q.id for q in labelled_questions("test")}


def test_answers_are_judged_against_references_and_invented_ones_are_wrong_whatever_they_say() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert answer_matches("It is Paris, of course.", ["Paris"]) == (True, False)
    assert answer_matches("paris", ["Paris"]) == (True, True)
    assert answer_matches("Parisian food", ["Paris"]) == (False, False)  # whole words only
    assert answer_matches("", ["Paris"]) == (False, False)
    real = next(q for q in TUNE if q.group == "real")
    invented = next(q for q in TUNE if q.group == "plausible")
    assert outcome_of(real, real.answers[0]) == "real-correct" and outcome_of(real, "no idea") == "real-wrong"
    assert outcome_of(invented, "It was founded in 1901 by Anna Berg.") == "plausible"


def test_calibrate_fits_a_guard_for_a_model_without_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "load_backend", scripted_loader(answer))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(q.question for q in TUNE[:16]) + "\n", encoding="utf-8")
    out = tmp_path / "profile.json"
    res = invoke("calibrate", "--model", "fake", "--prompts", str(prompts), "--out", str(out))
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the console wraps long lines
    assert "guard fit on the shipped labelled questions (tune half), answers per group: real-correct" in text
    assert "default policy threshold: passes at least 80% of correct answers at 90% confidence: guaranteed" in text
    n_real = sum(1 for q in TUNE if q.group == "real")
    right = sum(1 for q in TUNE if q.group == "real" and hash(q.question) % 2 == 0)
    assert f"accuracy on the real questions: {right / n_real:.1%} ({right} of {n_real})" in text
    line = text.split("default policy: retrieve when guard_score <", 1)[1].split("profile written", 1)[0]
    assert "95% Clopper-Pearson interval" in line and "syllable 100% [" in line, line
    guard = ModelProfile.load(out).guard
    assert guard is not None and guard.datasets == ["traffic-tune"]
    assert set(guard.reference_scores) <= set(GROUPS) and guard.reference_labels["real-correct"] is True
    assert guard.cv_auroc is not None and guard.cv_auroc > 0.95

    res = invoke("calibrate", "--model", "fake", "--prompts", str(prompts), "--out", str(out), "--no-fit-guard")
    assert res.exit_code == 0 and "guard score: unavailable" in " ".join(res.output.split())
    assert ModelProfile.load(out).guard is None
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"question": "q?", "correct": true}\n', encoding="utf-8")
    res = invoke("calibrate", "--model", "fake", "--labels", str(labels), "--fit-guard")
    assert res.exit_code == 2 and "give one" in res.output
