"""The guard end to end (``evaluation.rag``): scripted and tiny-model runs, with the live check
(``evaluation.live``) and the report (``evaluation.guard_report``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.tiny import make_model

from logtoku_eval.generate import GreedySpec
from logtoku_eval.knowledge_base import build_knowledge_base
from logtoku_eval.rag import GuardEvalConfig, run_guard_eval
from logtoku_guard.backends.fake import ScriptedBackend
from logtoku_guard.errors import ConfigurationError

from .support import HAS_MPL, nq_items, nq_script


def test_guard_eval_end_to_end_scripted(tmp_path: Path) -> None:
    items, pool = nq_items(8), nq_items(40)
    calls: list[str] = []
    script = nq_script(calls)
    config = GuardEvalConfig(
        cache_dir=tmp_path / "cache", out_dir=tmp_path / "out", coverage=0.5, n_boot=50, live=8, live_budget=0.5, plots=HAS_MPL
    )
    run = run_guard_eval(items, pool, "scripted", ScriptedBackend(script, k=5), config, live_backend=ScriptedBackend(script, k=2))
    rep, replay = run.report, run.replay
    assert replay.closed.tolist() == [i % 2 == 0 for i in range(8)]
    covered = [it.id in build_knowledge_base(items, pool, 0.5).covered for it in items]
    assert replay.rag.tolist() == covered  # the copied first passage is right exactly when the question is covered
    assert rep.diagnostics["answer_in_context_covered"] == 1.0
    # the LogTokU guard retrieves the shaky (odd, wrong) answers first: at budget 0.5 it retrieves all of them
    half = next(p for p in rep.points if p.guard == "logtoku" and p.budget == 0.5)
    assert half.hurt == 0 and half.helped == sum(c for i, c in enumerate(covered) if i % 2)
    assert half.accuracy == pytest.approx((4 + half.helped) / 8)
    never = next(p for p in rep.points if p.guard == "never retrieve")
    always = next(p for p in rep.points if p.guard == "always retrieve")
    assert never.accuracy == 0.5 and always.accuracy == sum(covered) / 8
    assert rep.areas["oracle"] >= rep.areas["logtoku"] >= rep.areas["random"]
    live = rep.live
    assert live is not None and live.same_decision == live.same_answer == 8
    assert live.retrieved_live == live.retrieved_replay == 4 and live.accuracy_live == live.accuracy_replay
    assert live.max_score_diff < 1e-9
    md = (tmp_path / "out" / "guard-e2e.md").read_text()
    assert "| never retrieve | 0 | 0 | 50.00" in md and "Live check" in md and "8/8" in md
    data = json.loads((tmp_path / "out" / "guard-e2e.json").read_text())
    assert data["live_check"]["same_answer"] == 8 and len(data["points"]) == 2 + 5 * 6  # 4 signals, random, oracle
    # the cross-fitted guard-score guard: every fold fit on the other folds' closed-book labels
    assert data["setup"]["guard_crossfit"]["n_fitted"] == 5 and rep.diagnostics["nan_scores"]["guard-score"] == 0
    guard_half = next(p for p in rep.points if p.guard == "guard-score" and p.budget == 0.5)
    assert guard_half.accuracy == half.accuracy and guard_half.hurt == 0  # the shaky answers score lowest here too
    pairs = {(r["budget"], r["guard"], r["vs"]) for r in rep.paired}
    assert {(0.3, "guard-score", "random"), (0.3, "guard-score", "entropy"), (0.5, "logtoku", "probability")} <= pairs
    vs_random = next(r for r in rep.paired if (r["budget"], r["guard"], r["vs"]) == (0.5, "guard-score", "random"))
    assert vs_random["diff"] == pytest.approx(guard_half.accuracy - replay.random_accuracy(0.5))
    assert "**At budget 0.3, the guard-score guard minus random" in md and "| 0.3 | guard-score | entropy |" in md
    if HAS_MPL:
        assert (tmp_path / "out" / "guard-e2e-budget.png").stat().st_size > 1000

    # Replaying again generates nothing: the model is never loaded.
    def no_model() -> Any:
        raise AssertionError("the model must not be loaded when everything is cached")

    again = run_guard_eval(items, pool, "scripted", no_model, GuardEvalConfig(cache_dir=tmp_path / "cache", coverage=0.5, live=0))
    assert [p.accuracy for p in again.report.points] == [p.accuracy for p in rep.points]
    off = GuardEvalConfig(cache_dir=tmp_path / "cache", coverage=0.5, live=0, guard_folds=0, n_boot=20)
    without = run_guard_eval(items, pool, "scripted", no_model, off).report
    assert "guard-score" not in {p.guard for p in without.points} and {r["guard"] for r in without.paired} == {"logtoku"}


def test_guard_eval_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="live must be >= 0"):
        GuardEvalConfig(cache_dir=tmp_path, live=-1)
    with pytest.raises(ConfigurationError, match="unknown live guard signal 'eu'"):
        GuardEvalConfig(cache_dir=tmp_path, live_guard="eu")
    with pytest.raises(ConfigurationError, match="live_budget"):
        GuardEvalConfig(cache_dir=tmp_path, live_budget=1.0)
    with pytest.raises(ConfigurationError, match=r"cannot run 'guard-score' \(cross-fitted"):
        GuardEvalConfig(cache_dir=tmp_path, live_guard="guard-score")
    with pytest.raises(ConfigurationError, match="guard_folds must be 0"):
        GuardEvalConfig(cache_dir=tmp_path, guard_folds=-1)
    items = nq_items(4)
    with pytest.raises(ConfigurationError, match=r"K=2 clamped score.*k=5"):
        run_guard_eval(items, items, "scripted", ScriptedBackend(nq_script([]), k=5), GuardEvalConfig(cache_dir=tmp_path, live=2))
    config = GuardEvalConfig(cache_dir=tmp_path, budgets=(0.5, 2.0), live=0)
    with pytest.raises(ConfigurationError, match=r"budgets are shares.*2\.0"):
        run_guard_eval(items, items, "scripted", ScriptedBackend(nq_script([]), k=5), config)


def test_guard_eval_on_the_tiny_model(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from logtoku_guard.backends.transformers import TransformersBackend

    model = make_model(tiny_tokenizer)
    gen = TransformersBackend("tiny", k=5, model_obj=model, tokenizer=tiny_tokenizer)
    live = TransformersBackend("tiny", k=2, model_obj=model, tokenizer=tiny_tokenizer)
    items, pool = nq_items(4), nq_items(12)
    config = GuardEvalConfig(
        cache_dir=tmp_path, coverage=0.5, greedy=GreedySpec(max_new_tokens=5), batch_size=2, n_boot=20, live=4, live_budget=0.5
    )
    run = run_guard_eval(items, pool, "tiny", gen, config, live_backend=live)
    check = run.report.live
    assert check is not None and check.n == 4 and check.retrieved_replay == 2
    # the real Guard (single-row generation) decides and answers as the batched replay does
    assert check.same_decision == 4 and check.same_answer == 4
    assert check.max_score_diff < 1e-4
