"""``logtoku-guard eval fabricated``: known vs fabricated questions, tuned on ``tune``, reported on ``test``.

Steps (every one reads the generation cache; the model is loaded only for missing answers):

1. greedy answers of both halves with their prompt-side scores
   (:func:`~logtoku_eval.generate.run_greedy`, cache named by
   :func:`~logtoku_eval.fabricated.dataset_name`);
2. :func:`stats_from_cached`: each cached answer re-scored at K = 2 (clamped evidence, the
   library's default) into :class:`~logtoku_guard.scoring.stats.ResponseStats`, the prompt-side
   statistics over the question's own tokens (the instruction around it is left out);
3. the guard score fitted on the **tune** half only (:func:`~logtoku_guard.scoring.guard_score.fit_guard`),
   and a profile of the tune half (its quantile grids place the policy's thresholds);
4. on the **test** half: AUROC (bootstrap 95% CI) of every single-pass method, the new
   statistics and ``guard-score`` (label: known = positive, the reliability direction), the
   paired difference of ``guard-score`` minus the best baseline, and the policy's share of
   fabricated questions flagged (any action but ``pass``) and of known questions passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import CachedGeneration, CachedToken
from logtoku_eval.jsonout import write_json
from logtoku_eval.methods import Method, single_pass_methods, single_pass_scores
from logtoku_eval.metrics import share_ci
from logtoku_eval.report import ResultTable, evaluate_methods
from logtoku_guard.calibration.profiles import ModelProfile, build_profile
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.scoring.guard_score import GuardModel, fit_guard, with_guard_score
from logtoku_guard.scoring.prompt_stats import focus_tokens
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N, rescore
from logtoku_guard.types import Generation, TokenScore

__all__ = [
    "STAT_METHODS",
    "FabricatedReport",
    "evaluate_fabricated",
    "generation_from_cached",
    "stat_scores",
    "stats_from_cached",
]

STAT_METHODS: tuple[tuple[Method, str, float], ...] = (
    (Method("guard-score", "logtoku", "learned guard score (logistic regression, fit on tune)"), "guard_score", 1.0),
    (Method("max-eu", "logtoku", "-max EU of the answer's tokens"), "max_eu", -1.0),
    (Method("first-eu", "logtoku", "-mean EU of the first 5 content tokens"), "first_eu", -1.0),
    (Method("first-max-eu", "logtoku", "-max EU of the first 5 content tokens"), "first_max_eu", -1.0),
    (Method("word-mean-eu", "logtoku", "-mean over words of the word's max EU"), "word_mean_eu", -1.0),
    (
        Method("reliability-debiased", "logtoku", "LogTokU reliability minus its fit on log(1 + length)"),
        "reliability_debiased",
        1.0,
    ),
    (Method("prompt-max-eu", "logtoku", "-max EU predicting the question's tokens (prefill)"), "prompt_max_eu", -1.0),
    (
        Method("prompt-mean-logprob", "single-pass baseline", "mean log p of the question's tokens (prefill)"),
        "prompt_mean_logprob",
        1.0,
    ),
    (
        Method("prompt-min-logprob", "single-pass baseline", "min log p of the question's tokens (prefill)"),
        "prompt_min_logprob",
        1.0,
    ),
)
"""(method, statistic, sign): the method's score is ``sign * statistic`` (higher = more reliable)."""


def _tokens(cached: Sequence[CachedToken], k: int) -> tuple[TokenScore, ...]:
    if not cached:
        return ()
    r = rescore([t.top_logits for t in cached], k=k)
    return tuple(
        TokenScore(i, t.id, t.text, t.top_logits, t.top_ids, float(a), float(e), t.logprob, t.entropy)
        for i, (t, a, e) in enumerate(zip(cached, r.au.tolist(), r.eu.tolist()))
    )


def generation_from_cached(rec: CachedGeneration, model: str, k: int = 2, top_n: int = DEFAULT_TOP_N) -> Generation:
    """A cached answer as a :class:`Generation` re-scored at ``k`` (prompt scores: the question's tokens only)."""
    prompt = focus_tokens(_tokens(rec.prompt_tokens, k), rec.question)
    finish = rec.finish_reason if rec.finish_reason in ("stop", "length", "cancelled") else "stop"
    return Generation(
        model=model,
        prompt=rec.question,
        text=rec.answer,
        tokens=_tokens(rec.tokens, k),
        finish_reason=finish,  # type: ignore[arg-type]
        k=k,
        top_n=top_n,
        prompt_scores=prompt,
    )


