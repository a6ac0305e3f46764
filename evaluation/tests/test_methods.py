"""Uncertainty methods re-scored from the cache (``evaluation.methods``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logtoku_eval.cache import CachedGeneration, CachedToken
from logtoku_eval.methods import HEADLINE, cluster_by_similarity, cluster_entropy, sampling_scores, single_pass_scores

from .support import BagOfWords


def test_single_pass_scores_match_spec_vectors() -> None:
    tok = CachedToken(1, " a", (30.0, 20.0, 10.0, 5.0, 1.0), (1, 2, 3, 4, 5), -0.5, 2.0)
    bad = CachedToken(2, " b", (5.0, -3.0, -4.0, -5.0, -6.0), (1, 2, 3, 4, 5), -1.5, 1.0)
    recs = [
        CachedGeneration("a", "q", "a", "stop", (tok,)),
        CachedGeneration("b", "q", "a b", "stop", (tok, bad)),
        CachedGeneration("c", "q", "", "stop", ()),
    ]
    s = single_pass_scores(recs)
    assert s[HEADLINE][0] == pytest.approx(-0.663117 * 0.038462, rel=1e-4)
    assert s["logtoku-k5-clamped-top25"][0] == pytest.approx(-1.236385 * 0.070423, rel=1e-4)
    # token b: clamped AU = 0 -> u = 0; mean of (u_a, 0) over 2 tokens
    assert s["logtoku-k2-clamped-mean"][1] == pytest.approx(-0.663117 * 0.038462 / 2, rel=1e-4)
    assert math.isnan(s["logtoku-k2-raw-top25"][1])  # raw evidence: NaN, kept
    assert s["probability-top25"][1] == pytest.approx(-1.0)  # -(0.5 + 1.5) / 2
    assert s["entropy-mean"][1] == pytest.approx(-1.5)
    assert all(math.isnan(v[2]) for v in s.values())  # empty answer


def test_semantic_clustering_and_entropy() -> None:
    v = np.array([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0], [0.0, 1.0]])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    assert cluster_by_similarity(v, 0.9) == [0, 0, 1, 1]
    assert cluster_entropy([0, 0, 1, 1]) == pytest.approx(math.log(2))
    assert cluster_entropy([0, 0, 0]) == 0.0


def test_sampling_scores() -> None:
    from logtoku_eval.cache import CachedSample, CachedSamples

    same = CachedSamples("a", "q", tuple(CachedSample("Paris", 1, 0.2) for _ in range(3)))
    mixed = CachedSamples("b", "q", (CachedSample("Paris", 1, 0.5), CachedSample("Lyon", 1, 1.5), CachedSample("", 0, math.nan)))
    s = sampling_scores([same, mixed], BagOfWords())
    assert s["ln-entropy"].tolist() == pytest.approx([-0.2, -1.0])
    assert s["lexical-similarity"].tolist() == pytest.approx([1.0, 0.0])
    assert s["semantic-entropy-emb"][0] == 0.0 and s["semantic-entropy-emb"][1] == pytest.approx(-math.log(2))
