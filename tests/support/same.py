"""Assertions shared by the batching tests: two generations are the same, waiting for a condition."""

from __future__ import annotations

import time
from typing import Any

import pytest

from logtoku_guard.types import Generation


def wait_until(cond: Any, what: str, seconds: float = 30.0) -> None:
    """Poll ``cond()`` until it is true; fail naming ``what`` after ``seconds`` (a hang guard, not a timing)."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


NEAR_TIE = 1e-3
"""Largest gap between the top two logits that a batched forward pass's float differences (~1e-6)
may flip: the tiny random model's logits are nearly flat, and a changed prompt can land on such a tie."""


def _first_difference(a: Generation, b: Generation) -> int | None:
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens)):
        if x.id != y.id:
            return i
    return None if len(a.tokens) == len(b.tokens) else min(len(a.tokens), len(b.tokens))


def assert_same(a: Generation, b: Generation) -> None:
    """The same tokens, text, finish, stop string, per-token scores and prompt-side scores (1e-4).

    One allowance: where the two part ways, the first answer's top two logits must be a near tie
    (within :data:`NEAR_TIE`, which float differences can flip); up to there everything must match.
    """
    split = _first_difference(a, b)
    if split is not None and split < min(len(a.tokens), len(b.tokens)):
        top = a.tokens[split].top_logits
        gap = top[0] - top[1]
        assert gap < NEAR_TIE, f"token {split} differs ({a.tokens[split].id} vs {b.tokens[split].id}) with a top-2 gap of {gap}"
        assert b.tokens[split].top_logits[0] - b.tokens[split].top_logits[1] < NEAR_TIE
    else:
        assert [t.id for t in a.tokens] == [t.id for t in b.tokens]
        assert a.text == b.text and a.finish_reason == b.finish_reason and a.stop_sequence == b.stop_sequence
    for x, y in zip(a.tokens[:split], b.tokens[:split]):
        assert x.au == pytest.approx(y.au, abs=1e-4) and x.eu == pytest.approx(y.eu, abs=1e-4)
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4) and x.entropy == pytest.approx(y.entropy, abs=1e-4)
        assert x.top_ids == y.top_ids and x.top_logits == pytest.approx(y.top_logits, abs=1e-4)
    assert [t.id for t in a.prompt_scores] == [t.id for t in b.prompt_scores]
    for x, y in zip(a.prompt_scores, b.prompt_scores):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4) and x.eu == pytest.approx(y.eu, abs=1e-4)
