"""The learned guard score: a small, transparent logistic regression over single-pass statistics.

``guard_score`` = predicted probability that an answer is correct (or its question is about
something the model knows), higher = more reliable. It combines a few statistics of
:class:`~logtoku_guard.scoring.stats.ResponseStats` (:data:`FEATURES`: answer reliability, EU and AU, the
question's own teacher-forced surprise, the answer length), each standardised with the mean
and standard deviation of the data it was fit on, with an L2 penalty. A statistic that is
undefined for an answer (NaN: an empty answer, a backend without prompt scores) takes the
fit data's mean, i.e. contributes nothing.

A :class:`GuardModel` keeps everything needed to read and audit it: features, means, stds,
coefficients, intercept, penalty, the data it was fit on (dataset names, n, positives) and
its cross-validated AUROC. It is saved inside the model's
:class:`~logtoku_guard.calibration.profiles.ModelProfile` (field ``guard``); a profile
without one (made by an older version) still loads, ``guard_score`` is then NaN and the
default policy falls back to reliability (:func:`logtoku_guard.decision.policy.default_policy`).

:func:`fit_guard` is deterministic for a seed (Newton iterations, no random start; the seed
only draws the cross-validation folds). :func:`with_guard_score` fills ``guard_score`` and
``reliability_debiased`` (reliability minus its least-squares fit on ``log(1 + n_tokens)``
over the fit data: higher = more reliable than answers of the same length).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np

    from logtoku_guard.scoring.stats import ResponseStats
    from logtoku_guard.types import Generation

__all__ = ["FEATURES", "GuardModel", "StatsLike", "auroc", "feature_matrix", "fit_guard", "ranking_arrays", "with_guard_score"]

FEATURES: tuple[str, ...] = (
    "reliability",
    "probability_reliability",
    "max_eu",
    "first_eu",
    "word_mean_eu",
    "max_au",
    "mean_au",
    "prompt_max_eu",
    "prompt_mean_eu",
    "prompt_mean_logprob",
    "prompt_min_logprob",
    "n_tokens",
)
"""Statistics the guard score combines (``n_tokens`` enters as ``log(1 + n_tokens)``).

The answer's AU (``max_au``, ``mean_au``) is in the list because the fabricated tune half's
cross-validated AUROC, the guard's own fit data, is 0.9975 with it and 0.9867 without
(RESULTS.md section 7 lists the other numbers seen before that choice). A :class:`GuardModel`
keeps its own feature list, so a guard fit on other features still scores with the ones it
was fit on."""


class GuardModel(BaseModel):
    """A fitted logistic regression ``P(reliable) = sigmoid(intercept + sum(coef * (x - mean) / std))``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    guard_version: int = 1
    features: list[str]
    means: list[float]
    stds: list[float]
    coef: list[float]
    intercept: float
    l2: float
    length_fit: list[float]
    """``[a, b]``: expected reliability ``a + b * log(1 + n_tokens)`` on the fit data."""
    datasets: list[str]
    n: int
    n_positive: int
    cv_auroc: float | None
    cv_folds: int
    seed: int
    created_at: str
    max_tokens: int | None = None
    """The answer length the fit data had at most (its answers' ``max_new_tokens``): a longer
    answer is scored on its first ``max_tokens`` tokens (:func:`with_guard_score` with the
    generation), so the guard never extrapolates in length. None: the whole answer."""
    balanced_groups: bool = False
    """Whether each group of the fit data was weighted to count equally (``fit_guard(balance_groups=True)``)."""
    reference_scores: dict[str, list[float]] = {}
    """Out-of-fold guard scores of the fit data by group (e.g. ``real-correct``, ``plausible``; or
    ``correct``/``incorrect``), so :meth:`expected_flag_rates` can say what a threshold flags."""
    reference_labels: dict[str, bool] = {}
    """Whether each reference group's answers were right (True) or wrong (False); a group of
    mixed labels is left out. With it, a threshold can be chosen for a stated risk
    (:mod:`logtoku_guard.scoring.risk`)."""

    def labelled_scores(self) -> tuple[list[float], list[float]]:
        """The out-of-fold scores of the right answers and of the wrong ones (empty without labels)."""
        correct: list[float] = []
        wrong: list[float] = []
        for group, scores in self.reference_scores.items():
            if group in self.reference_labels:
                (correct if self.reference_labels[group] else wrong).extend(scores)
        return correct, wrong

    def expected_flag_rates(self, threshold: float) -> dict[str, float]:
        """Share of each reference group that a rule ``guard_score < threshold`` flags (empty without references)."""
        return {
            group: sum(1 for v in scores if not v >= threshold) / len(scores)
            for group, scores in self.reference_scores.items()
            if scores
        }

    def predict(self, x: Sequence[float]) -> float:
        """``guard_score`` of one raw feature vector (in :attr:`features` order; NaN = the mean)."""
        z = self.intercept
        for v, m, s, c in zip(x, self.means, self.stds, self.coef):
            if math.isfinite(v):
                z += c * (v - m) / s
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def describe(self) -> str:
        """One line per feature: its weight on the standardised scale (sign = direction)."""
        terms = ", ".join(f"{f} {c:+.2f}" for f, c in zip(self.features, self.coef))
        cv = f"CV AUROC {self.cv_auroc:.3f}" if self.cv_auroc is not None else "no CV"
        return f"logistic regression on {', '.join(self.datasets)} (n={self.n}, {cv}): {terms}"


