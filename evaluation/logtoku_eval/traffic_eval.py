"""``logtoku-guard eval traffic``: the guard on questions that look like a user's traffic.

Four groups, each cut into ``tune`` and ``test`` halves before any answer was seen:

* ``real-correct`` / ``real-wrong``: real questions (every known fact of the pool and a sample
  of NQ-open, :mod:`~logtoku_eval.traffic`) whose answer the ``nq-match`` judge
  finds right / wrong: the model's confident wrong answers are a class of their own;
* ``plausible``: invented things named with ordinary words ("the Northfield Institute for
  Coastal Research");
* ``syllable``: invented names made of random syllables (the fabricated half of the
  known-vs-fabricated benchmark).

Answers are made as ``logtoku-guard ask`` makes them (:data:`~logtoku_eval.generate.SERVING`:
the question alone, greedy, 64 tokens), and the default calibration set is answered the same
way, so the thresholds are placed in the very profile ``calibrate`` builds.

Steps, all fitting on **tune** only (:func:`evaluate_traffic`):

1. for each candidate feature set (:data:`FEATURE_SETS`) a pooled guard is fit on tune
   (positive = ``real-correct``, every other group negative); its stratified out-of-fold tune
   scores, kept by group (:attr:`~logtoku_guard.scoring.guard_score.GuardModel.reference_scores`),
   place its flag threshold: the highest guard score that still passes ``pass_target`` of the
   correct real answers (:func:`choose_threshold`);
2. the feature set whose threshold flags the most of the three groups to flag (their mean
   out-of-fold flag rate, each group counting once) is kept, and its threshold is expressed as
   a quantile of the calibration profile (what the default policy stores);
3. on **test**: the flag rate of each group with bootstrap 95% CIs, the AUROC of each statistic
   for three contrasts (correct vs wrong, vs plausible, vs syllable), and the trade-off curve of
   correct-passed against wrong-flagged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from logtoku_eval.cache import CachedGeneration
from logtoku_eval.fabricated_eval import generation_from_cached
from logtoku_eval.generate import SERVING
from logtoku_eval.jsonout import write_json
from logtoku_eval.metrics import bootstrap_ci, share_ci
from logtoku_eval.traffic import load_traffic
from logtoku_guard.calibration.profiles import ModelProfile, build_profile
from logtoku_guard.calibration.self_labels import LabelledQuestion, fit_on_outcomes, labelled_questions, outcome_of
from logtoku_guard.scoring.guard_score import FEATURES, GuardModel, auroc, with_guard_score
from logtoku_guard.scoring.risk import RiskThreshold
from logtoku_guard.scoring.risk import choose_threshold as choose_risk_threshold
from logtoku_guard.scoring.stats import HIGHER_IS_RELIABLE, ResponseStats

__all__ = [
    "CLAIM_FEATURES",
    "CONTRASTS",
    "FEATURE_SETS",
    "OUTCOMES",
    "RISK_TARGETS",
    "STYLES",
    "RiskCheck",
    "TrafficAnswer",
    "TrafficQuestion",
    "TrafficReport",
    "choose_threshold",
    "evaluate_traffic",
    "judge_answers",
    "traffic_questions",
    "write_traffic",
]

OUTCOMES = ("real-correct", "real-wrong", "plausible", "syllable")
"""The report's groups; only ``real-correct`` answers should pass."""
CONTRASTS = (("real-correct", "real-wrong"), ("real-correct", "plausible"), ("real-correct", "syllable"))
CLAIM_FEATURES = ("claim_max_eu", "claim_mean_eu", "claim_min_logprob", "claim_mean_logprob")
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "answer+prompt": FEATURES,
    "answer+prompt+claim": (*FEATURES, *CLAIM_FEATURES),
    "answer+prompt+echo": (*FEATURES, "question_echo"),
    "claim+prompt": (
        "claim_max_eu",
        "claim_mean_eu",
        "claim_min_logprob",
        "claim_mean_logprob",
        "prompt_max_eu",
        "prompt_mean_eu",
        "prompt_mean_logprob",
        "prompt_min_logprob",
        "n_tokens",
    ),
}
"""Candidate guard features, chosen between on the tune half's pooled cross-validated AUROC."""
REPORTED_STATS = (
    "guard_score",
    "reliability",
    "probability_reliability",
    "max_eu",
    "word_mean_eu",
    "prompt_mean_logprob",
    "claim_max_eu",
    "claim_mean_eu",
    "claim_min_logprob",
    "claim_mean_logprob",
    "question_echo",
)


