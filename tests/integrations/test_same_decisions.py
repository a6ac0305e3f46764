"""One guard loop: the core Guard, LangChain's LogTokUGuard and LogTokUMiddleware (an agent's model
calls) and LlamaIndex's LogTokUQueryEngine decide the same way on the same scripted logits
(action, rule, reason, route, attempts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain.agents")
pytest.importorskip("llama_index.core")

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding

from langchain_logtoku import ChatLogTokU, LogTokUGuard, LogTokUMiddleware
from llama_index.llms.logtoku import LogTokULLM, LogTokUQueryEngine
from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.wire.payloads import result_payload

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])  # reliability -0.01
MIDDLING = ScriptedAnswer(["Paris", "."], [[3.0, 1.0], [4.0, 0.5]])  # -0.12
UNSURE = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])  # -0.26
DOCS = [f"Passage {i} about the Zarnovian Institute." for i in range(8)]

CASES = {
    "pass": ([SURE], {}),
    "warn": ([MIDDLING], {}),
    "retrieve-then-pass": ([UNSURE, SURE], {}),
    "retrieve-exhausted-fallback": ([UNSURE, UNSURE, UNSURE], {"retrieve": {"max_attempts": 2, "fallback": "abstain"}}),
}


def make_policy(**settings: Any) -> Policy:
    rules = [
        {"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"},
        {"name": "shaky", "when": {"stat": "reliability", "op": "<", "value": -0.05}, "action": "warn"},
    ]
    return Policy.from_dict({"name": "same", "version": "1", "rules": rules, **settings})


def core(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    guard = Guard(ScriptedBackend(answers), policy, retriever=lambda q: DOCS[:2])
    return dict(result_payload(guard.run("Who founded the Zarnovian Institute?")))


def langchain(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    llm = ChatLogTokU(backend=ScriptedBackend(answers), logtoku_profile=None)
    guard = LogTokUGuard(llm=llm, policy=policy, profile=None, retriever=lambda q: DOCS[:2])
    return dict(guard.invoke("Who founded the Zarnovian Institute?").response_metadata["logtoku_guard"])


def middleware(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    llm = ChatLogTokU(backend=ScriptedBackend(answers), logtoku_profile=None)
    agent = create_agent(llm, middleware=[LogTokUMiddleware(policy=policy, retriever=lambda q: DOCS[:2])])
    out = agent.invoke({"messages": [HumanMessage("Who founded the Zarnovian Institute?")]})
    return dict(out["messages"][-1].response_metadata["logtoku_guard"])


def llamaindex(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))
    llm = LogTokULLM(backend=ScriptedBackend(answers))
    engine = LogTokUQueryEngine.from_index(index, llm=llm, similarity_top_k=2, policy=policy)
    return dict(engine.query("Who founded the Zarnovian Institute?").metadata["logtoku"])


ADAPTERS: dict[str, Callable[[list[ScriptedAnswer], Policy], dict[str, Any]]] = {
    "core": core,
    "langchain": langchain,
    "middleware": middleware,
    "llamaindex": llamaindex,
}


def decision(payload: dict[str, Any]) -> tuple[Any, ...]:
    route = tuple((a["action"], a["rule"], a["reason"]) for a in payload["route"])
    return payload["action"], payload["rule"], payload["reason"], payload["attempts"], route


@pytest.mark.parametrize("case", list(CASES))
def test_every_adapter_decides_like_the_core(case: str) -> None:
    answers, settings = CASES[case]
    got = {name: decision(run(list(answers), make_policy(**settings))) for name, run in ADAPTERS.items()}
    assert got["langchain"] == got["core"]
    assert got["middleware"] == got["core"]
    assert got["llamaindex"] == got["core"]
    action, rule, reason, attempts, _ = got["core"]
    expected = {
        "pass": ("pass", None, 1),
        "warn": ("warn", "shaky", 1),
        "retrieve-then-pass": ("pass", None, 2),
        "retrieve-exhausted-fallback": ("abstain", "unsure", 3),
    }[case]
    assert (action, rule, attempts) == expected
    if case == "retrieve-then-pass":
        assert reason == "after retrieval: no rule fired"
    if case == "retrieve-exhausted-fallback":
        assert reason.startswith("still uncertain after 2 retrieval attempt(s): ")


# -- early stop: every entry point cuts the same draft at the same token --------------------------------
DRIFTING = ScriptedAnswer(
    ["It", " was", " Zq", " maybe", " someone", " else", "."],
    [[9.0, 0.1], [8.0, 0.2], [0.3, 0.2], [9.0, 0.1], [9.0, 0.1], [9.0, 0.1], [9.0, 0.1]],
)  # the third token is a near-tie of tiny logits: max_eu 0.8 from there on
EARLY_STOP = {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "abstain", "early_stop": True}


def core_stream(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    guard = Guard(ScriptedBackend(answers), policy, retriever=lambda q: DOCS[:2])
    stream = guard.stream("Who founded the Zarnovian Institute?")
    streamed = [t.text for t in stream]
    payload = dict(result_payload(stream.result))
    assert len(streamed) == len(payload["tokens"])  # the reader saw the cut draft, no more
    return payload


def llamaindex_streaming(mode: str) -> Callable[[list[ScriptedAnswer], Policy], dict[str, Any]]:
    def run(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
        index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))
        llm = LogTokULLM(backend=ScriptedBackend(answers))
        engine = LogTokUQueryEngine.from_index(
            index, llm=llm, similarity_top_k=2, policy=policy, streaming=True, stream_mode=mode
        )
        response = engine.query("Who founded the Zarnovian Institute?")
        "".join(response.response_gen)  # type: ignore[union-attr]
        return dict(response.metadata["logtoku"])  # type: ignore[union-attr]

    return run


def served(answers: list[ScriptedAnswer], policy: Policy) -> dict[str, Any]:
    import httpx

    from logtoku_guard.server import BackgroundServer, build_app

    backend = ScriptedBackend(answers, model_name="scripted")
    with BackgroundServer(build_app(backend, policy=policy)) as srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Who founded the Zarnovian Institute?"}]}
        raw = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=30).content
        streamed = httpx.post(f"{srv.base_url}/chat/completions", json={**body, "stream": True}, timeout=30).content
    if policy.rules[0].action == "abstain":  # the withheld draft leaves no trace in the bytes, streamed or not
        assert b"Zq" not in raw and b"Zq" not in streamed and b"It was" not in raw and b"It was" not in streamed
    reply = json.loads(raw)
    payload = dict(reply["choices"][0]["logtoku_guard"])
    payload["tokens"] = [None] * payload["generated_tokens"]  # the served payload counts the withheld draft's tokens
    return payload


EARLY_STOP_ENTRY_POINTS: dict[str, Callable[[list[ScriptedAnswer], Policy], dict[str, Any]]] = {
    **ADAPTERS,
    "core stream": core_stream,
    "llamaindex live": llamaindex_streaming("live"),
    "llamaindex after_decision": llamaindex_streaming("after_decision"),
    "server": served,
}


@pytest.mark.parametrize("entry", list(EARLY_STOP_ENTRY_POINTS))
def test_an_early_stop_rule_cuts_the_draft_in_every_entry_point(entry: str) -> None:
    """The one driver watches every generation: the rule fires on the third token wherever the
    question comes in (before the driver, Guard.run, LogTokUGuard.invoke and the server generated
    all seven tokens and decided on the whole answer)."""
    policy = Policy.from_dict({"name": "es", "version": "1", "rules": [EARLY_STOP, *make_policy().model_dump()["rules"]]})
    payload = EARLY_STOP_ENTRY_POINTS[entry]([DRIFTING], policy)
    assert decision(payload)[:4] == ("abstain", "lost", "max_eu 0.8 > 0.5", 1)
    assert payload["stopped_early"] is True
    assert len(payload["tokens"]) == 3, payload["tokens"]
