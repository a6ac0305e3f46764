"""Cross-fitted guard scores: every answer scored by a guard that never saw its label.

Why cross-fit. The shipped guard (:func:`~logtoku_guard.calibration.guard_fit.shipped_guard`)
is fit on invented-entity questions (the tune half of the known-vs-fabricated benchmark).
Applied to TruthfulQA or NQ-open it is judged on a kind of data it never saw: that measures
how its weights transfer (reported as the separate method ``guard-score-shipped``), not what
the learned combination can do on the domain. Fitting on the evaluated answers themselves
would score each answer with a model that saw its label (in-sample, optimistic). Cross-fitting
does neither: the answers are cut into ``folds`` folds by a seeded permutation of their
positions (the folds never depend on the labels), and each fold is scored by
:func:`~logtoku_guard.scoring.guard_score.fit_guard` fit on the other folds' answers of the **same
dataset** with the **same judge's** labels, nothing else (no fabricated questions pooled in:
on TruthfulQA the question's own log-probability ranks the other way round). Each answer's
score comes from a model that never saw it, so the pooled out-of-fold AUROC estimates the
procedure "fit the guard on (k-1)/k of this domain's labelled answers", with k slightly
different models behind the numbers.

Degenerate folds never raise: :func:`~logtoku_guard.scoring.guard_score.fit_guard` needs at least
:data:`MIN_PER_CLASS` correct and incorrect training answers; a fold whose training part has
fewer is scored NaN (the metrics rank NaN least reliable; the guard replay never retrieves
on NaN) and :attr:`CrossFit.skipped` says why.

Scores: higher = more reliable (the predicted probability that the answer is correct).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from logtoku_eval.fabricated_eval import STAT_METHODS
from logtoku_eval.methods import Method
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import GuardModel, fit_guard, with_guard_score
from logtoku_guard.scoring.stats import ResponseStats

__all__ = [
    "GUARD_SCORE",
    "GUARD_SCORE_SHIPPED",
    "MIN_PER_CLASS",
    "CrossFit",
    "cross_fit_guard",
    "guard_scores",
    "plain_stat_methods",
    "plain_stat_scores",
    "shipped_scores",
]

MIN_PER_CLASS = 2
"""Correct and incorrect training answers a fold needs (what :func:`fit_guard` requires)."""

GUARD_SCORE = Method(
    "guard-score", "logtoku", "learned guard score, cross-fitted: each fold fit on the other folds' judged answers"
)
GUARD_SCORE_SHIPPED = Method(
    "guard-score-shipped", "logtoku", "the shipped guard score (fit on the fabricated tune half), applied as-is"
)
_NEEDS_GUARD = ("guard-score", "reliability-debiased")


@dataclass(frozen=True)
class CrossFit:
    """Out-of-fold guard scores of ``n`` answers.

    ``scores``: ``(n,)`` float64, higher = more reliable, NaN where the answer's fold could not
    be fit; ``fold``: ``(n,)`` the fold of each answer; ``guards``: the model of each fold
    (None: empty or skipped); ``skipped``: one reason per skipped fold.
    """

    scores: np.ndarray
    fold: np.ndarray
    folds: int
    seed: int
    guards: tuple[GuardModel | None, ...]
    skipped: tuple[str, ...]

    @property
    def n_fitted(self) -> int:
        return sum(g is not None for g in self.guards)

    def mean_weights(self) -> dict[str, float]:
        """Each feature's standardised weight averaged over the fitted folds (sign = direction)."""
        fitted = [g for g in self.guards if g is not None]
        if not fitted:
            return {}
        coef = np.mean([g.coef for g in fitted], axis=0)
        return {f: float(c) for f, c in zip(fitted[0].features, coef)}

    def describe(self, labels: str = "this judge's labels") -> str:
        """One paragraph: how it was fit (on ``labels``), the mean weights, every skipped fold's reason."""
        weights = ", ".join(f"{f} {c:+.2f}" for f, c in self.mean_weights().items())
        text = (
            f"guard-score is cross-fitted: {self.folds} folds (seeded permutation, seed {self.seed}), each answer "
            f"scored by the guard fit on the other folds' answers and {labels}, never on its own; "
            f"{self.n_fitted} fold fits"
        )
        text += f", mean standardised weights: {weights}." if weights else "."
        if self.skipped:
            text += " Scored NaN: " + "; ".join(self.skipped) + "."
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "seed": self.seed,
            "n_fitted": self.n_fitted,
            "mean_weights": self.mean_weights(),
            "skipped": list(self.skipped),
        }


