"""Enough labels for a stated risk (issue 41 item 5): how many correct answers a coverage target needs
for a useful threshold, and ``calibrate --fit-guard`` answering more shipped questions until it has them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.scripted_cli import scripted_loader
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration import self_labels as sl
from logtoku_guard.calibration.self_labels import LabelledQuestion, fit_with_enough_labels, ordinary_questions
from logtoku_guard.calibration.thresholds import DEFAULT_SLACK, coverage_supply, labels_needed, passes_needed
from logtoku_guard.cli import _common, app
from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.risk import choose_threshold, clopper_pearson


# -- the maths ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 5, 11, 30, 71, 138, 216])
def test_passes_needed_is_what_the_risk_threshold_must_pass(n: int) -> None:
    k = passes_needed(n, 0.8, 0.9)
    if k is None:  # not even every correct answer passing gives a bound >= 80%
        assert clopper_pearson(n, n, 0.1, "lower") < 0.8
        return
    assert clopper_pearson(k, n, 0.1, "lower") >= 0.8 > clopper_pearson(k - 1, n, 0.1, "lower")
    # the Learn-then-Test threshold on n distinct correct scores passes exactly k of them
    chosen = choose_threshold([float(i) for i in range(n)], [-1.0], "coverage", 0.8, 0.9)
    assert chosen.met and chosen.observed == pytest.approx(k / n)


def test_labels_needed_is_where_the_threshold_stays_within_the_slack() -> None:
    def useful(n: int, target: float, slack: float) -> bool:
        k = passes_needed(n, target, 0.9)
        return k is not None and k <= (target + slack) * n

    for target, slack in ((0.8, 0.05), (0.8, 0.1), (0.9, 0.05), (0.7, 0.03)):
        need = labels_needed("coverage", target, 0.9, slack)
        # the last n that misses it, then every n up to twice as many meets it (a linear check of the scan)
        assert not useful(need - 1, target, slack)
        assert all(useful(m, target, slack) for m in range(need, 2 * need))
    # issue 41's case: 71 correct labels put the 80%-at-90% threshold at 87% of them
    assert labels_needed("coverage", DEFAULT_COVERAGE, DEFAULT_CONFIDENCE, DEFAULT_SLACK) == 149
    assert passes_needed(71, 0.8, 0.9) == 62
    assert labels_needed("coverage", 0.8, 0.9, 0.03) > labels_needed("coverage", 0.8, 0.9, 0.05)  # tighter: more
    assert labels_needed("coverage", 0.9, 0.9, 0.1) == 1  # target + slack reaches 100%: any threshold is within it


def test_labels_needed_for_a_selective_risk() -> None:
    from logtoku_guard.scoring.risk import GRID

    need = labels_needed("selective_risk", 0.2, 0.9, 0.05)
    level = 0.1 / GRID
    assert clopper_pearson(int(0.15 * need), need, level, "upper") <= 0.2
    assert clopper_pearson(int(0.15 * (need - 1)), need - 1, level, "upper") > 0.2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("coverage", 1.0, 0.9, 0.05), "strictly between 0 and 1"),
        (("coverage", 0.8, 0.9, 0.0), "slack must be a share"),
        (("coverage", 0.8, 0.9, float("nan")), "slack must be a share"),
        (("coverage", 0.8, 0.9, 0.001), "from 0.01 to below 1 .*tens of thousands of labels"),  # would scan for an hour
        (("selective_risk", 0.05, 0.9, 0.05), "below its target"),
        (("bogus", 0.8, 0.9, 0.05), "'coverage' or 'selective_risk'"),
    ],
)
def test_labels_needed_refuses_bad_targets(args: tuple[Any, ...], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        labels_needed(*args)


def test_coverage_supply_says_whether_the_labels_are_enough() -> None:
    few = coverage_supply(71, 0.8, 0.9)
    assert not few.enough and few.needed == 149 and few.passes == pytest.approx(62 / 71)
    assert "needs 149 correct labelled answers" in few.describe() and "at least 87.3% of them" in few.describe()
    assert "too few" in few.describe()
    plenty = coverage_supply(216, 0.8, 0.9)
    assert plenty.enough and "too few" not in plenty.describe()
    assert "cannot support it at all" in coverage_supply(5, 0.8, 0.9).describe()
    assert coverage_supply(0, 0.8, 0.9).passes is None


# -- more shipped questions until there are enough ------------------------------------------------
def test_ordinary_questions_are_one_wording_of_every_question_first_categories_in_turn() -> None:
    tune = ordinary_questions("tune")
    assert len(tune) == 1044 and {q.split for q in tune} == {"tune"} and all(q.group == "real" and q.answers for q in tune)
    wordings = [q.id.rsplit("-", 1)[1] for q in tune]
    assert wordings == ["sentence"] * 348 + ["lower"] * 348 + ["paraphrase"] * 348
    first = tune[:15]
    assert len({q.category for q in first}) == 15  # categories in turn
    assert len(ordinary_questions("all")) == 2073
    with pytest.raises(ConfigurationError, match="'train'"):
        ordinary_questions("train")


def _question(i: int, answer: str = "Paris") -> LabelledQuestion:
    return LabelledQuestion(f"q{i}", "real", "capital", "tune", f"Question number {i}?", (answer,))


RIGHT = ScriptedAnswer(["Paris", "."], [[20.0, 1.0, 0.5], [15.0, 2.0, 1.0]])
WRONG = ScriptedAnswer(["Lyon", "."], [[2.0, 1.8, 1.5], [1.5, 1.4, 1.0]])


def _reply(asked: list[str]) -> Any:
    def reply(messages: Any) -> ScriptedAnswer:
        q = messages[-1].content
        asked.append(q)
        return RIGHT if int(q.split()[-1].rstrip("?")) % 3 == 0 else WRONG  # a third of the questions right

    return reply


def _backend(asked: list[str]) -> ScriptedBackend:
    return ScriptedBackend(_reply(asked), k=2, model_name="fake")


def test_fit_with_enough_labels_answers_more_until_it_has_them() -> None:
    asked: list[str] = []
    first = [_question(i) for i in range(12)]  # 4 right
    more = [_question(i) for i in range(100, 160)]
    fit = fit_with_enough_labels(_backend(asked), 10, batch_size=4, questions=first, more=more)
    # 6 more right answers needed, a third of each batch of 4 is right: batches until the count reaches 10
    right = [i for i in range(100, 160) if i % 3 == 0]
    stop = right[5]  # the 6th right one among the extra questions
    batches = (stop - 100) // 4 + 1
    assert fit.more == 4 * batches and fit.met and fit.needed == 10
    assert fit.counts["real-correct"] == 4 + sum(1 for i in range(100, 100 + 4 * batches) if i % 3 == 0) >= 10
    assert fit.more_correct == fit.counts["real-correct"] - 4
    assert asked == [q.question for q in [*first, *more[: fit.more]]]  # nothing asked beyond the last batch needed
    assert fit.guard.datasets == [f"self-labelled questions + {fit.more} more"]


def test_fit_with_enough_labels_says_when_the_questions_run_out() -> None:
    asked: list[str] = []
    fit = fit_with_enough_labels(
        _backend(asked), 50, batch_size=8, questions=[_question(i) for i in range(9)], more=[_question(i) for i in range(9, 21)]
    )
    assert not fit.met and fit.more == 12 and len(asked) == 21 and fit.counts["real-correct"] == 7
    enough = fit_with_enough_labels(_backend([]), 3, questions=[_question(i) for i in range(9)], more=[_question(99)])
    assert enough.met and enough.more == 0 and enough.guard.datasets == ["self-labelled questions"]
    with pytest.raises(ConfigurationError, match="needed must be"):
        fit_with_enough_labels(_backend([]), -1, questions=[_question(0)])


def test_calibrate_fit_guard_answers_more_shipped_questions_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traffic = [_question(i) for i in range(30)]  # 10 right: fewer than the default target needs
    ordinary = [_question(i) for i in range(1000, 1600)]
    monkeypatch.setattr(sl, "labelled_questions", lambda split="tune": list(traffic))
    monkeypatch.setattr(sl, "ordinary_questions", lambda split="tune": list(ordinary))
    monkeypatch.setattr(_common, "load_backend", scripted_loader(_reply([])))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Question number 3?\nQuestion number 4?\n", encoding="utf-8")
    out = tmp_path / "profile.json"
    res = CliRunner().invoke(app, ["calibrate", "--model", "fake", "--prompts", str(prompts), "--out", str(out), "--fit-guard"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    needed = labels_needed("coverage", 0.8, 0.9, 0.05)
    assert f"10 correct answers to the traffic questions were fewer than the {needed}" in text, text
    guard = ModelProfile.load(out).guard
    assert guard is not None
    correct, _ = guard.labelled_scores()
    assert len(correct) >= needed and "could not" not in text
    assert (
        f"labels for the default policy's stated risk: passing at least 80% of correct answers at 90% confidence needs {needed}"
        in text
    )
    # too few shipped questions: it says it could not
    monkeypatch.setattr(sl, "ordinary_questions", lambda split="tune": list(ordinary[:30]))
    res = CliRunner().invoke(app, ["calibrate", "--model", "fake", "--prompts", str(prompts), "--out", str(out), "--fit-guard"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and f"could not reach {needed} correct answers with the shipped questions (20)" in text, text
    assert "too few: a lenient threshold" in text
    for bad in ("1.5", "0.001"):
        res = CliRunner().invoke(app, ["calibrate", "--model", "fake", "--risk-slack", bad, "--fit-guard"])
        assert res.exit_code == 2 and "--risk-slack must be a share from 0.01" in " ".join(res.output.split()), res.output
