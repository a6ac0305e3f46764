"""Response statistics: hand-computed values, one holder of the reliability numbers, quadrant shares."""

from __future__ import annotations

import math

import pytest

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.scoring.stats import STAT_NAMES, ResponseStats
from logtoku_guard.types import TokenScore


def answer(*rows: tuple[str, float, float]) -> ScriptedAnswer:
    return ScriptedAnswer([r[0] for r in rows], [[r[1], r[2]] for r in rows])


def stats_of(*rows: tuple[str, float, float], quadrants: QuadrantThresholds | None = None) -> ResponseStats:
    g = ScriptedBackend([answer(*rows)]).generate("q")
    return ResponseStats.from_generation(g, quadrants, first_tokens=2)


def tok(i: int, au: float, eu: float) -> TokenScore:
    return TokenScore(
        index=i, id=i, text=f"t{i}", top_logits=(1.0, 0.0), top_ids=(i, i + 1), au=au, eu=eu, logprob=-0.1, entropy=0.2
    )


def test_response_stats_by_hand() -> None:
    # EU = 2 / (e1 + e2 + 2); AU from the digamma formula (checked in test_uncertainty).
    s = stats_of(("A", 8.0, 0.0), (" b", 2.0, 0.0), (" ", 0.0, 0.0), ("c", 1.0, 1.0), quadrants=QuadrantThresholds(0.3, 0.5))
    eus = [2 / 10, 2 / 4, 1.0, 2 / 4]
    assert s.max_eu == pytest.approx(1.0) and s.mean_eu == pytest.approx(sum(eus) / 4)
    assert s.first_eu == pytest.approx((0.2 + 0.5) / 2)  # whitespace tokens are not content
    assert s.max_au == pytest.approx(0.5) and s.mean_au == pytest.approx(0.5 / 4)  # only (1, 1) has AU > 0
    # token 4: evidence (1, 1) -> AU = 1 - ... > 0.3, EU = 0.5 (not > 0.5): quadrant IV; token 3: AU 0, EU 1: II
    assert s.quadrant_ii_share == pytest.approx(0.25) and s.quadrant_i_share == 0.0
    assert s.n_tokens == 4
    empty = ResponseStats.from_tokens([])
    assert math.isnan(empty.max_eu) and math.isnan(empty.reliability) and empty.n_tokens == 0
    assert empty.as_dict()["max_eu"] is None


def test_the_reliability_numbers_are_the_generations_score() -> None:
    g = ScriptedBackend([answer(("A", 8.0, 0.0), (" b", 1.0, 1.0))]).generate("q")
    s = ResponseStats.from_generation(g)
    assert s.score is g.score  # one holder: the cached ResponseScore, not a copy
    for name in ("reliability", "reliability_mean", "probability_reliability", "entropy_reliability"):
        assert s.get(name) == getattr(g.score, name)
    assert list(s.as_dict()) == list(STAT_NAMES)


def test_unknown_stat_name_is_an_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown response statistic 'max_eu2'.*max_eu"):
        stats_of(("A", 1.0, 0.0)).get("max_eu2")


def test_quadrant_shares_count_an_undefined_token_in_no_quadrant_over_all_tokens() -> None:
    th = QuadrantThresholds(au=0.5, eu=0.5)
    tokens = [tok(0, 0.9, 0.9), tok(1, 0.1, 0.9), tok(2, math.nan, 0.9), tok(3, 0.1, 0.1)]
    s = ResponseStats.from_tokens(tokens, top_n=2, quadrants=th)
    assert s.quadrant_i_share == pytest.approx(1 / 4)  # I: high AU, high EU
    assert s.quadrant_ii_share == pytest.approx(1 / 4)  # II: low AU, high EU; the NaN token is in neither
    assert s.unreliable_share == pytest.approx(2 / 4)
    assert math.isnan(ResponseStats.from_tokens(tokens).quadrant_i_share)  # no thresholds: undefined
