"""Prompt-side scores, the learned guard score and its profile round-trip (no real model; the
``eval fabricated`` benchmark is tested in evaluation/tests/test_fabricated_eval.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from logtoku_guard.calibration import ModelProfile
from logtoku_guard.calibration.profiles import build_profile
from logtoku_guard.decision.policy import default_policy
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import fit_guard, with_guard_score
from logtoku_guard.scoring.prompt_stats import PromptStats, focus_tokens
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.scoring.uncertainty import logsumexp_entropy, logtoku, rescore
from logtoku_guard.types import DecodingOptions, Generation, TokenScore


# -- prompt-side capture ---------------------------------------------------------------------------
def test_prompt_scores_equal_a_separate_teacher_forced_pass(tiny_backend: Any) -> None:
    import torch

    question = "What is the capital of France?"
    gen = tiny_backend.generate(question, DecodingOptions(max_new_tokens=3))
    assert "".join(t.text for t in gen.prompt_scores) == question
    rendered = tiny_backend.render(question)
    ids = tiny_backend.tokenizer(rendered, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = tiny_backend.model(input_ids=ids).logits[0].float()
    offsets = tiny_backend.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start = rendered.rfind(question)
    positions = [j for j, (a, b) in enumerate(offsets) if b > start and a < start + len(question)]
    assert len(positions) == len(gen.prompt_scores)
    for pos, tok in zip(positions, gen.prompt_scores):
        row = logits[pos - 1]
        assert tok.id == int(ids[0, pos])
        lse, entropy = logsumexp_entropy(row[None])
        values = row.topk(tiny_backend.k).values
        au, eu = logtoku(values[None], "clamped")
        # Two float32 forward passes of another shape (the prefill with its KV cache, this pass alone)
        # reduce in another order, and a CPU with wider SIMD sums in another order again: they agree to
        # a few units in the last place of the numbers summed (float32 keeps ~7 digits), not to an
        # absolute 1e-5. So: 1e-4 relative to the largest logit that went into each figure.
        f32 = {"rel": 1e-4, "abs": 1e-4 * max(1.0, float(row.abs().max()))}
        assert tok.logprob == pytest.approx(float(row[tok.id] - lse[0]), **f32)
        assert tok.entropy == pytest.approx(float(entropy[0]), **f32)
        assert tok.au == pytest.approx(float(au[0]), **f32)
        assert tok.eu == pytest.approx(float(eu[0]), **f32)
        assert tok.top_logits == pytest.approx(values.tolist(), **f32)
    stats = ResponseStats.from_generation(gen)
    assert stats.prompt_min_logprob == pytest.approx(min(t.logprob for t in gen.prompt_scores))
    assert stats.prompt_max_eu == pytest.approx(max(t.eu for t in gen.prompt_scores))


def test_prompt_scores_in_a_padded_batch_match_single_prompts(tiny_backend: Any) -> None:
    prompts = ["Paris is a city", "What is the capital of Italy? Rome."]
    batch = tiny_backend.batch(prompts, DecodingOptions(max_new_tokens=2))
    for p, g in zip(prompts, batch):
        single = tiny_backend.generate(p, DecodingOptions(max_new_tokens=2))
        assert [t.id for t in g.prompt_scores] == [t.id for t in single.prompt_scores]
        assert [t.logprob for t in g.prompt_scores] == pytest.approx([t.logprob for t in single.prompt_scores], abs=1e-4)


@pytest.mark.parametrize("chunk", [1, 3])
def test_long_questions_scored_by_the_hook_in_chunks_equal_the_kept_logits(
    tiny_backend: Any, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """More question positions than CHUNK: the decoder hook scores them in chunks of CHUNK,
    with the same result as the logits the prefill keeps for short questions."""
    from logtoku_guard.backends import prompt_scoring

    prompts = ["Paris is a city", "What is the capital of Italy? Rome."]
    kept = tiny_backend.batch(prompts, DecodingOptions(max_new_tokens=2))
    assert all(g.prompt_scores for g in kept)
    calls: list[int] = []
    hook = prompt_scoring.PromptCapture.hook
    monkeypatch.setattr(prompt_scoring.PromptCapture, "hook", lambda self, *a: (calls.append(1), hook(self, *a))[1])
    monkeypatch.setattr(prompt_scoring, "CHUNK", chunk)
    chunked = tiny_backend.batch(prompts, DecodingOptions(max_new_tokens=2))
    assert calls  # the hook path ran
    for a, b in zip(kept, chunked, strict=True):
        assert [t.id for t in a.prompt_scores] == [t.id for t in b.prompt_scores]
        assert [t.text for t in a.prompt_scores] == [t.text for t in b.prompt_scores]
        for x, y in zip(a.prompt_scores, b.prompt_scores, strict=True):
            assert (x.logprob, x.entropy, x.au, x.eu) == pytest.approx((y.logprob, y.entropy, y.au, y.eu), abs=1e-4)
            assert x.top_ids == y.top_ids and x.top_logits == pytest.approx(y.top_logits, abs=1e-4)


def test_focus_tokens_keeps_the_question_only() -> None:
    gen = _generation("q1", "Who wrote Zorblax?", known=False, prefix="Answer concisely. Q: ", suffix=" A:")
    assert "".join(t.text for t in gen.prompt_scores).strip() == "Who wrote Zorblax?"
    assert focus_tokens(gen.prompt_scores, "absent") == gen.prompt_scores
    assert math.isnan(PromptStats.from_tokens(()).prompt_max_eu)


# -- synthetic answers: known = peaked logits, fabricated = flat ones ------------------------------
def _raw(text: str, peak: float, rng: random.Random) -> tuple[str, tuple[float, ...], int, float]:
    """A token's text, raw top-5 logits (largest first), id and log p: the first logit peaked at ``peak``."""
    top = tuple(sorted((rng.gauss(0, 1) + (peak if i == 0 else 0.0) for i in range(5)), reverse=True))
    return text, top, rng.randrange(100), -1.0 / peak


