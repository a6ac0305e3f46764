"""The QA harness end to end (``evaluation.qa``) with a scripted backend and the tiny random model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tiny import make_model

from logtoku_eval.crossfit import cross_fit_guard
from logtoku_eval.datasets import QAItem, load_truthfulqa
from logtoku_eval.fabricated_eval import stats_from_cached
from logtoku_eval.generate import GreedySpec, SamplingSpec, qa_prompt
from logtoku_eval.judges import EmbeddingJudge, MatchJudge, RougeJudge
from logtoku_eval.methods import HEADLINE
from logtoku_eval.qa import QAConfig, evaluate, run_qa
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import auroc

from .support import HAS_MPL, BagOfWords, judged_answers, make_data_dir, qa_backend


@pytest.mark.slow
def test_harness_end_to_end_and_rescoring_never_regenerates(tmp_path: Path) -> None:
    items = load_truthfulqa(data_dir=make_data_dir(tmp_path / "data"))
    calls: list[str] = []
    config = QAConfig(
        "truthfulqa",
        cache_dir=tmp_path / "cache",
        out_dir=tmp_path / "out",
        samples_limit=3,
        sampling=SamplingSpec(n=3),
        n_boot=50,
        plots=HAS_MPL,
    )
    run = run_qa(
        items, "scripted", qa_backend(calls), [RougeJudge(), EmbeddingJudge(BagOfWords())], config, embedder=BagOfWords()
    )
    assert calls[0] == qa_prompt(items[0].question) == "Answer the question concisely. Q: What is the capital of France? A:"
    assert len(calls) == 4 + 3 * 3  # 4 greedy answers, 3 samples for each of the first 3 questions
    assert [g.answer for g in run.generations] == ["Paris", "Woof woof", "Woof woof", "Shakespeare"]  # stopped at "\n"
    assert len(run.generations[0].tokens[0].top_logits) == 5
    rouge, emb = run.reports
    assert rouge.judge == "rouge-l-rule" and emb.judge == "embedding-rule:bow"
    full, subset = rouge.tables
    assert full.n == 4 and full.accuracy == 0.5 and subset.n == 3
    head = next(r for r in full.results if r.method.name == HEADLINE)
    assert head.auroc.value == 1.0  # confident answers are the right ones here
    assert {r.method.name for r in subset.results} >= {"ln-entropy", "lexical-similarity", "semantic-entropy-emb"}
    assert full.comparisons and full.comparisons[0].method == HEADLINE
    md = (tmp_path / "out" / "truthfulqa.md").read_text()
    assert "rouge-l-rule" in md and "BLEURT" in md and "STAND-IN" in md
    data = json.loads((tmp_path / "out" / "truthfulqa.json").read_text())
    assert data["reports"][0]["tables"][0]["n"] == 4 and len(data["answers"]) == 4
    if HAS_MPL:
        assert (tmp_path / "out" / "truthfulqa-roc.png").stat().st_size > 1000
        assert (tmp_path / "out" / "truthfulqa-au-eu.png").exists()

    # Re-scoring: nothing is generated again, and a lazy loader is never called.
    def no_model() -> Any:
        raise AssertionError("the model must not be loaded when everything is cached")

    again = run_qa(items, "scripted", no_model, [RougeJudge()], config)
    assert again.reports[0].tables[0].results[0].auroc.value == head.auroc.value


def test_harness_on_the_tiny_model(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from logtoku_guard.backends.transformers import TransformersBackend

    backend = TransformersBackend("tiny", k=5, model_obj=make_model(tiny_tokenizer), tokenizer=tiny_tokenizer)
    items = [QAItem(f"q{i}", q, ("Paris",), ("Rome",)) for i, q in enumerate(["Capital of France?", "Capital of Italy?", "Hi?"])]
    config = QAConfig("toy", cache_dir=tmp_path, samples_limit=0, greedy=GreedySpec(max_new_tokens=6), n_boot=20, batch_size=2)
    run = run_qa(items, "tiny", backend, [RougeJudge()], config)
    gens = run.generations
    assert len(gens) == 3 and all(1 <= len(g.tokens) <= 6 for g in gens if g.answer)
    for g in gens:
        for t in g.tokens:
            assert len(t.top_logits) == 5 and list(t.top_logits) == sorted(t.top_logits, reverse=True)
            assert "\n" not in t.text


def test_qa_report_has_the_cross_fitted_guard_score_and_its_paired_difference(tmp_path: Path) -> None:
    items, gens, labels = judged_answers(45)
    config = QAConfig("nq-open", cache_dir=tmp_path, out_dir=tmp_path / "out", n_boot=50, plots=False)
    (report,), _ = evaluate(items, gens, [], [MatchJudge()], config, model=EMBEDDED_MODEL)
    assert [bool(v) for v in labels] == [i % 3 != 0 for i in range(45)]
    (table,) = report.tables
    by_name = {r.method.name: r for r in table.results}
    assert {"guard-score", "guard-score-shipped", "max-eu", "prompt-mean-logprob", HEADLINE} <= set(by_name)
    assert by_name["guard-score"].n_nan == 0 and by_name["guard-score"].auroc.value > 0.9
    rows = [stats_from_cached(g) for g in gens]
    expected = cross_fit_guard(rows, np.array(labels), folds=5, seed=0).scores
    assert by_name["guard-score"].auroc.value == pytest.approx(auroc(expected, labels))
    best = table.best(["single-pass baseline", "sampling baseline"])
    assert best is not None
    pairs = [(c.method, c.baseline) for c in table.comparisons]
    assert pairs == [(HEADLINE, best.method.name), ("guard-score", best.method.name)]
    md = report.to_markdown()
    assert "guard-score minus" in md and "cross-fitted: 5 folds" in md and "guard-score-shipped is the guard shipped" in md
    data = json.loads((tmp_path / "out" / "nq-open.json").read_text())
    assert data["reports"][0]["settings"]["guard_crossfit"]["n_fitted"] == 5
    assert data["answers"][0]["guard_scores"]["nq-match"]["guard-score"] == pytest.approx(expected[0])
    # off, and a model without a shipped guard: neither row, no guard comparison
    off = replace(config, guard_folds=0, out_dir=None)
    (plain,), _ = evaluate(items, gens, [], [MatchJudge()], off, model="other-model")
    names = {r.method.name for r in plain.tables[0].results}
    assert "guard-score" not in names and "guard-score-shipped" not in names
    assert [c.method for c in plain.tables[0].comparisons] == [HEADLINE]
    with pytest.raises(ConfigurationError, match="guard_folds must be 0"):
        QAConfig("nq-open", cache_dir=tmp_path, guard_folds=1)
