"""The guard replay: every retrieval guard at every budget, from two cached answer sets.

Every question is answered twice, greedily, and both are cached: closed book (the cache of
``eval nq-open``) and with retrieval (:mod:`~logtoku_eval.knowledge_base`). A
guard with one rule "retrieve when <signal> < t" (one attempt, then pass) answers each
question with one of the two, so its accuracy at any threshold is replayed exactly from the
caches, for every signal and budget, without generating again. Budgets are matched: at
budget ``b`` each signal retrieves for its ``round(b n)`` least reliable closed-book answers
(in-sample thresholds; a NaN score never fires, as in the guard). ``random`` is the expected
accuracy of retrieving ``round(b n)`` questions at random; ``oracle`` retrieves where it
helps first and where it hurts last (an upper bound). ``guard-score`` is the learned guard
score cross-fitted on the closed-book answers' labels
(:func:`~logtoku_eval.crossfit.cross_fit_guard`): k models, one per fold, so the
live check cannot run it as one rule (:data:`CROSS_FITTED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from logtoku_eval.methods import HEADLINE
from logtoku_eval.metrics import PairedDifference, paired_difference, percentile_interval
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.wire.payloads import json_float

__all__ = [
    "CROSS_FITTED",
    "CURVE_BUDGETS",
    "DEFAULT_BUDGETS",
    "PAIRED",
    "SIGNALS",
    "BudgetPoint",
    "Replay",
    "json_fields",
    "oracle_mask",
    "retrieve_mask",
    "threshold_for",
]

SIGNALS: dict[str, tuple[str, str]] = {
    "logtoku": (HEADLINE, "reliability"),
    "entropy": ("entropy-top25", "entropy_reliability"),
    "probability": ("probability-top25", "probability_reliability"),
    "guard-score": ("guard-score", "guard_score"),
}
"""Guard signal -> (the evaluation method re-scored from the cache, the guard's statistic)."""
CROSS_FITTED = frozenset({"guard-score"})
"""Signals scored by one model per fold (no single rule for the live check to run)."""
PAIRED: tuple[tuple[str, str], ...] = (
    ("logtoku", "entropy"),
    ("logtoku", "probability"),
    ("guard-score", "random"),
    ("guard-score", "entropy"),
    ("guard-score", "logtoku"),
)
"""(guard, other) pairs whose accuracy difference is bootstrapped at every budget strictly inside (0, 1)."""

DEFAULT_BUDGETS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
"""Retrieval budgets (shares of the questions) reported by default."""
CURVE_BUDGETS = np.linspace(0.0, 1.0, 51)
"""The budget grid of the accuracy-budget curves and their areas (step 0.02)."""


def json_fields(obj: Any) -> dict[str, Any]:
    """A flat dataclass as JSON: its float fields through :func:`~logtoku_guard.wire.payloads.json_float` (NaN -> ``None``)."""
    return {k: json_float(v) if isinstance(v, float) else v for k, v in obj.__dict__.items()}


def retrieve_mask(scores: np.ndarray, n_retrieve: int) -> np.ndarray:
    """Retrieve for the ``n_retrieve`` lowest finite scores (ties by position); NaN never retrieves."""
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    order = np.argsort(np.where(finite, s, np.inf), kind="stable")[: min(n_retrieve, int(finite.sum()))]
    mask = np.zeros(s.size, dtype=bool)
    mask[order] = True
    return mask


def threshold_for(scores: np.ndarray, mask: np.ndarray) -> float:
    """A threshold ``t`` with ``score < t`` exactly on ``mask`` (midpoint between the two sides).

    NaN when no threshold separates them (ties across the boundary); the guard then retrieves
    for every tied score, which the live check reports.
    """
    s = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(s)
    inside, outside = s[mask], s[finite & ~mask]
    if inside.size == 0:
        return float(np.min(s[finite])) - 1.0 if finite.any() else 0.0
    if outside.size == 0:
        return float(np.max(inside)) + 1.0
    lo, hi = float(np.max(inside)), float(np.min(outside))
    return (lo + hi) / 2.0 if lo < hi else math.nan


def oracle_mask(closed: np.ndarray, rag: np.ndarray, n_retrieve: int) -> np.ndarray:
    """The best ``n_retrieve`` retrievals: where they help, then neutral ones, where they hurt last."""
    priority = np.where(~closed & rag, 0, np.where(closed == rag, 1, 2))
    order = np.argsort(priority, kind="stable")[:n_retrieve]
    mask = np.zeros(closed.size, dtype=bool)
    mask[order] = True
    return mask


@dataclass(frozen=True)
class BudgetPoint:
    """One guard at one retrieval budget."""

    guard: str
    budget: float
    retrievals: int
    accuracy: float
    low: float = math.nan
    high: float = math.nan
    helped: int = 0
    hurt: int = 0
    threshold: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return json_fields(self)


@dataclass(frozen=True)
class Replay:
    """Closed-book and retrieval answers, their labels and the closed-book signals of every guard."""

    ids: tuple[str, ...]
    closed: np.ndarray
    rag: np.ndarray
    scores: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.closed.shape != (n,) or self.rag.shape != (n,) or any(v.shape != (n,) for v in self.scores.values()):
            msg = f"every label and score array must have one value per question ({n})"
            raise ConfigurationError(msg)

    @property
    def n(self) -> int:
        return len(self.ids)

    def mask(self, guard: str, budget: float) -> np.ndarray:
        k = round(budget * self.n)
        if guard == "oracle":
            return oracle_mask(self.closed, self.rag, k)
        return retrieve_mask(self.scores[guard], k)

    def final(self, mask: np.ndarray) -> np.ndarray:
        """Whether each final answer is right: the retrieval answer where ``mask``, else the closed-book one."""
        return np.where(mask, self.rag, self.closed)

    def accuracy(self, mask: np.ndarray) -> float:
        return float(self.final(mask).mean()) if self.n else math.nan

    def random_accuracy(self, budget: float) -> float:
        """Expected accuracy when ``round(b n)`` questions are retrieved uniformly at random."""
        k = round(budget * self.n)
        gain = float((self.rag.astype(float) - self.closed.astype(float)).mean())
        return float(self.closed.mean()) + k / self.n * gain if self.n else math.nan

    def point(self, guard: str, budget: float, idx: np.ndarray | None = None, level: float = 0.95) -> BudgetPoint:
        if guard == "random":
            return BudgetPoint("random", budget, round(budget * self.n), self.random_accuracy(budget))
        mask = self.mask(guard, budget)
        final = self.final(mask)
        low = high = math.nan
        if idx is not None and idx.size:
            ci = percentile_interval(float(final.mean()), final[idx].mean(axis=1), idx.shape[0], level)
            low, high = ci.low, ci.high
        thr = threshold_for(self.scores[guard], mask) if guard in self.scores else math.nan
        return BudgetPoint(
            guard,
            budget,
            int(mask.sum()),
            float(final.mean()),
            low,
            high,
            helped=int((mask & ~self.closed & self.rag).sum()),
            hurt=int((mask & self.closed & ~self.rag).sum()),
            threshold=thr,
        )

    def curve(self, guard: str, budgets: np.ndarray = CURVE_BUDGETS) -> np.ndarray:
        if guard == "random":
            return np.array([self.random_accuracy(b) for b in budgets])
        return np.array([self.accuracy(self.mask(guard, b)) for b in budgets])

    def outcome(self, guard: str, budget: float) -> np.ndarray:
        """Per question, 1.0 where the guard's final answer is right, else 0.0; for ``random``, its
        expected value ``closed + k/n (rag - closed)`` (``k = round(b n)`` retrieved at random)."""
        if guard == "random":
            share = round(budget * self.n) / self.n if self.n else 0.0
            return self.closed.astype(float) + share * (self.rag.astype(float) - self.closed.astype(float))
        return self.final(self.mask(guard, budget)).astype(float)

    def paired(self, a: str, b: str, budget: float, idx: np.ndarray, level: float = 0.95) -> PairedDifference:
        """Accuracy of ``a`` minus ``b`` (either may be ``random``) at ``budget`` on the resamples ``idx``."""
        d = self.outcome(a, budget) - self.outcome(b, budget)
        return paired_difference(float(d.mean()), d[idx].mean(axis=1), idx.shape[0], level)