def _scored(raw: list[tuple[str, tuple[float, ...], int, float]], peak: float) -> tuple[TokenScore, ...]:
    """The tokens scored as a backend scores them (K=2, clamped evidence) from their raw logits."""
    r = rescore([top for _, top, _, _ in raw], k=2)
    return tuple(
        TokenScore(i, tid, text, top, (1, 2, 3, 4, 5), a, e, logprob, 1.0 / peak)
        for i, ((text, top, tid, logprob), a, e) in enumerate(zip(raw, r.au.tolist(), r.eu.tolist()))
    )


def _generation(rid: str, question: str, *, known: bool, prefix: str = "", suffix: str = "", seed: int = 0) -> Generation:
    """An answer "The answer is X." to ``question`` whose answer and prompt tokens are all peaked
    (known) or flat (fabricated); its prompt scores are the question's own tokens."""
    rng = random.Random(f"{rid}-{seed}")
    peak = (8.0 if known else 2.0) + rng.uniform(-1.5, 1.5)
    words = [prefix, *(" " + w if i else w for i, w in enumerate(question.split())), suffix]
    prompt = [_raw(w, peak, rng) for w in words if w]
    answer = [_raw(w, peak, rng) for w in ["The", " answer", " is", " X", "."]]
    return Generation(
        model="m",
        prompt=question,
        text="The answer is X.",
        tokens=_scored(answer, peak),
        finish_reason="stop",
        k=2,
        prompt_scores=focus_tokens(_scored(prompt, peak), question),
    )


def _rows(n: int, seed: int = 0) -> tuple[list[ResponseStats], list[bool]]:
    labels = [i % 2 == 0 for i in range(n)]
    gens = [_generation(f"r{i}", f"question number {i}?", known=y, seed=seed) for i, y in enumerate(labels)]
    return [ResponseStats.from_generation(g) for g in gens], labels


def test_fit_is_deterministic_and_round_trips_through_the_profile(tmp_path: Path) -> None:
    rows, labels = _rows(40)
    a = fit_guard(rows, labels, ["synthetic"], seed=3)
    b = fit_guard(rows, labels, ["synthetic"], seed=3)
    assert a.model_dump(exclude={"created_at"}) == b.model_dump(exclude={"created_at"})
    assert a.cv_auroc is not None and a.cv_auroc > 0.9
    assert a.n == 40 and a.n_positive == 20 and a.datasets == ["synthetic"]
    gens = [_generation(f"c{i}", f"calibration {i}?", known=i % 3 > 0) for i in range(12)]
    profile = build_profile(gens, "synthetic", a)
    path = profile.save(tmp_path / "p.json")
    loaded = ModelProfile.load(path)
    assert loaded.guard == a and loaded.guard_available
    scored = [with_guard_score(r, loaded) for r in rows]
    assert [s.guard_score for s in scored] == [with_guard_score(r, a).guard_score for r in rows]
    assert all(0.0 <= s.guard_score <= 1.0 for s in scored)
    known = [s.guard_score for s, y in zip(scored, labels) if y]
    fab = [s.guard_score for s, y in zip(scored, labels) if not y]
    assert min(known) > max(fab)  # higher = more reliable
    assert loaded.has_stat("guard_score")


def test_a_guard_fit_on_the_older_feature_list_keeps_scoring_with_it(tmp_path: Path) -> None:
    """A profile saved before the AU features joined :data:`FEATURES` still loads and scores with
    the 10 features it was fit on; changing an answer's AU moves only the newer guard's score."""
    from logtoku_guard.scoring.guard_score import FEATURES

    older = [f for f in FEATURES if f not in ("max_au", "mean_au")]
    assert len(older) == 10 and len(FEATURES) == 12
    rows, labels = _rows(40)
    old, new = fit_guard(rows, labels, ["synthetic"], features=older), fit_guard(rows, labels, ["synthetic"])
    assert old.features == older and new.features == list(FEATURES)
    gens = [_generation(f"c{i}", f"calibration {i}?", known=i % 3 > 0) for i in range(12)]
    loaded = ModelProfile.load(build_profile(gens, "synthetic", old).save(tmp_path / "old-guard.json"))
    assert loaded.guard == old and loaded.guard_available
    row = rows[1]
    louder = dataclasses.replace(row, max_au=row.max_au + 5.0, mean_au=row.mean_au + 5.0)
    assert with_guard_score(louder, loaded).guard_score == with_guard_score(row, loaded).guard_score
    assert with_guard_score(louder, new).guard_score != with_guard_score(row, new).guard_score


