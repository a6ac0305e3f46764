"""Response-reliability methods scored from the cache (higher = more reliable, always).

Single-pass, from the greedy answer's stored raw top-K logits (no model needed):

* ``logtoku-k{2,5}-{clamped,raw}-{top25,mean}``: ``-mean(AU*EU)`` over the 25 least reliable
  tokens (the paper's score; ``top25``) or over all tokens (``mean``), with K = 2 (paper) or
  5 and clamped (default) or raw (reference reproduction: NaN where undefined) evidence;
* ``probability-{top25,mean}``: ``-mean(-log p)`` of the chosen tokens, same aggregation;
* ``entropy-{top25,mean}``: ``-mean(H)`` of the full-softmax entropy, same aggregation.

Sampling baselines, from ``n`` sampled answers (10 at T = 0.5 in the paper):

* ``ln-entropy``: ``-mean`` over samples of the length-normalised NLL;
* ``lexical-similarity``: mean pairwise ROUGE-L F of the samples (the paper's "minus
  mean pairwise ROUGE-L" as an uncertainty, Ma et al. 2025, so + as a reliability);
* ``semantic-entropy-emb``: **a stand-in for semantic entropy** (no entailment model installs
  offline): samples are clustered greedily by sentence-embedding cosine similarity >=
  ``threshold`` (MiniLM by default) instead of bidirectional entailment; reliability =
  ``-`` the entropy of the cluster frequencies (discrete semantic entropy).

An empty answer scores NaN (ranked least reliable by the metrics).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from logtoku_eval.cache import CachedGeneration, CachedSamples
from logtoku_eval.judges import Embedder, rouge_l
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N, EvidenceMode, rescore

Family = Literal["logtoku", "single-pass baseline", "sampling baseline"]


@dataclass(frozen=True)
class Method:
    """A named scoring method; ``family`` groups the table (LogTokU vs the baselines)."""

    name: str
    family: Family
    description: str


HEADLINE = "logtoku-k2-clamped-top25"
"""The paper's setting (K = 2, top-25 aggregation) with the library's default evidence."""


def single_pass_methods(top_n: int = DEFAULT_TOP_N) -> list[Method]:
    """The single-pass methods, LogTokU variants first (headline first of all)."""
    methods = []
    for k in (2, 5):
        for evidence in ("clamped", "raw"):
            for agg in ("top", "mean"):
                name = f"logtoku-k{k}-{evidence}-{'top' + str(top_n) if agg == 'top' else 'mean'}"
                how = f"top-{top_n} mean" if agg == "top" else "mean over all tokens"
                methods.append(Method(name, "logtoku", f"-(AU*EU), {how}, K={k}, {evidence} evidence"))
    for base, what in (("probability", "-log p of the chosen token"), ("entropy", "full-softmax entropy")):
        methods.append(Method(f"{base}-top{top_n}", "single-pass baseline", f"-({what}), top-{top_n} mean"))
        methods.append(Method(f"{base}-mean", "single-pass baseline", f"-({what}), mean over all tokens"))
    return methods


SAMPLING_METHODS = [
    Method("ln-entropy", "sampling baseline", "-mean length-normalised NLL of the sampled answers"),
    Method("lexical-similarity", "sampling baseline", "mean pairwise ROUGE-L F of the sampled answers"),
    Method(
        "semantic-entropy-emb",
        "sampling baseline",
        "STAND-IN for semantic entropy: -entropy of clusters by embedding cosine (not entailment)",
    ),
]


def _top_mean(values: np.ndarray, top_n: int) -> float:
    """Mean of the ``top_n`` largest values (NaN anywhere -> NaN, as the library's ``top_n_mean``)."""
    if values.size == 0 or np.isnan(values).any():
        return math.nan
    n = min(top_n, values.size)
    return float(np.sort(values)[::-1][:n].mean())


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def single_pass_scores(records: Sequence[CachedGeneration], top_n: int = DEFAULT_TOP_N) -> dict[str, np.ndarray]:
    """Every single-pass method's reliability per record, re-scored from the stored logits."""
    out: dict[str, list[float]] = {m.name: [] for m in single_pass_methods(top_n)}
    top = f"top{top_n}"
    for rec in records:
        width = len(rec.tokens[0].top_logits) if rec.tokens else 0
        logits = np.array([t.top_logits for t in rec.tokens], dtype=np.float64).reshape(len(rec.tokens), width)
        for k in (2, 5):
            for evidence in ("clamped", "raw"):
                name = f"logtoku-k{k}-{evidence}"
                if logits.shape[0] == 0 or logits.shape[1] < k:
                    out[f"{name}-{top}"].append(math.nan)
                    out[f"{name}-mean"].append(math.nan)
                    continue
                ev: EvidenceMode = "raw" if evidence == "raw" else "clamped"
                u = rescore(logits, k=k, evidence=ev).uncertainty
                out[f"{name}-{top}"].append(-_top_mean(u, top_n))
                out[f"{name}-mean"].append(-_mean(u))
        nll = -np.array([t.logprob for t in rec.tokens], dtype=np.float64)
        ent = np.array([t.entropy for t in rec.tokens], dtype=np.float64)
        out[f"probability-{top}"].append(-_top_mean(nll, top_n))
        out["probability-mean"].append(-_mean(nll))
        out[f"entropy-{top}"].append(-_top_mean(ent, top_n))
        out["entropy-mean"].append(-_mean(ent))
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def cluster_by_similarity(vectors: np.ndarray, threshold: float) -> list[int]:
    """Greedy clustering of L2-normalised ``(n, d)`` vectors: each joins the first cluster whose
    first member has cosine >= ``threshold``, else opens a new one. Returns cluster ids."""
    reps: list[int] = []
    ids: list[int] = []
    for i in range(vectors.shape[0]):
        for c, r in enumerate(reps):
            if float(vectors[i] @ vectors[r]) >= threshold:
                ids.append(c)
                break
        else:
            reps.append(i)
            ids.append(len(reps) - 1)
    return ids


def cluster_entropy(cluster_ids: Sequence[int]) -> float:
    """Entropy (nats) of the cluster frequencies; 0 when every sample is in one cluster."""
    if not cluster_ids:
        return math.nan
    counts = np.bincount(np.asarray(cluster_ids))
    p = counts[counts > 0] / len(cluster_ids)
    return float(-(p * np.log(p)).sum())


def sampling_scores(
    samples: Sequence[CachedSamples], embedder: Embedder | None = None, threshold: float = 0.85
) -> dict[str, np.ndarray]:
    """The sampling baselines' reliability per record (semantic variant only with an embedder)."""
    out: dict[str, list[float]] = {"ln-entropy": [], "lexical-similarity": []}
    if embedder is not None:
        out["semantic-entropy-emb"] = []
    for rec in samples:
        texts = [s.text for s in rec.samples if s.text.strip()]
        nlls = [s.nll for s in rec.samples if s.n_tokens > 0 and math.isfinite(s.nll)]
        out["ln-entropy"].append(-float(np.mean(nlls)) if nlls else math.nan)
        pairs = list(itertools.combinations([s.text for s in rec.samples], 2))
        out["lexical-similarity"].append(float(np.mean([rouge_l(a, b) for a, b in pairs])) if pairs else math.nan)
        if embedder is not None:
            out["semantic-entropy-emb"].append(
                -cluster_entropy(cluster_by_similarity(embedder.embed(texts), threshold)) if texts else math.nan
            )
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def response_au_eu(records: Sequence[CachedGeneration], k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Per answer: mean token AU and mean token EU (clamped, K = ``k``), for the quadrant scatter."""
    au, eu = [], []
    for rec in records:
        if not rec.tokens:
            au.append(math.nan)
            eu.append(math.nan)
            continue
        r = rescore([t.top_logits for t in rec.tokens], k=k)
        au.append(float(r.au.mean()))
        eu.append(float(r.eu.mean()))
    return np.asarray(au), np.asarray(eu)
