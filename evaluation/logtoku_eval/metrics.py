"""Selective-prediction metrics (numpy only): does a reliability score rank correct answers first?

Conventions: ``scores`` are reliabilities (higher = more reliable); ``labels`` are True for a
correct answer, the positive class of AUROC and AUPRC. A NaN score (an empty answer, or raw
evidence mode outside its domain) is never dropped: it ranks as the least reliable of all
(the same as ``-inf``), and reports count it.

* AUROC: the probability that a random correct answer scores above a random incorrect one
  (ties count one half): the Mann-Whitney U statistic. One implementation, the core's
  (:func:`logtoku_guard.scoring.guard_score.auroc`, which the guard's fit reports too), used here.
* AUPRC: average precision of retrieving the correct answers by score, ties grouped
  (``sum_k (R_k - R_{k-1}) P_k`` over the distinct score thresholds, as scikit-learn).
* Risk-coverage: keep the ``k`` most reliable answers, ``k = 1..n``; risk = their error
  rate, coverage = ``k / n``. Tied scores share their errors evenly (the expectation over
  orderings of the tie). AURC = mean risk over the ``n`` coverages (lower is better).
* PRR (prediction rejection ratio): ``(AURC_random - AURC) / (AURC_random - AURC_oracle)``
  where AURC_random is the base error rate (a random order's expected risk at every
  coverage) and the oracle ranks every correct answer first: 1 = oracle, 0 = random,
  negative = worse than random.
* Bootstrap: resample the answers with replacement (``n_boot`` times, a seeded
  ``numpy.random.default_rng``); percentile intervals. Resamples where a metric is undefined
  (one class only) are skipped and counted. The paired bootstrap applies the same resamples
  to two methods and reports the difference, its interval and a two-sided p-value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import auroc, ranking_arrays

ArrayLike = Sequence[float] | Sequence[bool] | np.ndarray
MetricFn = Callable[[np.ndarray, np.ndarray], float]

_prepare = ranking_arrays
"""Scores (NaN as ``-inf``) and boolean labels, checked (the core's, as :func:`auroc` reads them)."""


def roc_curve(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(fpr, tpr)`` at every distinct threshold, from (0, 0) to (1, 1)."""
    s, y = _prepare(scores, labels)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(s[1:] != s[:-1]), s.size - 1] if s.size else np.array([], dtype=int)
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    n_pos, n_neg = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fp / n_neg], np.r_[0.0, tp / n_pos]


def auprc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Average precision of finding the correct answers by descending score; NaN with no correct one."""
    s, y = _prepare(scores, labels)
    n_pos = int(y.sum())
    if n_pos == 0 or y.size == 0:
        return math.nan
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(s[1:] != s[:-1]), s.size - 1]
    tp = np.cumsum(y)[last].astype(np.float64)
    k = (last + 1).astype(np.float64)
    precision = tp / k
    recall = tp / n_pos
    gains = np.diff(np.r_[0.0, recall])
    return float((gains * precision).sum())


def risk_coverage(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage, risk)`` for keeping the k most reliable answers, k = 1..n (ties averaged)."""
    s, y = _prepare(scores, labels)
    n = s.size
    if n == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    err = (~y[order]).astype(np.float64)
    # Spread each tie group's errors evenly: the expected risk over orderings of the tie.
    _, inverse = np.unique(-s_sorted, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=err)
    counts = np.bincount(inverse.ravel())
    err = (sums / counts)[inverse.ravel()]
    k = np.arange(1, n + 1, dtype=np.float64)
    return k / n, np.cumsum(err) / k


def aurc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the risk-coverage curve (mean risk over the n coverages); lower = better."""
    _, risk = risk_coverage(scores, labels)
    return float(risk.mean()) if risk.size else math.nan


def prr(scores: ArrayLike, labels: ArrayLike) -> float:
    """Prediction rejection ratio: 1 = oracle ranking, 0 = random, < 0 worse than random."""
    s, y = _prepare(scores, labels)
    if y.all() or not y.any():
        return math.nan
    random = float((~y).mean())
    oracle = aurc(y.astype(np.float64), y)
    return (random - aurc(s, y)) / (random - oracle)


METRICS: dict[str, MetricFn] = {"auroc": auroc, "auprc": auprc, "prr": prr, "aurc": aurc}
"""Every metric by name; all higher = better except ``aurc``."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval."""

    value: float
    low: float
    high: float
    n_boot: int
    n_valid: int

    def to_json(self) -> dict[str, Any]:
        return {
            "value": _j(self.value),
            "low": _j(self.low),
            "high": _j(self.high),
            "n_boot": self.n_boot,
            "n_valid": self.n_valid,
        }


@dataclass(frozen=True)
class PairedDifference:
    """``metric(a) - metric(b)`` on the same resamples: interval and two-sided p-value."""

    diff: float
    low: float
    high: float
    p_value: float
    n_boot: int
    n_valid: int

    def to_json(self) -> dict[str, Any]:
        return {
            "diff": _j(self.diff),
            "low": _j(self.low),
            "high": _j(self.high),
            "p_value": _j(self.p_value),
            "n_boot": self.n_boot,
            "n_valid": self.n_valid,
        }


def _j(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _check_boot(n_boot: int, level: float) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        msg = f"n_boot must be a positive integer, got {n_boot!r}; e.g. 1000"
        raise ConfigurationError(msg)
    if not 0.0 < level < 1.0:
        msg = f"confidence level must be in (0, 1), got {level!r}; e.g. 0.95"
        raise ConfigurationError(msg)


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """``(n_boot, n)`` resampling indices from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_ci(
    metric: MetricFn, scores: ArrayLike, labels: ArrayLike, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> Interval:
    """Point estimate of ``metric`` and its percentile bootstrap interval (deterministic per seed)."""
    _check_boot(n_boot, level)
    s, y = _prepare(scores, labels)
    point = metric(s, y)
    values = np.array([metric(s[i], y[i]) for i in bootstrap_indices(s.size, n_boot, seed)]) if s.size else np.zeros(0)
    return percentile_interval(point, values, n_boot, level)


def share_ci(flags: ArrayLike, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """The share of true values in ``flags`` (e.g. answers flagged) with its bootstrap interval;
    NaN for an empty array."""
    x = np.asarray(flags, dtype=np.float64)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, n_boot, 0)
    return bootstrap_ci(lambda v, _y: float(np.mean(v)), x, np.zeros(x.size, dtype=bool), n_boot=n_boot, seed=seed, level=level)


def bootstrap_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """``(n_boot, n)`` multiplicities of each answer in each resample (same draws as :func:`bootstrap_indices`)."""
    idx = bootstrap_indices(n, n_boot, seed)
    counts = np.zeros((n_boot, n), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.ravel()), 1.0)
    return counts


def resampled_metrics(scores: ArrayLike, labels: ArrayLike, counts: np.ndarray) -> dict[str, np.ndarray]:
    """AUROC, AUPRC, AURC and PRR of every resample at once, shape ``(n_boot,)`` each.

    Vectorised over resamples: answers are grouped by distinct score (ties), each resample
    is a row of multiplicities, and every metric is written in per-group counts (AURC with
    harmonic numbers for the evenly spread tie errors). Equal to the per-resample functions
    above (a test checks it); NaN where a metric is undefined.
    """
    s, y = _prepare(scores, labels)
    n = s.size
    _, inverse = np.unique(s, return_inverse=True)
    onehot = np.zeros((n, int(inverse.max()) + 1 if n else 0))
    onehot[np.arange(n), inverse.ravel()] = 1.0
    pos = (counts * y) @ onehot  # (B, G), groups in ascending score
    neg = (counts * ~y) @ onehot
    p_tot, n_tot = pos.sum(1), neg.sum(1)
    total = p_tot + n_tot
    with np.errstate(divide="ignore", invalid="ignore"):
        neg_below = np.cumsum(neg, axis=1) - neg
        roc = (pos * (neg_below + 0.5 * neg)).sum(1) / (p_tot * n_tot)
        # Descending order for precision and risk.
        pd, nd = pos[:, ::-1], neg[:, ::-1]
        tp, k = np.cumsum(pd, axis=1), np.cumsum(pd + nd, axis=1)
        precision = np.where(k > 0, tp / np.where(k > 0, k, 1.0), 0.0)
        ap = (pd * precision).sum(1) / p_tot
        harmonic = np.r_[0.0, np.cumsum(1.0 / np.arange(1, int(total.max(initial=0)) + 1))]
        m = pd + nd
        k_before = (k - m).astype(np.int64)
        e_before = np.cumsum(nd, axis=1) - nd
        r = np.where(m > 0, nd / np.where(m > 0, m, 1.0), 0.0)
        spread = (e_before - r * k_before) * (harmonic[k_before + m.astype(np.int64)] - harmonic[k_before]) + r * m
        area = spread.sum(1) / total
        oracle = (n_tot - p_tot * (harmonic[total.astype(np.int64)] - harmonic[p_tot.astype(np.int64)])) / total
        rand = n_tot / total
        ratio = (rand - area) / (rand - oracle)
    one_class = (p_tot == 0) | (n_tot == 0)
    nan = np.full_like(roc, math.nan)
    return {
        "auroc": np.where(one_class, nan, roc),
        "auprc": np.where(p_tot == 0, nan, ap),
        "aurc": area,
        "prr": np.where(one_class, nan, ratio),
    }


def percentile_interval(point: float, values: np.ndarray, n_boot: int, level: float = 0.95) -> Interval:
    """``point`` with the percentile interval of its resampled ``values`` (non-finite ones dropped)."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(point, math.nan, math.nan, n_boot, 0)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return Interval(point, float(low), float(high), n_boot, int(values.size))


def bootstrap_all(
    scores: ArrayLike, labels: ArrayLike, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, Interval]:
    """Every metric of :data:`METRICS` with its interval, from one vectorised set of resamples.

    Same resamples as :func:`bootstrap_ci` with the same seed, hence the same intervals.
    """
    _check_boot(n_boot, level)
    s, y = _prepare(scores, labels)
    values = resampled_metrics(s, y, bootstrap_counts(s.size, n_boot, seed))
    return {name: percentile_interval(fn(s, y), values[name], n_boot, level) for name, fn in METRICS.items()}


def paired_all(
    scores_a: ArrayLike, scores_b: ArrayLike, labels: ArrayLike, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, PairedDifference]:
    """:func:`paired_bootstrap` of every metric at once (vectorised, same resamples)."""
    _check_boot(n_boot, level)
    a, y = _prepare(scores_a, labels)
    b, _ = _prepare(scores_b, labels)
    counts = bootstrap_counts(a.size, n_boot, seed)
    va, vb = resampled_metrics(a, y, counts), resampled_metrics(b, y, counts)
    return {name: paired_difference(fn(a, y) - fn(b, y), va[name] - vb[name], n_boot, level) for name, fn in METRICS.items()}


def paired_bootstrap(
    metric: MetricFn,
    scores_a: ArrayLike,
    scores_b: ArrayLike,
    labels: ArrayLike,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> PairedDifference:
    """``metric(a) - metric(b)`` with both methods scored on the same resamples.

    The p-value is two-sided: twice the smaller share of resampled differences on either
    side of 0 (capped at 1).
    """
    _check_boot(n_boot, level)
    a, y = _prepare(scores_a, labels)
    b, _ = _prepare(scores_b, labels)
    point = metric(a, y) - metric(b, y)
    diffs = np.array([metric(a[i], y[i]) - metric(b[i], y[i]) for i in bootstrap_indices(a.size, n_boot, seed)])
    return paired_difference(point, diffs, n_boot, level)


def paired_difference(point: float, diffs: np.ndarray, n_boot: int, level: float = 0.95) -> PairedDifference:
    """``point`` (a difference a - b) with the percentile interval and two-sided p-value of its
    resampled differences (non-finite ones dropped): twice the smaller share on either side of 0."""
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size == 0:
        return PairedDifference(point, math.nan, math.nan, math.nan, n_boot, 0)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    p = min(1.0, 2.0 * min(float((diffs <= 0).mean()), float((diffs >= 0).mean())))
    return PairedDifference(point, float(low), float(high), p, n_boot, int(diffs.size))