def test_a_profile_without_a_guard_loads_and_the_default_policy_falls_back_to_reliability(tmp_path: Path) -> None:
    gens = [_generation(f"c{i}", f"calibration {i}?", known=i % 3 > 0) for i in range(12)]
    data = json.loads(build_profile(gens, "synthetic").model_dump_json())
    data.pop("guard")
    for stat in ("guard_score", "reliability_debiased", "prompt_max_eu", "first_max_eu"):
        data["stats"].pop(stat, None)  # what an older version wrote
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = ModelProfile.load(tmp_path / "old.json")
    assert not old.guard_available and not old.has_stat("guard_score")
    stats = with_guard_score(ResponseStats.from_generation(gens[0]), old)
    assert math.isnan(stats.guard_score)
    decision = default_policy().decide(stats, old)
    assert decision.checks and all(c.stat == "reliability" for c in decision.checks)


def test_balanced_groups_weigh_a_small_group_as_much_as_a_large_one() -> None:
    """Group weights: the fit records that it was weighted, keeps every row's out-of-fold score
    under its group, and says what a threshold flags per group; weighting without groups is refused."""
    rows, labels = _rows(60)
    groups = ["pos" if y else ("small" if i % 10 == 1 else "big") for i, y in enumerate(labels)]
    plain = fit_guard(rows, labels, ["s"], groups=groups)
    balanced = fit_guard(rows, labels, ["s"], groups=groups, balance_groups=True)
    assert not plain.balanced_groups and balanced.balanced_groups
    assert set(balanced.reference_scores) == {"pos", "small", "big"}
    assert sum(len(v) for v in balanced.reference_scores.values()) == 60
    rates = balanced.expected_flag_rates(0.5)
    assert set(rates) == {"pos", "small", "big"} and all(0.0 <= r <= 1.0 for r in rates.values())
    with pytest.raises(ConfigurationError, match="balance_groups needs groups"):
        fit_guard(rows, labels, ["s"], balance_groups=True)
    with pytest.raises(ConfigurationError, match="one group per row"):
        fit_guard(rows, labels, ["s"], groups=groups[:-1])


def test_an_empty_answer_has_no_guard_score() -> None:
    """Nothing to predict from: guard_score is undefined, not a score made of the fit data's means."""
    import math

    rows, labels = _rows(20)
    guard = fit_guard(rows, labels, ["s"])
    empty = with_guard_score(ResponseStats.from_tokens([]), guard)
    assert math.isnan(empty.guard_score) and math.isnan(empty.reliability_debiased)
    assert empty.undefined_reason("guard_score") == "empty answer"


def test_a_longer_answer_is_scored_on_the_length_the_guard_was_fit_on() -> None:
    """A guard fit on answers of at most N tokens scores a longer answer on its first N tokens."""
    from logtoku_guard import ScriptedAnswer, ScriptedBackend

    rows, labels = _rows(20)
    guard = fit_guard(rows, labels, ["s"], max_tokens=3)
    assert guard.max_tokens == 3
    long = ScriptedBackend([ScriptedAnswer(["a", " b", " c", " d", " e"], [[9.0, 1.0]] * 3 + [[1.0, 0.9]] * 2)]).generate("q?")
    short = ScriptedBackend([ScriptedAnswer(["a", " b", " c"], [[9.0, 1.0]] * 3)]).generate("q?")
    scored_long = with_guard_score(ResponseStats.from_generation(long), guard, long)
    scored_short = with_guard_score(ResponseStats.from_generation(short), guard, short)
    assert scored_long.guard_score == scored_short.guard_score
    assert scored_long.max_eu > scored_short.max_eu  # the other statistics still describe the whole answer
    unbounded = fit_guard(rows, labels, ["s"])
    assert with_guard_score(ResponseStats.from_generation(long), unbounded, long).guard_score != scored_short.guard_score


def test_auroc_is_the_rank_statistic_with_ties_at_one_half_and_nan_lowest() -> None:
    """The one AUROC (the guard's CV figure and every eval report): equal to counting the pairs."""
    import numpy as np

    from logtoku_guard.scoring.guard_score import auroc

    rng = np.random.default_rng(3)
    s = rng.integers(0, 6, 300).astype(float)  # many ties
    s[:7] = np.nan
    y = rng.random(300) < 0.4
    low = np.nan_to_num(s, nan=-np.inf)
    pos, neg = low[y], low[~y]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auroc(s, y) == pytest.approx(pairs / (pos.size * neg.size))
    assert auroc([math.nan, 0.5], [True, False]) == 0.0 and math.isnan(auroc([1.0, 2.0], [1, 1]))
    with pytest.raises(ConfigurationError, match="same length"):
        auroc([1.0, 2.0], [True])
    with pytest.raises(ConfigurationError, match="0/1"):
        auroc([1.0, 2.0], [0, 2])