class StatsLike(Protocol):
    """What a fit reads of one answer: each statistic by name, its reliability and its length
    (a :class:`~logtoku_guard.scoring.stats.ResponseStats`, or the statistics an audit record kept)."""

    def get(self, name: str) -> float: ...

    @property
    def reliability(self) -> float: ...

    @property
    def n_tokens(self) -> float: ...


def _value(stats: StatsLike, name: str) -> float:
    v = stats.get(name)
    return math.log1p(v) if name == "n_tokens" and math.isfinite(v) else v


def feature_matrix(rows: Sequence[StatsLike], features: Sequence[str] = FEATURES) -> np.ndarray:
    """``(n, len(features))`` raw feature values (NaN kept)."""
    import numpy as np

    return np.array([[_value(r, f) for f in features] for r in rows], dtype=np.float64).reshape(len(rows), len(features))


def ranking_arrays(
    scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``scores`` as float64 with NaN as ``-inf`` (the least reliable, never dropped) and
    ``labels`` as booleans (True = positive), checked: the same length, labels booleans or 0/1."""
    import numpy as np

    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    if s.shape != y.shape:
        msg = f"scores and labels must have the same length, got {s.size} and {y.size}"
        raise ConfigurationError(msg)
    if y.dtype != np.bool_:
        if not np.isin(y, (0, 1)).all():
            msg = "labels must be booleans (True = correct) or 0/1"
            raise ConfigurationError(msg)
        y = y.astype(bool)
    return np.where(np.isnan(s), -np.inf, s), y


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for ``labels`` (True = positive): the Mann-Whitney U
    statistic from average ranks, O(n log n), ties counting one half; NaN scores rank lowest.
    NaN when only one class is present (:func:`ranking_arrays` checks the inputs)."""
    import numpy as np

    s, y = ranking_arrays(scores, labels)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse.ravel()]  # 1-based, ties at their average rank
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    means = np.array([np.nanmean(c) if np.isfinite(c).any() else 0.0 for c in x.T])
    filled = np.where(np.isfinite(x), x, means)
    stds = filled.std(axis=0)
    stds = np.where(stds > 1e-12, stds, 1.0)
    return (filled - means) / stds, means, stds