def cross_fit_guard(
    rows: Sequence[ResponseStats],
    labels: Sequence[bool] | np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
    dataset: str = "evaluated answers",
    l2: float = 1.0,
) -> CrossFit:
    """Score each row with the guard fit on the other folds (see the module docstring).

    ``rows``: one :class:`ResponseStats` per answer (e.g. from
    :func:`~logtoku_eval.fabricated_eval.stats_from_cached`); ``labels``: True =
    correct. Deterministic for a seed. ``folds`` >= 2; with fewer answers than folds some
    folds are empty (nothing to score there).
    """
    y = np.asarray(labels, dtype=bool)
    if y.shape != (len(rows),):
        msg = f"cross_fit_guard needs one label per row, got {len(rows)} rows and labels of shape {y.shape}"
        raise ConfigurationError(msg)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        msg = f"folds must be an integer >= 2, got {folds!r}; to turn the cross-fitted guard score off, skip it (--guard-folds 0)"
        raise ConfigurationError(msg)
    n = y.size
    fold = np.random.default_rng(seed).permutation(n) % folds
    scores = np.full(n, np.nan)
    guards: list[GuardModel | None] = []
    skipped: list[str] = []
    for f in range(folds):
        test = np.flatnonzero(fold == f)
        train = np.flatnonzero(fold != f)
        n_pos = int(y[train].sum())
        n_neg = train.size - n_pos
        if test.size == 0:
            guards.append(None)
            continue
        if min(n_pos, n_neg) < MIN_PER_CLASS:
            skipped.append(
                f"fold {f} ({test.size} answers): the other folds hold {n_pos} correct and {n_neg} incorrect answers, "
                f"the guard needs at least {MIN_PER_CLASS} of each (more answers, or fewer --guard-folds)"
            )
            guards.append(None)
            continue
        train_rows = [rows[i] for i in train.tolist()]
        guard = fit_guard(train_rows, y[train].tolist(), [f"{dataset}, folds != {f}"], l2=l2, folds=0, seed=seed)
        guards.append(guard)
        scores[test] = [with_guard_score(rows[i], guard).guard_score for i in test.tolist()]
    return CrossFit(scores, fold, folds, seed, tuple(guards), tuple(skipped))


def shipped_scores(rows: Sequence[ResponseStats], model: str, k: int = 2, evidence: str = "clamped") -> np.ndarray | None:
    """The shipped guard of ``model`` applied as-is to each row, or None when none is shipped."""
    from logtoku_guard.calibration.guard_fit import shipped_guard

    guard = shipped_guard(model, k, evidence)
    if guard is None:
        return None
    return np.array([with_guard_score(r, guard).guard_score for r in rows], dtype=np.float64)


def plain_stat_methods() -> list[Method]:
    """The :data:`~logtoku_eval.fabricated_eval.STAT_METHODS` that need no fitted guard."""
    return [m for m, _, _ in STAT_METHODS if m.name not in _NEEDS_GUARD]


def plain_stat_scores(rows: Sequence[ResponseStats]) -> dict[str, np.ndarray]:
    """Those methods' scores (higher = more reliable); a statistic NaN for every row is left out
    (a cache without prompt scores has no ``prompt-*`` statistics)."""
    out = {}
    for m, stat, sign in STAT_METHODS:
        if m.name in _NEEDS_GUARD:
            continue
        s = np.array([sign * r.get(stat) for r in rows], dtype=np.float64)
        if np.isfinite(s).any():
            out[m.name] = s
    return out


def guard_scores(
    rows: Sequence[ResponseStats],
    labels: Sequence[bool] | np.ndarray,
    *,
    model: str,
    folds: int,
    seed: int = 0,
    dataset: str = "evaluated answers",
) -> tuple[dict[str, np.ndarray], list[str], CrossFit | None]:
    """``guard-score`` (cross-fitted; absent when ``folds == 0``) and ``guard-score-shipped``
    (absent when ``model`` has no shipped guard), with the notes that explain them."""
    scores: dict[str, np.ndarray] = {}
    notes: list[str] = []
    fit = None
    if folds:
        fit = cross_fit_guard(rows, labels, folds=folds, seed=seed, dataset=dataset)
        scores[GUARD_SCORE.name] = fit.scores
        notes.append(fit.describe())
    shipped = shipped_scores(rows, model)
    if shipped is not None:
        scores[GUARD_SCORE_SHIPPED.name] = shipped
        notes.append(
            "guard-score-shipped is the guard shipped for this model (fit on the fabricated tune half only), "
            "applied as-is: how invented-entity weights transfer to this dataset."
        )
    return scores, notes, fit
