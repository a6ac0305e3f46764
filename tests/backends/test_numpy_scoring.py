"""The llama.cpp backend's numpy step maths equal the torch maths of the recorder and the library."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from logtoku_guard.backends import numpy_scoring
from logtoku_guard.backends.prompt_scoring import QuestionSpan, score_kept
from logtoku_guard.backends.recorder import Row, StepRecorder, top_k
from logtoku_guard.scoring.uncertainty import logsumexp_entropy
from logtoku_guard.types import DecodingOptions, DynamicTemperature


def logits(rows: int = 3, vocab: int = 1000, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, vocab)) * 4).astype(np.float32)


@pytest.mark.parametrize("vocab", [25, 64 * 3, 1000, 49152])
@pytest.mark.parametrize("k", [2, 20])
def test_top_k_equals_the_torch_top_k(vocab: int, k: int) -> None:
    z = logits(vocab=vocab)
    values, ids = numpy_scoring.top_k(z, k)
    tv, ti = top_k(torch.from_numpy(z), k)
    assert values == tv and ids == ti


def test_top_k_ties_keep_the_lower_id() -> None:
    z = np.zeros((1, 300), dtype=np.float32)
    z[0, [7, 150, 299]] = 5.0
    assert numpy_scoring.top_k(z, 2) == ([[5.0, 5.0]], [[7, 150]])


def test_lse_entropy_equals_the_library() -> None:
    z = logits()
    z[1] += 80.0  # a shifted row
    lse, ent = numpy_scoring.lse_entropy(z, z.max(axis=-1).tolist())
    tl, te = logsumexp_entropy(torch.from_numpy(z).double())
    assert lse == pytest.approx(tl.tolist(), abs=1e-5) and ent == pytest.approx(te.tolist(), abs=1e-5)
    nan_row = np.array([[np.nan, 1.0, 2.0]], dtype=np.float32)
    assert all(map(math.isnan, numpy_scoring.lse_entropy(nan_row, [2.0])[0]))


def test_prompt_scores_equal_score_kept() -> None:
    z = logits(rows=4, vocab=500)
    ids = [3, 10, 20, 30, 40, 50]
    span = QuestionSpan(1, 5, ("a", "b", "c", "d"))
    kept = [0, 1, 2, 3]  # positions 0..3 score tokens 1..4
    got = numpy_scoring.prompt_scores(z, ids, span, 2, "clamped")
    want = score_kept(torch.from_numpy(z), kept, torch.tensor(ids), span, 2, "clamped")
    assert [t.id for t in got] == [t.id for t in want] == ids[1:5] and [t.text for t in got] == list("abcd")
    for a, b in zip(got, want):
        assert a.top_ids == b.top_ids and a.top_logits == pytest.approx(b.top_logits)
        assert a.au == pytest.approx(b.au, abs=1e-6) and a.eu == pytest.approx(b.eu, abs=1e-6)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.entropy == pytest.approx(b.entropy, abs=1e-4)
    raw = numpy_scoring.prompt_scores(z, ids, span, 2, "raw")
    assert [t.eu for t in raw] == pytest.approx([t.eu for t in got], abs=1e-6)


def recorder(rows: int) -> StepRecorder:
    class Tok:
        def decode(self, ids: list[int], **_: object) -> str:
            return "".join(f"<{i}>" for i in ids)

    return StepRecorder(
        k=2,
        evidence="clamped",
        tokenizer=Tok(),
        rows=[Row() for _ in range(rows)],
        stop=(),
        eos_ids=frozenset(),
        on_token=None,
        cancel=None,
    )


def test_top_p_keeps_the_likeliest_tokens_and_seeds_repeat() -> None:
    z = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    rec = recorder(1)
    numpy_scoring.record(rec, z)
    opts = DecodingOptions(temperature=1.0, top_p=0.7)
    draws = [numpy_scoring.sample(rec, z, opts, np.random.default_rng(i))[0] for i in range(300)]
    assert set(draws) == {0, 1}  # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are cut
    again = [numpy_scoring.sample(rec, z, opts, np.random.default_rng(i))[0] for i in range(300)]
    assert draws == again


def test_dynamic_temperature_is_recorded_per_row() -> None:
    z = np.array([[30.0, 0.0, -1.0], [0.5, 0.4, 0.3]], dtype=np.float32)
    rec = recorder(2)
    numpy_scoring.record(rec, z)
    schedule = DynamicTemperature(t_max=1.0, t_min=0.1)
    numpy_scoring.sample(rec, z, DecodingOptions(dynamic=schedule), np.random.default_rng(0))
    eu = [2 / (30.0 + 2), 2 / (0.9 + 2)]
    assert rec.temperatures is not None
    assert rec.temperatures.tolist() == pytest.approx([schedule.temperature(e) for e in eu])
    rec.step_tokens([0, 1])
    assert [r.tokens[0].temperature for r in rec.rows] == pytest.approx([schedule.temperature(e) for e in eu])
