"""eval fabricated (``logtoku_eval.fabricated_eval``): cached answers re-scored as the core scores
them, the guard fit on the tune half, AUROC and the default policy's rates on the test half, and
the CLI reading its cache (synthetic answers, no model)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logtoku_eval.cache import CachedGeneration, CachedToken
from logtoku_eval.cli import eval_app
from logtoku_eval.fabricated import dataset_name, load_fabricated
from logtoku_eval.fabricated_eval import evaluate_fabricated, generation_from_cached, stats_from_cached
from logtoku_eval.generate import GreedySpec, greedy_cache
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.scoring.uncertainty import rescore


# -- synthetic cached answers: known = peaked logits, fabricated = flat ones ------------------------
def _tok(text: str, peak: float, rng: random.Random) -> CachedToken:
    top = sorted((rng.gauss(0, 1) + (peak if i == 0 else 0.0) for i in range(5)), reverse=True)
    return CachedToken(
        id=rng.randrange(100), text=text, top_logits=tuple(top), top_ids=(1, 2, 3, 4, 5), logprob=-1.0 / peak, entropy=1.0 / peak
    )


def _record(rid: str, question: str, *, known: bool, prefix: str = "", suffix: str = "", seed: int = 0) -> CachedGeneration:
    rng = random.Random(f"{rid}-{seed}")
    peak = (8.0 if known else 2.0) + rng.uniform(-1.5, 1.5)
    words = [prefix, *(" " + w if i else w for i, w in enumerate(question.split())), suffix]
    prompt = tuple(_tok(w, peak, rng) for w in words if w)
    answer = tuple(_tok(w, peak, rng) for w in ["The", " answer", " is", " X", "."])
    return CachedGeneration(rid, question, "The answer is X.", "stop", answer, prompt)


def test_a_cached_answer_is_scored_as_the_core_scores_its_logits() -> None:
    """Re-scored at K=2 from the stored logits, the prompt narrowed to the question's own tokens."""
    rec = _record("q1", "Who wrote Zorblax?", known=False, prefix="Answer concisely. Q: ", suffix=" A:")
    gen = generation_from_cached(rec, "m")
    assert "".join(t.text for t in gen.prompt_scores).strip() == "Who wrote Zorblax?"
    r = rescore([t.top_logits for t in rec.tokens], k=2)
    assert [t.au for t in gen.tokens] == r.au.tolist() and [t.eu for t in gen.tokens] == r.eu.tolist()
    assert [t.logprob for t in gen.tokens] == [t.logprob for t in rec.tokens] and gen.k == 2
    # repr: NaN statistics (e.g. guard_score without a guard) compare unequal to themselves
    assert repr(stats_from_cached(rec)) == repr(ResponseStats.from_generation(generation_from_cached(rec, "cached")))


def test_evaluate_fabricated_reports_auroc_and_policy_rates() -> None:
    tune = [(_record(f"t{i}", f"tune question {i}?", known=i % 2 == 0), i % 2 == 0) for i in range(40)]
    test = [(_record(f"s{i}", f"test question {i}?", known=i % 2 == 0, seed=1), i % 2 == 0) for i in range(40)]
    report = evaluate_fabricated(tune, test, model="m", n_boot=50)
    by_name = {r.method.name: r for r in report.table.results}
    assert by_name["guard-score"].auroc.value > 0.9
    assert report.table.comparisons and report.table.comparisons[0].method == "guard-score"
    assert 0.0 <= report.flagged_fabricated[0] <= 1.0 and 0.0 <= report.passed_known[0] <= 1.0
    assert "Known vs fabricated" in report.to_markdown()


@pytest.mark.slow  # the whole fabricated report, bootstrap included
def test_cli_eval_fabricated_reads_the_cache(tmp_path: Path) -> None:
    cache = greedy_cache(tmp_path / "cache", EMBEDDED_MODEL, dataset_name(), GreedySpec())
    items = load_fabricated("tune")[:10] + load_fabricated("test")[:10]
    cache.append(_record(it.id, it.question, known=it.is_known, prefix="Q: ") for it in items)
    result = CliRunner().invoke(
        eval_app,
        [
            "fabricated",
            "--limit",
            "10",
            "--gen-cache-dir",
            str(tmp_path / "cache"),
            "--out-dir",
            str(tmp_path / "out"),
            "--n-boot",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "guard-score" in result.output
    payload = json.loads((tmp_path / "out" / "fabricated.json").read_text())
    assert payload["n_test"] == 20 and payload["guard"]["datasets"] == ["fabricated-tune"]
