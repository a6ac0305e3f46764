"""LogTokULLM on a scripted backend: responses, streaming, async, capture, events, engines."""

# ruff: noqa: F811 - the fixtures imported from li_support are redefined as test arguments

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import all_events, index, scripted, sure, unsure  # noqa: F401 - fixtures
from llama_index.core import Settings
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMPredictEndEvent,
)
from llama_index.core.prompts import PromptTemplate

from llama_index.llms.logtoku import LogTokULLM, capture_generations
from logtoku_guard import ConfigurationError, Generation, InvalidPromptError, ScriptedBackend

PIECES = ("Paris", " is", " the", " capital", ".")


def make_llm(*answers: Any, **kwargs: Any) -> tuple[LogTokULLM, Any]:
    backend, script = scripted(*(answers or (sure(*PIECES),)))
    return LogTokULLM(backend=backend, **kwargs), script


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=text)]


# -- construction and metadata -------------------------------------------------------------
def test_metadata_reports_a_chat_model_with_the_backend_name() -> None:
    llm, _ = make_llm(max_new_tokens=64, context_window=4096)
    meta = llm.metadata
    assert (meta.is_chat_model, meta.num_output, meta.context_window, meta.model_name) == (True, 64, 4096, "scripted")
    assert meta.is_function_calling_model is False
    assert LogTokULLM.class_name() == "LogTokULLM"


def test_default_backend_is_built_lazily() -> None:
    llm = LogTokULLM(model="/no/such/model")
    assert llm._backend is None  # nothing loaded until first use


def test_rejects_a_non_backend_and_bad_options() -> None:
    with pytest.raises(ConfigurationError, match="backend must be a logtoku_guard Backend"):
        LogTokULLM(backend=object())
    with pytest.raises(ConfigurationError, match="max_new_tokens must be a positive integer, got 0"):
        make_llm(max_new_tokens=0)
    with pytest.raises(ConfigurationError, match="temperature must be >= 0"):
        make_llm(temperature=-1.0)
    with pytest.raises(ConfigurationError, match="context_window must be a positive"):
        make_llm(context_window=0)


# -- complete / chat ------------------------------------------------------------------------
def test_complete_carries_per_token_scores_and_summary() -> None:
    llm, script = make_llm(unsure(*PIECES))
    response = llm.complete("What is the capital of France?")
    assert response.text == "Paris is the capital."
    generation = response.raw
    assert isinstance(generation, Generation)
    payload = response.additional_kwargs["logtoku"]
    assert [t["token"] for t in payload["tokens"]] == list(PIECES)
    assert [t["index"] for t in payload["tokens"]] == [0, 1, 2, 3, 4]
    assert [t["au"] for t in payload["tokens"]] == [t.au for t in generation.tokens]
    assert [t["eu"] for t in payload["tokens"]] == [t.eu for t in generation.tokens]
    assert payload["tokens"][0]["top_logits"] == [1.0, 0.9]
    summary = payload["summary"]
    assert summary["reliability"] == pytest.approx(generation.score.reliability)
    assert summary["reliability"] < -0.2  # near-equal top logits: unreliable
    assert (summary["n_tokens"], summary["finish_reason"], summary["k"], summary["model"]) == (5, "stop", 2, "scripted")
    assert [lp[0].logprob for lp in response.logprobs] == [t.logprob for t in generation.tokens]
    assert script.prompts == ["What is the capital of France?"]


def test_complete_uses_system_prompt_unless_formatted() -> None:
    backend, _ = scripted(sure("ok"))
    llm = LogTokULLM(backend=backend, system_prompt="Be brief.")
    llm.complete("hi")
    llm.complete("hi", formatted=True)
    assert [[(m.role, m.content) for m in call] for call in backend.calls] == [
        [("system", "Be brief."), ("user", "hi")],
        [("user", "hi")],
    ]


