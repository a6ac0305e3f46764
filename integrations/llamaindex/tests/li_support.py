"""Helpers and fixtures for the LlamaIndex adapter tests (import the fixtures you use).

Not a ``conftest.py``: other test modules import the root ``conftest`` by name, which a second
``conftest`` module would shadow.

Scripted rows: ``sure`` tokens have top-2 logits (9, 0): AU = 0, so ``u = AU*EU = 0`` and the
response reliability is exactly 0. ``unsure`` tokens have near-equal top logits
((1, 0.9), (1, 1)): AU ~ 0.5, EU ~ 0.5, reliability ~ -0.25, max EU ~ 0.51. Policies in these
tests split them at ``reliability < -0.1``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.bridge.pydantic import Field
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

from llama_index.llms.logtoku import LogTokUDecisionEvent
from logtoku_guard import Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.types import ChatMessage

SPLIT = -0.1  # reliability threshold between SURE (0.0) and UNSURE (~ -0.25)


def sure(*pieces: str) -> ScriptedAnswer:
    return ScriptedAnswer(list(pieces), [[9.0, 0.0, 0.0] for _ in pieces])


def unsure(*pieces: str) -> ScriptedAnswer:
    rows = [[1.0, 0.9, 0.8] if i % 2 == 0 else [1.0, 1.0, 1.0] for i in range(len(pieces))]
    return ScriptedAnswer(list(pieces), rows)


class Script:
    """Answers calls in order and keeps the user turn of each call."""

    def __init__(self, *answers: ScriptedAnswer) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    def __call__(self, messages: list[ChatMessage]) -> ScriptedAnswer:
        self.prompts.append(messages[-1].content)
        return self.answers[min(len(self.prompts), len(self.answers)) - 1]


def scripted(*answers: ScriptedAnswer) -> tuple[ScriptedBackend, Script]:
    script = Script(*answers)
    return ScriptedBackend(script), script


def policy(*rules: dict[str, Any], **settings: Any) -> Policy:
    return Policy.from_dict({"name": "test", "version": "7", "rules": list(rules), **settings})


def low(action: str, name: str = "low-reliability") -> dict[str, Any]:
    return {"name": name, "when": {"stat": "reliability", "op": "<", "value": SPLIT}, "action": action}


DOCS = [
    "Paris is the capital of France.",
    "Rome is the capital of Italy.",
    "Madrid is the capital of Spain.",
    "Berlin is the capital of Germany.",
    "Lisbon is the capital of Portugal.",
    "Vienna is the capital of Austria.",
    "Oslo is the capital of Norway.",
    "Dublin is the capital of Ireland.",
]


def tagged(spans: Sequence[tuple[str, dict[str, Any]]], name: str) -> list[dict[str, Any]]:
    """Tags of the spans whose id starts with ``<Class>.<name>-``."""
    return [tags for id_, tags in spans if id_.rsplit("-", 5)[0].endswith("." + name)]


@pytest.fixture
def index() -> VectorStoreIndex:
    """Eight one-sentence nodes (fake embeddings: every node ties, so top-k takes any k)."""
    return VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=MockEmbedding(embed_dim=8))


def _remove(attr: str, handler: Any) -> None:
    root = get_dispatcher()
    setattr(root, attr, [h for h in getattr(root, attr) if h is not handler])


class _Decisions(BaseEventHandler):
    events: list[Any] = Field(default_factory=list)

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LogTokUDecisionEvent):
            self.events.append(event)


@pytest.fixture
def decisions() -> Iterator[list[LogTokUDecisionEvent]]:
    """Every LogTokUDecisionEvent that reaches the root dispatcher during the test."""
    handler = _Decisions()
    get_dispatcher().add_event_handler(handler)
    yield handler.events
    _remove("event_handlers", handler)


class _Events(BaseEventHandler):
    events: list[Any] = Field(default_factory=list)

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def all_events() -> Iterator[list[Any]]:
    handler = _Events()
    get_dispatcher().add_event_handler(handler)
    yield handler.events
    _remove("event_handlers", handler)


class _Spans(BaseSpanHandler[SimpleSpan]):
    entered: list[tuple[str, dict[str, Any]]] = Field(default_factory=list)

    def new_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> SimpleSpan:
        self.entered.append((id_, dict(tags or {})))
        return SimpleSpan(id_=id_, parent_id=parent_span_id, tags=tags or {})

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **kw: Any) -> Any:
        return self.open_spans.get(id_)

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None, err: Any = None, **kw: Any) -> Any:
        return self.open_spans.get(id_)


@pytest.fixture
def spans() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(span id, tags) of every span opened during the test."""
    handler = _Spans()
    get_dispatcher().add_span_handler(handler)
    yield handler.entered
    _remove("span_handlers", handler)
