"""Threshold fitting: a reliability threshold chosen from answers labelled correct/incorrect.

:func:`fit_threshold` places "flag when score < threshold" on a reliability-like score
(higher = more reliable) for one of three objectives: a flag precision, a share of answers
passed (coverage), or the best F-beta of flagging incorrect answers.

:func:`labels_needed`: how many labelled answers a stated-risk target
(:mod:`~logtoku_guard.scoring.risk`) needs before the threshold it places is *useful*, that is,
no further than ``slack`` from the target on the labelled answers. With too few, the finite-sample
bound forces a threshold far more lenient than the target (a coverage of 80% at 90% confidence,
on 71 correct answers, needs a threshold passing at least 87% of them, and passed 98% of correct
answers on other questions): ``calibrate`` answers more shipped questions until it has them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from logtoku_guard.errors import ConfigurationError

__all__ = [
    "DEFAULT_SLACK",
    "MIN_SLACK",
    "LabelSupply",
    "ThresholdFit",
    "coverage_supply",
    "fit_threshold",
    "labels_needed",
    "passes_needed",
]

DEFAULT_SLACK = 0.05
"""How far from its target a stated-risk threshold may sit on the labelled answers and still count
as useful: a coverage target ``c`` placed by a threshold passing at most ``c + 0.05`` of them."""
MIN_SLACK = 0.01
"""The finest slack :func:`labels_needed` computes: 0.01 already needs 2,896 labels for 80% at 90%; the
scan's cost grows with the square of the count (0.005: 11,037 labels, ~10 s; 0.001: about an hour)."""
MAX_LABELS = 1_000_000
"""The largest number of labels :func:`labels_needed` looks at."""


@dataclass(frozen=True)
class ThresholdFit:
    """A reliability threshold fitted on labelled answers: flag (do not pass) when score < threshold.

    The flagged class is "incorrect": ``precision`` = share of flagged answers that were
    incorrect, ``recall`` = share of incorrect answers flagged, ``coverage`` = share passed.
    """

    threshold: float
    precision: float
    recall: float
    coverage: float
    f_beta: float
    beta: float
    objective: str


def fit_threshold(
    scores: Sequence[float],
    correct: Sequence[bool],
    objective: Literal["precision", "coverage", "fbeta"] = "fbeta",
    target: float | None = None,
    beta: float = 1.0,
) -> ThresholdFit:
    """Choose a threshold on a reliability-like score (higher = more reliable).

    * ``precision``: the largest recall whose flag precision is >= ``target``;
    * ``coverage``: pass (at least) a share ``target`` of answers, flag the rest;
    * ``fbeta``: maximise the F-beta of flagging incorrect answers.
    """
    if len(scores) != len(correct) or not scores:
        msg = f"scores and labels must be non-empty and of equal length, got {len(scores)} and {len(correct)}"
        raise ConfigurationError(msg)
    if objective in ("precision", "coverage") and (target is None or not 0.0 < target <= 1.0):
        msg = f"objective {objective!r} needs a target in (0, 1], got {target!r}"
        raise ConfigurationError(msg)
    if objective not in ("precision", "coverage", "fbeta"):
        msg = f"objective must be 'precision', 'coverage' or 'fbeta', got {objective!r}"
        raise ConfigurationError(msg)
    pairs = sorted((float(s), bool(c)) for s, c in zip(scores, correct) if math.isfinite(s))
    n = len(pairs)
    n_bad = sum(not c for _, c in pairs)
    # Candidate thresholds: flag everything strictly below pairs[i][0] (i flagged).
    best: ThresholdFit | None = None
    flagged_bad = 0
    for i in range(n + 1):
        if i > 0:
            flagged_bad += not pairs[i - 1][1]
            if i < n and pairs[i][0] == pairs[i - 1][0]:
                continue  # ties cannot be split by a threshold
        threshold = pairs[i][0] if i < n else math.nextafter(pairs[-1][0], math.inf)
        precision = flagged_bad / i if i else 1.0
        recall = flagged_bad / n_bad if n_bad else 1.0
        coverage = (n - i) / n
        b2 = beta * beta
        f = (1 + b2) * precision * recall / (b2 * precision + recall) if precision + recall > 0 and i else 0.0
        fit = ThresholdFit(threshold, precision, recall, coverage, f, beta, objective)
        if objective == "coverage":
            if coverage >= (target or 0.0):
                best = fit  # the last one still passing the target share flags the most
        elif objective == "precision":
            if i and precision >= (target or 0.0) and (best is None or recall > best.recall):
                best = fit
        elif best is None or f > best.f_beta:
            best = fit
    if best is None:
        msg = f"no threshold reaches {objective}={target!r} on these {n} labelled answers; lower the target"
        raise ConfigurationError(msg)
    return best


