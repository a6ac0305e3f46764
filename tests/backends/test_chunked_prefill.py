"""Chunked prefill in TransformersBackend: a long prompt is fed a chunk at a time beside the live rows.

By default (``concurrent_prefill``) a thread of its own feeds the chunks but the last while the loop
decodes; with ``concurrent_prefill=False`` the loop feeds one between decoding steps. Either way a
prompt fed in chunks must give the tokens, AU/EU and question scores of one whole prefill (1e-4); a
short request that arrives while a long prompt is being fed must finish before the long one answers
(with ``prefill_chunk=0`` it waits for the whole prefill: the same test, inverted, shows the test
can fail), and beside the loop it is answered while the long prompt's thread is held inside a
chunk; a cancelled or failing long prompt ends alone. The order is made deterministic by holding a
thread inside a chunk (:class:`support.gate.Gate` on the decoder), not by timing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support.ended import ended_order
from support.gate import Gate
from support.joins import queued
from support.same import assert_same, wait_until
from support.tiny import make_model

from logtoku_guard.backends.chunked_prefill import (
    DEPTH_SCALE,
    MIN_PREFILL_CHUNK,
    FairShare,
    check_prefill_chunk,
    chunk_at,
    plan,
)
from logtoku_guard.backends.prompt_scoring import QuestionSpan
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions, to_messages

CHUNK = MIN_PREFILL_CHUNK
SIDE = "logtoku-transformers-prefill"  # the name of the thread that feeds a long prompt beside the loop
LONG = "Retrieval augmented generation adds context before answering a question. " * 30


def prompt_tokens(backend: Any, text: str) -> int:
    """Tokens of ``text``'s prompt as the backend feeds it (chat template applied)."""
    return len(backend._prepare(to_messages(text), DecodingOptions()).ids)


def backend_for(model: Any, tokenizer: Any, chunk: int, **kwargs: Any) -> TransformersBackend:
    return TransformersBackend("tiny", model_obj=model, tokenizer=tokenizer, prefill_chunk=chunk, **kwargs)


class Chunks:
    """The decoder's forward passes that feed exactly one chunk (a staged prompt's)."""

    def __init__(self, model: Any) -> None:
        self.sizes: list[int] = []
        model.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.sizes.append(int(kwargs["input_ids"].shape[1]))

    @property
    def fed(self) -> int:
        return sum(1 for n in self.sizes if n == CHUNK)