def stats_from_cached(rec: CachedGeneration, k: int = 2, top_n: int = DEFAULT_TOP_N) -> ResponseStats:
    """The :class:`ResponseStats` of a cached answer (see :func:`generation_from_cached`)."""
    return ResponseStats.from_generation(generation_from_cached(rec, "cached", k, top_n))


def stat_scores(rows: Sequence[ResponseStats]) -> dict[str, np.ndarray]:
    """Each :data:`STAT_METHODS` score per row (higher = more reliable)."""
    return {m.name: np.array([sign * r.get(stat) for r in rows], dtype=np.float64) for m, stat, sign in STAT_METHODS}


@dataclass(frozen=True)
class FabricatedReport:
    """The test-half table, the fitted guard and the policy's flag/pass rates (with 95% CIs)."""

    table: ResultTable
    guard: GuardModel
    policy: str
    flagged_fabricated: tuple[float, float, float]
    passed_known: tuple[float, float, float]
    actions: dict[str, dict[str, int]]
    n_tune: int
    n_test: int

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table.to_json(),
            "guard": self.guard.model_dump(),
            "policy": self.policy,
            "flagged_fabricated": list(self.flagged_fabricated),
            "passed_known": list(self.passed_known),
            "actions": self.actions,
            "n_tune": self.n_tune,
            "n_test": self.n_test,
        }

    def to_markdown(self) -> str:
        def rate(r: tuple[float, float, float]) -> str:
            return f"{100 * r[0]:.1f}% [{100 * r[1]:.1f}, {100 * r[2]:.1f}]"

        return "\n".join(
            [
                f"### Known vs fabricated (test half, n = {self.n_test}; guard fit on the tune half, n = {self.n_tune})",
                "",
                self.table.to_markdown(),
                "",
                f"Guard: {self.guard.describe()}",
                "",
                f"Policy `{self.policy}` (thresholds from the tune half's profile): flags {rate(self.flagged_fabricated)} "
                f"of fabricated questions, passes {rate(self.passed_known)} of known ones. Actions: {self.actions}.",
            ]
        )


def _rate(x: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    iv = share_ci(x, n_boot=n_boot, seed=seed)
    return (iv.value, iv.low, iv.high)


def evaluate_fabricated(
    tune: Sequence[tuple[CachedGeneration, bool]],
    test: Sequence[tuple[CachedGeneration, bool]],
    *,
    model: str,
    policy: Policy | None = None,
    k: int = 2,
    top_n: int = DEFAULT_TOP_N,
    l2: float = 1.0,
    n_boot: int = 1000,
    seed: int = 0,
) -> FabricatedReport:
    """Fit on ``tune`` (answer, is_known) pairs, report on ``test``."""
    tune_gens = [generation_from_cached(r, model, k, top_n) for r, _ in tune]
    tune_rows = [ResponseStats.from_generation(g) for g in tune_gens]
    guard = fit_guard(tune_rows, [y for _, y in tune], ["fabricated-tune"], l2=l2, seed=seed)
    profile: ModelProfile = build_profile(tune_gens, "fabricated tune half", guard)
    test_rows = [with_guard_score(stats_from_cached(r, k, top_n), guard) for r, _ in test]
    labels = np.array([y for _, y in test], dtype=bool)
    scores = {**single_pass_scores([r for r, _ in test], top_n), **stat_scores(test_rows)}
    methods = [m for m, _, _ in STAT_METHODS] + single_pass_methods(top_n)
    table = evaluate_methods(
        "Test half, single-pass methods", methods, scores, labels, n_boot=n_boot, seed=seed, headline="guard-score"
    )
    pol = policy or default_policy()
    decisions = [pol.decide(row, profile).action for row in test_rows]
    flagged = np.array([a != "pass" for a in decisions])
    actions: dict[str, dict[str, int]] = {"known": {}, "fabricated": {}}
    for a, y in zip(decisions, labels):
        bucket = actions["known" if y else "fabricated"]
        bucket[a] = bucket.get(a, 0) + 1
    return FabricatedReport(
        table=table,
        guard=guard,
        policy=pol.name,
        flagged_fabricated=_rate(flagged[~labels], n_boot, seed),
        passed_known=_rate(~flagged[labels], n_boot, seed),
        actions=actions,
        n_tune=len(tune),
        n_test=len(test),
    )


def write_fabricated(report: FabricatedReport, out_dir: str | Path) -> list[Path]:
    """``fabricated.md`` and ``fabricated.json`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "fabricated.md", out / "fabricated.json"
    md.write_text(report.to_markdown() + "\n", encoding="utf-8")
    write_json(js, report.to_json())
    return [md, js]
