"""Metric maths (``evaluation.metrics``) against hand-computed values and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logtoku_eval import metrics as M
from logtoku_guard.errors import ConfigurationError

S4 = [0.9, 0.8, 0.7, 0.6]


Y4 = [True, False, True, False]


def test_auroc_hand_computed() -> None:
    # positive pairs won: (0.9>0.8), (0.9>0.6), (0.7>0.6); lost: (0.7<0.8) -> 3/4
    assert M.auroc(S4, Y4) == pytest.approx(0.75)
    assert M.auroc([1, 1], [True, False]) == pytest.approx(0.5)  # a tie counts one half
    assert M.auroc([3, 2, 1], [True, True, False]) == 1.0
    assert M.auroc([1, 2, 3], [True, True, False]) == 0.0
    assert math.isnan(M.auroc([1, 2], [True, True]))  # one class only


def test_auroc_matches_brute_force_with_ties() -> None:
    rng = np.random.default_rng(3)
    s = rng.integers(0, 5, size=60).astype(float)
    y = rng.random(60) < 0.4
    pos, neg = s[y], s[~y]
    brute = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])
    assert M.auroc(s, y) == pytest.approx(brute)


def test_nan_scores_rank_least_reliable_and_are_not_dropped() -> None:
    assert M.auroc([math.nan, 0.5], [True, False]) == 0.0
    assert M.auroc([math.nan, 0.5], [False, True]) == 1.0


def test_auprc_hand_computed() -> None:
    # k=1: P=1 R=.5; k=2: P=.5 R=.5; k=3: P=2/3 R=1 -> AP = .5*1 + .5*2/3
    assert M.auprc(S4, Y4) == pytest.approx(0.5 + 1 / 3)
    assert M.auprc([3, 2, 1], [True, True, False]) == pytest.approx(1.0)


def test_risk_coverage_aurc_and_prr_hand_computed() -> None:
    cov, risk = M.risk_coverage(S4, Y4)
    assert cov.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert risk.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5])
    assert M.aurc(S4, Y4) == pytest.approx((0 + 0.5 + 1 / 3 + 0.5) / 4)
    # random AURC = 0.5 (error rate); oracle risks 0, 0, 1/3, 1/2 -> 5/24; PRR = (1/2-1/3)/(1/2-5/24) = 4/7
    assert M.prr(S4, Y4) == pytest.approx(4 / 7)
    assert M.prr([4, 3, 2, 1], [True, True, False, False]) == pytest.approx(1.0)
    assert M.prr([1, 2, 3, 4], [True, True, False, False]) < 0


def test_risk_coverage_spreads_ties() -> None:
    _, risk = M.risk_coverage([1.0, 1.0], [True, False])
    assert risk.tolist() == pytest.approx([0.5, 0.5])


def test_roc_curve_endpoints() -> None:
    fpr, tpr = M.roc_curve(S4, Y4)
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.trapezoid(tpr, fpr) == pytest.approx(M.auroc(S4, Y4))


def test_bootstrap_is_deterministic_per_seed_and_brackets_the_point() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(80) < 0.5
    s = y + rng.normal(0, 1.0, 80)
    a = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=7)
    b = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=7)
    c = M.bootstrap_ci(M.auroc, s, y, n_boot=200, seed=8)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low <= a.value <= a.high and a.n_valid == 200
    idx = M.bootstrap_indices(5, 3, seed=1)
    assert idx.shape == (3, 5) and (idx == M.bootstrap_indices(5, 3, seed=1)).all()


def test_bootstrap_undefined_resamples_are_skipped() -> None:
    iv = M.bootstrap_ci(M.auroc, [1.0, 2.0], [True, True], n_boot=10, seed=0)
    assert math.isnan(iv.value) and iv.n_valid == 0


def test_paired_bootstrap() -> None:
    rng = np.random.default_rng(1)
    y = rng.random(100) < 0.5
    good = y + rng.normal(0, 0.5, 100)
    noise = rng.normal(0, 1, 100)
    same = M.paired_bootstrap(M.auroc, good, good, y, n_boot=100, seed=0)
    assert same.diff == 0 and same.low == 0 and same.high == 0 and same.p_value == 1.0
    better = M.paired_bootstrap(M.auroc, good, noise, y, n_boot=300, seed=0)
    assert better.diff > 0.2 and better.low > 0 and better.p_value < 0.05
    with pytest.raises(ConfigurationError, match="n_boot"):
        M.paired_bootstrap(M.auroc, good, noise, y, n_boot=0)


def test_metric_input_validation() -> None:
    with pytest.raises(ConfigurationError, match="same length"):
        M.auroc([1, 2], [True])
    with pytest.raises(ConfigurationError, match="labels"):
        M.auroc([1, 2], [0, 2])


def test_vectorised_bootstrap_equals_the_per_resample_metrics() -> None:
    rng = np.random.default_rng(5)
    s = rng.integers(0, 6, size=40).astype(float)  # many ties
    s[3] = math.nan
    y = rng.random(40) < 0.45
    counts = M.bootstrap_counts(40, 30, seed=2)
    fast = M.resampled_metrics(s, y, counts)
    for b, idx in enumerate(M.bootstrap_indices(40, 30, seed=2)):
        for name, fn in M.METRICS.items():
            want = fn(s[idx], y[idx])
            assert (math.isnan(want) and math.isnan(fast[name][b])) or fast[name][b] == pytest.approx(want), (name, b)
    full = M.bootstrap_all(s, y, n_boot=30, seed=2)
    slow = M.bootstrap_ci(M.prr, s, y, n_boot=30, seed=2)
    assert (full["prr"].low, full["prr"].high) == pytest.approx((slow.low, slow.high))
    paired = M.paired_all(s, -s, y, n_boot=30, seed=2)
    assert paired["auroc"].diff == pytest.approx(M.auroc(s, y) - M.auroc(-s, y))
