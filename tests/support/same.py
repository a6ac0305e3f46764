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


def assert_same(a: Generation, b: Generation) -> None:
    """The same tokens, text, finish, stop string, per-token scores and prompt-side scores (1e-4)."""
    assert [t.id for t in a.tokens] == [t.id for t in b.tokens]
    assert a.text == b.text and a.finish_reason == b.finish_reason and a.stop_sequence == b.stop_sequence
    for x, y in zip(a.tokens, b.tokens):
        assert x.au == pytest.approx(y.au, abs=1e-4) and x.eu == pytest.approx(y.eu, abs=1e-4)
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4) and x.entropy == pytest.approx(y.entropy, abs=1e-4)
        assert x.top_ids == y.top_ids and x.top_logits == pytest.approx(y.top_logits, abs=1e-4)
    assert [t.id for t in a.prompt_scores] == [t.id for t in b.prompt_scores]
    for x, y in zip(a.prompt_scores, b.prompt_scores):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4) and x.eu == pytest.approx(y.eu, abs=1e-4)
