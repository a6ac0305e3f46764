"""Helpers of :mod:`llama_index.llms.logtoku.query_engine`: its run state and LlamaIndex responses.

The state of one guarded query, text of (streaming, async streaming) responses, the tail to
stream once a decision changed the answer, small sync/async generators, the default re-query
engines, and the resolution of the engine's LLM.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import AsyncGenerator, Generator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse, StreamingResponse
from llama_index.core.schema import NodeWithScore
from llama_index.core.settings import Settings

from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.results import Attempt
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.guard.guard_steps import Progress
from logtoku_guard.guard.telemetry import RunSpan

from .base import LogTokULLM


@dataclass
class QueryRun:
    """The state of one guarded query: the core loop's progress (attempts, timings, stopped early), and
    per attempt its nodes and text; the answer being made and its nodes; the query's span."""

    query: str
    progress: Progress = field(init=False)
    nodes: list[list[NodeWithScore]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    answer: Any = None  # the Synthesis being made (see _route.py), from ``answer_nodes``
    answer_nodes: list[NodeWithScore] = field(default_factory=list)
    span: RunSpan = field(default_factory=lambda: _RUN_SPAN.get() or RunSpan(None))  # the GUARDRAIL span (see traced_query)

    def __post_init__(self) -> None:
        self.progress = Progress(self.query)

    @property
    def attempts(self) -> list[Attempt]:
        return self.progress.attempts


_RUN_SPAN: ContextVar[RunSpan | None] = ContextVar("logtoku_query_span", default=None)


def traced_query(method: Any) -> Any:
    """Run the engine's ``_query``/``_aquery`` under its guard's GUARDRAIL span (the :class:`QueryRun`
    made inside takes it); when the query raises, the span ends with the error, otherwise the engine
    ends it once the decision is acted on."""

    def start(self: Any, query_bundle: Any) -> RunSpan:
        return self.guard.telemetry.start_run(self.guard, query_bundle.query_str)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def atraced(self: Any, query_bundle: Any) -> Any:
            span = start(self, query_bundle)
            token = _RUN_SPAN.set(span)
            try:
                return await method(self, query_bundle)
            except BaseException as exc:
                span.fail(exc)
                span.end()
                raise
            finally:
                _RUN_SPAN.reset(token)

        return atraced

    @functools.wraps(method)
    def traced(self: Any, query_bundle: Any) -> Any:
        span = start(self, query_bundle)
        token = _RUN_SPAN.set(span)
        try:
            return method(self, query_bundle)
        except BaseException as exc:
            span.fail(exc)
            span.end()
            raise
        finally:
            _RUN_SPAN.reset(token)

    return traced


def wider_engines(query_engine: BaseQueryEngine, step: int, count: int) -> list[BaseQueryEngine]:
    """``count`` copies of ``query_engine`` whose retriever's ``similarity_top_k`` grows by ``step`` each.

    Empty when the engine's retriever has no ``similarity_top_k`` (or no ``with_retriever``).
    The caller's retriever is never changed.
    """
    engine: Any = query_engine
    retriever: object = getattr(engine, "retriever", None)  # a BaseRetriever, read by attribute
    top_k = getattr(retriever, "similarity_top_k", None)
    if not isinstance(top_k, int) or not hasattr(engine, "with_retriever"):
        return []
    engines = []
    for i in range(1, count + 1):
        wider = copy.copy(retriever)
        setattr(wider, "similarity_top_k", top_k + step * i)  # noqa: B010 - an attribute of some retrievers only
        engines.append(engine.with_retriever(wider))
    return engines


def text_of(response: RESPONSE_TYPE) -> str:
    """The full text of a (possibly streaming) synchronous response."""
    if isinstance(response, StreamingResponse):
        return "".join(response.response_gen) if response.response_txt is None else response.response_txt
    if isinstance(response, AsyncStreamingResponse):
        msg = "an async streaming response reached the synchronous path; use aquery() with an async streaming engine"
        raise UsageError(msg)
    return str(response.response or "")


async def atext_of(response: RESPONSE_TYPE) -> str:
    """The full text of any response, reading an async stream asynchronously."""
    if isinstance(response, AsyncStreamingResponse):
        return "".join([piece async for piece in response.async_response_gen()])
    return text_of(response)


async def apieces(response: RESPONSE_TYPE) -> AsyncGenerator[str, None]:
    """The pieces of any response as an async stream (a whole answer is one piece)."""
    if isinstance(response, AsyncStreamingResponse):
        async for piece in response.async_response_gen():
            yield piece
    elif isinstance(response, StreamingResponse):
        for piece in response.response_gen:
            yield piece
    else:
        yield text_of(response)


def tail(streamed: str, answer: str) -> list[str]:
    """What to stream after ``streamed`` so the reader ends with ``answer``."""
    if answer == streamed:
        return []
    if answer.startswith(streamed):
        return [answer[len(streamed) :]]
    return ["\n\n", answer]


async def empty_async() -> AsyncGenerator[str, None]:
    return
    yield  # pragma: no cover - makes this an async generator


def sync_iter(items: Sequence[str]) -> Generator[str, None, None]:
    yield from items


async def async_iter(items: Sequence[str]) -> AsyncGenerator[str, None]:
    for item in items:
        yield item


def policy_uses_quantiles(policy: Policy | None) -> bool:
    return (policy or default_policy()).uses_quantiles()


def resolve_llm(llm: LogTokULLM | None) -> LogTokULLM:
    """``llm``, else ``Settings.llm``; a :class:`ConfigurationError` unless it is a :class:`LogTokULLM`."""
    found: Any = llm
    if found is None:
        try:
            found = Settings.llm
        except Exception:  # the default LLM cannot be resolved (e.g. no OpenAI package)
            found = None
    if not isinstance(found, LogTokULLM):
        msg = (
            f"LogTokUQueryEngine needs a LogTokULLM (to read the token scores), got {type(found).__name__}; "
            "pass llm=LogTokULLM(...) or set Settings.llm = LogTokULLM(...)"
        )
        raise ConfigurationError(msg)
    return found