@pytest.mark.parametrize("concurrent", [True, False], ids=["beside the loop", "in the loop"])
@pytest.mark.parametrize("prefix_cache_mb", [64, 0], ids=["prefix cache", "no prefix cache"])
def test_a_prompt_fed_in_chunks_equals_one_whole_prefill(tiny_tokenizer: Any, prefix_cache_mb: int, concurrent: bool) -> None:
    model = make_model(tiny_tokenizer, max_positions=1024)
    chunks = Chunks(model)
    whole = backend_for(model, tiny_tokenizer, 0, prefix_cache_mb=prefix_cache_mb)
    chunked = backend_for(model, tiny_tokenizer, CHUNK, prefix_cache_mb=prefix_cache_mb, concurrent_prefill=concurrent)
    assert chunked.concurrent_prefill is concurrent and not whole.concurrent_prefill
    options = DecodingOptions(max_new_tokens=8)
    a = whole.generate(LONG, options)
    assert chunks.fed == 0
    b = chunked.generate(LONG, options)
    assert a.prompt_tokens > 4 * CHUNK
    assert chunks.fed == -(-a.prompt_tokens // CHUNK) - 1  # every chunk but the last, which joins the batch
    assert_same(a, b)
    # the question's scores cross every chunk boundary: the same indices and texts, in order
    assert [(t.index, t.text) for t in b.prompt_scores] == [(t.index, t.text) for t in a.prompt_scores]
    assert len(b.prompt_scores) > 4 * CHUNK
    short = chunked.generate("Hi", options)  # a prompt within one chunk is prefilled whole
    assert chunks.fed == -(-a.prompt_tokens // CHUNK) - 1 and short.prompt_scores


def model_threads(model: Any) -> list[str]:
    """The thread of each whole-model forward pass (a prompt's last chunk, or a decoding step)."""
    names: list[str] = []
    model.register_forward_pre_hook(lambda module, args: names.append(threading.current_thread().name))
    return names


@pytest.mark.parametrize("concurrent", [True, False], ids=["beside the loop", "in the loop"])
def test_long_prompts_answered_beside_the_loop_equal_whole_prefills_alone_or_in_a_request_of_several(
    tiny_tokenizer: Any, concurrent: bool
) -> None:
    """Beside the loop, a one-row request with a long prompt is answered whole in a loop of its own
    (its thread prefills and decodes it: it never joins, and widens, the running batch); the long rows
    of a request of several are fed by the thread, their last chunk too, and join the batch."""
    model = make_model(tiny_tokenizer, max_positions=1024)
    whole = backend_for(model, tiny_tokenizer, 0)
    chunked = backend_for(model, tiny_tokenizer, CHUNK, concurrent_prefill=concurrent)
    options = DecodingOptions(max_new_tokens=6)
    threads = model_threads(model)
    one = chunked.generate(LONG, options)
    assert threads and set(threads) == ({SIDE} if concurrent else {"logtoku-batcher"})  # its last chunk and every step
    assert_same(whole.generate(LONG, options), one)
    threads.clear()
    prompts = [LONG, "Count from one to ten, slowly. " * 40]
    several = chunked.batch(prompts, options)
    for a, b in zip(whole.batch(prompts, options), several, strict=True):
        assert_same(a, b)
    assert (SIDE in threads) is concurrent  # the long rows' last chunks ran in their thread


@pytest.mark.parametrize(
    ("chunk", "concurrent"),
    [(CHUNK, True), (CHUNK, False), (0, False)],
    ids=["chunked beside the loop", "chunked in the loop", "whole (the failure this fixes)"],
)
def test_a_short_request_finishes_before_a_long_prompt_beside_it_answers(
    tiny_tokenizer: Any, chunk: int, concurrent: bool
) -> None:
    model = make_model(tiny_tokenizer, max_positions=1024)
    backend = backend_for(model, tiny_tokenizer, chunk, concurrent_prefill=concurrent)
    gate = Gate(model.model, thread=SIDE if concurrent else None)
    order = ended_order(backend)
    alone = backend.generate("Hi", DecodingOptions(max_new_tokens=3))
    n_long = prompt_tokens(backend, LONG)
    order.clear()
    results: dict[str, Any] = {}
    long = threading.Thread(target=lambda: results.update(long=backend.generate(LONG, DecodingOptions(max_new_tokens=1))))
    long.start()
    with gate.held():  # the long prompt's thread (or the worker) waits inside its first chunk (or its whole prefill)
        short = threading.Thread(target=lambda: results.update(short=backend.generate("Hi", DecodingOptions(max_new_tokens=3))))
        short.start()
        if concurrent:  # the loop goes on: the short request is answered while the long prompt is held
            wait_until(lambda: "short" in results, "the short request to be answered beside the held long prompt")
        else:
            wait_until(lambda: queued(backend) == 1, "the short request to queue")
    long.join(60)
    short.join(60)
    assert_same(alone, results["short"])
    expected = [alone.prompt_tokens, n_long] if chunk else [n_long, alone.prompt_tokens]
    assert order == expected


@pytest.mark.parametrize("concurrent", [True, False], ids=["beside the loop", "in the loop"])
def test_a_long_prompt_cancelled_while_fed_ends_at_once(tiny_tokenizer: Any, concurrent: bool) -> None:
    model = make_model(tiny_tokenizer, max_positions=1024)
    backend = backend_for(model, tiny_tokenizer, CHUNK, concurrent_prefill=concurrent)
    gate, chunks = Gate(model.model), Chunks(model)
    stream = backend.stream(LONG, DecodingOptions(max_new_tokens=50))
    with gate.held():
        stream._cancel()  # the client went away during the first chunk (close() would wait for the end)
        fed = len(chunks.sizes)
    stream.close()
    g = stream.generation
    assert g.finish_reason == "cancelled" and g.tokens == ()
    assert len(chunks.sizes) == fed + 1  # the chunk held when it was cancelled, none after it
    assert backend.generate("Hi", DecodingOptions(max_new_tokens=3)).finish_reason == "length"


@pytest.mark.parametrize("concurrent", [True, False], ids=["beside the loop", "in the loop"])
def test_a_chunk_that_fails_fails_its_request_alone(tiny_tokenizer: Any, concurrent: bool) -> None:
    model = make_model(tiny_tokenizer, max_positions=1024)
    backend = backend_for(model, tiny_tokenizer, CHUNK, concurrent_prefill=concurrent)
    running = "Count from one to ten, slowly, and then stop counting"
    options = DecodingOptions(max_new_tokens=30)
    alone = backend.generate(running, options)
    failed = []

    def fail_second_chunk(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("position_ids")
        if kwargs["input_ids"].shape[1] == CHUNK and not failed and positions is not None and int(positions[0, 0]) == CHUNK:
            failed.append(True)
            raise RuntimeError("chunk failed on purpose")

    model.model.register_forward_pre_hook(fail_second_chunk, with_kwargs=True)
    gate = Gate(model.model)
    results: dict[str, Any] = {}

    def run_long() -> None:
        try:
            backend.generate(LONG, DecodingOptions(max_new_tokens=4))
        except RuntimeError as exc:
            results["long"] = exc

    stream = backend.stream(running, options)
    tokens = iter(stream)
    head = [next(tokens) for _ in range(2)]
    with gate.held():
        long = threading.Thread(target=run_long)
        long.start()
        wait_until(lambda: queued(backend) == 1, "the long request to queue")
    rest = list(tokens)
    long.join(60)
    assert "on purpose" in str(results["long"]) and failed
    assert [t.id for t in head + rest] == [t.id for t in alone.tokens]
    assert_same(alone, stream.generation)


@pytest.mark.parametrize("value", [8, MIN_PREFILL_CHUNK - 1, -1, True, 256.0, "256"])
def test_a_bad_chunk_size_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"prefill_chunk must be a whole number of tokens >= 128.*got"):
        check_prefill_chunk(value)
    assert check_prefill_chunk(0) is None and check_prefill_chunk(None) is None and check_prefill_chunk(512) == 512


def test_a_bad_concurrent_prefill_is_refused_naming_it(tiny_tokenizer: Any) -> None:
    model = make_model(tiny_tokenizer, max_positions=1024)
    with pytest.raises(ConfigurationError, match=r"concurrent_prefill must be True or False, got 'no'"):
        backend_for(model, tiny_tokenizer, CHUNK, concurrent_prefill="no")
    assert backend_for(model, tiny_tokenizer, CHUNK).concurrent_prefill  # the default
    assert not backend_for(model, tiny_tokenizer, 0).concurrent_prefill  # no chunks: nothing to feed beside


def test_the_plan_prefills_short_prompts_whole_and_long_ones_oldest_first() -> None:
    whole, longer = plan([("a", 900, 0), ("b", 12, 0), ("c", 300, 0), ("d", 128, 0), ("e", 40, 600)], 128)
    # a prompt partly fed already ("e") keeps taking turns with the decoding rows, to its last piece
    assert whole == ["b", "d"] and longer == ["a", "c", "e"]
    assert plan([("a", 900, 0), ("b", 12, 0)], None) == (["a", "b"], [])


def test_chunks_shrink_with_depth_to_the_floor_and_depend_on_the_position_alone() -> None:
    assert chunk_at(0, 256) == 256 and chunk_at(5, None) is None
    sizes = [chunk_at(fed, 256) or 0 for fed in (0, 256, 1024, DEPTH_SCALE, 4096, 8192, 10**6)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) > 3
    assert chunk_at(DEPTH_SCALE, 256) == 128 and sizes[-1] == MIN_PREFILL_CHUNK
    assert all(n % 16 == 0 for n in sizes)
    assert chunk_at(10**6, MIN_PREFILL_CHUNK) == MIN_PREFILL_CHUNK  # never below the floor, never above chunk


def test_a_span_part_keeps_each_tokens_question_index() -> None:
    span = QuestionSpan(10, 15, ("a", "b", "c", "d", "e"))
    part = span.part(12, 14)
    assert part == QuestionSpan(12, 14, ("c", "d"), 2)
    assert part.part(13) == QuestionSpan(13, 14, ("d",), 3)
    assert span.part(0) is span and span.part(15) is None and span.part(3, 10) is None


def test_a_chunk_waits_until_the_decoding_rows_have_had_as_much_time() -> None:
    share = FairShare()
    assert share.chunk_may_run(decoding=True)  # nobody owed anything yet
    share.chunk_ran(2.0)
    assert share.chunk_may_run(decoding=False)  # nobody decoding: nobody waits for the chunk
    share.decoded(1.5)
    assert not share.chunk_may_run(decoding=True)
    share.decoded(0.5)
    assert share.chunk_may_run(decoding=True)


def test_the_prompt_scoring_hook_acts_on_the_passes_of_its_own_thread_only(tiny_tokenizer: Any) -> None:
    """A prompt scored by a hook on the decoder (a model without ``logits_to_keep``, as this tiny one) is
    prefilled while a long prompt's chunks run through the same decoder from a thread of their own:
    the hook must not take the other thread's pass for its prompt's."""
    import torch

    from logtoku_guard.backends.prompt_scoring import PromptCapture, QuestionSpan

    model = make_model(tiny_tokenizer, max_positions=1024)
    ids = torch.tensor([[5, 6, 7, 8]])
    hidden = torch.randn(1, 4, model.config.hidden_size)
    capture = PromptCapture(model.get_output_embeddings(), model.config, ids, [QuestionSpan(1, 4, ("a", "b", "c"))], 2, "clamped")
    other = threading.Thread(target=capture.hook, args=(model.model, (), (hidden,)), name=SIDE)
    other.start()
    other.join()
    assert not capture.done and capture.scores == [()]  # another thread's pass: left alone
    capture.hook(model.model, (), (hidden,))
    assert capture.done and [t.index for t in capture.scores[0]] == [0, 1, 2]
