"""LogTokU maths: aleatoric (AU) and epistemic (EU) uncertainty from top-K raw logits.

Everything here is framework-free torch, vectorised over any leading shape
(``(batch, steps, K)``, ``(steps, K)``, ``(K,)``), on any device, in float32 or float64
(float16/bfloat16 inputs are promoted to float32 first: the digamma terms are not safe in
half precision).

Sign conventions, kept everywhere in the library:

* AU, EU, token uncertainty ``u = AU * EU``, ``-log p`` and entropy: higher = more uncertain.
* reliability (token ``-u``, response ``-mean(top-N u)``): higher = more reliable.

The formulas are those of Ma et al., "Estimating LLM Uncertainty with Evidence" (arXiv 2502.00290).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np
    import torch

EvidenceMode = Literal["clamped", "raw"]
"""``"clamped"`` (default): evidence ``max(z, 0)``, AU = 0 and EU = 1 when no top-K logit is
positive. ``"raw"``: the reference code's behaviour for reproduction, AU fed with the raw
logits; it yields NaN (never an exception) whenever a top-K logit is <= -1 (outside the
Dirichlet's domain) and the formula's own non-finite value (-inf or NaN) when the raw top-K
logits sum to 0. EU is clamped in both modes."""

DEFAULT_K = 2
DEFAULT_TOP_N = 25


def validate_k(k: int, vocab_size: int | None = None) -> int:
    """Return ``k`` if ``1 < k <= vocab_size``; raise :class:`ConfigurationError` otherwise."""
    if isinstance(k, bool) or not isinstance(k, int):
        msg = f"top-K must be an integer, got {k!r}; pass e.g. k=2 (the paper's setting)"
        raise ConfigurationError(msg)
    if k < 2:
        msg = f"top-K must be at least 2 (a Dirichlet over one logit has no uncertainty), got k={k}; use k=2"
        raise ConfigurationError(msg)
    if vocab_size is not None and k > vocab_size:
        msg = f"top-K k={k} is larger than the model's vocabulary ({vocab_size} tokens); use 2 <= k <= {vocab_size}"
        raise ConfigurationError(msg)
    return k


def validate_evidence(evidence: str) -> EvidenceMode:
    """Return ``evidence`` if it is ``"clamped"`` or ``"raw"``; raise otherwise."""
    if evidence not in ("clamped", "raw"):
        msg = f"evidence must be 'clamped' (default) or 'raw' (reference reproduction), got {evidence!r}"
        raise ConfigurationError(msg)
    return evidence  # type: ignore[return-value]


def validate_top_n(top_n: int) -> int:
    """Return ``top_n`` if it is a positive integer; raise otherwise."""
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        msg = f"top_n (number of least reliable tokens averaged) must be a positive integer, got {top_n!r}; the paper uses 25"
        raise ConfigurationError(msg)
    return top_n


def _as_float(t: torch.Tensor) -> torch.Tensor:
    import torch

    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.to(torch.float32)


def top_k_logits(logits: torch.Tensor, k: int = DEFAULT_K) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest raw logits along the last dim, largest first.

    Args:
        logits: ``(..., V)`` raw logits (before softmax or any processor).
        k: number of logits kept, ``2 <= k <= V``.

    Returns:
        ``(values, indices)``, each ``(..., k)``; values in float32/float64.
    """
    validate_k(k, int(logits.shape[-1]))
    values, indices = _as_float(logits).topk(k, dim=-1, largest=True, sorted=True)
    return values, indices


def logtoku(top_logits: torch.Tensor, evidence: EvidenceMode = "clamped") -> tuple[torch.Tensor, torch.Tensor]:
    """AU and EU of each position from its top-K raw logits.

    Args:
        top_logits: ``(..., K)`` raw logits; any order (the result is permutation invariant).
        evidence: ``"clamped"`` or ``"raw"`` (see :data:`EvidenceMode`).

    Returns:
        ``(au, eu)``, each of shape ``(...)``. In clamped mode ``eu`` is in (0, 1] and ``au``
        in [0, ln K); higher = more uncertain.
    """
    import torch

    validate_evidence(evidence)
    z = _as_float(top_logits)
    k = z.shape[-1]
    validate_k(int(k))
    clamped = z.clamp_min(0.0)
    eu = k / (clamped + 1.0).sum(dim=-1)
    alpha = clamped if evidence == "clamped" else z
    alpha0 = alpha.sum(dim=-1, keepdim=True)
    psi = torch.special.digamma
    if evidence == "clamped":
        # alpha0 == 0 only when every evidence is 0: AU -> 0 (the limit); avoid 0/0.
        safe0 = torch.where(alpha0 > 0, alpha0, torch.ones_like(alpha0))
        terms = (alpha / safe0) * (psi(alpha + 1.0) - psi(safe0 + 1.0))
        au = -terms.sum(dim=-1)
        au = torch.where(alpha0.squeeze(-1) > 0, au, torch.zeros_like(au))
        # Rounding can leave -0.0 or -1e-8 for a one-hot evidence; AU >= 0 exactly.
        au = au.clamp_min(0.0)
    else:
        terms = (alpha / alpha0) * (psi(alpha + 1.0) - psi(alpha0 + 1.0))
        au = -terms.sum(dim=-1)
        # digamma(alpha + 1) is outside the Dirichlet's domain for alpha <= -1: at integers it
        # is a pole (NaN), elsewhere a meaningless finite number. Report NaN for all of them.
        invalid = (alpha <= -1.0).any(dim=-1)
        au = torch.where(invalid, torch.full_like(au, math.nan), au)
    return au, eu


def digamma(x: float) -> float:
    """The digamma function for ``x > 0`` (recurrence up to 6, then the asymptotic series; ~1e-13)."""
    shift = 0.0
    while x < 6.0:
        shift -= 1.0 / x
        x += 1.0
    f = 1.0 / (x * x)
    series = f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))
    return shift + math.log(x) - 0.5 / x - series