def _newton(z: np.ndarray, y: np.ndarray, l2: float, weights: np.ndarray | None = None, iterations: int = 100) -> np.ndarray:
    """L2-penalised, optionally row-weighted logistic regression (intercept unpenalised) by Newton's method."""
    import numpy as np

    r = np.ones(z.shape[0]) if weights is None else weights
    design = np.hstack([np.ones((z.shape[0], 1)), z])
    w = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -700, 700)))
        grad = design.T @ (r * (p - y)) + penalty * w
        hess = (design * (r * p * (1 - p))[:, None]).T @ design + np.diag(penalty) + 1e-9 * np.eye(design.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-10:
            break
    return w


def _fit_arrays(
    x: np.ndarray, y: np.ndarray, l2: float, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z, means, stds = _standardise(x)
    return _newton(z, y, l2, weights), means, stds


def _predict_arrays(x: np.ndarray, w: np.ndarray, means: np.ndarray, stds: np.ndarray) -> np.ndarray:
    import numpy as np

    z = (np.where(np.isfinite(x), x, means) - means) / stds
    return 1.0 / (1.0 + np.exp(-np.clip(w[0] + z @ w[1:], -700, 700)))


def fit_guard(
    rows: Sequence[StatsLike],
    labels: Sequence[bool],
    datasets: Sequence[str],
    *,
    features: Sequence[str] = FEATURES,
    l2: float = 1.0,
    folds: int = 5,
    seed: int = 0,
    groups: Sequence[str] | None = None,
    balance_groups: bool = False,
    max_tokens: int | None = None,
) -> GuardModel:
    """Fit the guard on ``rows`` (one per labelled answer; ``labels``: True = correct/known).

    ``datasets`` names what the rows came from (kept in the model). The reported CV AUROC is
    from ``folds``-fold stratified cross-validation (folds drawn with ``seed``); its out-of-fold
    scores are kept by ``groups`` (one name per row; default ``correct``/``incorrect`` by label)
    in :attr:`GuardModel.reference_scores`. ``balance_groups``: weight each row by
    ``n / (n_groups * size of its group)``, so every group counts as much in the fit whatever
    its size (a small group such as wrong answers to real questions is not drowned out).
    ``max_tokens``: the most tokens the fit data's answers could have (kept in the model).
    """
    import numpy as np

    y = np.asarray(labels, dtype=np.float64)
    if len(rows) != y.size:
        msg = f"fit_guard needs one label per row, got {len(rows)} rows and {y.size} labels"
        raise ConfigurationError(msg)
    n_pos = int(y.sum())
    if n_pos < 2 or y.size - n_pos < 2:
        msg = f"fit_guard needs at least 2 correct and 2 incorrect labelled answers, got {n_pos} and {y.size - n_pos}"
        raise ConfigurationError(msg)
    if not l2 >= 0:
        msg = f"l2 must be >= 0, got {l2!r}"
        raise ConfigurationError(msg)
    if groups is not None and len(groups) != y.size:
        msg = f"fit_guard needs one group per row, got {len(groups)} groups for {y.size} rows"
        raise ConfigurationError(msg)
    if balance_groups and groups is None:
        msg = "balance_groups needs groups (one group name per row)"
        raise ConfigurationError(msg)
    weights = None
    if balance_groups and groups is not None:
        sizes = {g: list(groups).count(g) for g in set(groups)}
        weights = np.array([y.size / (len(sizes) * sizes[g]) for g in groups])
    x = feature_matrix(rows, features)
    w, means, stds = _fit_arrays(x, y, l2, weights)
    oof = _cross_validate(x, y, l2, folds, seed, weights) if folds >= 2 else None
    cv = auroc(oof, y.astype(bool)) if oof is not None else None
    reference: dict[str, list[float]] = {}
    seen: dict[str, set[bool]] = {}
    if oof is not None:
        names = list(groups) if groups is not None else ["correct" if v else "incorrect" for v in y]
        for name, v, label in zip(names, oof.tolist(), y.tolist()):
            # exact, never rounded: a threshold is placed on these very values, and a rounded one can sit
            # just above the live score of an answer identical to its reference (issue 43, N4)
            reference.setdefault(name, []).append(float(v))
            seen.setdefault(name, set()).add(bool(label))
    rel = np.array([r.reliability for r in rows])
    n_log = np.log1p(np.array([r.n_tokens for r in rows]))
    ok = np.isfinite(rel) & np.isfinite(n_log)
    if ok.sum() >= 2 and float(np.ptp(n_log[ok])) > 0:
        length_fit = [float(v) for v in np.polyfit(n_log[ok], rel[ok], 1)[::-1]]
    else:  # one length only: the expected reliability is the mean
        length_fit = [float(rel[ok].mean()) if ok.any() else 0.0, 0.0]
    return GuardModel(
        features=list(features),
        means=[float(v) for v in means],
        stds=[float(v) for v in stds],
        coef=[float(v) for v in w[1:]],
        intercept=float(w[0]),
        l2=float(l2),
        length_fit=length_fit,
        datasets=sorted(set(datasets)),
        n=int(y.size),
        n_positive=n_pos,
        cv_auroc=cv,
        cv_folds=folds,
        seed=seed,
        created_at=datetime.now(timezone.utc).isoformat(),
        max_tokens=max_tokens,
        balanced_groups=weights is not None,
        reference_scores=reference,
        reference_labels={name: labels.pop() for name, labels in seen.items() if len(labels) == 1},
    )


def _cross_validate(
    x: np.ndarray, y: np.ndarray, l2: float, folds: int, seed: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Each row's prediction from a fit on the other stratified folds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fold = np.empty(y.size, dtype=int)
    for cls in (0.0, 1.0):
        idx = np.flatnonzero(y == cls)
        fold[rng.permutation(idx)] = np.arange(idx.size) % folds
    pred = np.empty(y.size)
    for f in range(folds):
        test = fold == f
        w, means, stds = _fit_arrays(x[~test], y[~test], l2, None if weights is None else weights[~test])
        pred[test] = _predict_arrays(x[test], w, means, stds)
    return pred


def with_guard_score(stats: ResponseStats, guard: GuardModel | Any | None, generation: Generation | None = None) -> ResponseStats:
    """``stats`` with ``guard_score`` and ``reliability_debiased`` filled from ``guard``.

    Both stay NaN (undefined) when the answer's reliability is: an empty answer or NaN token
    scores give the guard nothing to predict from, and a policy then reads them as the least
    reliable value instead of a score made of the fit data's means.

    ``generation``: the answer ``stats`` were computed from; when it is longer than the guard's
    :attr:`~GuardModel.max_tokens`, the guard score is computed from the statistics of its first
    ``max_tokens`` tokens (the length the guard was fit on), the rest of ``stats`` unchanged.

    ``guard``: a :class:`GuardModel`, or a profile holding one in ``.guard`` (None, or a
    profile without one: ``stats`` unchanged, both stay NaN).
    """
    model = guard if isinstance(guard, GuardModel) or guard is None else getattr(guard, "guard", None)
    if model is None:
        return stats
    if not math.isfinite(stats.reliability):  # an empty answer or NaN token scores: nothing to predict from
        return dataclasses.replace(stats, guard_score=math.nan, reliability_debiased=math.nan)
    basis = stats
    if generation is not None and model.max_tokens is not None and len(generation.tokens) > model.max_tokens:
        from logtoku_guard.scoring.stats import ResponseStats

        basis = ResponseStats.from_tokens(
            generation.tokens[: model.max_tokens],
            generation.top_n,
            prompt_tokens=generation.prompt_scores,
            question=generation.prompt,
        )
    x = [_value(basis, f) for f in model.features]
    a, b = model.length_fit
    n = stats.n_tokens
    debiased = stats.reliability - (a + b * math.log1p(n)) if math.isfinite(n) else math.nan
    return dataclasses.replace(stats, guard_score=model.predict(x), reliability_debiased=debiased)
