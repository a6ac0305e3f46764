"""Thresholds stated as risk: a guard-score threshold chosen with a finite-sample guarantee.

A rule ``guard_score < t`` flags an answer and passes every other. Instead of a bare ``t``, a
policy may state what it needs, with a confidence ``1 - delta`` (:class:`RiskTarget`):

* **coverage** ``c``: at least a share ``c`` of *correct* answers pass. On the ``n`` correct
  calibration answers, candidate thresholds are tested from the most lenient up (each passing
  fewer), each with a one-sided exact binomial test of "coverage < c" (its Clopper-Pearson lower
  bound >= c); the strictest threshold reached before the first test that fails is kept. Testing
  a fixed sequence this way needs no multiplicity correction (Learn-then-Test, Angelopoulos et
  al. 2021), so with probability >= ``1 - delta`` the kept threshold's coverage is >= ``c``.
* **selective risk** ``r``: at most a share ``r`` of *passed* answers are wrong. Each of at most
  :data:`GRID` candidate thresholds (every ``1/GRID`` of the passed share) gets the
  Clopper-Pearson upper bound of its wrong share among the answers it passes, at ``delta /
  GRID`` (Bonferroni: the bound holds for all of them at once with probability >= ``1 - delta``);
  the most lenient threshold whose bound is <= ``r`` is kept.

The labelled answers are a guard's out-of-fold scores (:attr:`~logtoku_guard.scoring.guard_score.GuardModel.reference_scores`,
each group labelled correct or wrong in ``reference_labels``): each scored by a model that did not
see it, as a new answer is. The guarantee is about answers drawn like those calibration answers
(same model, same kind of questions); it says nothing of other traffic. When the data cannot
support the target, :func:`choose_threshold` says so (``met`` False) with the best bound it can give.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from logtoku_guard.errors import ConfigurationError

__all__ = ["GRID", "RiskThreshold", "binom_cdf", "choose_threshold", "clopper_pearson"]

GRID = 20
"""Candidate thresholds of a selective-risk target (Bonferroni over this many)."""

Kind = Literal["coverage", "selective_risk"]


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``, summed exactly in log space (n up to ~10^6)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    log_term = n * lq  # log P(X = 0); each next term by the ratio of binomial coefficients
    logs = [log_term]
    for i in range(k):
        log_term += math.log((n - i) / (i + 1)) + lp - lq
        logs.append(log_term)
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def clopper_pearson(successes: int, n: int, delta: float, side: Literal["lower", "upper"]) -> float:
    """The one-sided Clopper-Pearson bound of a binomial proportion at confidence ``1 - delta``.

    ``lower``: the smallest ``p`` with ``P(X >= successes | p) >= delta`` (0 when none succeed);
    ``upper``: the largest ``p`` with ``P(X <= successes | p) >= delta`` (1 when all do).
    """
    if not 0 <= successes <= n or n < 1:
        msg = f"need 0 <= successes <= n and n >= 1, got {successes} of {n}"
        raise ValueError(msg)
    if side == "lower":
        if successes == 0:
            return 0.0
        return 1.0 - clopper_pearson(n - successes, n, delta, "upper")
    if successes == n:
        return 1.0
    lo, hi = successes / n, 1.0
    for _ in range(60):  # P(X <= s | p) falls as p grows: bisect to ~1e-18
        mid = (lo + hi) / 2
        if binom_cdf(successes, n, mid) >= delta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class RiskThreshold:
    """The threshold a risk target chose, and the guarantee behind it.

    ``threshold``: flag when ``guard_score < threshold``. ``bound``: the coverage lower bound
    (``coverage``) or the passed answers' wrong-share upper bound (``selective_risk``) at
    ``confidence``; when ``met`` is False, the best such bound any candidate threshold reached
    (and ``threshold`` is that candidate). ``n``: labelled answers the bound rests on (correct
    answers for coverage, passed answers for selective risk); ``observed``: the share measured
    on them; ``method``: how the threshold was chosen.
    """

    kind: Kind
    target: float
    confidence: float
    threshold: float
    met: bool
    bound: float
    observed: float
    n: int
    n_correct: int
    n_wrong: int
    method: str

    def describe(self) -> str:
        """One line: the target, whether it is met, the bound, the data behind it and the threshold."""
        conf = f"{self.confidence:.0%} confidence"
        if self.kind == "coverage":
            what = f"passes at least {self.target:.0%} of correct answers"
            got = f"lower bound {self.bound:.1%} (observed {self.observed:.1%} of {self.n} correct)"
        else:
            what = f"at most {self.target:.0%} of passed answers wrong"
            got = f"upper bound {self.bound:.1%} (observed {self.observed:.1%} of {self.n} passed)"
        state = "guaranteed" if self.met else "NOT met; best"
        data = f"{self.n_correct} correct and {self.n_wrong} wrong labelled answers, {self.method}"
        return f"{what} at {conf}: {state} {got}; {data}; threshold {self.threshold:.4g}"


def choose_threshold(
    correct: Sequence[float], wrong: Sequence[float], kind: Kind, target: float, confidence: float
) -> RiskThreshold:
    """The guard-score threshold that meets ``target`` at ``confidence`` on labelled scores
    (``correct``: scores of right answers, ``wrong``: of wrong ones); see the module docstring."""
    if not 0.0 < target < 1.0 or not 0.0 < confidence < 1.0:
        msg = f"a risk target and its confidence are shares strictly between 0 and 1, got {target!r} at {confidence!r}"
        raise ConfigurationError(msg)
    good = tuple(sorted(float(v) for v in correct if math.isfinite(v)))
    bad = tuple(sorted(float(v) for v in wrong if math.isfinite(v)))
    if not good or (kind == "selective_risk" and not bad):
        msg = f"a {kind} target needs labelled correct and wrong answers, got {len(good)} correct and {len(bad)} wrong"
        raise ConfigurationError(msg)
    return _choose(good, bad, kind, target, confidence)


@functools.lru_cache(maxsize=64)
def _choose(good: tuple[float, ...], bad: tuple[float, ...], kind: Kind, target: float, confidence: float) -> RiskThreshold:
    delta = 1.0 - confidence
    n_good, n_bad = len(good), len(bad)
    if kind == "coverage":
        best: tuple[float, float, float, int] | None = None  # threshold, bound, observed, passes
        first = (good[0], clopper_pearson(n_good, n_good, delta, "lower"), 1.0, n_good)
        ladder = sorted(set(good))  # most lenient first: each passes fewer correct answers

        def held(t: float) -> bool:  # "coverage < target" not rejected
            passes = n_good - _count_below(good, t)
            return 1.0 - binom_cdf(passes - 1, n_good, target) > delta

        # The fixed sequence stops at the first threshold whose test is not rejected; fewer passes only
        # make that more likely (monotone), so that first one is found by bisection: O(log n) binomial
        # sums instead of one per distinct score (minutes for a guard refit on 100 000 verdicts).
        lo, hi = 0, len(ladder)
        while lo < hi:
            mid = (lo + hi) // 2
            if held(ladder[mid]):
                hi = mid
            else:
                lo = mid + 1
        if lo > 0:
            t = ladder[lo - 1]
            passes = n_good - _count_below(good, t)
            best = (t, 0.0, passes / n_good, passes)
        method = "exact binomial tests of a fixed sequence of thresholds (Learn-then-Test)"
        t, _, observed, passes = best if best is not None else first
        bound = clopper_pearson(passes, n_good, delta, "lower")
        return RiskThreshold(kind, target, confidence, t, best is not None, bound, observed, n_good, n_good, n_bad, method)
    scores = sorted([*good, *bad])
    n = len(scores)
    grid = sorted({scores[min(n - 1, (n * j) // GRID)] for j in range(GRID)})  # pass shares 1, 1 - 1/GRID, ...
    level = delta / len(grid)
    found: RiskThreshold | None = None
    closest: RiskThreshold | None = None
    method = f"Clopper-Pearson bounds, Bonferroni over {len(grid)} thresholds"
    for t in grid:
        passed_good = n_good - _count_below(good, t)
        passed_bad = n_bad - _count_below(bad, t)
        passed = passed_good + passed_bad
        if passed == 0:
            continue
        upper = clopper_pearson(passed_bad, passed, level, "upper")
        observed = passed_bad / passed
        cand = RiskThreshold(kind, target, confidence, t, upper <= target, upper, observed, passed, n_good, n_bad, method)
        if cand.met and found is None:  # the most lenient threshold that meets the target
            found = cand
        if closest is None or upper < closest.bound:
            closest = cand
    if found is not None:
        return found
    assert closest is not None  # the highest threshold passes at least one answer
    return closest


def _count_below(sorted_scores: tuple[float, ...], t: float) -> int:
    import bisect

    return bisect.bisect_left(sorted_scores, t)