def clamped_logtoku(values: Sequence[float]) -> tuple[float, float]:
    """AU and EU of one token's top-K logits, clamped evidence, in float64 Python.

    The same maths as :func:`logtoku` (``"clamped"``) without a dozen tiny tensor operations
    per token: for the K values of a token (K is small) plain floats are several times cheaper.
    Every backend scores its answer tokens with it (the transformers step recorder, llama.cpp's
    numpy scoring, the remote backend); :func:`logtoku` is its vectorised form (prompt tokens,
    re-scoring, raw evidence). Non-finite values give NaN (the caller raises).
    """
    if not all(map(math.isfinite, values)):
        return math.nan, math.nan
    alpha = [v if v > 0.0 else 0.0 for v in values]
    alpha0 = sum(alpha)
    eu = len(values) / (alpha0 + len(values))
    if alpha0 <= 0.0:
        return 0.0, eu
    psi0 = digamma(alpha0 + 1.0)
    au = -sum((a / alpha0) * (digamma(a + 1.0) - psi0) for a in alpha if a > 0.0)
    return max(au, 0.0), eu


def token_logtoku(values: Sequence[Sequence[float]], evidence: EvidenceMode = "clamped") -> tuple[list[float], list[float]]:
    """AU and EU of each row of top-K logits (Python floats): :func:`clamped_logtoku` per row,
    or, for the reference ``"raw"`` evidence, :func:`logtoku` on a float64 tensor."""
    if evidence == "clamped":
        pairs = [clamped_logtoku(v) for v in values]
        return [a for a, _ in pairs], [e for _, e in pairs]
    import torch

    au, eu = logtoku(torch.tensor([list(v) for v in values], dtype=torch.float64), evidence)
    return au.tolist(), eu.tolist()


def token_uncertainty(au: torch.Tensor, eu: torch.Tensor) -> torch.Tensor:
    """``u = AU * EU`` per token; higher = less reliable (token reliability is ``-u``)."""
    return au * eu


