"""How far can any guard built on the single-pass statistics go on a judged dataset?

Issue 12's TruthfulQA target (guard_score AUROC >= 0.65 under the embedding judge) was missed
by every guard tried (RESULTS.md section 7). This script asks whether *any* combination of the
statistics the guard can see could reach it, on the answers and labels that ``logtoku-guard
eval truthfulqa|nq-open`` wrote (``<out-dir>/<dataset>.json``: each answer's id and its label
under each judge) and the generation cache the eval filled (the statistics are re-scored from
the cached logits exactly as the eval does: K = 2, clamped evidence):

* every statistic alone, its direction chosen on these labels (so slightly optimistic);
* **in-sample fit**: the guard's logistic regression on all 14 statistics, fit on the very
  labels it is scored on: optimistic (a guard fit on other answers is expected to do worse),
  a reference for what a linear guard could reach at best, not a result. (Not a strict bound:
  the fit maximises the likelihood, not the AUROC, and can sit below the best statistic);
* **flexible models, cross-validated** (scikit-learn, stratified 5-fold, 3 seeds): random
  forest, gradient boosting, and logistic regression on all pairwise products. Honest
  estimates of what a non-linear guard would reach;
* **judge agreement**: share of answers two judges label alike, and Cohen's kappa (how much of
  the label is the judge rather than the answer).

    python benchmarks/guard_score/ceiling.py --results results/truthfulqa-817/truthfulqa.json \\
        --dataset truthfulqa --cache-dir results/cache

Needs scikit-learn (``pip install -e ".[bench]"``; ``scripts/install.sh --dev`` installs it).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from logtoku_eval.fabricated_eval import stats_from_cached
from logtoku_eval.generate import GreedySpec, greedy_cache
from logtoku_eval.metrics import Interval, bootstrap_ci
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import FEATURES, auroc, feature_matrix, fit_guard, with_guard_score
from logtoku_guard.scoring.stats import ResponseStats

ALL_FEATURES: tuple[str, ...] = (*FEATURES, "mean_eu", "first_max_eu")
"""The guard's 12 features and the 2 other per-answer statistics of :class:`ResponseStats`."""

MAX_RESULTS_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Judged:
    """The evaluated answers: their ids, statistics and each judge's labels (True = correct)."""

    ids: list[str]
    rows: list[ResponseStats]
    labels: dict[str, np.ndarray]


@dataclass(frozen=True)
class Ceiling:
    """What one judge's labels allow (AUROC in [0, 1])."""

    judge: str
    n: int
    n_correct: int
    single: dict[str, tuple[float, int]]
    """statistic -> (AUROC in its better direction, +1 if higher means correct else -1)."""
    in_sample: Interval
    flexible: dict[str, list[float]]
    """model -> cross-validated AUROC per seed."""


def load_judged(results: Path, cache_dir: Path, dataset: str, model: str = EMBEDDED_MODEL) -> Judged:
    """Read the eval's answers and labels, and each answer's statistics from the generation cache."""
    if not results.is_file():
        msg = f"no eval results at {results}; run `logtoku-guard eval {dataset} --out-dir ...` first"
        raise ConfigurationError(msg)
    if results.stat().st_size > MAX_RESULTS_BYTES:
        msg = f"{results} is over {MAX_RESULTS_BYTES >> 20} MiB; give the <dataset>.json that `logtoku-guard eval` wrote"
        raise ConfigurationError(msg)
    try:
        answers = json.loads(results.read_text(encoding="utf-8"))["answers"]
        pairs = [(str(a["id"]), {str(j): bool(v) for j, v in a["labels"].items()}) for a in answers]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"{results} is not an eval results file (needs answers[].id and answers[].labels): {exc!r}"
        raise ConfigurationError(msg) from exc
    if not pairs:
        msg = f"{results} holds no answers"
        raise ConfigurationError(msg)
    cache = greedy_cache(cache_dir, model, dataset, GreedySpec())
    missing = [rid for rid, _ in pairs if rid not in cache]
    if missing:
        msg = (
            f"{len(missing)} answers of {results} are not in the generation cache {cache.path} (first: {missing[0]!r}); "
            f"give the --cache-dir the eval used"
        )
        raise ConfigurationError(msg)
    judges = list(pairs[0][1])
    if any(list(labels) != judges for _, labels in pairs):
        msg = f"{results}: the answers are not all labelled by the same judges ({judges})"
        raise ConfigurationError(msg)
    rows = [stats_from_cached(cache.get(rid)) for rid, _ in pairs]  # type: ignore[arg-type]
    labels = {j: np.array([lab[j] for _, lab in pairs], dtype=bool) for j in judges}
    return Judged([rid for rid, _ in pairs], rows, labels)


def single_statistics(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[float, int]]:
    out = {}
    for i, name in enumerate(ALL_FEATURES):
        column = x[:, i]
        if not np.isfinite(column).any():
            continue
        a = auroc(column, y)
        out[name] = (a, 1) if a >= 0.5 else (auroc(-column, y), -1)
    return out


def in_sample_fit(rows: Sequence[ResponseStats], y: np.ndarray, *, n_boot: int, seed: int) -> Interval:
    """AUROC of the guard's logistic regression on all statistics, fit on these very labels."""
    guard = fit_guard(rows, y.tolist(), ["in-sample fit"], features=ALL_FEATURES, folds=0, seed=seed)
    scores = np.array([with_guard_score(r, guard).guard_score for r in rows])
    return bootstrap_ci(auroc, scores, y, n_boot=n_boot, seed=seed)


