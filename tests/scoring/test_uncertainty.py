"""LogTokU maths without a model: spec test vectors, invariants, aggregation, helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds
from logtoku_guard.scoring.uncertainty import (
    RescoredLogits,
    WordScore,
    log_softmax_stats,
    logtoku,
    masked_mean,
    mean_of,
    rescore,
    response_reliability,
    token_uncertainty,
    top_k_logits,
    top_n_mean,
    top_n_mean_of,
    validate_evidence,
    word_scores,
)

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover - the seeded-random invariants below still run
    HAVE_HYPOTHESIS = False

NAN = math.nan
NEG_INF = -math.inf

# Spec section 8. Each entry: top logits, {K: (clamped AU, raw AU, EU)}.
# Raw values: the table's own "(raw: ...)" notes; where the table gives no note, raw equals the
# clamped value when the top-K logits are all >= 0, and is NaN when a top-K logit is <= -1
# (spec section 3: "results must then be NaN"), which is row 3 with K = 5 (it holds -1 and -2).
VECTORS = [
    ([30, 20, 10, 5, 1], {2: (0.663117, 0.663117, 0.038462), 5: (1.236385, 1.236385, 0.070423)}),
    ([3, 1, 0.5, 0.2, 0.1], {2: (0.458333, 0.458333, 0.333333), 5: (0.813098, 0.813098, 0.510204)}),
    ([10, 10, 0, -1, -2], {2: (0.668771, 0.668771, 0.090909), 5: (0.668771, NAN, 0.200000)}),
    ([5, -3, -4, -5, -6], {2: (0.0, NAN, 0.285714), 5: (0.0, NAN, 0.500000)}),
    ([0.5, -0.5, -1, -2, -3], {2: (0.0, NEG_INF, 0.800000), 5: (0.0, NAN, 0.909091)}),
]
CASES = [(row, k, *vals[k]) for row, vals in VECTORS for k in (2, 5)]
CASE_IDS = [f"{'_'.join(str(v) for v in row)}-K{k}" for row, k, *_ in CASES]
DTYPES = {torch.float64: 1e-6, torch.float32: 1e-5}


def assert_same(actual: float, expected: float, tol: float) -> None:
    """Equal within ``tol``; NaN must be NaN and -inf must be -inf exactly."""
    if math.isnan(expected):
        assert math.isnan(actual), f"expected NaN, got {actual}"
    elif math.isinf(expected):
        assert actual == expected, f"expected {expected}, got {actual}"
    else:
        assert actual == pytest.approx(expected, abs=tol)


def table(k: int, dtype: torch.dtype) -> tuple[torch.Tensor, list[float], list[float], list[float]]:
    """The five table rows as ``(5, k)`` plus expected clamped AU, raw AU and EU."""
    rows = torch.tensor([row[:k] for row, _ in VECTORS], dtype=dtype)
    return rows, [v[k][0] for _, v in VECTORS], [v[k][1] for _, v in VECTORS], [v[k][2] for _, v in VECTORS]


# --------------------------------------------------------------------------- test vectors


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["float64", "float32"])
@pytest.mark.parametrize(("row", "k", "au_clamped", "au_raw", "eu"), CASES, ids=CASE_IDS)
def test_spec_vector_single_row(
    row: list[float], k: int, au_clamped: float, au_raw: float, eu: float, dtype: torch.dtype
) -> None:
    tol = DTYPES[dtype]
    z = torch.tensor(row[:k], dtype=dtype)
    au_c, eu_c = logtoku(z)  # default mode is clamped
    assert au_c.shape == () and eu_c.shape == ()
    assert au_c.dtype == dtype and eu_c.dtype == dtype
    assert_same(float(au_c), au_clamped, tol)
    assert_same(float(eu_c), eu, tol)
    au_r, eu_r = logtoku(z, evidence="raw")
    assert_same(float(au_r), au_raw, tol)
    assert_same(float(eu_r), eu, tol)  # EU is clamped in both modes


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["float64", "float32"])
@pytest.mark.parametrize(("row", "k", "au_clamped", "au_raw", "eu"), CASES, ids=CASE_IDS)
def test_spec_vector_unsorted_row(
    row: list[float], k: int, au_clamped: float, au_raw: float, eu: float, dtype: torch.dtype
) -> None:
    tol = DTYPES[dtype]
    top = row[:k]
    for shuffled in (top[::-1], top[1:] + top[:1]):
        z = torch.tensor(shuffled, dtype=dtype)
        au_c, eu_c = logtoku(z, "clamped")
        au_r, _ = logtoku(z, "raw")
        assert_same(float(au_c), au_clamped, tol)
        assert_same(float(eu_c), eu, tol)
        assert_same(float(au_r), au_raw, tol)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["float64", "float32"])
@pytest.mark.parametrize("k", [2, 5])
def test_spec_vectors_vectorised_over_batch_steps(k: int, dtype: torch.dtype) -> None:
    tol = DTYPES[dtype]
    rows, au_c_exp, au_r_exp, eu_exp = table(k, dtype)
    # batch 0: the table in order; batch 1: steps reversed and each row's K values rolled.
    batch = torch.stack([rows, rows.flip(0).roll(1, dims=-1)])
    assert batch.shape == (2, 5, k)
    expected = {
        "clamped": (au_c_exp, au_c_exp[::-1]),
        "raw": (au_r_exp, au_r_exp[::-1]),
    }
    for mode, (au0, au1) in expected.items():
        au, eu = logtoku(batch, mode)  # type: ignore[arg-type]
        assert au.shape == (2, 5) and eu.shape == (2, 5)
        assert au.dtype == dtype
        for step in range(5):
            assert_same(float(au[0, step]), au0[step], tol)
            assert_same(float(au[1, step]), au1[step], tol)
            assert_same(float(eu[0, step]), eu_exp[step], tol)
            assert_same(float(eu[1, step]), eu_exp[::-1][step], tol)


def test_raw_mode_never_raises_on_hostile_values() -> None:
    z = torch.tensor(
        [[0.0, 0.0], [-1.0, -1.0], [-0.5, 0.5], [-5.0, -7.0], [1e30, -1e30], [-0.999, 0.2], [3.0, -1.0]],
        dtype=torch.float64,
    )
    au, eu = logtoku(z, "raw")
    assert au.shape == (7,)
    # any top-K logit <= -1 -> NaN (never a crash, never dropped)
    invalid = (z <= -1).any(-1)
    assert torch.isnan(au[invalid]).all()
    assert torch.isfinite(eu).all() and (eu > 0).all() and (eu <= 1).all()


def test_all_zero_top_logits_clamped_is_zero_raw_is_nan() -> None:
    """Sum of raw logits 0 is outside the formula (spec section 3): raw NaN, clamped the limit 0."""
    au_c, eu_c = logtoku(torch.zeros(3, 4, dtype=torch.float64))
    au_r, eu_r = logtoku(torch.zeros(3, 4, dtype=torch.float64), "raw")
    assert torch.equal(au_c, torch.zeros(3))
    assert torch.equal(eu_c, torch.ones(3, dtype=torch.float64))
    assert torch.isnan(au_r).all()
    assert torch.equal(eu_r, eu_c)


def test_one_hot_evidence_has_zero_au_and_exact_eu() -> None:
    au, eu = logtoku(torch.tensor([7.0, 0.0, -3.0], dtype=torch.float64))
    assert float(au) == 0.0
    assert float(eu) == pytest.approx(3 / 10)


def test_k_of_one_is_rejected_by_logtoku() -> None:
    with pytest.raises(ConfigurationError, match="k=1"):
        logtoku(torch.tensor([[3.0]]))


def test_token_uncertainty_is_product() -> None:
    au = torch.tensor([0.5, 0.0, 2.0])
    eu = torch.tensor([0.2, 1.0, 0.25])
    assert torch.allclose(token_uncertainty(au, eu), torch.tensor([0.1, 0.0, 0.5]))


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_promoted_to_float32(dtype: torch.dtype) -> None:
    z = torch.tensor([[3.0, 1.0, 0.5, 0.25, 0.125]], dtype=dtype)
    au, eu = logtoku(z[..., :2])
    assert au.dtype == torch.float32 and eu.dtype == torch.float32
    assert float(au[0]) == pytest.approx(0.458333, abs=1e-5)
    assert float(eu[0]) == pytest.approx(1 / 3, abs=1e-5)
    values, _ = top_k_logits(z, 2)
    assert values.dtype == torch.float32
    log_probs, entropy = log_softmax_stats(z)
    assert log_probs.dtype == torch.float32 and entropy.dtype == torch.float32
    assert top_n_mean(z).dtype == torch.float32
    assert masked_mean(z).dtype == torch.float32


def test_integer_logits_are_promoted() -> None:
    au, eu = logtoku(torch.tensor([3, 1]))
    assert au.dtype == torch.float32
    assert float(au) == pytest.approx(0.458333, abs=1e-5)
    assert float(eu) == pytest.approx(1 / 3, abs=1e-6)


# --------------------------------------------------------------------------- invariants (seeded)


def _random_logits(seed: int, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_seeded_ranges_clamped(k: int) -> None:
    z = _random_logits(k, (4, 64, k), -15.0, 40.0)
    au, eu = logtoku(z)
    assert ((eu > 0) & (eu <= 1)).all()
    assert ((au >= 0) & (au < math.log(k))).all()
    au_r, eu_r = logtoku(z, "raw")
    assert torch.equal(eu_r, eu)
    assert torch.isnan(au_r[(z <= -1).any(-1)]).all()


@pytest.mark.parametrize("k", [2, 5])
def test_seeded_equal_large_logits_stay_below_ln_k(k: int) -> None:
    for value in (1.0, 10.0, 100.0, 1000.0):
        au, _ = logtoku(torch.full((k,), value, dtype=torch.float64))
        assert 0 < float(au) < math.log(k)


@pytest.mark.parametrize("k", [2, 5])
def test_seeded_shift_lowers_eu_and_keeps_order(k: int) -> None:
    z = _random_logits(100 + k, (200, k), 0.01, 30.0)
    _, eu = logtoku(z)
    for c in (0.5, 3.0, 50.0):
        _, eu_shift = logtoku(z + c)
        assert (eu_shift < eu).all()
        assert torch.equal(eu.argsort(stable=True), eu_shift.argsort(stable=True))


@pytest.mark.parametrize("k", [2, 5])
def test_seeded_permutation_invariance(k: int) -> None:
    z = _random_logits(200 + k, (3, 50, k), -5.0, 20.0)
    g = torch.Generator().manual_seed(7)
    perm = torch.stack([torch.randperm(k, generator=g) for _ in range(150)]).reshape(3, 50, k)
    zp = z.gather(-1, perm)
    for mode in ("clamped", "raw"):
        au, eu = logtoku(z, mode)  # type: ignore[arg-type]
        au_p, eu_p = logtoku(zp, mode)  # type: ignore[arg-type]
        assert torch.allclose(au, au_p, atol=1e-12, equal_nan=True)
        assert torch.allclose(eu, eu_p, atol=1e-12)


@pytest.mark.parametrize("k", [2, 5])
def test_seeded_modes_agree_for_non_negative(k: int) -> None:
    z = _random_logits(300 + k, (100, k), 0.0, 25.0)
    z[::7, 1:] = 0.0  # exact zeros (not all of a row) are allowed
    au_c, eu_c = logtoku(z)
    au_r, eu_r = logtoku(z, "raw")
    assert torch.allclose(au_c, au_r, atol=1e-12)
    assert torch.equal(eu_c, eu_r)


# --------------------------------------------------------------------------- invariants (hypothesis)

if HAVE_HYPOTHESIS:
    HYP = settings(max_examples=150, derandomize=True, database=None, deadline=None)

    def rows(low: float, high: float) -> st.SearchStrategy[list[float]]:
        return st.integers(min_value=2, max_value=6).flatmap(
            lambda k: st.lists(
                st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False),
                min_size=k,
                max_size=k,
            )
        )

    @HYP
    @given(rows(-1e4, 1e4))
    def test_hyp_clamped_ranges(row: list[float]) -> None:
        k = len(row)
        au, eu = logtoku(torch.tensor(row, dtype=torch.float64))
        assert 0 < float(eu) <= 1
        assert 0 <= float(au) < math.log(k)

    @HYP
    @given(rows(-1e4, 1e4))
    def test_hyp_raw_never_raises(row: list[float]) -> None:
        z = torch.tensor(row, dtype=torch.float64)
        au, eu = logtoku(z, "raw")
        _, eu_c = logtoku(z)
        assert float(eu) == float(eu_c)
        if min(row) <= -1:
            assert math.isnan(float(au))

    @HYP
    @given(rows(-50.0, 50.0), st.randoms(use_true_random=False))
    def test_hyp_permutation_invariance(row: list[float], rnd: object) -> None:
        shuffled = list(row)
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        for mode in ("clamped", "raw"):
            au, eu = logtoku(torch.tensor(row, dtype=torch.float64), mode)  # type: ignore[arg-type]
            au_s, eu_s = logtoku(torch.tensor(shuffled, dtype=torch.float64), mode)  # type: ignore[arg-type]
            assert_same(float(au_s), float(au), 1e-9)
            assert float(eu_s) == pytest.approx(float(eu), abs=1e-12)

    @HYP
    @given(rows(0.0, 1e3))
    def test_hyp_modes_agree_for_non_negative(row: list[float]) -> None:
        if sum(row) < 1e-6:  # raw is 0/0 at an all-zero row (spec section 3: sum near 0)
            return
        z = torch.tensor(row, dtype=torch.float64)
        au_c, eu_c = logtoku(z)
        au_r, eu_r = logtoku(z, "raw")
        assert float(au_r) == pytest.approx(float(au_c), abs=1e-9)
        assert float(eu_r) == float(eu_c)

    @HYP
    @given(
        st.integers(min_value=2, max_value=5).flatmap(
            lambda k: st.lists(
                st.lists(st.floats(min_value=0.001, max_value=100.0), min_size=k, max_size=k),
                min_size=2,
                max_size=8,
            )
        ),
        st.floats(min_value=0.01, max_value=100.0),
    )
    def test_hyp_shift_lowers_eu_keeps_order(tokens: list[list[float]], c: float) -> None:
        z = torch.tensor(tokens, dtype=torch.float64)
        _, eu = logtoku(z)
        _, eu_s = logtoku(z + c)
        assert (eu_s < eu).all()
        # ordering of tokens by EU: every strict pairwise order is kept
        d = eu[:, None] - eu[None, :]
        d_s = eu_s[:, None] - eu_s[None, :]
        strict = d.abs() > 1e-12
        assert (torch.sign(d[strict]) == torch.sign(d_s[strict])).all()


# --------------------------------------------------------------------------- top_k_logits & validation


def test_top_k_logits_sorted_and_indices_match() -> None:
    logits = _random_logits(1, (2, 3, 10), -5.0, 5.0)
    values, indices = top_k_logits(logits, 4)
    assert values.shape == (2, 3, 4) and indices.shape == (2, 3, 4)
    assert (values[..., :-1] >= values[..., 1:]).all()
    assert torch.equal(values, logits.sort(dim=-1, descending=True).values[..., :4])
    assert torch.equal(logits.gather(-1, indices), values)


def test_top_k_logits_default_k_is_two() -> None:
    values, indices = top_k_logits(torch.tensor([0.1, 9.0, -2.0, 4.0]))
    assert values.tolist() == pytest.approx([9.0, 4.0])
    assert indices.tolist() == [1, 3]


def test_top_k_logits_k_equal_vocab_is_allowed() -> None:
    values, _ = top_k_logits(torch.tensor([1.0, 3.0, 2.0]), 3)
    assert values.tolist() == [3.0, 2.0, 1.0]


@pytest.mark.parametrize(
    ("k", "needle"),
    [(1, "k=1"), (0, "k=0"), (-3, "k=-3"), (11, "k=11"), (2.0, "2.0"), ("2", "'2'"), (True, "True"), (None, "None")],
)
def test_top_k_logits_rejects_bad_k(k: object, needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        top_k_logits(torch.zeros(10), k)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_top_k_logits_k_above_vocab_names_the_vocab() -> None:
    with pytest.raises(ConfigurationError, match=r"k=11.*10 tokens"):
        top_k_logits(torch.zeros(2, 10), 11)


@pytest.mark.parametrize("bad", ["Clamped", "", "softplus", None, 1])
def test_validate_evidence_errors(bad: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_evidence(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    with pytest.raises(ConfigurationError):
        logtoku(torch.tensor([1.0, 2.0]), bad)  # type: ignore[arg-type]


def test_validate_evidence_accepts_both_modes() -> None:
    assert validate_evidence("clamped") == "clamped"
    assert validate_evidence("raw") == "raw"


# --------------------------------------------------------------------------- aggregation


def test_top_n_mean_hand_values() -> None:
    s = torch.tensor([0.1, 0.5, 0.3, 0.9], dtype=torch.float64)
    assert float(top_n_mean(s, top_n=2)) == pytest.approx(0.7)
    assert float(top_n_mean(s, top_n=1)) == pytest.approx(0.9)
    assert float(top_n_mean(s, top_n=3)) == pytest.approx((0.9 + 0.5 + 0.3) / 3)
    assert float(top_n_mean(s)) == pytest.approx(0.45)  # fewer tokens than the default 25
    assert float(top_n_mean(s, top_n=100)) == pytest.approx(0.45)


def test_top_n_mean_with_mask() -> None:
    s = torch.tensor([0.1, 0.5, 0.3, 0.9], dtype=torch.float64)
    mask = torch.tensor([True, False, True, True])
    assert float(top_n_mean(s, mask, top_n=2)) == pytest.approx(0.6)
    assert float(top_n_mean(s, mask, top_n=10)) == pytest.approx((0.1 + 0.3 + 0.9) / 3)
    only_first = torch.tensor([True, False, False, False])
    assert float(top_n_mean(s, only_first, top_n=2)) == pytest.approx(0.1)


def test_top_n_mean_batched_rows() -> None:
    s = torch.tensor([[0.1, 0.5, 0.3, 0.9], [2.0, 1.0, 4.0, 3.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True], [True, True, False, False], [False, False, False, False]])
    out = top_n_mean(s, mask, top_n=2)
    assert out.shape == (3,)
    assert float(out[0]) == pytest.approx(0.7)
    assert float(out[1]) == pytest.approx(1.5)
    assert math.isnan(float(out[2]))  # all-masked row


def test_top_n_mean_nan_propagation() -> None:
    # a valid NaN makes the row NaN even when it would otherwise be the smallest score
    s = torch.tensor([[0.9, math.nan, 0.5], [0.9, math.nan, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, True]])
    out = top_n_mean(s, mask, top_n=1)
    assert math.isnan(float(out[0]))
    assert float(out[1]) == pytest.approx(0.9)  # masked-out NaN is ignored
    assert math.isnan(float(top_n_mean(torch.tensor([1.0, 2.0, math.nan]), top_n=3)))


def test_top_n_mean_empty_last_dim_is_nan() -> None:
    out = top_n_mean(torch.zeros(2, 0))
    assert out.shape == (2,)
    assert torch.isnan(out).all()


def test_top_n_mean_of_a_sequence_agrees_with_the_tensor_maths() -> None:
    """The torch-free aggregation of one response (what ``ResponseScore`` uses) agrees with
    :func:`top_n_mean` / :func:`masked_mean` to the last bits, including NaN, -inf and ties."""
    rng = np.random.default_rng(7)
    cases = [list(rng.random(n) * 3) for n in (1, 3, 24, 25, 26, 200)]
    cases += [[0.5, 0.5, 0.2], [NEG_INF, 0.3, 0.1], [0.9, NAN, 0.1], [math.inf, 1.0]]
    for values in cases:
        t = torch.tensor(values, dtype=torch.float64)
        for n in (1, 2, 25):
            assert top_n_mean_of(values, n) == pytest.approx(float(top_n_mean(t, top_n=n)), rel=1e-14, nan_ok=True)
        assert mean_of(values) == pytest.approx(float(masked_mean(t)), rel=1e-14, nan_ok=True)
    assert math.isnan(top_n_mean_of([], 25)) and math.isnan(mean_of([]))
    assert top_n_mean_of([0.1, 0.5, 0.3, 0.9], 2) == pytest.approx(0.7)
    with pytest.raises(ConfigurationError, match="top_n"):
        top_n_mean_of([1.0], 0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", None])
def test_top_n_validation(bad: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        top_n_mean(torch.ones(3), top_n=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


def test_response_reliability_is_minus_top_n_mean() -> None:
    u = torch.tensor([[0.2, 0.0, 0.6, 0.4], [0.1, 0.1, 0.1, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    r = response_reliability(u, mask, top_n=2)
    assert r.tolist() == pytest.approx([-0.5, -0.1])
    assert float(response_reliability(u[0])) == pytest.approx(-0.3)
    assert torch.equal(response_reliability(u, mask, 3), -top_n_mean(u, mask, 3))


def test_response_reliability_all_masked_is_nan() -> None:
    r = response_reliability(torch.ones(1, 3), torch.zeros(1, 3, dtype=torch.bool))
    assert math.isnan(float(r[0]))


def test_top_n_mean_valid_minus_inf_is_not_displaced_by_padding() -> None:
    s = torch.tensor([0.0, -math.inf], dtype=torch.float64)
    mask = torch.tensor([False, True])
    # same data without padding gives -inf
    assert float(top_n_mean(s[1:], top_n=1)) == -math.inf
    assert float(top_n_mean(s, mask, top_n=1)) == -math.inf


def test_masked_mean() -> None:
    s = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.nan, 8.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True], [True, False, True], [False, False, False]])
    out = masked_mean(s, mask)
    assert float(out[0]) == pytest.approx(2.0)
    assert float(out[1]) == pytest.approx(6.0)  # masked-out NaN ignored
    assert math.isnan(float(out[2]))
    assert masked_mean(s[[0, 2]]).tolist() == pytest.approx([2.0, 1.0])
    assert math.isnan(float(masked_mean(s)[1]))  # unmasked NaN propagates
    assert torch.isnan(masked_mean(torch.zeros(2, 0))).all()


# --------------------------------------------------------------------------- log_softmax_stats


def test_log_softmax_stats_uniform_entropy_is_ln_v() -> None:
    for v in (2, 7, 50):
        log_probs, entropy = log_softmax_stats(torch.full((3, v), 1.7, dtype=torch.float64))
        assert entropy.shape == (3,)
        assert torch.allclose(entropy, torch.full((3,), math.log(v), dtype=torch.float64))
        assert torch.allclose(log_probs, torch.full((3, v), -math.log(v), dtype=torch.float64))


def test_log_softmax_stats_probabilities_sum_to_one() -> None:
    logits = _random_logits(5, (4, 6, 33), -10.0, 10.0)
    log_probs, entropy = log_softmax_stats(logits)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(4, 6, dtype=torch.float64))
    p = log_probs.exp()
    assert torch.allclose(entropy, -(p * log_probs).sum(-1))
    assert (entropy >= 0).all() and (entropy <= math.log(33) + 1e-12).all()


def test_log_softmax_stats_masked_logits_give_finite_entropy() -> None:
    logits = torch.tensor([1.0, 2.0, -math.inf, -math.inf], dtype=torch.float64)
    log_probs, entropy = log_softmax_stats(logits)
    assert math.isfinite(float(entropy))
    ref_lp, ref_h = log_softmax_stats(torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert float(entropy) == pytest.approx(float(ref_h))
    assert log_probs[:2].tolist() == pytest.approx(ref_lp.tolist())
    assert log_probs[2:].tolist() == [-math.inf, -math.inf]
    # one surviving token: entropy exactly 0
    _, h1 = log_softmax_stats(torch.tensor([-math.inf, 3.0, -math.inf]))
    assert float(h1) == 0.0


# --------------------------------------------------------------------------- quadrants


@pytest.mark.parametrize(
    ("au", "eu", "quadrant"),
    [
        (0.6, 0.4, Quadrant.I),
        (0.4, 0.4, Quadrant.II),
        (0.4, 0.2, Quadrant.III),
        (0.6, 0.2, Quadrant.IV),
        (0.5, 0.3, Quadrant.III),  # equal to a threshold is "low"
        (0.5, 0.31, Quadrant.II),
        (0.51, 0.3, Quadrant.IV),
    ],
)
def test_quadrant_classify(au: float, eu: float, quadrant: Quadrant) -> None:
    th = QuadrantThresholds(au=0.5, eu=0.3)
    assert th.classify(au, eu) is quadrant
    assert quadrant.description


def test_quadrant_values() -> None:
    assert [q.value for q in Quadrant] == ["I", "II", "III", "IV"]
    assert "several" in Quadrant.IV.description and "no idea" in Quadrant.I.description


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.5", True, None])
def test_quadrant_thresholds_must_be_finite_numbers(bad: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        QuadrantThresholds(au=bad, eu=0.1)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    with pytest.raises(ConfigurationError):
        QuadrantThresholds(au=0.1, eu=bad)  # type: ignore[arg-type]


def test_quadrant_thresholds_from_quantile() -> None:
    au = [0.0, 1.0, 2.0, 3.0, 4.0, math.nan]
    eu = [0.1, 0.2, 0.3, 0.4, 0.5]
    th = QuadrantThresholds.from_quantile(au, eu)
    assert th.au == pytest.approx(2.0)
    assert th.eu == pytest.approx(0.3)
    assert th.source == "quantile 0.5"
    th9 = QuadrantThresholds.from_quantile(np.array(au), np.array(eu), q=0.75, source="calib")
    assert th9.au == pytest.approx(3.0)
    assert th9.eu == pytest.approx(0.4)
    assert th9.source == "calib"


@pytest.mark.parametrize("q", [0.0, 1.0, -0.5, 1.5, math.nan])
def test_quadrant_from_quantile_rejects_bad_q(q: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        QuadrantThresholds.from_quantile([1.0, 2.0], [0.1, 0.2], q=q)
    assert repr(q) in str(info.value)


def test_quadrant_from_quantile_rejects_empty() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        QuadrantThresholds.from_quantile([], [0.1])
    with pytest.raises(ConfigurationError, match="empty"):
        QuadrantThresholds.from_quantile([math.nan], [0.1])


# --------------------------------------------------------------------------- word scores


def test_word_scores_max_over_subtokens() -> None:
    pieces = ["The", " cap", "ital", " of", " Fr", "ance", ".", "\n", "Yes"]
    au = [0.1, 0.7, 0.2, 0.05, 0.3, 0.1, 0.9, 0.0, 0.4]
    eu = [0.5, 0.6, 0.1, 0.2, 0.05, 0.35, 0.0, 0.9, 0.3]
    words = word_scores(pieces, au, eu)
    assert [w.text for w in words] == ["The", "capital", "of", "France.", "Yes"]
    assert [w.token_indices for w in words] == [(0,), (1, 2), (3,), (4, 5, 6), (8,)]
    assert [w.au for w in words] == pytest.approx([0.1, 0.7, 0.05, 0.9, 0.4])
    assert [w.eu for w in words] == pytest.approx([0.5, 0.6, 0.2, 0.35, 0.3])
    assert words[1].uncertainty == pytest.approx(0.7 * 0.6)
    assert all(isinstance(w, WordScore) for w in words)


def test_word_scores_whitespace_leading_token_starts_new_word() -> None:
    words = word_scores(["a", "b", " c", "d", "  e"], [1, 2, 3, 4, 5], [5, 4, 3, 2, 1])
    assert [w.text for w in words] == ["ab", "cd", "e"]
    assert [(w.au, w.eu) for w in words] == [(2, 5), (4, 3), (5, 1)]


def test_word_scores_nan_propagates_and_empty() -> None:
    words = word_scores(["x", "y", " z"], [0.1, math.nan, 0.2], [0.3, 0.4, 0.5])
    assert math.isnan(words[0].au) and words[0].eu == pytest.approx(0.4)
    assert words[1].au == pytest.approx(0.2)
    assert word_scores([], [], []) == []
    assert word_scores([" ", "\n"], [1.0, 2.0], [1.0, 2.0]) == []


def test_word_scores_length_mismatch() -> None:
    with pytest.raises(ConfigurationError, match=r"2, 1, 2"):
        word_scores(["a", "b"], [0.1], [0.1, 0.2])


# --------------------------------------------------------------------------- rescore

STORED = [row for row, _ in VECTORS]  # five tokens, K = 5 stored


@pytest.mark.parametrize(
    ("make", "tol"),
    [
        (lambda rows: rows, 1e-6),
        (lambda rows: np.array(rows, dtype=np.float64), 1e-6),
        (lambda rows: np.array(rows, dtype=np.float32), 1e-5),
        (lambda rows: torch.tensor(rows, dtype=torch.float32, requires_grad=True), 1e-5),
        (lambda rows: torch.tensor(rows, dtype=torch.float16), 1e-3),  # 0.1 etc. are rounded on input
    ],
    ids=["list", "numpy64", "numpy32", "torch-grad", "torch-half"],
)
def test_rescore_input_kinds(make: object, tol: float) -> None:
    res = rescore(make(STORED))  # type: ignore[operator]
    assert isinstance(res, RescoredLogits)
    assert isinstance(res.au, np.ndarray) and res.au.dtype == np.float64 and res.au.shape == (5,)
    assert res.k == 5 and res.evidence == "clamped"
    for i, (_, vals) in enumerate(VECTORS):
        assert res.au[i] == pytest.approx(vals[5][0], abs=tol)
        assert res.eu[i] == pytest.approx(vals[5][2], abs=tol)
    assert np.allclose(res.uncertainty, res.au * res.eu)


def test_rescore_smaller_k_uses_largest_of_unsorted_rows() -> None:
    shuffled = [row[::-1] for row in STORED]
    res = rescore(shuffled, k=2)
    assert res.k == 2
    for i, (_, vals) in enumerate(VECTORS):
        assert res.au[i] == pytest.approx(vals[2][0], abs=1e-6)
        assert res.eu[i] == pytest.approx(vals[2][2], abs=1e-6)
    raw = rescore(shuffled, k=2, evidence="raw")
    assert raw.evidence == "raw"
    for i, (_, vals) in enumerate(VECTORS):
        assert_same(float(raw.au[i]), vals[2][1], 1e-6)


def test_rescore_keeps_leading_shape() -> None:
    arr = np.array([STORED, STORED[::-1]])
    res = rescore(arr, k=2)
    assert res.au.shape == (2, 5) and res.eu.shape == (2, 5)
    assert np.allclose(res.au[1], res.au[0][::-1])


def test_rescore_k_larger_than_stored() -> None:
    with pytest.raises(ConfigurationError, match=r"k=6.*only 5"):
        rescore(STORED, k=6)


def test_rescore_ragged_input() -> None:
    with pytest.raises(ConfigurationError, match="rectangular"):
        rescore([[1.0, 2.0], [3.0]])
    with pytest.raises(ConfigurationError, match="rectangular"):
        rescore([["a", "b"]])


def test_rescore_other_errors() -> None:
    with pytest.raises(ConfigurationError, match="scalar"):
        rescore(3.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="k=1"):
        rescore(STORED, k=1)
    with pytest.raises(ConfigurationError, match="k=1"):
        rescore([[1.0], [2.0]])  # one stored logit per token
    with pytest.raises(ConfigurationError, match="'bogus'"):
        rescore(STORED, evidence="bogus")  # type: ignore[arg-type]


def test_logsumexp_entropy_matches_the_full_log_softmax() -> None:
    from logtoku_guard.scoring.uncertainty import logsumexp_entropy

    torch.manual_seed(0)
    z = torch.randn(3, 50, dtype=torch.float64) * 4
    z[1, :10] = -math.inf  # masked vocabulary entries
    lse, entropy = logsumexp_entropy(z)
    log_probs = torch.log_softmax(z, dim=-1)  # independent reference, not log_softmax_stats (built on the tested code)
    probs = log_probs.exp()
    ref_entropy = -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(-1)
    assert torch.allclose(entropy, ref_entropy, atol=1e-10)
    chosen = torch.tensor([3, 20, 7])
    assert torch.allclose(z.gather(-1, chosen[:, None]).squeeze(-1) - lse, log_probs.gather(-1, chosen[:, None]).squeeze(-1))
    assert torch.isfinite(entropy).all()