def top_n_mean(scores: torch.Tensor, mask: torch.Tensor | None = None, top_n: int = DEFAULT_TOP_N) -> torch.Tensor:
    """Mean of the ``top_n`` largest ``scores`` along the last dim (all of them when fewer).

    Args:
        scores: ``(..., T)``, higher = more uncertain.
        mask: ``(..., T)`` bool, True where a token counts (padding and finished rows False).
        top_n: number of largest scores averaged.

    Returns:
        ``(...)``; NaN for a row with no valid token, NaN if a selected score is NaN.
    """
    import torch

    validate_top_n(top_n)
    s = _as_float(scores)
    if mask is None:
        mask = torch.ones_like(s, dtype=torch.bool)
    count = mask.sum(dim=-1)
    n = min(top_n, int(s.shape[-1])) if s.shape[-1] else 0
    if n == 0:
        return torch.full(s.shape[:-1], float("nan"), dtype=s.dtype, device=s.device)
    # NaN must be selected (and propagate), so rank NaN above everything; padding ranks last.
    rank_key = torch.where(torch.isnan(s), torch.full_like(s, math.inf), s)
    # A real -inf score must still rank above padding: map it to the lowest finite value.
    rank_key = torch.where(rank_key == -math.inf, torch.full_like(s, torch.finfo(s.dtype).min), rank_key)
    rank_key = torch.where(mask, rank_key, torch.full_like(s, -math.inf))
    order = rank_key.argsort(dim=-1, descending=True, stable=True)[..., :n]
    has_nan = (torch.isnan(s) & mask).any(dim=-1)
    picked = s.gather(-1, order)
    picked_mask = mask.gather(-1, order)
    total = torch.where(picked_mask, picked, torch.zeros_like(picked)).sum(dim=-1)
    used = count.clamp(max=n).to(s.dtype)
    out = total / used
    out = torch.where(has_nan, torch.full_like(out, float("nan")), out)
    return out


def masked_mean(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plain mean of ``scores`` over valid positions of the last dim (NaN when none)."""
    import torch

    s = _as_float(scores)
    if mask is None:
        return s.mean(dim=-1) if s.shape[-1] else torch.full(s.shape[:-1], float("nan"), dtype=s.dtype)
    total = torch.where(mask, s, torch.zeros_like(s)).sum(dim=-1)
    return total / mask.sum(dim=-1).to(s.dtype)


def top_n_mean_of(scores: Sequence[float], top_n: int = DEFAULT_TOP_N) -> float:
    """:func:`top_n_mean` of one response's scores (a sequence of floats), without torch.

    The mean of the ``top_n`` largest scores (all of them when fewer); NaN when there are none
    or any score is NaN. The sum is correctly rounded (:func:`math.fsum`), so the result does
    not depend on the order or on a library's vectorised summation (torch's float64 sum can
    differ from it in the last bit).
    """
    validate_top_n(top_n)
    values = [float(x) for x in scores]
    if not values or any(math.isnan(x) for x in values):
        return math.nan
    picked = sorted(values, reverse=True)[:top_n]
    return _sum(picked) / len(picked)


def mean_of(scores: Sequence[float]) -> float:
    """:func:`masked_mean` of one response's scores without torch (correctly rounded sum; NaN when empty)."""
    values = [float(x) for x in scores]
    return _sum(values) / len(values) if values else math.nan


def _sum(values: list[float]) -> float:
    """``math.fsum``, or the plain sum when an infinity is present (``fsum`` raises on ``inf - inf``)."""
    if all(math.isfinite(x) for x in values):
        return math.fsum(values)
    return sum(values)


def response_reliability(u: torch.Tensor, mask: torch.Tensor | None = None, top_n: int = DEFAULT_TOP_N) -> torch.Tensor:
    """Response reliability: ``-mean`` of the ``top_n`` largest token uncertainties ``u``.

    Higher = more reliable. ``u`` is ``(..., T)``; returns ``(...)``.
    """
    return -top_n_mean(u, mask, top_n)