def flexible_cv(x: np.ndarray, y: np.ndarray, *, seeds: Sequence[int] = (0, 1, 2), folds: int = 5) -> dict[str, list[float]]:
    """Out-of-fold AUROC of three non-linear models (stratified ``folds``-fold, one split per seed)."""
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_predict
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import PolynomialFeatures, StandardScaler
    except ImportError as exc:
        msg = 'the flexible models need scikit-learn: pip install -e ".[bench]" (or run with --no-flexible)'
        raise ConfigurationError(msg) from exc
    means = np.array([np.nanmean(c) if np.isfinite(c).any() else 0.0 for c in x.T])
    filled = np.where(np.isfinite(x), x, means)
    folds = min(folds, int(y.sum()), int((~y).sum()))
    if folds < 2:
        msg = f"cross-validation needs at least 2 correct and 2 incorrect answers, got {int(y.sum())} and {int((~y).sum())}"
        raise ConfigurationError(msg)
    out: dict[str, list[float]] = {}
    for seed in seeds:
        models = {
            "random forest (400 trees, leaves >= 10)": RandomForestClassifier(
                n_estimators=400, min_samples_leaf=10, random_state=seed, n_jobs=1
            ),
            "gradient boosting (depth 3, 150 rounds)": HistGradientBoostingClassifier(
                max_depth=3, learning_rate=0.05, max_iter=150, random_state=seed
            ),
            "logistic regression, pairwise products": make_pipeline(
                StandardScaler(), PolynomialFeatures(2), StandardScaler(), LogisticRegression(C=0.05, max_iter=5000)
            ),
        }
        split = StratifiedKFold(folds, shuffle=True, random_state=seed)
        for name, model in models.items():
            p = cross_val_predict(model, filled, y, cv=split, method="predict_proba")[:, 1]
            out.setdefault(name, []).append(auroc(p, y))
    return out


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Share of answers two judges label alike, and Cohen's kappa (NaN when chance agreement is 1)."""
    observed = float((a == b).mean())
    chance = float(a.mean() * b.mean() + (1 - a.mean()) * (1 - b.mean()))
    return observed, (observed - chance) / (1 - chance) if chance < 1 else math.nan


def ceilings(judged: Judged, *, n_boot: int, seed: int, flexible: bool) -> list[Ceiling]:
    x = feature_matrix(judged.rows, ALL_FEATURES)
    out = []
    for judge, y in judged.labels.items():
        bound = in_sample_fit(judged.rows, y, n_boot=n_boot, seed=seed)
        flex = flexible_cv(x, y) if flexible else {}
        out.append(Ceiling(judge, y.size, int(y.sum()), single_statistics(x, y), bound, flex))
    return out


def to_markdown(found: Sequence[Ceiling], judged: Judged) -> str:
    lines = []
    for c in found:
        best = max(c.single.items(), key=lambda kv: kv[1][0])
        lines += [
            f"### judge {c.judge}: {c.n} answers, {c.n_correct} correct ({100 * c.n_correct / c.n:.1f}%)",
            "",
            "| | AUROC % |",
            "|---|---|",
            f"| best single statistic (`{best[0]}`, direction chosen on these labels) | {100 * best[1][0]:.2f} |",
        ]
        for name, values in c.flexible.items():
            v = 100 * np.array(values)
            lines.append(f"| {name}, cross-validated (seeds: {', '.join(f'{a:.2f}' for a in v)}) | {v.mean():.2f} |")
        b = c.in_sample
        lines += [
            f"| **in-sample fit** (optimistic): logistic regression on all {len(ALL_FEATURES)} statistics, fit on these labels "
            f"| **{100 * b.value:.2f}** [{100 * b.low:.1f}, {100 * b.high:.1f}] |",
            "",
            "Every statistic alone: "
            + ", ".join(f"`{k}` {100 * a:.1f}{'+' if s > 0 else '-'}" for k, (a, s) in c.single.items())
            + " (+: higher means correct).",
            "",
        ]
    judges = list(judged.labels)
    for i, a in enumerate(judges):
        for b_name in judges[i + 1 :]:
            share, kappa = agreement(judged.labels[a], judged.labels[b_name])
            lines.append(f"Judges {a} and {b_name} agree on {100 * share:.1f}% of the answers (Cohen's kappa {kappa:.2f}).")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--results", type=Path, required=True, help="the <dataset>.json that `logtoku-guard eval` wrote")
    ap.add_argument("--dataset", required=True, help="the eval's dataset name: truthfulqa or nq-open")
    ap.add_argument("--cache-dir", type=Path, default=Path("results/cache"), help="the eval's generation cache")
    ap.add_argument("--model", default=EMBEDDED_MODEL)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-flexible", dest="flexible", action="store_false", help="skip the scikit-learn models")
    args = ap.parse_args(argv)
    judged = load_judged(args.results, args.cache_dir, args.dataset, args.model)
    return to_markdown(ceilings(judged, n_boot=args.n_boot, seed=args.seed, flexible=args.flexible), judged)


if __name__ == "__main__":
    print(main(), end="")
