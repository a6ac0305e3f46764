"""LogTokU maths: aleatoric (AU) and epistemic (EU) uncertainty from top-K raw logits.

AU and EU are computed in one place, :func:`au_eu` (numpy, float64, vectorised over any
leading shape): the backends read only the K largest logits of a token from the device and
hand them here. The torch helpers (:func:`logtoku` for tensors, :func:`top_n_mean`,
:func:`logsumexp_entropy` over a whole vocabulary) work on any device, in float32 or float64
(float16/bfloat16 inputs are promoted to float32 first).

Sign conventions, kept everywhere in the library:

* AU, EU, token uncertainty ``u = AU * EU``, ``-log p`` and entropy: higher = more uncertain.
* reliability (token ``-u``, response ``-mean(top-N u)``): higher = more reliable.

The formulas are those of Ma et al., "Estimating LLM Uncertainty with Evidence" (arXiv 2502.00290).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

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
    """AU and EU of each position from its top-K raw logits, as tensors: :func:`au_eu` on a tensor.

    Args:
        top_logits: ``(..., K)`` raw logits; any order (the result is permutation invariant).
        evidence: ``"clamped"`` or ``"raw"`` (see :data:`EvidenceMode`).

    Returns:
        ``(au, eu)``, each of shape ``(...)``, in the input's float dtype (float32 for half
        precision) and on its device; the maths runs in float64 on the CPU (the K values per
        token are all it reads). In clamped mode ``eu`` is in (0, 1] and ``au`` in [0, ln K);
        higher = more uncertain.
    """
    import torch

    z = _as_float(top_logits)
    au, eu = au_eu(z.detach().to("cpu", torch.float64).numpy(), evidence)
    return (torch.from_numpy(au).to(z.device, z.dtype), torch.from_numpy(eu).to(z.device, z.dtype))


_PSI_SHIFT = 8
""":func:`_digamma` recurs ``x`` up by this much before the asymptotic series (error below ~2e-13 there)."""


def _digamma(x: np.ndarray, positive: bool = False) -> np.ndarray:
    """The digamma function, elementwise, in float64: reflection below 1/2, recurrence, asymptotic series.

    ``psi(x) = psi(x + n) - sum(1 / (x + i), i < n)`` and ``psi(x) = psi(1 - x) - pi / tan(pi x)``;
    NaN at the poles (0 and the negative integers), as ``torch.special.digamma`` is there too.
    ``positive``: the caller knows every ``x >= 1/2`` (clamped evidence), which spares the reflection.
    """
    import numpy as np

    reflect = None if positive else x < 0.5
    if reflect is None or not reflect.any():
        return _digamma_above_half(x)
    psi = _digamma_above_half(np.where(reflect, 1.0 - x, x))
    pole = reflect & (x == np.floor(x))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pole, np.nan, np.where(reflect, psi - np.pi / np.tan(np.pi * x), psi))


def _digamma_above_half(y: np.ndarray) -> np.ndarray:
    """:func:`_digamma` for ``y >= 1/2``: the recurrence up by :data:`_PSI_SHIFT`, then the asymptotic series."""
    import numpy as np

    w = y + _PSI_SHIFT
    f = 1.0 / (w * w)
    series = f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))
    return np.log(w) - 0.5 / w - series - (1.0 / (y[..., None] + np.arange(float(_PSI_SHIFT)))).sum(axis=-1)


def au_eu(top_logits: np.ndarray, evidence: EvidenceMode = "clamped") -> tuple[np.ndarray, np.ndarray]:
    """AU and EU of each row of top-K raw logits: the library's one implementation of LogTokU's formulas.

    Every backend (transformers, llama.cpp, a remote server) and every re-scoring reads AU and EU
    from here, through :func:`token_logtoku` (rows as lists), :func:`logtoku` (tensors) or
    :func:`rescore`. Vectorised over any leading shape, in float64, in few numpy operations
    (a decoding step calls it once for all its rows).

    Args:
        top_logits: ``(..., K)`` raw logits, any order (the result is permutation invariant).
        evidence: ``"clamped"`` (evidence ``max(z, 0)``) or ``"raw"`` (see :data:`EvidenceMode`).

    Returns:
        ``(au, eu)``, float64 arrays of shape ``(...)``. ``EU = K / sum(max(z, 0) + 1)`` and ``AU =
        -sum(a / a0 * (psi(a + 1) - psi(a0 + 1)))`` with ``a0 = sum(a)``. A row holding a NaN or an
        infinity gives NaN for both (the caller raises).
    """
    import numpy as np

    validate_evidence(evidence)
    z = np.asarray(top_logits, dtype=np.float64)
    k = z.shape[-1] if z.ndim else 0
    validate_k(int(k))
    finite = np.asarray(np.isfinite(z).all(axis=-1, keepdims=True))
    all_finite = bool(finite.all())
    if not all_finite:
        z = np.where(finite, z, 0.0)
    clamped = np.maximum(z, 0.0)
    total = clamped.sum(axis=-1, keepdims=True)
    eu = k / (total[..., 0] + k)
    if evidence == "clamped":
        # total == 0 only when every evidence is 0: AU -> 0 (the limit); avoid 0/0.
        safe0 = np.where(total > 0, total, 1.0)
        psi = _digamma(np.concatenate([clamped, safe0], axis=-1) + 1.0, positive=True)
        au = -((clamped / safe0) * (psi[..., :k] - psi[..., k:])).sum(axis=-1)
        # Rounding can leave -0.0 or -1e-8 for a one-hot evidence (and 0 is the limit at no evidence): AU >= 0.
        au = np.maximum(au, 0.0)
    else:
        alpha0 = z.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            psi = _digamma(np.concatenate([z, alpha0], axis=-1) + 1.0)
            au = -((z / alpha0) * (psi[..., :k] - psi[..., k:])).sum(axis=-1)
        # digamma(alpha + 1) is outside the Dirichlet's domain for alpha <= -1: at integers it
        # is a pole (NaN), elsewhere a meaningless finite number. Report NaN for all of them.
        au = np.where((z <= -1.0).any(axis=-1), np.nan, au)
    if not all_finite:
        au, eu = np.where(finite[..., 0], au, np.nan), np.where(finite[..., 0], eu, np.nan)
    return np.asarray(au), np.asarray(eu)


def token_logtoku(values: Sequence[Sequence[float]], evidence: EvidenceMode = "clamped") -> tuple[list[float], list[float]]:
    """AU and EU of each row of top-K logits (Python floats in, Python floats out): :func:`au_eu`."""
    if not values:
        return [], []
    au, eu = au_eu(values, evidence)  # type: ignore[arg-type]
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


def lse_entropy_of(shifts: Sequence[float], sums: Sequence[float], dots: Sequence[float]) -> tuple[list[float], list[float]]:
    """``logsumexp`` and softmax entropy (nats) of each row from its vocabulary-wide sums.

    The backends do only the vocabulary-wide work on their device (torch for transformers,
    numpy for llama.cpp): for a row of logits ``z`` and a shift ``m`` (0, or the row maximum),
    ``s = sum(exp(z - m))`` and ``d = sum(exp(z - m) * (z - m))``. Then ``logsumexp = m + log s``
    and ``entropy = log s - d / s`` (clamped at 0 against rounding); a chosen token's
    log-probability is its logit minus the ``logsumexp``. NaN for a row whose sums are not finite.
    """
    lse: list[float] = []
    entropy: list[float] = []
    for m, s, d in zip(shifts, sums, dots):
        if not (s > 0.0 and math.isfinite(s) and math.isfinite(d) and math.isfinite(m)):
            lse.append(math.nan)
            entropy.append(math.nan)
            continue
        log_s = math.log(s)
        lse.append(m + log_s)
        entropy.append(max(log_s - d / s, 0.0))
    return lse, entropy


def row_lse_entropy(rows: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """``logsumexp`` and softmax entropy of short rows of logits in Python floats (a scripted
    answer's row, the K logits a remote server sent): their sums, shifted by the row maximum,
    finished by :func:`lse_entropy_of`. Masked (-inf) logits contribute 0; NaN for a row holding NaN."""
    shifts: list[float] = []
    sums: list[float] = []
    dots: list[float] = []
    for z in rows:
        m = max(z) if z and not any(map(math.isnan, z)) else math.nan
        e = [math.exp(v - m) for v in z]
        shifts.append(m)
        sums.append(sum(e))
        dots.append(sum(w * (v - m) for w, v in zip(e, z) if w > 0.0))
    return lse_entropy_of(shifts, sums, dots)


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
    if use_k < stored_k:  # the k largest (a row holding NaN stays NaN: au_eu then gives NaN)
        top = -np.partition(-arr, use_k - 1, axis=-1)[..., :use_k]
        arr = np.where(np.isnan(arr).any(axis=-1, keepdims=True), np.nan, top)
    au, eu = au_eu(arr, evidence)
    return RescoredLogits(au=au, eu=eu, k=use_k, evidence=evidence)
