"""The guard replay (``evaluation.replay``): masks, thresholds, oracle and accuracy, hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logtoku_eval.replay import Replay, oracle_mask, retrieve_mask, threshold_for
from logtoku_guard.errors import ConfigurationError


def test_retrieve_mask_takes_the_lowest_finite_scores_ties_by_position() -> None:
    s = np.array([0.3, math.nan, -1.0, 0.5, -1.0])
    assert retrieve_mask(s, 0).tolist() == [False] * 5
    assert retrieve_mask(s, 2).tolist() == [False, False, True, False, True]
    assert retrieve_mask(s, 3).tolist() == [True, False, True, False, True]
    assert retrieve_mask(s, 10).tolist() == [True, False, True, True, True]  # NaN never fires, as in the guard


def test_threshold_separates_exactly_the_mask() -> None:
    s = np.array([0.3, math.nan, -1.0, 0.5, -1.0])
    assert math.isnan(threshold_for(s, retrieve_mask(s, 1)))  # the two -1.0 tie across the boundary
    for k in (0, 2, 3, 4):
        mask = retrieve_mask(s, k)
        t = threshold_for(s, mask)
        assert np.array_equal(np.isfinite(s) & (s < t), mask), k
    assert threshold_for(s, retrieve_mask(s, 2)) == pytest.approx(-0.35)


def test_oracle_retrieves_where_it_helps_first_and_where_it_hurts_last() -> None:
    closed = np.array([True, False, False, True])
    rag = np.array([False, False, True, True])
    assert oracle_mask(closed, rag, 1).tolist() == [False, False, True, False]
    assert oracle_mask(closed, rag, 3).tolist() == [False, True, True, True]
    assert oracle_mask(closed, rag, 4).all()


def test_replay_accuracy_random_and_oracle_hand_computed() -> None:
    closed = np.array([True, False, False, True])
    rag = np.array([True, True, False, False])
    replay = Replay(("a", "b", "c", "d"), closed, rag, {"logtoku": np.array([0.9, 0.1, 0.2, 0.8])})
    half = replay.point("logtoku", 0.5)  # retrieves b and c: final [T, T, F, T]
    assert (half.retrievals, half.accuracy, half.helped, half.hurt) == (2, 0.75, 1, 0)
    assert half.threshold == pytest.approx(0.5)
    assert replay.point("logtoku", 1.0).accuracy == 0.5 and replay.point("logtoku", 0.0).accuracy == 0.5
    # random: closed accuracy 0.5 + k/n * mean(rag - closed) = 0.5 + 0.5 * 0
    assert replay.point("random", 0.5).accuracy == 0.5
    assert replay.point("oracle", 0.25).accuracy == 0.75
    assert replay.curve("logtoku", np.array([0.0, 0.25, 0.5, 0.75, 1.0])).tolist() == [0.5, 0.75, 0.75, 0.5, 0.5]
    idx = np.random.default_rng(0).integers(0, 4, size=(200, 4))
    d = replay.paired("logtoku", "oracle", 0.25, idx)
    assert d.diff == 0.0 and d.low <= 0.0 <= d.high and d.p_value == 1.0
    with_ci = replay.point("logtoku", 0.5, idx)
    assert with_ci.low <= 0.75 <= with_ci.high
    with pytest.raises(ConfigurationError, match="one value per question"):
        Replay(("a",), closed, rag, {})


def test_paired_difference_against_random_uses_its_expected_accuracy_per_question() -> None:
    closed = np.array([True, False, False, True])
    rag = np.array([True, True, False, False])
    replay = Replay(("a", "b", "c", "d"), closed, rag, {"guard-score": np.array([0.9, 0.1, 0.2, 0.8])})
    # random at budget 0.25 retrieves 1 of 4: expected outcome closed + (rag - closed) / 4
    assert replay.outcome("random", 0.25).tolist() == [1.0, 0.25, 0.0, 0.75]
    assert replay.outcome("guard-score", 0.25).tolist() == [1.0, 1.0, 0.0, 1.0]  # retrieves b only
    idx = np.random.default_rng(0).integers(0, 4, size=(300, 4))
    d = replay.paired("guard-score", "random", 0.25, idx)
    assert d.diff == pytest.approx(replay.point("guard-score", 0.25).accuracy - replay.random_accuracy(0.25))
    assert d.diff == pytest.approx(0.25) and d.low <= d.diff <= d.high
    assert replay.paired("random", "random", 0.25, idx).diff == 0.0
