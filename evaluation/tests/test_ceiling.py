"""``benchmarks/guard_score/ceiling.py``: what any guard on the single-pass statistics could reach."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.scripts import imported_script

from logtoku_eval.generate import GreedySpec, greedy_cache
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.errors import ConfigurationError

from .support import cached_answer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "guard_score" / "ceiling.py"


@pytest.fixture(scope="module")
def ceiling():
    with imported_script(SCRIPT) as module:
        yield module


def _write(tmp_path: Path, n: int = 40) -> tuple[Path, Path, list[bool], list[bool]]:
    """``n`` cached answers (peaked logits on even rows) and a results file with two judges:
    ``sharp`` labels the peaked answers correct, ``noisy`` flips every 4th of those labels."""
    cache_dir = tmp_path / "cache"
    cache = greedy_cache(cache_dir, EMBEDDED_MODEL, "truthfulqa", GreedySpec())
    right = [i % 2 == 0 for i in range(n)]
    cache.append(cached_answer(f"tqa-{i}", f"question number {i}?", right=y) for i, y in enumerate(right))
    noisy = [y != (i % 4 == 1) for i, y in enumerate(right)]
    answers = [
        {"id": f"tqa-{i}", "answer": "The answer is X.", "labels": {"sharp": a, "noisy": b}}
        for i, (a, b) in enumerate(zip(right, noisy))
    ]
    results = tmp_path / "truthfulqa.json"
    results.write_text(json.dumps({"reports": [], "answers": answers}), encoding="utf-8")
    return results, cache_dir, right, noisy


@pytest.mark.slow  # fits three flexible models per judge
def test_report_per_judge_with_agreement(ceiling, tmp_path: Path) -> None:
    results, cache_dir, right, noisy = _write(tmp_path, n=80)
    judged = ceiling.load_judged(results, cache_dir, "truthfulqa")
    assert judged.ids[:2] == ["tqa-0", "tqa-1"] and set(judged.labels) == {"sharp", "noisy"}
    found = ceiling.ceilings(judged, n_boot=50, seed=0, flexible=True)
    sharp, fuzzy = found
    assert sharp.judge == "sharp" and sharp.n == 80 and sharp.n_correct == 40
    # peaked logits separate the sharp judge's labels: every statistic of the answer's EU does
    assert sharp.single["max_eu"] == (1.0, -1)
    assert sharp.in_sample.value == 1.0
    assert set(sharp.flexible) == {
        "random forest (400 trees, leaves >= 10)",
        "gradient boosting (depth 3, 150 rounds)",
        "logistic regression, pairwise products",
    }
    assert all(len(v) == 3 and min(v) > 0.9 for v in sharp.flexible.values())
    # the noisy judge flips 20 of 80 labels: the same statistic can no longer separate them
    assert fuzzy.single["max_eu"][0] < 0.9 and fuzzy.in_sample.value < 1.0
    text = ceiling.to_markdown(found, judged)
    a, b = np.array(right), np.array(noisy)
    share, kappa = ceiling.agreement(a, b)
    assert share == 0.75
    chance = a.mean() * b.mean() + (1 - a.mean()) * (1 - b.mean())
    assert kappa == pytest.approx((0.75 - chance) / (1 - chance))
    assert f"agree on 75.0% of the answers (Cohen's kappa {kappa:.2f})" in text
    assert "### judge sharp: 80 answers, 40 correct (50.0%)" in text and "**in-sample fit** (optimistic)" in text


def test_main_without_the_flexible_models(ceiling, tmp_path: Path) -> None:
    results, cache_dir, _, _ = _write(tmp_path, n=12)
    args = ["--results", str(results), "--dataset", "truthfulqa", "--cache-dir", str(cache_dir)]
    text = ceiling.main([*args, "--n-boot", "20", "--no-flexible"])
    assert "random forest" not in text and "in-sample fit" in text and text.count("### judge") == 2


def test_bad_inputs_name_the_file_and_the_fix(ceiling, tmp_path: Path) -> None:
    results, cache_dir, _, _ = _write(tmp_path, n=6)
    with pytest.raises(ConfigurationError, match="--cache-dir the eval used"):
        ceiling.load_judged(results, tmp_path / "elsewhere", "truthfulqa")
    with pytest.raises(ConfigurationError, match="no eval results at"):
        ceiling.load_judged(tmp_path / "none.json", cache_dir, "truthfulqa")
    bad = tmp_path / "bad.json"
    bad.write_text('{"answers": [{"id": "tqa-0"}]}', encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"needs answers\[\]\.id and answers\[\]\.labels"):
        ceiling.load_judged(bad, cache_dir, "truthfulqa")
    bad.write_text("not json", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="is not an eval results file"):
        ceiling.load_judged(bad, cache_dir, "truthfulqa")
    mixed = json.loads(results.read_text(encoding="utf-8"))
    del mixed["answers"][3]["labels"]["noisy"]
    bad.write_text(json.dumps(mixed), encoding="utf-8")
    with pytest.raises(ConfigurationError, match="not all labelled by the same judges"):
        ceiling.load_judged(bad, cache_dir, "truthfulqa")
