"""Threshold fitting: a reliability threshold chosen from answers labelled correct/incorrect.

:func:`fit_threshold` places "flag when score < threshold" on a reliability-like score
(higher = more reliable) for one of three objectives: a flag precision, a share of answers
passed (coverage), or the best F-beta of flagging incorrect answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from logtoku_guard.errors import ConfigurationError

__all__ = ["ThresholdFit", "fit_threshold"]


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
