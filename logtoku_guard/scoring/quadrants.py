"""The paper's four token quadrants: high or low AU against high or low EU.

A token is placed by thresholds taken from the model's own statistics
(:class:`QuadrantThresholds`, usually a calibration profile's quantiles); the payloads, the
policy's ``quadrant_*_share`` statistics and the review page read the shares from here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from logtoku_guard.errors import ConfigurationError


class Quadrant(str, enum.Enum):
    """The four AU/EU quadrants of the paper (I and II are the unreliable ones)."""

    I = "I"  # noqa: E741 - the paper's name. high AU, high EU: lacks knowledge, no idea
    II = "II"  # low AU, high EU: lacks knowledge but one suggestion (probability looks fine)
    III = "III"  # low AU, low EU: sure of one token
    IV = "IV"  # high AU, low EU: knows several good tokens

    @property
    def description(self) -> str:
        return _QUADRANT_TEXT[self]


_QUADRANT_TEXT = {
    Quadrant.I: "high AU, high EU: lacks knowledge, no idea (unreliable)",
    Quadrant.II: "low AU, high EU: lacks knowledge but has one suggestion (risky)",
    Quadrant.III: "low AU, low EU: sure of one token",
    Quadrant.IV: "high AU, low EU: knows several good tokens (reliable)",
}


@dataclass(frozen=True)
class QuadrantThresholds:
    """AU and EU thresholds; a value strictly above its threshold is "high".

    Take them from the model's own statistics (a calibration profile's quantiles): AU/EU
    live on the model's logit scale, so no constant is right for every model.
    """

    au: float
    eu: float
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("au", "eu"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                msg = f"quadrant threshold {name}={value!r} must be a finite number"
                raise ConfigurationError(msg)

    def classify(self, au: float, eu: float) -> Quadrant:
        """The quadrant of one token."""
        high_au = au > self.au
        high_eu = eu > self.eu
        if high_eu:
            return Quadrant.I if high_au else Quadrant.II
        return Quadrant.IV if high_au else Quadrant.III

    @classmethod
    def from_quantile(cls, au: Sequence[float], eu: Sequence[float], q: float = 0.5, source: str = "") -> QuadrantThresholds:
        """Thresholds at quantile ``q`` of observed token AU and EU (NaN ignored)."""
        import numpy as np

        if not 0.0 < q < 1.0:
            msg = f"quantile q={q!r} must be in (0, 1); e.g. 0.5 for the median"
            raise ConfigurationError(msg)
        a = np.asarray(au, dtype=np.float64)
        e = np.asarray(eu, dtype=np.float64)
        a, e = a[np.isfinite(a)], e[np.isfinite(e)]
        if a.size == 0 or e.size == 0:
            msg = "cannot derive quadrant thresholds from an empty set of token scores; score at least one token first"
            raise ConfigurationError(msg)
        return cls(au=float(np.quantile(a, q)), eu=float(np.quantile(e, q)), source=source or f"quantile {q:g}")


class HasAUEU(Protocol):
    """A scored token as far as its quadrant goes (:class:`~logtoku_guard.types.TokenScore` is one)."""

    @property
    def au(self) -> float: ...

    @property
    def eu(self) -> float: ...


def quadrant_of(token: HasAUEU, thresholds: QuadrantThresholds | None) -> Quadrant | None:
    """The token's quadrant, or ``None`` without thresholds or when its AU or EU is undefined."""
    if thresholds is None or not (math.isfinite(token.au) and math.isfinite(token.eu)):
        return None
    return thresholds.classify(token.au, token.eu)


def quadrant_shares(tokens: Sequence[HasAUEU], thresholds: QuadrantThresholds | None) -> dict[str, float] | None:
    """Share of *all* tokens in each quadrant (``None`` without thresholds or without tokens).

    A token whose AU or EU is undefined (raw evidence mode) is in no quadrant, so the four
    shares then sum to less than 1. The payloads and the policy's ``quadrant_*_share``
    statistics both use this.
    """
    n = len(tokens)
    if thresholds is None or n == 0:
        return None
    counts = dict.fromkeys((q.value for q in Quadrant), 0)
    for t in tokens:
        q = quadrant_of(t, thresholds)
        if q is not None:
            counts[q.value] += 1
    return {label: c / n for label, c in counts.items()}