def passes_needed(n: int, target: float, confidence: float) -> int | None:
    """The fewest of ``n`` correct labelled answers a threshold must pass for the coverage target
    (``target`` at ``confidence``) to be guaranteed: the smallest ``k`` whose one-sided exact binomial
    test rejects "coverage < target" (its Clopper-Pearson lower bound >= ``target``); None when even
    all ``n`` cannot (too few labels for any bound)."""
    from logtoku_guard.scoring.risk import binom_cdf

    _check_target(target, confidence)
    delta = 1.0 - confidence

    def rejects(k: int) -> bool:  # P(X >= k | n, target) <= delta
        return 1.0 - binom_cdf(k - 1, n, target) <= delta

    if n < 1 or not rejects(n):
        return None
    lo, hi = 0, n  # the tail falls as k grows: bisect for the first k that rejects
    while lo < hi:
        mid = (lo + hi) // 2
        if rejects(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def labels_needed(
    kind: Literal["coverage", "selective_risk"], target: float, confidence: float, slack: float = DEFAULT_SLACK
) -> int:
    """The fewest labelled answers for which a stated-risk target gets a useful threshold.

    * ``coverage`` (at least ``target`` of correct answers pass, at ``confidence``): the number of
      **correct** labelled answers from which the strictest guaranteed threshold needs to pass at most
      ``target + slack`` of them (:func:`passes_needed`). The binomial is discrete, so the condition
      comes and goes for a while as ``n`` grows: this is the smallest ``n`` from which it holds for
      every larger ``n`` up to twice the last one where it failed (a scan, exact tail sums).
    * ``selective_risk`` (at most ``target`` of passed answers wrong): the number of **passed** labelled
      answers whose Clopper-Pearson upper bound (at the Bonferroni level of
      :data:`~logtoku_guard.scoring.risk.GRID` thresholds) stays within ``target`` when their observed
      wrong share is ``target - slack`` (found by bisection).
    """
    from logtoku_guard.scoring.risk import GRID, clopper_pearson

    _check_target(target, confidence)
    if not MIN_SLACK <= slack < 1.0 or not math.isfinite(slack):
        msg = (
            f"slack must be a share from {MIN_SLACK} to below 1 (how far from the target a useful bound may be), "
            f"got {slack!r}; a finer one needs tens of thousands of labels"
        )
        raise ConfigurationError(msg)
    if kind == "coverage":
        return 1 if target + slack >= 1.0 else _coverage_labels(target, 1.0 - confidence, slack)
    if kind != "selective_risk":
        msg = f"kind must be 'coverage' or 'selective_risk', got {kind!r}"
        raise ConfigurationError(msg)
    if target - slack <= 0.0:
        msg = f"a selective-risk slack must be below its target ({target:g}), got {slack:g}"
        raise ConfigurationError(msg)
    level = (1.0 - confidence) / GRID

    def enough(n: int) -> bool:
        return clopper_pearson(math.floor((target - slack) * n), n, level, "upper") <= target

    hi = 16
    while not enough(hi):
        hi *= 2
        if hi > MAX_LABELS:
            msg = f"{kind} {target:g} at {confidence:g} needs more than {MAX_LABELS} labels within {slack:g}; widen the slack"
            raise ConfigurationError(msg)
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _coverage_labels(target: float, delta: float, slack: float) -> int:
    """The scan of :func:`labels_needed` for a coverage target. ``k``, the fewest passes whose exact test
    rejects "coverage < target" at ``delta``, never falls and grows by at most one as ``n`` grows by one."""
    import numpy as np

    size = 4096
    logfact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, size + 1)))])
    lp, lq = math.log(target), math.log1p(-target)
    k, last_fail, n = 0, 0, 0
    while n < 2 * max(last_fail, 8):
        n += 1
        if n > MAX_LABELS:
            msg = f"coverage {target:g} needs more than {MAX_LABELS} labels within {slack:g}; widen the slack"
            raise ConfigurationError(msg)
        if n >= size:
            size *= 2
            logfact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, size + 1)))])
        j = np.arange(n + 1)
        logpmf = logfact[n] - logfact[j] - logfact[n - j] + j * lp + (n - j) * lq
        top = logpmf.max()
        tails = np.exp(top) * np.cumsum(np.exp(logpmf - top)[::-1])[::-1]  # tails[k] = P(X >= k)
        while k <= n and tails[k] > delta:
            k += 1
        if k > n or k > (target + slack) * n:
            last_fail = n
    return last_fail + 1


@dataclass(frozen=True)
class LabelSupply:
    """Whether ``have`` correct labelled answers support a coverage target usefully: ``needed`` for a
    threshold within ``slack`` of ``target``; ``passes``: the share of them the strictest guaranteed
    threshold must pass with ``have`` (None: no threshold can be guaranteed)."""

    target: float
    confidence: float
    slack: float
    needed: int
    have: int
    passes: float | None

    @property
    def enough(self) -> bool:
        return self.have >= self.needed

    def describe(self) -> str:
        """One line: the target, the labels it needs and has, and what the threshold must pass with them."""
        what = f"passing at least {self.target:.0%} of correct answers at {self.confidence:.0%} confidence"
        need = f"needs {self.needed} correct labelled answers for a threshold within {self.slack:.0%} of it"
        if self.passes is None:
            got = f"{self.have} cannot support it at all (the policy falls back or its threshold is refused)"
        else:
            got = f"with {self.have} the threshold must pass at least {self.passes:.1%} of them"
        lenient = "" if self.enough or self.passes is None else " (too few: a lenient threshold)"
        return f"{what} {need}; {got}{lenient}"


def coverage_supply(have: int, target: float, confidence: float, slack: float = DEFAULT_SLACK) -> LabelSupply:
    """:class:`LabelSupply` of ``have`` correct labelled answers for a coverage target."""
    k = passes_needed(have, target, confidence) if have > 0 else None
    needed = labels_needed("coverage", target, confidence, slack)
    return LabelSupply(target, confidence, slack, needed, have, k / have if k else None)


def _check_target(target: float, confidence: float) -> None:
    if not (0.0 < target < 1.0 and 0.0 < confidence < 1.0):
        msg = f"a risk target and its confidence are shares strictly between 0 and 1, got {target!r} at {confidence!r}"
        raise ConfigurationError(msg)
