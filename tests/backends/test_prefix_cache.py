"""Prefix caching: prompts that begin alike prefill only their own tokens, on the cached prefix.

Every answer must equal the same request prefilled whole (a backend with
``prefix_cache_mb=0`` on the same model): tokens, AU/EU, log-probabilities and the
question's prompt-side scores (1e-4), alone, batched with prompts of other lengths (padding
between the prefix and the rest), with another system prompt in the same batch, and joining a
running batch.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.gate import Forwards
from support.joins import gated, join_mid_generation
from support.same import assert_same
from support.tiny import make_model

from logtoku_guard.backends.prefix_cache import PrefixCache, prefix_length
from logtoku_guard.backends.prompt_scoring import QuestionSpan
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import ChatMessage, DecodingOptions

SYSTEM = "You are a careful assistant. Answer the question briefly, and say when you do not know."
OTHER_SYSTEM = "Count from one to ten."
QUESTIONS = ["Hi", "What is the capital of France?", "Retrieval augmented generation adds context before answering."]
OPTIONS = DecodingOptions(max_new_tokens=12)


def pair(tokenizer: Any, seed: int = 2) -> tuple[TransformersBackend, TransformersBackend]:
    """Two backends on one model: prefix caching on (the default) and off."""
    model = make_model(tokenizer, seed=seed)
    cached = TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer)
    whole = TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer, prefix_cache_mb=0)
    return cached, whole


@pytest.mark.slow
def test_answers_on_a_cached_prefix_equal_whole_prompt_prefills(tiny_tokenizer: Any) -> None:
    cached, whole = pair(tiny_tokenizer)
    assert whole.prefix_cache is None and cached.prefix_cache is not None
    forwards = Forwards(cached.model)
    expected = [whole.generate(q, OPTIONS, system=SYSTEM) for q in QUESTIONS]
    mark = len(forwards.seen)
    first = cached.generate(QUESTIONS[0], OPTIONS, system=SYSTEM)  # a miss: the prefix is prefilled and kept
    assert cached.prefix_cache.stats() | {"bytes": 0} == {"entries": 1, "bytes": 0, "hits": 0, "misses": 1}
    batched = cached.batch(QUESTIONS, OPTIONS, system=SYSTEM)  # a hit: three rows of other lengths on it
    assert cached.prefix_cache.stats()["hits"] == 1
    assert_same(expected[0], first)
    for a, b in zip(expected, batched, strict=True):
        assert_same(a, b)
        assert b.prompt_scores and b.prompt_tokens == a.prompt_tokens
    # the batch's prefill fed only the tokens after the prefix: the chat template's opening and
    # the system prompt came from the cache
    prompt = cached.count_tokens(cached.render(QUESTIONS[2], system=SYSTEM))
    prefill = [f for f in forwards.seen[mark:] if f.new > 1][-1]
    assert prefill.rows == 3 and prefill.new < prompt - 15 and prefill.width == prompt


def test_two_system_prompts_in_one_batch_each_use_their_own_prefix(tiny_tokenizer: Any) -> None:
    cached, whole = pair(tiny_tokenizer, seed=4)
    prompts = [
        [ChatMessage("system", SYSTEM), ChatMessage("user", QUESTIONS[1])],
        [ChatMessage("system", OTHER_SYSTEM), ChatMessage("user", QUESTIONS[2])],
        [ChatMessage("system", SYSTEM), ChatMessage("user", QUESTIONS[0])],
        QUESTIONS[1],  # no system prompt: the chat template's opening only
    ]
    expected = [whole.generate(p, OPTIONS) for p in prompts]
    for _ in range(2):  # misses, then hits
        for a, b in zip(expected, cached.batch(prompts, OPTIONS), strict=True):
            assert_same(a, b)
    assert cached.prefix_cache is not None
    assert cached.prefix_cache.stats() | {"bytes": 0} == {"entries": 3, "bytes": 0, "hits": 3, "misses": 3}


def test_rows_on_a_cached_prefix_join_and_leave_a_running_batch(tiny_tokenizer: Any) -> None:
    """Two joiners prefilled together on the prefix: the shorter one has padding between the
    prefix and its own tokens. Merging, and cutting the columns nobody uses once the others
    left, keep every row equal to its whole-prompt prefill."""
    backend, gate, model = gated(tiny_tokenizer, seed=5)
    whole = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, prefix_cache_mb=0)

    def ask(question: str, tokens: int) -> tuple[list[ChatMessage], DecodingOptions]:
        return [ChatMessage("system", SYSTEM), ChatMessage("user", question)], DecodingOptions(max_new_tokens=tokens)

    running = ask("Count from one to ten, slowly", 12)
    joiners = [ask(QUESTIONS[0], 30), ask(QUESTIONS[2], 4)]
    expected = [whole.generate(p, o) for p, o in [running, *joiners]]
    backend.generate(*running)  # the prefix is cached before the join
    forwards = Forwards(model)
    together = join_mid_generation(backend, gate, running, joiners)  # type: ignore[arg-type]
    for a, b in zip(expected, together, strict=True):
        assert_same(a, b)
    steps = [f for f in forwards.seen if f.new == 1]
    assert max(f.rows for f in steps) == 3 and steps[-1].rows == 1
    # the short joiner ends last, alone: the padding between its prefix and its own tokens is cut
    # with the other rows' columns, and its mask is as wide as its own tokens again
    own = backend.count_tokens(backend.render(joiners[0][0]))
    assert steps[-1].width == own + len(together[1].tokens) - 1


def test_the_store_is_least_recently_used_and_bounded_in_bytes() -> None:
    import torch

    def layers(tokens: int) -> Any:
        return ((torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4)),)  # 64 bytes per token

    store = PrefixCache(64 * 10)
    assert store.put((1,), layers(4)) and store.put((2,), layers(4))
    assert store.get((1,)) is not None  # (1,) is now the most recently used
    assert store.put((3,), layers(4))  # evicts (2,), the least recently used
    assert store.get((2,)) is None and store.get((1,)) is not None and store.get((3,)) is not None
    assert store.nbytes == 64 * 8 and len(store) == 2
    assert not store.put((4,), layers(11))  # larger than the whole bound: not kept, nothing evicted
    assert len(store) == 2 and store.get((4,)) is None
    assert store.stats() == {"entries": 2, "bytes": 512, "hits": 3, "misses": 2}
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_the_prefix_stops_before_the_token_that_predicts_the_question() -> None:
    assert prefix_length(None) == 0
    assert prefix_length(QuestionSpan(0, 3, ("a", "b", "c"))) == 0  # the question starts the prompt
    assert prefix_length(QuestionSpan(1, 3, ("b", "c"))) == 0
    assert prefix_length(QuestionSpan(9, 12, ("a", "b", "c"))) == 8


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64"])
def test_a_bad_bound_is_refused_with_the_fix(tiny_tokenizer: Any, bad: Any) -> None:
    model = make_model(tiny_tokenizer)
    with pytest.raises(ConfigurationError, match=r"prefix_cache_mb must be a whole number of MiB >= 0 \(0 disables"):
        TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer, prefix_cache_mb=bad)
    with pytest.raises(ValueError, match="max_bytes must be a whole number of bytes"):
        PrefixCache(bad if bad != 1.5 else -5)


def test_prompt_scoring_is_each_requests_own_setting_when_it_joins(tiny_tokenizer: Any) -> None:
    """``score_prompt`` is read when a request is made: a request that joins a batch started
    with the other setting keeps its own (a benchmark toggling it between requests measures
    what it asks for)."""
    from concurrent.futures import ThreadPoolExecutor

    from support.joins import queued
    from support.same import wait_until

    backend, gate, _ = gated(tiny_tokenizer, seed=6)
    stream = backend.stream("Count from one to ten, slowly", DecodingOptions(max_new_tokens=20))
    tokens = iter(stream)
    head = [next(tokens) for _ in range(3)]
    backend.score_prompt = False
    joins = backend._batcher.joins
    with ThreadPoolExecutor(1) as pool:
        with gate.held():
            joiner = pool.submit(backend.generate, QUESTIONS[1], OPTIONS)
            wait_until(lambda: queued(backend) == 1, "the joiner to queue")
        assert len(head) + len(list(tokens)) == len(stream.generation.tokens)
        joined = joiner.result(60)
    assert backend._batcher.joins == joins + 1
    assert stream.generation.prompt_scores and not joined.prompt_scores
