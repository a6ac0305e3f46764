"""LogTokUQueryEngine: in ``stream_mode="after_decision"`` no stream or event shows a withdrawn draft;
decision events carry the route with each attempt's rule."""

# ruff: noqa: F811 - the fixtures imported from li_support are redefined as test arguments

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import all_events, decisions, index, low, policy, scripted, sure, unsure  # noqa: F401 - fixtures
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.instrumentation.events.llm import LLMChatInProgressEvent, LLMCompletionInProgressEvent

from llama_index.llms.logtoku import LogTokUDecisionEvent, LogTokULLM, LogTokUQueryEngine

SURE = ("Paris", " is", " the", " capital", ".")
DRAFT = ("Fabricated", " Lyon", "?")


def engine_for(index: Any, *answers: Any, **kwargs: Any) -> LogTokUQueryEngine:
    backend, _ = scripted(*answers)
    llm = LogTokULLM(backend=backend)
    return LogTokUQueryEngine.from_index(index, llm=llm, similarity_top_k=2, streaming=True, **kwargs)


def in_progress_text(events: list[Any]) -> str:
    out = ""
    for e in events:
        if isinstance(e, LLMChatInProgressEvent):
            out += str(e.response.delta or "") + str(e.response.message.content or "")
        elif isinstance(e, LLMCompletionInProgressEvent):
            out += str(e.response.delta or "") + str(e.response.text or "")
    return out


@pytest.mark.parametrize("action", ["abstain", "retrieve"])
def test_after_decision_never_streams_the_withdrawn_draft(index: Any, all_events: list[Any], action: str) -> None:
    engine = engine_for(index, unsure(*DRAFT), sure(*SURE), policy=policy(low(action)), stream_mode="after_decision")
    response = engine.query("q")
    assert isinstance(response, StreamingResponse)
    text = "".join(response.response_gen)
    assert "Fabricated" not in text
    assert "Fabricated" not in in_progress_text(all_events)
    assert response.metadata["logtoku"]["draft"] in ("Fabricated Lyon?", "Paris is the capital.")


def test_after_decision_async_never_streams_the_withdrawn_draft(index: Any, all_events: list[Any]) -> None:
    engine = engine_for(index, unsure(*DRAFT), policy=policy(low("abstain")), stream_mode="after_decision")

    async def run() -> str:
        response = await engine.aquery("q")
        assert isinstance(response, (StreamingResponse, AsyncStreamingResponse))
        if isinstance(response, AsyncStreamingResponse):
            return "".join([p async for p in response.async_response_gen()])
        return "".join(response.response_gen)

    text = asyncio.run(run())
    assert "Fabricated" not in text and "Fabricated" not in in_progress_text(all_events)


def test_after_decision_with_an_early_stop_rule_still_never_streams_the_draft(index: Any, all_events: list[Any]) -> None:
    """An early_stop rule makes the LLM generate token by token for its watch (LogTokULLM drains its
    own stream): no event or stream piece shows those tokens, and the draft is cut where it fired."""
    cut = {"name": "cut", "when": {"stat": "n_tokens", "op": ">=", "value": 2}, "action": "abstain", "early_stop": True}
    engine = engine_for(index, unsure(*DRAFT), policy=policy(cut), stream_mode="after_decision")
    response = engine.query("q")
    assert isinstance(response, StreamingResponse)
    assert "".join(response.response_gen) == "I don't know."
    assert "Fabricated" not in in_progress_text(all_events)
    meta = response.metadata["logtoku"]
    assert meta["stopped_early"] is True and meta["draft"] == "Fabricated Lyon" and len(meta["tokens"]) == 2


def test_live_mode_shows_the_first_draft(index: Any, all_events: list[Any]) -> None:
    engine = engine_for(index, unsure(*DRAFT), policy=policy(low("abstain")), stream_mode="live")
    response = engine.query("q")
    pieces = list(response.response_gen)
    assert "".join(pieces).startswith("Fabricated Lyon?")  # the mode's purpose: tokens as generated
    assert pieces[-1] == "I don't know."


def test_decision_events_carry_the_route_with_each_attempts_rule(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine = engine_for(index, unsure(*DRAFT), sure(*SURE), policy=policy(low("retrieve")), stream_mode="after_decision")
    engine.query("q")
    first, final = decisions
    assert [(a["action"], a["rule"]) for a in first.route] == [("retrieve", "low-reliability")]
    assert [(a["action"], a["rule"]) for a in final.route] == [("retrieve", "low-reliability"), ("pass", None)]
    assert final.action == "pass" and final.model_dump()["route"][0]["rule"] == "low-reliability"
