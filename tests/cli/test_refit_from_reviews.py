"""Labels from reviewers, end to end: answers queued for review, verdicts given in the review page,
``calibrate --labels-from-store`` refits the guard, and the next ``ask`` uses the changed threshold.

Confident scripted answers are approved (a few edited: wrong), shaky ones rejected; the refit
must learn that, replace a guard that ranks them worse, keep a guard that ranks them better, and
refuse too few verdicts before any model loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient
from support.scripted_cli import CliBackend, scripted_loader
from typer.testing import CliRunner

from logtoku_guard import ScriptedAnswer
from logtoku_guard.audit import AuditStore
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.review_labels import refit_on_reviews, reviewer_labels
from logtoku_guard.cli import _common, app
from logtoku_guard.decision.policy import Policy
from logtoku_guard.guard.guard import Guard
from logtoku_guard.review_web import create_app


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


TOKEN = "admin-token-for-the-refit-test-0123456789"
SURE = ScriptedAnswer(["Paris", " is", " the", " capital", "."], [[14.0, 2.0, 1.0]] * 5)
SHAKY = ScriptedAnswer(["Some", " town", " maybe", "."], [[1.3, 1.2, 1.1], [1.1, 1.0, 0.9], [1.0, 1.0, 0.9], [0.9, 0.8, 0.7]])
ALWAYS = {"stat": "n_tokens", "op": ">=", "value": 0}
REVIEW_ALL = Policy.from_dict({"name": "review-all", "rules": [{"name": "all", "when": ALWAYS, "action": "human_review"}]})


def answer(messages: Any) -> ScriptedAnswer:
    return SURE if "good" in messages[-1].content else SHAKY


def questions(n: int) -> list[str]:
    return [f"{'good' if i % 3 else 'odd'} question {i}?" for i in range(n)]


def queue_and_review(store_path: Path, n: int) -> None:
    """``n`` answers of model 'fake' queued for review, then decided in the review page (HTTP, CSRF)."""
    backend = CliBackend(answer, model_name="fake")
    with AuditStore(store_path) as store:
        guard = Guard(backend, policy=REVIEW_ALL, store=store)
        for q in questions(n):
            assert guard.run(q).action == "human_review"
        with TestClient(create_app(store, TOKEN), base_url="http://127.0.0.1") as page:
            r = page.get(f"/?token={TOKEN}", headers={"Sec-Fetch-Site": "none"}, follow_redirects=False)
            assert r.status_code == 303
            for item in store.pending():
                html = page.get(f"/items/{item.id}").text
                csrf = html.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
                if "odd" in item.record.prompt:
                    form = {"csrf_token": csrf, "note": "wrong town"}
                    assert page.post(f"/items/{item.id}/reject", data=form).status_code == 200
                elif item.id % 7 == 0:  # approved only after an edit: the answer was wrong
                    form = {"csrf_token": csrf, "edited_answer": "Paris, the capital of France."}
                    assert page.post(f"/items/{item.id}/approve", data=form).status_code == 200
                else:
                    assert page.post(f"/items/{item.id}/approve", data={"csrf_token": csrf}).status_code == 200
        assert not store.pending()


def test_verdicts_in_the_review_page_refit_the_guard_and_the_next_ask_uses_its_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_common, "load_backend", scripted_loader(answer))
    db = tmp_path / "audit.db"
    queue_and_review(db, 45)
    with AuditStore(db) as store:
        labels = reviewer_labels(store, "fake")
    assert len(labels) == 45 and 20 <= sum(lab.correct for lab in labels) < 30  # 30 good answers, a few edited
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(questions(12)) + "\n", encoding="utf-8")
    profile_path = tmp_path / "profile.json"

    before = invoke("ask", "good question 100?", "--model", "fake", "--store", str(tmp_path / "b.db"), "--json")
    assert before.exit_code == 0, before.output
    check = json.loads(before.stdout)["checks"]
    assert not check or check[0]["stat"] == "reliability"  # no guard yet: the default policy's fallback

    res = invoke(
        "calibrate", "--model", "fake", "--prompts", str(prompts), "--labels-from-store", str(db), "--out", str(profile_path)
    )
    assert res.exit_code == 0, res.output
    assert "reviewer labels:" in res.output and "approved as written (right)" in res.output
    assert "before (current guard on these answers): no current guard" in res.output
    assert "after (refit, out of fold): AUROC" in res.output and "the refit replaces the current guard" in res.output
    profile = ModelProfile.load(profile_path)
    assert profile.guard is not None and profile.guard.datasets == ["reviewer labels"]
    assert profile.guard.reference_labels == {"correct": True, "incorrect": False}

    asked = ("ask", "odd question 101?", "--model", "fake", "--profile", str(profile_path), "--store", str(tmp_path / "c.db"))
    after = invoke(*asked)
    assert after.exit_code == 0, after.output
    data = json.loads(invoke(*asked, "--json").stdout)
    (check,) = data["checks"]
    assert check["stat"] == "guard_score" and check["passed"] is True  # a shaky answer is now flagged by the refit guard
    assert "passes at least 80% of correct answers at 90% confidence" in check["guarantee"]
    assert data["action"] in ("retrieve", "abstain")


def test_a_refit_that_ranks_worse_keeps_the_current_guard(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    queue_and_review(db, 45)
    with AuditStore(db) as store:
        labels = reviewer_labels(store, "fake")
    good = refit_on_reviews(None, labels)
    assert good.replace and good.after_auroc > 0.8  # edited answers look sure but were wrong: not separable
    # the refit guard, now current, was fit on these very answers: in sample it ranks them better than
    # any refit can out of fold, so a second refit keeps it
    again = refit_on_reviews(good.guard, labels)
    assert again.before_auroc is not None and again.after_auroc < again.before_auroc and not again.replace
    assert "the current guard is kept (the refit is worse)" in again.lines()
    assert set(again.before_flags) == {"correct", "incorrect"}


def test_too_few_verdicts_are_refused_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Any] = []
    monkeypatch.setattr(_common, "load_backend", scripted_loader(answer, calls=loads))
    db = tmp_path / "audit.db"
    queue_and_review(db, 12)
    res = invoke("calibrate", "--model", "fake", "--labels-from-store", str(db))
    assert res.exit_code == 2 and "the store holds 12 review verdicts; a refit needs at least 30" in res.output
    assert loads == []
    res = invoke("calibrate", "--model", "fake", "--labels-from-store", str(db), "--since", "yesterday")
    assert res.exit_code == 2 and "--since must be an ISO date" in res.output and loads == []
    res = invoke("calibrate", "--model", "fake", "--since", "2026-01-01")
    assert res.exit_code == 2 and "give the store too" in res.output
    res = invoke("calibrate", "--model", "fake", "--labels-from-store", str(db), "--since", "2999-01-01", "--min-labels", "10")
    assert res.exit_code == 2 and "holds 0 review verdicts since 2999-01-01" in res.output
    missing = tmp_path / "nope.db"
    res = invoke("calibrate", "--model", "fake", "--labels-from-store", str(missing))
    assert res.exit_code == 2 and not missing.exists() and loads == []
