"""The guard end to end (issue 6 part 4): knowledge base, replay maths, live check, CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny import make_model

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.evaluation.datasets import QAItem
from logtoku_guard.evaluation.generate import GreedySpec
from logtoku_guard.evaluation.rag import (
    GuardEvalConfig,
    RagSetup,
    Replay,
    build_knowledge_base,
    faq_entry,
    oracle_mask,
    retrieve_mask,
    run_guard_eval,
    threshold_for,
)
from logtoku_guard.policy import RetrieveSettings

HAS_MPL = __import__("importlib").util.find_spec("matplotlib") is not None


# -- replay maths, hand-computed ------------------------------------------------------------------------------------
def test_retrieve_mask_takes_the_lowest_finite_scores_ties_by_position() -> None:
    s = np.array([0.3, math.nan, -1.0, 0.5, -1.0])
    assert retrieve_mask(s, 0).tolist() == [False] * 5
    assert retrieve_mask(s, 2).tolist() == [False, False, True, False, True]
    assert retrieve_mask(s, 3).tolist() == [True, False, True, False, True]
    assert retrieve_mask(s, 10).tolist() == [True, False, True, True, True]  # NaN never fires, as in the guard


def test_threshold_separates_exactly_the_mask() -> None:
    s = np.array([0.3, math.nan, -1.0, 0.5, -1.0])
    assert math.isnan(threshold_for(s, retrieve_mask(s, 1)))  # the two -1.0 tie across the boundary
    for k in (0, 2, 3, 4):
        mask = retrieve_mask(s, k)
        t = threshold_for(s, mask)
        assert np.array_equal(np.isfinite(s) & (s < t), mask), k
    assert threshold_for(s, retrieve_mask(s, 2)) == pytest.approx(-0.35)


def test_oracle_retrieves_where_it_helps_first_and_where_it_hurts_last() -> None:
    closed = np.array([True, False, False, True])
    rag = np.array([False, False, True, True])
    assert oracle_mask(closed, rag, 1).tolist() == [False, False, True, False]
    assert oracle_mask(closed, rag, 3).tolist() == [False, True, True, True]
    assert oracle_mask(closed, rag, 4).all()


def test_replay_accuracy_random_and_oracle_hand_computed() -> None:
    closed = np.array([True, False, False, True])
    rag = np.array([True, True, False, False])
    replay = Replay(("a", "b", "c", "d"), closed, rag, {"logtoku": np.array([0.9, 0.1, 0.2, 0.8])})
    half = replay.point("logtoku", 0.5)  # retrieves b and c: final [T, T, F, T]
    assert (half.retrievals, half.accuracy, half.helped, half.hurt) == (2, 0.75, 1, 0)
    assert half.threshold == pytest.approx(0.5)
    assert replay.point("logtoku", 1.0).accuracy == 0.5 and replay.point("logtoku", 0.0).accuracy == 0.5
    # random: closed accuracy 0.5 + k/n * mean(rag - closed) = 0.5 + 0.5 * 0
    assert replay.point("random", 0.5).accuracy == 0.5
    assert replay.point("oracle", 0.25).accuracy == 0.75
    assert replay.curve("logtoku", np.array([0.0, 0.25, 0.5, 0.75, 1.0])).tolist() == [0.5, 0.75, 0.75, 0.5, 0.5]
    idx = np.random.default_rng(0).integers(0, 4, size=(200, 4))
    d = replay.paired("logtoku", "oracle", 0.25, idx)
    assert d.diff == 0.0 and d.low <= 0.0 <= d.high and d.p_value == 1.0
    with_ci = replay.point("logtoku", 0.5, idx)
    assert with_ci.low <= 0.75 <= with_ci.high
    with pytest.raises(ConfigurationError, match="one value per question"):
        Replay(("a",), closed, rag, {})


# -- knowledge base ----------------------------------------------------------------------------------------------
def _items(n: int, start: int = 0) -> list[QAItem]:
    return [QAItem(f"nq-{i}", f"what is thing number {i}?", (f"answer{i}",)) for i in range(start, start + n)]


def test_knowledge_base_covers_a_seeded_share_and_keeps_the_pool_as_distractors() -> None:
    items, pool = _items(10), _items(30)
    kb = build_knowledge_base(items, pool, 0.7, seed=3)
    assert len(kb.covered) == 7 and len(kb.passages) == 7 + 20
    for it in items:
        assert (faq_entry(it) in kb.passages) == (it.id in kb.covered)
    assert all(faq_entry(p) in kb.passages for p in pool[10:])
    assert build_knowledge_base(items, pool, 0.7, seed=3) == kb
    assert build_knowledge_base(items, pool, 0.7, seed=4).covered != kb.covered
    assert kb.name == "faq-c0.7-s3-n27"
    assert len(build_knowledge_base(items, pool, 0.0).covered) == 0
    with pytest.raises(ConfigurationError, match=r"coverage must be in \[0, 1\].*1\.5"):
        build_knowledge_base(items, pool, 1.5)


def test_rag_prompt_is_the_guards_retrieval_prompt() -> None:
    items = _items(3)
    setup = RagSetup(build_knowledge_base(items, items, 1.0), RetrieveSettings(passages=2))
    prompt = setup.prompt(items[1])
    assert prompt == RetrieveSettings(passages=2).prompt(setup.user_turn(items[1]), setup.passages(items[1]))
    assert setup.passages(items[1])[0] == faq_entry(items[1])  # BM25 finds the question's own entry first
    assert "{context}" in setup.prompt_template and "Q: {question} A:" in setup.prompt_template


# -- end to end with a scripted model ------------------------------------------------------------------------------
GOOD = [9.0, 1.0, 0.5, 0.2, 0.1]
SHAKY = [1.2, 1.1, 1.0, 0.9, 0.8]


def _script(calls: list[str]) -> Any:
    """Closed book: right and confident on even questions, wrong and shaky on odd ones.
    With context: copies the answer of the first passage."""

    def script(messages: Any) -> ScriptedAnswer:
        text = messages[-1].content
        calls.append(text)
        if "Context:" in text:
            found = re.search(r"Context:\nQ: .*? A: (.*?)\.", text)
            return ScriptedAnswer([" " + (found.group(1) if found else "unknown")], [GOOD])
        n = int(re.search(r"number (\d+)", text).group(1))  # type: ignore[union-attr]
        if n % 2 == 0:
            return ScriptedAnswer([f" answer{n}"], [GOOD])
        return ScriptedAnswer([" no", " idea"], [SHAKY, SHAKY])

    return script


def test_guard_eval_end_to_end_scripted(tmp_path: Path) -> None:
    items, pool = _items(8), _items(40)
    calls: list[str] = []
    script = _script(calls)
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
    assert data["live_check"]["same_answer"] == 8 and len(data["points"]) == 2 + 5 * 5
    if HAS_MPL:
        assert (tmp_path / "out" / "guard-e2e-budget.png").stat().st_size > 1000

    # Replaying again generates nothing: the model is never loaded.
    def no_model() -> Any:
        raise AssertionError("the model must not be loaded when everything is cached")

    again = run_guard_eval(items, pool, "scripted", no_model, GuardEvalConfig(cache_dir=tmp_path / "cache", coverage=0.5, live=0))
    assert [p.accuracy for p in again.report.points] == [p.accuracy for p in rep.points]


def test_guard_eval_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="live must be >= 0"):
        GuardEvalConfig(cache_dir=tmp_path, live=-1)
    with pytest.raises(ConfigurationError, match="unknown live guard signal 'eu'"):
        GuardEvalConfig(cache_dir=tmp_path, live_guard="eu")
    with pytest.raises(ConfigurationError, match="live_budget"):
        GuardEvalConfig(cache_dir=tmp_path, live_budget=1.0)
    items = _items(4)
    with pytest.raises(ConfigurationError, match=r"K=2 clamped score.*k=5"):
        run_guard_eval(items, items, "scripted", ScriptedBackend(_script([]), k=5), GuardEvalConfig(cache_dir=tmp_path, live=2))
    config = GuardEvalConfig(cache_dir=tmp_path, budgets=(0.5, 2.0), live=0)
    with pytest.raises(ConfigurationError, match=r"budgets are shares.*2\.0"):
        run_guard_eval(items, items, "scripted", ScriptedBackend(_script([]), k=5), config)


def test_guard_eval_on_the_tiny_model(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from logtoku_guard.backends.transformers import TransformersBackend

    model = make_model(tiny_tokenizer)
    gen = TransformersBackend("tiny", k=5, model_obj=model, tokenizer=tiny_tokenizer)
    live = TransformersBackend("tiny", k=2, model_obj=model, tokenizer=tiny_tokenizer)
    items, pool = _items(4), _items(12)
    config = GuardEvalConfig(
        cache_dir=tmp_path, coverage=0.5, greedy=GreedySpec(max_new_tokens=5), batch_size=2, n_boot=20, live=4, live_budget=0.5
    )
    run = run_guard_eval(items, pool, "tiny", gen, config, live_backend=live)
    check = run.report.live
    assert check is not None and check.n == 4 and check.retrieved_replay == 2
    # the real Guard (single-row generation) decides and answers as the batched replay does
    assert check.same_decision == 4 and check.same_answer == 4
    assert check.max_score_diff < 1e-4


def test_cli_guard_from_a_filled_cache(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    data = tmp_path / "data" / "nq_open"
    data.mkdir(parents=True)
    rows = [{"question": it.question.rstrip("?"), "answer": list(it.correct)} for it in _items(20)]
    (data / "NQ-open.dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    from logtoku_guard.evaluation.datasets import load_nq_open

    pool = load_nq_open(data_dir=tmp_path / "data")
    run_guard_eval(
        pool[:6], pool, "scripted-model", ScriptedBackend(_script([]), k=5), GuardEvalConfig(cache_dir=tmp_path / "c", live=0)
    )
    args = ["eval", "guard", "--model", "scripted-model", "--data-dir", str(tmp_path / "data"), "--limit", "6"]
    args += [
        "--cache-dir",
        str(tmp_path / "c"),
        "--out-dir",
        str(tmp_path / "out"),
        "--live",
        "0",
        "--n-boot",
        "20",
        "--no-plots",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "always retrieve" in res.output and (tmp_path / "out" / "guard-e2e.json").exists()
    bad = CliRunner().invoke(app, [*args, "--budgets", "0,1.5"])
    assert bad.exit_code == 2 and "1.5" in bad.output
    bad = CliRunner().invoke(app, [*args, "--passages", "0"])
    assert bad.exit_code == 2 and "--passages" in bad.output
