"""LogTokULLM's completion forms are its chat forms on the completion's turns, converted with
LlamaIndex's ``chat_response_to_completion_response``: every field a chat response carries
(text, logprobs with their alternatives, delta, the logtoku payload, raw) reaches the completion."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import scripted, unsure
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from llama_index.llms.logtoku import LogTokULLM, capture_generations
from logtoku_guard import Generation

PIECES = ("Paris", " is", " the", " capital", ".")
QUESTION = [ChatMessage(role=MessageRole.USER, content="q")]


def make_llm(calls: int) -> LogTokULLM:
    backend, _ = scripted(*(unsure(*PIECES) for _ in range(calls)))
    return LogTokULLM(backend=backend)


def _same_fields(chat: Any, completion: Any) -> None:
    assert completion.text == chat.message.content
    assert completion.delta == chat.delta
    assert completion.logprobs == chat.logprobs
    assert completion.additional_kwargs == chat.additional_kwargs
    assert (completion.raw is None) == (chat.raw is None)
    assert completion.raw is None or isinstance(completion.raw, Generation)


def test_complete_carries_every_field_of_chat_alternatives_included() -> None:
    llm = make_llm(2)
    chat, completion = llm.chat(QUESTION, top_logprobs=2), llm.complete("q", top_logprobs=2)
    _same_fields(chat, completion)
    assert len(completion.logprobs) == len(PIECES)
    assert max(len(lp) for lp in completion.logprobs) == 2  # the chosen token and an alternative
    assert completion.additional_kwargs["logtoku"]["summary"]["n_tokens"] == len(PIECES)


def test_stream_complete_chunks_carry_every_field_of_the_chat_chunks() -> None:
    llm = make_llm(2)
    chat_chunks, completion_chunks = list(llm.stream_chat(QUESTION)), list(llm.stream_complete("q"))
    assert len(chat_chunks) == len(completion_chunks) == len(PIECES)
    for chat, completion in zip(chat_chunks, completion_chunks):
        _same_fields(chat, completion)
    assert [lp[0][0].token for lp in (c.logprobs for c in completion_chunks)] == list(PIECES)


def test_async_completion_forms_carry_every_field() -> None:
    llm = make_llm(4)

    async def run() -> tuple[Any, ...]:
        chat, completion = await llm.achat(QUESTION), await llm.acomplete("q")
        chat_chunks = [c async for c in await llm.astream_chat(QUESTION)]
        completion_chunks = [c async for c in await llm.astream_complete("q")]
        return chat, completion, chat_chunks, completion_chunks

    chat, completion, chat_chunks, completion_chunks = asyncio.run(run())
    _same_fields(chat, completion)
    for chat_chunk, completion_chunk in zip(chat_chunks, completion_chunks, strict=True):
        _same_fields(chat_chunk, completion_chunk)


def test_closing_a_completion_stream_early_reports_a_cancelled_generation() -> None:
    llm = make_llm(1)
    with capture_generations() as captured:
        stream = llm.stream_complete("q")
    assert next(stream).delta == "Paris"
    stream.close()
    assert captured.last is not None and captured.last.finish_reason == "cancelled"