TrafficQuestion = LabelledQuestion
"""One benchmark question: its group (``real``, ``plausible`` or ``syllable``), half and references
(the core's :class:`~logtoku_guard.calibration.self_labels.LabelledQuestion`)."""

STYLES = {"known": "cased", "nq-cased": "cased", "known-lower": "lower", "nq": "lower"}
"""category of a real question -> its wording style: ``cased`` (first letter and names upper case,
as the known facts are written) or ``lower`` (all lower case, as NQ-open writes); each real
question is asked in both (:mod:`~logtoku_eval.traffic`), so neither outcome owns a style."""


def traffic_questions(path: str | Path | None = None, fabricated_path: str | Path | None = None) -> list[TrafficQuestion]:
    """The traffic benchmark's questions plus the syllable-name fabrications of ``fabricated.jsonl``
    (both halves), read as ``calibrate --fit-guard`` reads them."""
    load_traffic(path)  # the benchmark's own checks of the traffic file (invented names, sources)
    return labelled_questions(
        "all", traffic=Path(path) if path is not None else None, fabricated=Path(fabricated_path) if fabricated_path else None
    )


@dataclass(frozen=True)
class TrafficAnswer:
    """A question, the model's answer and its outcome (one of :data:`OUTCOMES`)."""

    question: TrafficQuestion
    record: CachedGeneration
    outcome: str

    @property
    def correct(self) -> bool:
        return self.outcome == "real-correct"


def judge_answers(pairs: Sequence[tuple[TrafficQuestion, CachedGeneration]]) -> list[TrafficAnswer]:
    """The outcome of each answer (:func:`~logtoku_guard.calibration.self_labels.outcome_of`): real
    questions judged by ``nq-match``; any answer about an invented thing is not correct."""
    return [TrafficAnswer(q, rec, outcome_of(q, rec.answer)) for q, rec in pairs]


def _stats(answers: Sequence[TrafficAnswer], model: str) -> list[ResponseStats]:
    return [ResponseStats.from_generation(generation_from_cached(a.record, model)) for a in answers]


def _mean_flagged(rates: dict[str, float]) -> float:
    """Mean flag rate over the groups that should be flagged (each group counts once)."""
    values = [rates.get(g, math.nan) for g in OUTCOMES if g != "real-correct"]
    return float(np.mean(values)) if all(math.isfinite(v) for v in values) else math.nan


def choose_threshold(correct_scores: np.ndarray, pass_target: float) -> float:
    """The highest threshold ``t`` such that at least ``pass_target`` of ``correct_scores`` are ``>= t``
    (a rule ``guard_score < t`` flags the rest)."""
    s = np.sort(correct_scores[np.isfinite(correct_scores)])
    if s.size == 0:
        return math.nan
    k = math.floor((1.0 - pass_target) * s.size + 1e-9)  # how many correct answers may be flagged
    return float(s[min(k, s.size - 1)])


@dataclass(frozen=True)
class Rate:
    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        if not math.isfinite(self.value):
            return f"n/a (n={self.n})"
        ci = f" [{100 * self.low:.1f}, {100 * self.high:.1f}]" if math.isfinite(self.low) else ""
        return f"{100 * self.value:.1f}%{ci} (n={self.n})"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def _rate(x: np.ndarray, n_boot: int, seed: int) -> Rate:
    iv = share_ci(x, n_boot=n_boot, seed=seed)
    return Rate(iv.value, iv.low, iv.high, int(x.size))


