"""Verdicts cannot silently wreck the guard (issue 43, N4/N5).

The reproducer: a guard is refit on honest verdicts, then 60 identical answers get 25 approvals and
35 rejections; ``calibrate --labels-from-store`` must report the contradiction, refuse the constant
refit and keep the guard, and the next ``ask`` still passes the sure answer. Inverted verdicts are
reported and keep the guard (unless allowed); a refit that is genuinely better still replaces it;
a tie never does. The refit reads the store in batches and reports the rows it cannot read.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.scripted_cli import CliBackend, scripted_loader
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer
from logtoku_guard.audit import AuditStore
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.review_labels import (
    LabelMatrix,
    ReviewLabel,
    StoredStats,
    compare_auroc,
    read_label_matrix,
    refit_on_reviews,
    reviewer_labels,
)
from logtoku_guard.cli import _common, app
from logtoku_guard.decision.policy import Policy
from logtoku_guard.guard.guard import Guard
from logtoku_guard.scoring.guard_score import _cross_validate, auroc, feature_matrix, fit_guard

SURE = ScriptedAnswer(["Paris", " is", " the", " capital", "."], [[14.0, 2.0, 1.0]] * 5)
SHAKY = ScriptedAnswer(["Some", " town", " maybe", "."], [[1.3, 1.2, 1.1], [1.1, 1.0, 0.9], [1.0, 1.0, 0.9], [0.9, 0.8, 0.7]])
REVIEW_ALL = Policy.from_dict(
    {
        "name": "review-all",
        "rules": [{"name": "all", "when": {"stat": "n_tokens", "op": ">=", "value": 0}, "action": "human_review"}],
    }
)
FRANCE = "What is the capital of France?"
FEATURES = ["reliability", "max_eu", "n_tokens"]


def answer(messages: Any) -> ScriptedAnswer:
    text = messages[-1].content
    return SURE if "good" in text or "France" in text else SHAKY


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(_common, "out", Console(width=1000, color_system=None))
    monkeypatch.setattr(_common, "err", Console(width=1000, color_system=None, stderr=True))
    monkeypatch.setattr(_common, "load_backend", scripted_loader(answer))


def review(db: Path, questions: list[str], verdict: Any) -> None:
    """Answer each question (model 'fake'), queue it for review and decide it: ``verdict(i, question)``
    is "approve", "edit" or "reject"."""
    with AuditStore(db) as store:
        guard = Guard(CliBackend(answer, model_name="fake"), policy=REVIEW_ALL, store=store)
        for i, q in enumerate(questions):
            item = guard.run(q).review_id
            assert item is not None
            what = verdict(i, q)
            if what == "reject":
                store.reject(item, "ann", "wrong")
            else:
                store.approve(item, "ann", edited_answer="Fixed." if what == "edit" else None)


def honest(i: int, q: str) -> str:
    return "reject" if "odd" in q else ("edit" if i % 7 == 0 else "approve")


def honest_questions(n: int) -> list[str]:
    return [f"{'good' if i % 3 else 'odd'} question {i}?" for i in range(n)]


def test_contradictory_verdicts_on_identical_answers_keep_the_guard_and_ask_still_passes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(honest_questions(12)) + "\n", encoding="utf-8")
    honest_db = tmp_path / "honest.db"
    review(honest_db, honest_questions(45), honest)
    base = ("calibrate", "--model", "fake", "--prompts", str(prompts), "--cache-dir", str(cache))
    first = invoke(*base, "--labels-from-store", str(honest_db))
    assert first.exit_code == 0, first.output
    assert "the refit replaces the current guard (better than chance" in first.output
    (saved,) = (cache / "profiles").iterdir()
    guard_before = ModelProfile.load(saved).guard
    assert guard_before is not None

    # the reproducer: 60 identical answers, 25 approved and 35 rejected
    bad_db = tmp_path / "contradictory.db"
    review(bad_db, [FRANCE] * 60, lambda i, q: "approve" if i < 25 else "reject")
    res = invoke(*base, "--labels-from-store", str(bad_db))
    assert res.exit_code == 0, res.output
    out = res.output
    assert "warning: contradictory verdicts: 1 set(s) of answers with identical statistics" in out
    assert "60 answers, 25 approved as written and 35 rejected or edited" in out
    assert "the refit is refused: all 60 labelled answers have identical statistics" in out
    assert "the current guard is kept" in out and "the refit replaces" not in out
    assert out.index("contradictory verdicts") < out.index("the refit is refused")  # reported before the verdict
    assert ModelProfile.load(saved).guard == guard_before  # the guard in the profile is the honest one, unchanged

    asked = invoke("ask", FRANCE, "--model", "fake", "--cache-dir", str(cache), "--store", str(tmp_path / "ask.db"), "--json")
    assert asked.exit_code == 0, asked.output
    data = json.loads(asked.stdout)
    assert data["action"] == "pass" and not data["checks"], data  # the guard's rule does not fire on the sure answer
    assert data["stats"]["guard_score"] > 0.5


def stats_of(labels: list[ReviewLabel]) -> list[StoredStats]:
    return [lab.stats for lab in labels]


def labels_of(x: np.ndarray, y: np.ndarray, names: tuple[str, ...] = ("reliability", "max_eu", "n_tokens")) -> list[ReviewLabel]:
    return [
        ReviewLabel(i + 1, f"t{i}", StoredStats(dict(zip(names, map(float, row)))), bool(c), None)
        for i, (row, c) in enumerate(zip(x, y))
    ]


def synthetic(n: int, seed: int, signal: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` answers: reliability separates right (True) from wrong by ``signal`` sd; max_eu is noise."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    rel = rng.normal(0, 1, n) + signal * y
    x = np.column_stack([rel, rng.random(n), rng.integers(5, 60, n)])
    return x, y


def test_inverted_verdicts_are_reported_and_keep_the_guard_unless_allowed() -> None:
    x, y = synthetic(200, 1)
    current = fit_guard(stats_of(labels_of(x, y)), y.tolist(), ["honest"], features=FEATURES)
    flipped = labels_of(x, ~y)
    refit = refit_on_reviews(current, flipped)
    assert refit.inverted is not None and "the verdicts invert the current guard" in refit.inverted
    assert refit.before_auroc is not None and refit.before_auroc < 0.2
    assert refit.comparison is not None and refit.comparison.significant  # the inverted refit does rank them "better"
    assert not refit.replace
    lines = refit.lines()
    assert lines[0].startswith("warning: the verdicts invert the current guard") and "--allow-inverted" in lines[-1]
    allowed = refit_on_reviews(current, flipped, allow_inverted=True)
    assert allowed.replace and "although the verdicts invert the current guard (allowed)" in allowed.verdict()


def test_a_genuinely_better_refit_replaces_the_guard() -> None:
    x, y = synthetic(300, 2)
    rng = np.random.default_rng(3)
    weak_y = rng.random(300) < 0.5  # the current guard learned from labels unrelated to reliability
    # the current guard leans on max_eu (noise for these answers) and weakly on reliability
    weak_x = np.column_stack([rng.normal(0, 1, 300) + 0.4 * weak_y, rng.random(300) + 0.5 * weak_y, rng.integers(5, 60, 300)])
    current = fit_guard(
        stats_of(labels_of(weak_x, weak_y)), weak_y.tolist(), ["other"], features=["reliability", "max_eu", "n_tokens"]
    )
    refit = refit_on_reviews(current, labels_of(x, y))
    assert refit.replace and refit.inverted is None and refit.refused is None
    c = refit.comparison
    assert c is not None and c.lower > 0 and c.difference > 0.2 and c.before is not None and c.before < 0.7
    assert "the refit replaces the current guard (strictly better out of fold" in refit.lines()[-1]


def test_a_tie_never_replaces() -> None:
    """Only reliability is defined and it separates the verdicts perfectly: the current guard and the
    refit both rank every right answer above every wrong one (AUROC 1 both: a tie)."""
    x, y = synthetic(120, 4, signal=30.0)
    only_rel = [
        ReviewLabel(i + 1, f"t{i}", StoredStats({"reliability": float(r)}), bool(c), None)
        for i, (r, c) in enumerate(zip(x[:, 0], y))
    ]
    xo, yo = synthetic(400, 5)
    other = [
        ReviewLabel(i, f"o{i}", StoredStats({"reliability": float(r)}), bool(c), None)
        for i, (r, c) in enumerate(zip(xo[:, 0], yo))
    ]
    current = fit_guard(stats_of(other), yo.tolist(), ["other"], features=["reliability"])
    refit = refit_on_reviews(current, only_rel)
    c = refit.comparison
    assert c is not None and c.before == c.after == 1.0 and c.difference == 0.0 and c.se == 0.0
    assert not refit.replace and "no better (a tie)" in refit.verdict()


def test_a_constant_refit_is_refused_and_named() -> None:
    labels = [ReviewLabel(i + 1, f"t{i}", StoredStats({"reliability": 0.7, "n_tokens": 5.0}), i < 25, None) for i in range(60)]
    refit = refit_on_reviews(None, labels)
    assert refit.refused is not None and "identical statistics" in refit.refused and not refit.replace
    assert refit.contradictions is not None and (refit.contradictions.answers, refit.contradictions.approved) == (60, 25)
    assert refit.verdict().startswith("the refit is refused") and "no guard is made" in refit.verdict()


def test_delong_comparison_agrees_with_auroc_and_is_zero_on_identical_scores() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(500) < 0.4
    a = rng.normal(0, 1, 500) + y
    b = np.round(rng.normal(0, 1, 500) + 0.3 * y, 1)  # ties
    c = compare_auroc(a, y, b)
    assert c.after == pytest.approx(auroc(a, y)) and c.before == pytest.approx(auroc(b, y))
    assert c.difference > 0 and c.se > 0 and c.lower == pytest.approx(c.difference - 1.6448536 * c.se, rel=1e-6)
    same = compare_auroc(a, y, a.copy())
    assert same.difference == 0.0 and same.se == 0.0 and not same.significant
    chance = compare_auroc(rng.random(500), y)
    assert chance.before is None and abs(chance.difference) < 0.1 and not chance.significant


def test_reference_scores_are_kept_exact() -> None:
    """The threshold is placed on the stored reference scores: they are the out-of-fold scores, unrounded."""
    x, y = synthetic(80, 6)
    rows = stats_of(labels_of(x, y))
    guard = fit_guard(rows, y.tolist(), ["t"], features=FEATURES)
    oof = _cross_validate(feature_matrix(rows, guard.features), y.astype(float), 1.0, 5, 0)
    assert guard.reference_scores["correct"] == [float(v) for v, c in zip(oof, y) if c]
    assert guard.reference_scores["incorrect"] == [float(v) for v, c in zip(oof, y) if not c]
    assert any(len(repr(v)) > 9 for v in guard.reference_scores["correct"])


def test_labels_stream_in_batches_and_unreadable_rows_are_reported(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    review(db, honest_questions(40), honest)
    with AuditStore(db) as store:
        whole = read_label_matrix(store, "fake", batch_size=1000)
        small = read_label_matrix(store, "fake", batch_size=7)
        assert len(whole) == 40 and np.array_equal(whole.values, small.values, equal_nan=True)
        assert np.array_equal(whole.correct, small.correct) and np.array_equal(whole.review_ids, small.review_ids)
        assert [lab.correct for lab in reviewer_labels(store, "fake")] == whole.correct.tolist()
        assert len(read_label_matrix(store, "another model")) == 0
    raw = sqlite3.connect(db)
    with raw:
        raw.execute('UPDATE audit_records SET stats = \'{"reliability": "high"}\' WHERE review_id = 3')
        raw.execute("UPDATE review_items SET decided_at = 'garbage' WHERE id = 5")
    raw.close()
    with AuditStore(db) as store:
        labels = read_label_matrix(store, "fake")
    assert len(labels) == 38 and {(s.table, s.column) for s in labels.skipped} == {
        ("audit_records", "stats['reliability']"),
        ("review_items", "decided_at"),
    }
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("good question?\n", encoding="utf-8")
    res = invoke(
        "calibrate",
        "--model",
        "fake",
        "--prompts",
        str(prompts),
        "--labels-from-store",
        str(db),
        "--out",
        str(tmp_path / "p.json"),
    )
    assert res.exit_code == 0, res.output
    assert "warning: skipped an unreadable row: review_items row 5" in res.stderr
    assert "audit_records row" in res.stderr and "stats['reliability'] holds 'high', not a number" in res.stderr
    assert "reviewer labels: " in res.stdout and math.isfinite(float(res.stdout.split("AUROC ")[1].split(";")[0]))


def test_label_matrix_from_labels_matches_the_stored_statistics() -> None:
    labels = [ReviewLabel(1, "t", StoredStats({"reliability": 0.5, "n_tokens": 9, "max_eu": None}), True, None)]
    m = LabelMatrix.from_labels(labels, ["reliability", "max_eu"])
    assert m.columns == ("reliability", "max_eu", "n_tokens")
    got = m.features(["reliability", "max_eu", "n_tokens"])[0]
    assert got[0] == 0.5 and math.isnan(got[1]) and got[2] == pytest.approx(math.log1p(9))
