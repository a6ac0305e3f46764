"""OpenTelemetry spans from the adapters: LangChain's LogTokUGuard (invoke, stream, ainvoke) and
LlamaIndex's LogTokUQueryEngine (query, aquery, live stream) emit the core guard's span tree."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from langchain_logtoku import ChatLogTokU, LogTokUGuard
from llama_index.llms.logtoku import LogTokULLM, LogTokUQueryEngine
from logtoku_guard import GuardRejectedError, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.guard.telemetry import EVALUATION_EVENT

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])  # reliability -0.01
UNSURE = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])  # -0.26
DOCS = [f"Passage {i} about the Zarnovian Institute." for i in range(8)]


def make_policy(low: str = "retrieve") -> Policy:
    rules = [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": low}]
    return Policy.from_dict({"name": "otel", "version": "3", "rules": rules})


class Script:
    def __init__(self, *answers: ScriptedAnswer) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self, messages: Any) -> ScriptedAnswer:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[str], list[str]]:
    """The GUARDRAIL span, its children's names in start order, and its evaluation labels."""
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if (s.attributes or {}).get("openinference.span.kind") == "GUARDRAIL"]
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id), key=lambda s: s.start_time or 0
    )
    labels = [str((e.attributes or {})["gen_ai.evaluation.score.label"]) for e in root.events if e.name == EVALUATION_EVENT]
    return root, [s.name for s in children], labels


def check(root: ReadableSpan, action: str, attempts: int) -> None:
    a = root.attributes or {}
    assert (a["logtoku.action"], a["logtoku.attempts"], a["logtoku.policy.name"], a["logtoku.policy.version"]) == (
        action,
        attempts,
        "otel",
        "3",
    )
    assert a["gen_ai.operation.name"] == "apply_guardrail" and a["gen_ai.request.model"] == "scripted" and a["logtoku.k"] == 2


# -- LangChain ---------------------------------------------------------------------------------
def lc_guard(provider: TracerProvider, *answers: ScriptedAnswer, low: str = "retrieve") -> LogTokUGuard:
    llm = ChatLogTokU(backend=ScriptedBackend(Script(*answers)), logtoku_profile=None)
    return LogTokUGuard(llm=llm, profile=None, policy=make_policy(low), retriever=lambda q: DOCS[:2], tracer_provider=provider)


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "stream"])
def test_langchain_retrieve_then_pass(provider: TracerProvider, exporter: InMemorySpanExporter, path: str) -> None:
    guard = lc_guard(provider, UNSURE, SURE)
    if path == "invoke":
        message = guard.invoke("Who founded the Zarnovian Institute?")
    elif path == "ainvoke":
        message = asyncio.run(guard.ainvoke("Who founded the Zarnovian Institute?"))
    else:
        [message] = list(guard.stream("Who founded the Zarnovian Institute?"))
    assert message.response_metadata["logtoku_guard"]["action"] == "pass"
    root, children, labels = tree(exporter)
    check(root, "pass", 2)
    assert children == ["chat scripted", "retrieve", "chat scripted"] and labels == ["retrieve", "pass"]


def test_langchain_abstain_and_raise(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    lc_guard(provider, UNSURE, low="abstain").invoke("Who?")
    root, children, labels = tree(exporter)
    check(root, "abstain", 1)
    assert children == ["chat scripted"] and labels == ["abstain"] and root.status.status_code == StatusCode.UNSET
    exporter.clear()
    with pytest.raises(GuardRejectedError):
        list(lc_guard(provider, UNSURE, low="raise").stream("Who?"))
    root, _, labels = tree(exporter)
    check(root, "raise", 1)
    assert root.status.status_code == StatusCode.ERROR and labels == ["raise"]


# -- LlamaIndex --------------------------------------------------------------------------------
def li_engine(provider: TracerProvider, *answers: ScriptedAnswer, low: str = "retrieve", **kwargs: Any) -> LogTokUQueryEngine:
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))
    llm = LogTokULLM(backend=ScriptedBackend(Script(*answers)))
    return LogTokUQueryEngine.from_index(index, llm=llm, policy=make_policy(low), tracer_provider=provider, **kwargs)


