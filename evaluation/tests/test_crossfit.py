"""The cross-fitted guard score (``evaluation.crossfit``): determinism, no leakage, degenerate folds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from logtoku_eval.crossfit import (
    cross_fit_guard,
    guard_scores,
    plain_stat_methods,
    plain_stat_scores,
    shipped_scores,
)
from logtoku_eval.fabricated_eval import stats_from_cached
from logtoku_guard.backends.embedded import EMBEDDED_MODEL
from logtoku_guard.calibration.guard_fit import shipped_guard
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.guard_score import auroc, fit_guard, with_guard_score

from .support import cached_answer


def _rows(n: int) -> tuple[list, np.ndarray]:
    """``n`` answers, peaked logits on even rows; the label disagrees with the logits on every 7th row."""
    peaked = [i % 2 == 0 for i in range(n)]
    rows = [stats_from_cached(cached_answer(f"a{i}", f"question number {i}?", right=y)) for i, y in enumerate(peaked)]
    labels = np.array([y != (i % 7 == 3) for i, y in enumerate(peaked)])
    return rows, labels


def test_each_fold_is_scored_by_the_guard_fit_on_the_other_folds_only() -> None:
    rows, y = _rows(30)
    fit = cross_fit_guard(rows, y, folds=3, seed=4)
    assert fit.fold.tolist() == (np.random.default_rng(4).permutation(30) % 3).tolist()
    assert fit.n_fitted == 3 and fit.skipped == ()
    for f in range(3):
        train = [i for i in range(30) if fit.fold[i] != f]
        guard = fit_guard([rows[i] for i in train], [bool(y[i]) for i in train], ["x"], folds=0)
        for i in np.flatnonzero(fit.fold == f):
            assert fit.scores[i] == with_guard_score(rows[i], guard).guard_score
    assert auroc(fit.scores, y) > 0.7  # the peaked-logit answers are mostly the right ones
    assert set(fit.mean_weights()) >= {"reliability", "prompt_mean_logprob"}
    assert "3 folds" in fit.describe() and "3 fold fits" in fit.describe()


def test_cross_fit_is_deterministic_for_a_seed() -> None:
    rows, y = _rows(25)
    a, b = cross_fit_guard(rows, y, seed=1), cross_fit_guard(rows, y, seed=1)
    assert np.array_equal(a.scores, b.scores) and np.array_equal(a.fold, b.fold)
    other = cross_fit_guard(rows, y, seed=2)
    assert not np.array_equal(a.fold, other.fold)


def test_no_leakage_an_answers_score_ignores_its_own_label() -> None:
    rows, y = _rows(30)
    base = cross_fit_guard(rows, y, folds=5, seed=0)
    for i in (0, 7, 13, 29):
        flipped = y.copy()
        flipped[i] = not flipped[i]
        again = cross_fit_guard(rows, flipped, folds=5, seed=0)
        assert np.array_equal(again.fold, base.fold)  # the folds never depend on the labels
        assert again.scores[i] == base.scores[i]
        same_fold = (base.fold == base.fold[i]) & (np.arange(30) != i)
        assert np.array_equal(again.scores[same_fold], base.scores[same_fold])  # fit without that label either
        assert not np.allclose(again.scores[~(base.fold == base.fold[i])], base.scores[~(base.fold == base.fold[i])])


def test_degenerate_folds_are_nan_with_a_reason_never_an_error() -> None:
    rows, _ = _rows(12)
    one_class = cross_fit_guard(rows, np.ones(12, dtype=bool), folds=3)
    assert np.isnan(one_class.scores).all() and one_class.n_fitted == 0 and len(one_class.skipped) == 3
    assert "12 correct and 0 incorrect" not in one_class.skipped[0]  # the training part, not all answers
    assert "0 incorrect answers, the guard needs at least 2 of each" in one_class.skipped[0]
    assert "Scored NaN: fold 0" in one_class.describe() and one_class.mean_weights() == {}
    # two wrong answers: the folds holding one of them keep only one in their training part
    y = np.ones(12, dtype=bool)
    fold = np.random.default_rng(0).permutation(12) % 3
    wrong = [int(np.flatnonzero(fold == 0)[0]), int(np.flatnonzero(fold == 1)[0])]
    y[wrong] = False
    fit = cross_fit_guard(rows, y, folds=3, seed=0)
    assert np.isnan(fit.scores[fold != 2]).all() and np.isfinite(fit.scores[fold == 2]).all()
    assert fit.n_fitted == 1 and [r.split(" ")[1] for r in fit.skipped] == ["0", "1"]
    # fewer answers than folds: empty folds score nothing, the others still fit or say why
    tiny = cross_fit_guard(rows[:3], [True, False, True], folds=5)
    assert tiny.n_fitted == 0 and np.isnan(tiny.scores).all() and len(tiny.skipped) == 3


def test_cross_fit_input_errors_name_the_fix() -> None:
    rows, y = _rows(6)
    with pytest.raises(ConfigurationError, match=r"folds must be an integer >= 2, got 1.*--guard-folds 0"):
        cross_fit_guard(rows, y, folds=1)
    with pytest.raises(ConfigurationError, match="one label per row, got 6 rows"):
        cross_fit_guard(rows, y[:5])


def test_shipped_guard_applied_as_is_and_the_guard_score_bundle() -> None:
    rows, y = _rows(20)
    shipped = shipped_guard(EMBEDDED_MODEL)
    assert shipped is not None  # the embedded model ships one
    got = shipped_scores(rows, EMBEDDED_MODEL)
    assert got is not None and got.tolist() == [with_guard_score(r, shipped).guard_score for r in rows]
    assert shipped_scores(rows, "some-other-model") is None
    scores, notes, fit = guard_scores(rows, y, model=EMBEDDED_MODEL, folds=4, seed=3)
    assert set(scores) == {"guard-score", "guard-score-shipped"} and fit is not None and fit.folds == 4
    assert np.array_equal(scores["guard-score"], cross_fit_guard(rows, y, folds=4, seed=3).scores)
    assert any("cross-fitted" in n for n in notes) and any("shipped" in n for n in notes)
    off, notes, fit = guard_scores(rows, y, model="other", folds=0)
    assert off == {} and notes == [] and fit is None


def test_plain_statistics_skip_the_guard_ones_and_absent_prompt_scores() -> None:
    rows, _ = _rows(4)
    names = [m.name for m in plain_stat_methods()]
    assert "guard-score" not in names and "reliability-debiased" not in names and "prompt-mean-logprob" in names
    assert set(plain_stat_scores(rows)) == set(names)
    no_prompt = [stats_from_cached(replace(cached_answer(f"a{i}", "q?", right=True), prompt_tokens=())) for i in range(3)]
    assert set(plain_stat_scores(no_prompt)) == {n for n in names if not n.startswith("prompt-")}
