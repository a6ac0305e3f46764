"""The FAQ knowledge base and the retrieval prompt (``evaluation.knowledge_base``)."""

from __future__ import annotations

import pytest

from logtoku_eval.knowledge_base import RagSetup, build_knowledge_base, faq_entry
from logtoku_guard.decision.policy import RetrieveSettings
from logtoku_guard.errors import ConfigurationError

from .support import nq_items


def test_knowledge_base_covers_a_seeded_share_and_keeps_the_pool_as_distractors() -> None:
    items, pool = nq_items(10), nq_items(30)
    kb = build_knowledge_base(items, pool, 0.7, seed=3)
    assert len(kb.covered) == 7 and len(kb.passages) == 7 + 20
    for it in items:
        assert (faq_entry(it) in kb.passages) == (it.id in kb.covered)
    assert all(faq_entry(p) in kb.passages for p in pool[10:])
    assert build_knowledge_base(items, pool, 0.7, seed=3) == kb
    assert build_knowledge_base(items, pool, 0.7, seed=4).covered != kb.covered
    assert kb.name == "faq-c0.7-s3-n27"
    assert len(build_knowledge_base(items, pool, 0.0).covered) == 0
    with pytest.raises(ConfigurationError, match=r"coverage must be in \[0, 1\].*1\.5"):
        build_knowledge_base(items, pool, 1.5)


def test_rag_prompt_is_the_guards_retrieval_prompt() -> None:
    items = nq_items(3)
    setup = RagSetup(build_knowledge_base(items, items, 1.0), RetrieveSettings(passages=2))
    prompt = setup.prompt(items[1])
    assert prompt == RetrieveSettings(passages=2).prompt(setup.user_turn(items[1]), setup.passages(items[1]))
    assert setup.passages(items[1])[0] == faq_entry(items[1])  # BM25 finds the question's own entry first
    assert "{context}" in setup.prompt_template and "Q: {question} A:" in setup.prompt_template
