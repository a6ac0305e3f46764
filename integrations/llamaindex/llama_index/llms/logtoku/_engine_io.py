"""What :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` hands the core driver: its generate and retrieve.

The driver (:mod:`logtoku_guard.guard.driver`) runs the loop for every query, sync and async, held or
``"live"``; this module answers its requests the LlamaIndex way:

* **retrieve**: the re-query (:meth:`EngineIO.retrieve`): the decision's non-final event, then,
  in the re-query span, the wider engine's retrieval and, when it found new nodes, the synthesis
  from them (its LLM call starts when the answer is read; a streaming one lazily);
* **generate**: read the answer synthesised (before the loop for the first answer, by the
  re-query for a later one) and check it (:func:`~._route.answer_of`);
* **draft** (``"live"``): the answer's pieces as they come, after ``"\\n\\n"`` for a re-queried
  one. A reader who closes the stream stops the generation; the driver decides and records the
  answer so far (:meth:`~logtoku_guard.guard.guard_steps.Progress.abandon`: no retrieval is spent,
  the reason says the stream was closed), and the query's GUARDRAIL span ends with that
  decision, with its open generation span. Closed before any generation began: the span ends
  marked ``logtoku.abandoned``, nothing to decide.

A synthesis is made before the driver asks for its answer (with its retrieval, inside one
re-query span), so its capture carries its own :class:`~logtoku_guard.guard.driver.Watch` (made by
:meth:`LogTokUQueryEngine._synthesize` from the guard's decider): the ``early_stop`` rules are
watched there, token by token, by the same code as everywhere else.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.schema import QueryBundle

from logtoku_guard.decision.results import GuardResult
from logtoku_guard.guard.driver import ABANDONED, Watch, adrive_live, drive_live
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.guard_steps import Answer, Generate, Retrieve, Retrieved

from ._responses import QueryRun, apieces, atext_of, tail, text_of

__all__ = ["AsyncEngineIO", "EngineIO", "QueryEngine", "alive", "live"]


class QueryEngine(Protocol):
    """What the I/O needs of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` (which imports
    this module, so the engine's class is not imported back, not even for annotations)."""

    @property
    def guard(self) -> Guard: ...

    def _answer(self, run: QueryRun, text: str) -> Answer: ...

    def _requery(self, run: QueryRun, request: Retrieve, query_bundle: QueryBundle) -> Retrieved: ...

    async def _arequery(self, run: QueryRun, request: Retrieve, query_bundle: QueryBundle) -> Retrieved: ...

    def _act(self, run: QueryRun, result: GuardResult) -> GuardResult: ...


@dataclass
class _Pieces:
    """The live draft of the answer being read: its pieces, then :meth:`answer` (or the answer
    so far, once closed)."""

    engine: QueryEngine
    run: QueryRun
    after: bool  # a re-queried answer goes on after the one already streamed
    text: str = ""
    done: bool = False
    source: Any = field(default=None, init=False)

    def answer(self) -> Answer:
        if self.done:
            return self.engine._answer(self.run, self.text)
        generation = self.run.answer.capture.take()  # closed early: the generation so far, if any began
        self.run.generating.end_with(generation)
        return Answer(generation)

    def __iter__(self) -> Iterator[str]:
        response = self.run.answer.response
        self.source = response.response_gen if isinstance(response, StreamingResponse) else iter([text_of(response)])
        if self.after:
            yield "\n\n"
        for piece in self.source:
            self.text += piece
            yield piece
        self.done = True

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


@dataclass
class _AsyncPieces(_Pieces):
    """:class:`_Pieces` for ``aquery``."""

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces()

    async def _pieces(self) -> AsyncGenerator[str, None]:
        self.source = apieces(self.run.answer.response)
        if self.after:
            yield "\n\n"
        async for piece in self.source:
            self.text += piece
            yield piece
        self.done = True

    async def aclose(self) -> None:
        if self.source is not None:
            await self.source.aclose()  # ends the loop over the response's own stream, which is finalised with it


@dataclass(frozen=True)
class EngineIO:
    """The driver's requests of one query answered by the engine (``query``)."""

    engine: QueryEngine
    run: QueryRun
    query_bundle: QueryBundle

    def generate(self, request: Generate, watch: Watch) -> Answer:
        return self.engine._answer(self.run, text_of(self.run.answer.response))

    def retrieve(self, request: Retrieve) -> Retrieved:
        return self.engine._requery(self.run, request, self.query_bundle)

    def draft(self, request: Generate, watch: Watch) -> _Pieces:
        return _Pieces(self.engine, self.run, after=bool(self.run.attempts))


@dataclass(frozen=True)
class AsyncEngineIO:
    """:class:`EngineIO` for ``aquery``."""

    engine: QueryEngine
    run: QueryRun
    query_bundle: QueryBundle

    async def generate(self, request: Generate, watch: Watch) -> Answer:
        return self.engine._answer(self.run, await atext_of(self.run.answer.response))

    async def retrieve(self, request: Retrieve) -> Retrieved:
        return await self.engine._arequery(self.run, request, self.query_bundle)

    def draft(self, request: Generate, watch: Watch) -> _AsyncPieces:
        return _AsyncPieces(self.engine, self.run, after=bool(self.run.attempts))


def _ended(run: QueryRun, results: list[GuardResult]) -> None:
    """End the query's span after its reader closed the live stream (with the abandoned answer's decision)."""
    if results:
        run.span.end(results[0])
    else:
        run.span.abandon(ABANDONED)


def _conclude(
    engine: QueryEngine, run: QueryRun, result: GuardResult, out: StreamingResponse | AsyncStreamingResponse
) -> list[str]:
    """Act on ``result``, fill the response's final nodes and metadata; the pieces still to stream."""
    result = engine._act(run, result)
    out.source_nodes[:] = run.nodes[-1]
    out.metadata = run.metadata
    return tail(run.texts[-1], result.answer)


def live(engine: QueryEngine, io: EngineIO, out: StreamingResponse) -> Generator[str, None, None]:
    """A ``"live"`` stream: every answer's pieces as they come, then the tail of the final answer."""
    run, results = io.run, list[GuardResult]()
    guard = engine.guard
    try:
        yield from drive_live(guard.decider, run.progress, io, live="all", top_n=guard.backend.top_n, result=results)
    except GeneratorExit:
        _ended(run, results)
        raise
    yield from _conclude(engine, run, results[0], out)


async def alive(engine: QueryEngine, io: AsyncEngineIO, out: AsyncStreamingResponse) -> AsyncGenerator[str, None]:
    """:func:`live` for ``aquery``."""
    run, results = io.run, list[GuardResult]()
    guard = engine.guard
    pieces: AsyncGenerator[str, None] = adrive_live(
        guard.decider, run.progress, io, live="all", top_n=guard.backend.top_n, result=results
    )
    try:
        async for piece in pieces:
            yield piece
    except GeneratorExit:
        await pieces.aclose()
        _ended(run, results)
        raise
    for piece in _conclude(engine, run, results[0], out):
        yield piece