def test_chat_maps_roles_and_returns_an_assistant_message() -> None:
    backend, _ = scripted(sure(*PIECES))
    llm = LogTokULLM(backend=backend)
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="sys"),
        ChatMessage(role=MessageRole.USER, content="q1"),
        ChatMessage(role=MessageRole.ASSISTANT, content="a1"),
        ChatMessage(role=MessageRole.USER, content="q2"),
    ]
    response = llm.chat(messages)
    assert response.message.role == MessageRole.ASSISTANT
    assert response.message.content == "Paris is the capital."
    assert response.additional_kwargs["logtoku"]["summary"]["n_tokens"] == 5
    assert [(m.role, m.content) for m in backend.calls[0]] == [
        ("system", "sys"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
    ]


def test_tool_messages_are_refused_with_a_hint() -> None:
    llm, _ = make_llm()
    with pytest.raises(InvalidPromptError, match=r"role 'tool'.*no tool or function calling"):
        llm.chat([ChatMessage(role=MessageRole.TOOL, content="42")])


def test_call_kwargs_override_decoding_options() -> None:
    llm, _ = make_llm(sure(*PIECES), sure(*PIECES))
    response = llm.complete("q", max_new_tokens=2)
    assert response.text == "Paris is"
    assert response.additional_kwargs["logtoku"]["summary"]["finish_reason"] == "length"
    assert llm.complete("q", stop=[" the"]).text == "Paris is"
    with pytest.raises(ConfigurationError, match="top_p must be in"):
        llm.complete("q", top_p=2.0)


# -- streaming ------------------------------------------------------------------------------
def test_stream_chat_puts_one_token_per_chunk_and_the_summary_last() -> None:
    llm, _ = make_llm()
    chunks = list(llm.stream_chat(user("q")))
    assert [c.delta for c in chunks] == list(PIECES)
    assert [c.message.content for c in chunks] == [
        "Paris",
        "Paris is",
        "Paris is the",
        "Paris is the capital",
        "Paris is the capital.",
    ]
    payloads = [c.additional_kwargs["logtoku"] for c in chunks]
    assert [[t["token"] for t in p["tokens"]] for p in payloads] == [[p] for p in PIECES]
    assert ["summary" in p for p in payloads] == [False, False, False, False, True]
    assert payloads[-1]["summary"]["n_tokens"] == 5
    assert isinstance(chunks[-1].raw, Generation) and all(c.raw is None for c in chunks[:-1])


def test_stream_complete_matches_complete() -> None:
    llm, _ = make_llm(unsure(*PIECES), unsure(*PIECES))
    whole = llm.complete("q")
    chunks = list(llm.stream_complete("q"))
    assert "".join(c.delta for c in chunks) == whole.text == chunks[-1].text
    assert chunks[-1].additional_kwargs["logtoku"]["summary"] == whole.additional_kwargs["logtoku"]["summary"]
    streamed = [t for c in chunks for t in c.additional_kwargs["logtoku"]["tokens"]]
    assert streamed == whole.additional_kwargs["logtoku"]["tokens"]


def test_an_empty_answer_streams_one_chunk_with_the_summary() -> None:
    llm, _ = make_llm(sure())
    chunks = list(llm.stream_complete("q"))
    assert len(chunks) == 1
    assert chunks[0].delta == "" and chunks[0].additional_kwargs["logtoku"]["summary"]["n_tokens"] == 0


def test_closing_a_stream_early_reports_a_cancelled_generation() -> None:
    llm, _ = make_llm()
    with capture_generations() as captured:
        stream = llm.stream_chat(user("q"))
    first = next(stream)  # read after the capture block: it was taken when the call was made
    assert first.delta == "Paris"
    stream.close()
    assert captured.last is not None
    assert captured.last.finish_reason == "cancelled"
    assert [t.text for t in captured.last.tokens] == ["Paris", " is"]  # one token is held back per chunk


# -- async ----------------------------------------------------------------------------------
def test_async_forms() -> None:
    llm, _ = make_llm(*(sure(*PIECES) for _ in range(4)))

    async def run() -> tuple[Any, ...]:
        chat = await llm.achat(user("q"))
        comp = await llm.acomplete("q")
        chat_chunks = [c async for c in await llm.astream_chat(user("q"))]
        comp_chunks = [c async for c in await llm.astream_complete("q")]
        return chat, comp, chat_chunks, comp_chunks

    with capture_generations() as captured:
        chat, comp, chat_chunks, comp_chunks = asyncio.run(run())
    assert chat.message.content == comp.text == "Paris is the capital."
    assert chat.additional_kwargs["logtoku"]["summary"]["n_tokens"] == 5
    assert [c.delta for c in chat_chunks] == [c.delta for c in comp_chunks] == list(PIECES)
    assert "summary" in chat_chunks[-1].additional_kwargs["logtoku"]
    assert "summary" not in comp_chunks[0].additional_kwargs["logtoku"]
    assert len(captured.generations) == 4


# -- the side channel -----------------------------------------------------------------------
def test_predict_drops_metadata_but_capture_keeps_the_generation() -> None:
    llm, _ = make_llm(unsure(*PIECES), sure("x"))
    with capture_generations() as outer:
        with capture_generations() as inner:
            text = llm.predict(PromptTemplate("Capital of {country}?"), country="France")
        llm.complete("again")
    assert text == "Paris is the capital."  # a plain str: additional_kwargs are gone
    assert inner.last is not None and inner.last.text == text
    assert inner.last.score.reliability < -0.2
    assert [g.text for g in outer.generations] == [text, "x"]  # captures nest
    assert len(inner.generations) == 1


def test_stream_predict_reports_when_the_stream_ends() -> None:
    llm, _ = make_llm()
    with capture_generations() as captured:
        tokens = llm.stream(PromptTemplate("Capital of {country}?"), country="France")
    assert captured.generations == []
    assert "".join(tokens) == "Paris is the capital."
    assert captured.last is not None and len(captured.last.tokens) == 5
    assert [t.text for t in captured.live_tokens] == list(PIECES)


# -- instrumentation and engines -----------------------------------------------------------
def test_llm_events_fire_and_carry_the_scores(all_events: list[Any]) -> None:
    llm, _ = make_llm(sure(*PIECES), sure(*PIECES))
    llm.chat(user("q"))
    llm.complete("q")
    kinds = [type(e) for e in all_events]
    assert LLMChatStartEvent in kinds and LLMChatEndEvent in kinds and LLMCompletionEndEvent in kinds
    end = next(e for e in all_events if isinstance(e, LLMChatEndEvent))
    assert end.response.additional_kwargs["logtoku"]["summary"]["n_tokens"] == 5


def test_works_as_settings_llm_in_chat_and_query_engines(
    monkeypatch: pytest.MonkeyPatch, index: Any, all_events: list[Any]
) -> None:
    backend = ScriptedBackend(lambda messages: sure(*PIECES))
    llm = LogTokULLM(backend=backend)
    monkeypatch.setattr(Settings, "_llm", None)
    Settings.llm = llm
    chat_engine = SimpleChatEngine.from_defaults()
    assert str(chat_engine.chat("Capital of France?")) == "Paris is the capital."
    streamed = chat_engine.stream_chat("And again?")
    assert "".join(streamed.response_gen) == "Paris is the capital."

    with capture_generations() as captured:
        response = index.as_query_engine(similarity_top_k=2).query("Capital of France?")
    assert str(response) == "Paris is the capital."
    assert "logtoku" not in (response.metadata or {})  # the query engine drops it ...
    assert captured.last is not None and captured.last.text == "Paris is the capital."  # ... the capture does not
    assert "Context information is below" in backend.calls[-1][-1].content
    assert any(isinstance(e, LLMPredictEndEvent) for e in all_events)