def _auroc_ci(scores: np.ndarray, labels: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    iv = bootstrap_ci(lambda s, y: auroc(s, y), scores, labels, n_boot=n_boot, seed=seed)
    return (iv.value, iv.low, iv.high)


RISK_TARGETS: tuple[tuple[str, float, float], ...] = (
    ("coverage", 0.8, 0.9),  # the default policy's (version 4)
    ("coverage", 0.9, 0.9),
    ("selective_risk", 0.4, 0.9),
)
"""(kind, target, confidence) of the stated-risk thresholds whose promise is checked on the test half."""


@dataclass(frozen=True)
class RiskCheck:
    """A stated-risk threshold chosen on tune (``chosen``) and the test half's measure at it
    (``test``: coverage of the correct answers, or the share of wrong among the passed ones)."""

    chosen: RiskThreshold
    test: Rate

    @property
    def holds(self) -> bool:
        """The test half does not contradict the promise: the target lies on the promised side of
        the test measure's 95% interval or inside it (a test half is a sample too)."""
        if not self.chosen.met:
            return False
        if self.chosen.kind == "coverage":
            return self.test.high >= self.chosen.target
        return self.test.low <= self.chosen.target

    def row(self) -> str:
        c = self.chosen
        what = f"{c.kind} {'>=' if c.kind == 'coverage' else '<='} {c.target:.0%} at {c.confidence:.0%}"
        state = f"bound {100 * c.bound:.1f}% ({'met' if c.met else 'NOT met'})"
        return f"| {what} | {state} | {c.threshold:.4f} | {self.test} | {'yes' if self.holds else 'no'} |"

    def to_json(self) -> dict[str, Any]:
        test = [self.test.value, self.test.low, self.test.high, self.test.n]
        return {"chosen": asdict(self.chosen), "test": test, "holds": self.holds}


def _risk_checks(guard: GuardModel, scores: np.ndarray, outcomes: np.ndarray, n_boot: int, seed: int) -> list[RiskCheck]:
    correct_tune, wrong_tune = guard.labelled_scores()
    if not correct_tune or not wrong_tune:
        return []
    checks = []
    right = outcomes == "real-correct"
    for kind, target, confidence in RISK_TARGETS:
        chosen = choose_risk_threshold(correct_tune, wrong_tune, kind, target, confidence)  # type: ignore[arg-type]
        passed = scores >= chosen.threshold
        measured = _rate(passed[right], n_boot, seed) if kind == "coverage" else _rate(~right[passed], n_boot, seed)
        checks.append(RiskCheck(chosen, measured))
    return checks


@dataclass(frozen=True)
class TrafficReport:
    """What ``eval traffic`` measured (see the module docstring)."""

    model: str
    feature_sets: dict[str, float]
    """Each candidate feature set's mean out-of-fold tune flag rate over the groups to flag, at
    its threshold passing ``pass_target`` of the correct answers (the choice criterion)."""
    chosen: str
    guard: GuardModel
    pass_target: float
    threshold: float
    quantile: float
    """The threshold's place in the calibration profile's ``guard_score`` grid (the default policy's value)."""
    tune_rates: dict[str, Rate]
    test_rates: dict[str, Rate]
    contrasts: dict[str, dict[str, tuple[float, float, float]]]
    """contrast -> statistic -> test AUROC [95% CI] (higher score = more reliable)."""
    curve: list[tuple[float, float, float]]
    """(threshold, correct passed, wrong flagged) on the test half."""
    by_category: dict[str, Rate] = field(default_factory=dict)
    """Test flag rate of the real answers per category (``known``, ``known-lower``, ``nq``,
    ``nq-cased``) and per wording style (``cased``, ``lower``: :data:`STYLES`) and outcome, e.g.
    ``"real-wrong / known"`` or ``"real-wrong / style lower"``."""
    by_style: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    risk_checks: list[RiskCheck] = field(default_factory=list)
    """Each stated-risk target of :data:`RISK_TARGETS`, its threshold chosen on the tune half's
    out-of-fold labels, and what the test half measured at that threshold."""
    """Test AUROC [95% CI] of ``guard_score``, correct vs wrong real answers, within each wording style."""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def rates(r: dict[str, Rate]) -> dict[str, list[float]]:
            return {k: [v.value, v.low, v.high, v.n] for k, v in r.items()}

        return {
            "model": self.model,
            "feature_sets": self.feature_sets,
            "chosen": self.chosen,
            "guard": self.guard.model_dump(),
            "pass_target": self.pass_target,
            "threshold": self.threshold,
            "quantile": self.quantile,
            "tune_rates": rates(self.tune_rates),
            "test_rates": rates(self.test_rates),
            "contrasts": {c: {s: list(v) for s, v in d.items()} for c, d in self.contrasts.items()},
            "curve": [list(p) for p in self.curve],
            "by_category": {k: [v.value, v.low, v.high, v.n] for k, v in self.by_category.items()},
            "by_style_auroc": {k: list(v) for k, v in self.by_style.items()},
            "risk_checks": [c.to_json() for c in self.risk_checks],
            "counts": self.counts,
        }

    def to_markdown(self) -> str:
        lines = [
            f"### Realistic traffic ({self.model}; guard fit on the tune half, rates on the test half)",
            "",
            "Answer counts per half: " + "; ".join(f"{h}: {c}" for h, c in self.counts.items()),
            "",
            "Feature sets (mean tune flag rate of the groups to flag, out of fold, at the pass target): "
            + ", ".join(f"{k} {_pct(v)}" for k, v in self.feature_sets.items())
            + f"; chosen: **{self.chosen}**",
            "",
            self._rule(),
            "",
            "| group | should | tune flagged | test flagged % [95% CI] |",
            "|---|---|---|---|",
        ]
        for g in OUTCOMES:
            should = "pass" if g == "real-correct" else "flag"
            lines.append(f"| {g} | {should} | {self.tune_rates[g]} | {self.test_rates[g]} |")
        for key, rate in self.by_category.items():
            outcome, category = key.split(" / ")
            should = "pass" if outcome == "real-correct" else "flag"
            lines.append(f"| {outcome}, {category} questions only | {should} | | {rate} |")
        if self.by_style:
            cells = [f"{s} {100 * v[0]:.1f} [{100 * v[1]:.1f}, {100 * v[2]:.1f}]" for s, v in self.by_style.items()]
            lines += ["", "Test AUROC % [95% CI] of guard_score, correct vs wrong, within one wording style: " + "; ".join(cells)]
        lines += ["", "Test AUROC % [95% CI] per contrast (correct = positive):", ""]
        head = "| statistic | " + " | ".join(f"{a} vs {b}" for a, b in CONTRASTS) + " |"
        lines += [head, "|---|" + "---|" * len(CONTRASTS)]
        for stat in REPORTED_STATS:
            cells = []
            for a, b in CONTRASTS:
                v = self.contrasts[f"{a} vs {b}"].get(stat)
                cells.append("n/a" if v is None or math.isnan(v[0]) else f"{100 * v[0]:.1f} [{100 * v[1]:.1f}, {100 * v[2]:.1f}]")
            lines.append(f"| {stat} | " + " | ".join(cells) + " |")
        if self.risk_checks:
            lines += ["", "Stated-risk thresholds (chosen on the tune half's out-of-fold labels) measured on the test half:", ""]
            lines += ["| target | tune: guarantee | threshold | test % [95% CI] | holds |", "|---|---|---|---|---|"]
            lines += [c.row() for c in self.risk_checks]
        lines += ["", f"Guard: {self.guard.describe()}"]
        return "\n".join(lines)

    def _rule(self) -> str:
        if not math.isfinite(self.threshold):
            return (
                "Flag rule: n/a (no correct real answer of the tune half has a finite guard score to place the "
                "threshold; more answers, or a model that gets some right)."
            )
        where = f"quantile {self.quantile:.3f}" if math.isfinite(self.quantile) else "quantile n/a"
        return (
            f"Flag rule: guard_score < {self.threshold:.4f} (the highest threshold passing {self.pass_target:.0%} of the "
            f"tune half's correct real answers, out of fold), = {where} of the calibration profile."
        )


def evaluate_traffic(
    answers: Sequence[TrafficAnswer],
    calibration: Sequence[CachedGeneration],
    *,
    model: str,
    pass_target: float = 0.85,
    l2: float = 1.0,
    balance_groups: bool = False,
    folds: int = 5,
    n_boot: int = 1000,
    seed: int = 0,
) -> TrafficReport:
    """Fit on the tune half of ``answers``, report on the test half (``calibration``: the default
    calibration set answered the same way, for the profile the threshold is placed in)."""
    tune = [a for a in answers if a.question.split == "tune"]
    test = [a for a in answers if a.question.split == "test"]
    tune_rows, test_rows = _stats(tune, model), _stats(test, model)
    outcomes = [a.outcome for a in tune]
    fits = {
        name: fit_on_outcomes(
            tune_rows,
            outcomes,
            source="traffic-tune",
            features=f,
            l2=l2,
            folds=folds,
            seed=seed,
            balance_groups=balance_groups,
            max_tokens=SERVING.max_new_tokens,
        )
        for name, f in FEATURE_SETS.items()
    }
    thresholds = {
        name: choose_threshold(np.array(g.reference_scores.get("real-correct", [])), pass_target) for name, g in fits.items()
    }
    cv = {name: _mean_flagged(g.expected_flag_rates(thresholds[name])) for name, g in fits.items()}
    chosen = max(cv, key=lambda k: cv[k])
    guard, threshold = fits[chosen], thresholds[chosen]
    oof = {g: np.array(v) for g, v in guard.reference_scores.items()}  # out-of-fold tune scores by group
    cal_gens = [generation_from_cached(r, model) for r in calibration]
    profile: ModelProfile = build_profile(cal_gens, "default calibration set", guard)
    quantile = profile.percentile("guard_score", threshold)
    test_scored = [with_guard_score(r, guard) for r in test_rows]
    test_scores = np.array([r.guard_score for r in test_scored])
    test_outcomes = np.array([a.outcome for a in test])

    def flag_rate(scores: np.ndarray) -> Rate:
        return _rate(~(scores >= threshold), n_boot, seed)  # NaN counts as flagged (least reliable)

    contrasts: dict[str, dict[str, tuple[float, float, float]]] = {}
    for a, b in CONTRASTS:
        keep = (test_outcomes == a) | (test_outcomes == b)
        labels = test_outcomes[keep] == a
        table = {}
        for stat in REPORTED_STATS:
            sign = 1.0 if stat in HIGHER_IS_RELIABLE else -1.0
            values = np.array([sign * r.get(stat) for r in test_scored])[keep]
            table[stat] = _auroc_ci(values, labels, n_boot, seed) if labels.any() and (~labels).any() else (math.nan,) * 3
        contrasts[f"{a} vs {b}"] = table
    curve = _trade_off(test_scores, test_outcomes)
    categories = np.array([a.question.category for a in test])
    styles = np.array([STYLES.get(a.question.category, "") for a in test])
    by_category = {
        f"{o} / {c}": flag_rate(test_scores[(test_outcomes == o) & (categories == c)])
        for c in sorted({a.question.category for a in test if a.question.group == "real"})
        for o in ("real-correct", "real-wrong")
    }
    by_style: dict[str, tuple[float, float, float]] = {}
    for style in sorted(set(styles) - {""}):
        for o in ("real-correct", "real-wrong"):
            by_category[f"{o} / style {style}"] = flag_rate(test_scores[(test_outcomes == o) & (styles == style)])
        keep = (styles == style) & np.isin(test_outcomes, ["real-correct", "real-wrong"])
        labels = test_outcomes[keep] == "real-correct"
        if labels.any() and (~labels).any():
            by_style[style] = _auroc_ci(test_scores[keep], labels, n_boot, seed)
    counts = {
        half: {g: sum(1 for a in part if a.outcome == g) for g in OUTCOMES} for half, part in (("tune", tune), ("test", test))
    }
    return TrafficReport(
        model=model,
        feature_sets=cv,
        chosen=chosen,
        guard=guard,
        pass_target=pass_target,
        threshold=threshold,
        quantile=quantile,
        tune_rates={g: flag_rate(oof.get(g, np.array([]))) for g in OUTCOMES},
        test_rates={g: flag_rate(test_scores[test_outcomes == g]) for g in OUTCOMES},
        contrasts=contrasts,
        curve=curve,
        counts=counts,
        by_category=by_category,
        by_style=by_style,
        risk_checks=_risk_checks(guard, test_scores, test_outcomes, n_boot, seed),
    )


def _trade_off(scores: np.ndarray, outcomes: np.ndarray, points: int = 41) -> list[tuple[float, float, float]]:
    """(threshold, share of correct real answers passed, share of wrong ones flagged) over thresholds
    spread on the real answers' scores."""
    correct, wrong = scores[outcomes == "real-correct"], scores[outcomes == "real-wrong"]
    real = np.concatenate([correct, wrong])
    real = real[np.isfinite(real)]
    if correct.size == 0 or wrong.size == 0 or real.size == 0:
        return []
    return [
        (float(t), float(np.mean(correct >= t)), float(np.mean(~(wrong >= t))))
        for t in np.unique(np.quantile(real, np.linspace(0.0, 1.0, points)))
    ]


def write_traffic(report: TrafficReport, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """``traffic.md``, ``traffic.json``, the fitted guard ``traffic-guard.json`` and (``plots``, needs
    matplotlib) the correct-passed vs wrong-flagged trade-off ``traffic-trade-off.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js, guard = out / "traffic.md", out / "traffic.json", out / "traffic-guard.json"
    md.write_text(report.to_markdown() + "\n", encoding="utf-8")
    write_json(js, report.to_json())
    guard.write_text(report.guard.model_dump_json(indent=1), encoding="utf-8")
    files = [md, js, guard]
    if plots and report.curve:
        from logtoku_eval.plots import plot_trade_off

        point = (1.0 - report.test_rates["real-correct"].value, report.test_rates["real-wrong"].value)
        files.append(plot_trade_off(out / "traffic-trade-off.png", report.curve, point, "Real questions, test half"))
    return files