def log_softmax_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax and entropy (nats) of full-vocabulary raw logits ``(..., V)``.

    Returns ``(log_probs (..., V), entropy (...))``; the probability and entropy baselines
    (Ma et al. 2025) read the chosen token's log-prob and the entropy from these.
    """
    z = _as_float(logits)
    lse, entropy = logsumexp_entropy(z)
    log_probs = z - lse.unsqueeze(-1)
    return log_probs, entropy


def logsumexp_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logsumexp`` and softmax entropy (nats) of raw logits ``(..., V)``, in few passes.

    The chosen token's log-probability is then ``logit - logsumexp``: no vocabulary-sized
    log-softmax has to be materialised or kept. Masked (-inf) logits contribute 0.
    """
    import torch

    z = _as_float(logits)
    lse = torch.logsumexp(z, dim=-1)
    p = torch.exp(z - lse.unsqueeze(-1))
    entropy = lse - (p * z).nansum(dim=-1)  # 0 * -inf = NaN for masked tokens: skipped
    return lse, entropy


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


@dataclass(frozen=True)
class WordScore:
    """A word's AU and EU: the max over its sub-tokens (paper appendix)."""

    text: str
    au: float
    eu: float
    token_indices: tuple[int, ...]

    @property
    def uncertainty(self) -> float:
        return self.au * self.eu


def word_scores(pieces: Sequence[str], au: Sequence[float], eu: Sequence[float]) -> list[WordScore]:
    """Group token pieces into whitespace-separated words; AU/EU of a word = max over its tokens.

    A token whose text starts with whitespace starts a new word; whitespace-only tokens are
    not words. NaN (raw mode) propagates into the word's max.
    """
    if not len(pieces) == len(au) == len(eu):
        msg = f"pieces, au and eu must have one entry per token, got {len(pieces)}, {len(au)}, {len(eu)}"
        raise ConfigurationError(msg)
    words: list[WordScore] = []
    idx: list[int] = []
    text, a_max, e_max = "", -math.inf, -math.inf

    def flush() -> None:
        if idx and text.strip():
            words.append(WordScore(text.strip(), a_max, e_max, tuple(idx)))

    def nanmax(x: float, y: float) -> float:
        return math.nan if math.isnan(x) or math.isnan(y) else max(x, y)

    for i, piece in enumerate(pieces):
        if not piece.strip():
            flush()
            text, idx, a_max, e_max = "", [], -math.inf, -math.inf
            continue
        if piece[:1].isspace() and idx:
            flush()
            text, idx, a_max, e_max = "", [], -math.inf, -math.inf
        text += piece
        idx.append(i)
        a_max, e_max = nanmax(a_max, float(au[i])), nanmax(e_max, float(eu[i]))
    flush()
    return words


@dataclass(frozen=True)
class RescoredLogits:
    """AU/EU recomputed from stored top-K logits, as numpy arrays of shape ``(..., )``."""

    au: np.ndarray
    eu: np.ndarray
    k: int
    evidence: EvidenceMode

    @property
    def uncertainty(self) -> np.ndarray:
        return self.au * self.eu


def rescore(
    top_logits: Sequence[Sequence[float]] | np.ndarray | torch.Tensor,
    k: int | None = None,
    evidence: EvidenceMode = "clamped",
) -> RescoredLogits:
    """Re-score stored top-K logits (lists, numpy or torch) without a model, in float64.

    ``top_logits`` is ``(..., K_stored)``; with ``k`` smaller than ``K_stored`` the ``k``
    largest of each row are used (stored values need not be sorted).
    """
    import numpy as np
    import torch

    try:
        arr = np.asarray(top_logits.detach().cpu() if isinstance(top_logits, torch.Tensor) else top_logits, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        msg = f"top_logits must be a rectangular array of numbers (rows of K raw logits): {exc}"
        raise ConfigurationError(msg) from exc
    if arr.ndim == 0:
        msg = f"top_logits must have at least one dimension of K logits, got the scalar {arr!r}"
        raise ConfigurationError(msg)
    stored_k = arr.shape[-1]
    use_k = stored_k if k is None else validate_k(k)
    if use_k > stored_k:
        msg = f"k={use_k} but only {stored_k} logits per token were stored; re-score with k <= {stored_k}"
        raise ConfigurationError(msg)
    t = torch.from_numpy(arr)
    if use_k < stored_k:
        t = t.topk(use_k, dim=-1).values
    au, eu = logtoku(t, evidence)
    return RescoredLogits(au=au.numpy(), eu=eu.numpy(), k=use_k, evidence=evidence)