@pytest.mark.parametrize("path", ["query", "aquery", "stream"])
def test_llamaindex_retrieve_then_pass(provider: TracerProvider, exporter: InMemorySpanExporter, path: str) -> None:
    if path == "query":
        response: Any = li_engine(provider, UNSURE, SURE).query("Who founded it?")
    elif path == "aquery":
        response = asyncio.run(li_engine(provider, UNSURE, SURE).aquery("Who founded it?"))
    else:
        response = li_engine(provider, UNSURE, SURE, streaming=True).query("Who founded it?")
        assert "".join(response.response_gen).endswith("Elena Marwick.")
    assert response.metadata["logtoku"]["action"] == "pass"
    root, children, labels = tree(exporter)
    check(root, "pass", 2)
    # retrieval 0 is the engine's own retrieval before the first answer; retrieval 1 the re-query
    assert children == ["retrieve", "chat scripted", "retrieve", "chat scripted"] and labels == ["retrieve", "pass"]


def test_llamaindex_abstain_raise_and_errors(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    li_engine(provider, UNSURE, low="abstain").query("Who?")
    root, children, labels = tree(exporter)
    check(root, "abstain", 1)
    assert children == ["retrieve", "chat scripted"] and labels == ["abstain"]
    exporter.clear()
    with pytest.raises(GuardRejectedError):
        li_engine(provider, UNSURE, low="raise").query("Who?")
    root, _, _ = tree(exporter)
    assert root.status.status_code == StatusCode.ERROR and (root.attributes or {})["logtoku.action"] == "raise"
    exporter.clear()

    def broken(messages: Any) -> ScriptedAnswer:
        raise RuntimeError("model crashed")

    llm = LogTokULLM(backend=ScriptedBackend(broken))
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))
    engine = LogTokUQueryEngine.from_index(index, llm=llm, policy=make_policy(), tracer_provider=provider)
    with pytest.raises(RuntimeError, match="model crashed"):
        engine.query("Who?")
    root, _, _ = tree(exporter)
    assert root.status.status_code == StatusCode.ERROR and (root.attributes or {})["error.type"] == "RuntimeError"


@pytest.mark.parametrize("path", ["sync", "async"])
def test_llamaindex_live_stream_closed_early_is_decided_recorded_and_ends_its_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter, path: str, tmp_path: Path
) -> None:
    """As the core guard's and LangChain's closed streams: the answer so far is decided (the
    policy's retrieval becomes its fallback, nothing is retrieved) and recorded."""
    from logtoku_guard.audit import AuditStore

    store = AuditStore(tmp_path / "audit.db")
    engine = li_engine(provider, UNSURE, SURE, streaming=True, store=store)
    if path == "sync":
        response: Any = engine.query("Who founded it?")
        first = next(response.response_gen)
        response.response_gen.close()
    else:

        async def main() -> str:
            response = await engine.aquery("Who founded it?")
            gen = response.response_gen
            piece = await gen.__anext__()
            await gen.aclose()
            return str(piece)

        first = asyncio.run(main())
    assert first == "Maybe"
    [record] = store.tail(5)
    assert record.prompt == "Who founded it?" and record.action == "abstain" and record.attempts == 1
    assert "stream closed by the caller before it ended" in record.reason and record.reason.endswith("no retrieval")
    root, children, labels = tree(exporter)  # the GUARDRAIL span ended with the decision, and its generation span
    a = root.attributes or {}
    assert a["logtoku.action"] == "abstain" and "logtoku.abandoned" not in a and labels == ["abstain"]
    assert a["logtoku.reason"] == record.reason
    assert children == ["retrieve", "chat scripted"]  # no re-query: nothing retrieved after the close
    assert all(s.end_time is not None for s in exporter.get_finished_spans())
    store.close()
