"""What :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` hands the core driver: its generate and retrieve.

The driver (:mod:`logtoku_guard.guard.driver`) runs the loop for every query, sync and async, held or
``"live"``, and owns its spans (each answer's and re-query's, under the query's GUARDRAIL span),
its ``early_stop`` watch and ``stopped_early``; this module answers its requests the LlamaIndex way:

* **generate** (every answer, the first included): synthesise from the nodes the answer is made
  from (the engine's first retrieval, made before the loop, or the re-query's), the LLM call
  reporting its tokens to the driver's :class:`~logtoku_guard.guard.driver.Watch`; read it; check
  it (:func:`~._route.answer_of`);
* **retrieve**: the re-query (:meth:`EngineIO.retrieve`): the decision's non-final event, then, in
  the re-query span, the wider engine's retrieval;
* **draft** (``"live"``): the same synthesis, its pieces as they come (after ``"\\n\\n"`` for a
  re-queried one). The first draft yields ``""`` once its synthesis is made and before anything
  of it is read (:data:`SYNTHESISED`): the engine reads it to learn whether the answer streams
  (a query returns a ``StreamingResponse`` only then), nothing of the answer generated yet. A
  reader who closes the stream stops the generation; the driver decides and records the answer
  so far (:meth:`~logtoku_guard.guard.guard_steps.Progress.abandon`: no retrieval is spent, the
  reason says the stream was closed) and ends the query's span with that decision.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.schema import QueryBundle

from logtoku_guard.decision.results import GuardResult
from logtoku_guard.guard.driver import Driver, Watch
from logtoku_guard.guard.guard_steps import Answer, Generate, Retrieve, Retrieved

from ._responses import QueryRun, apieces, atext_of, tail, text_of
from ._route import Synthesis

__all__ = ["SYNTHESISED", "AsyncEngineIO", "EngineIO", "QueryEngine", "alive", "live"]

SYNTHESISED = ""
"""The first piece of a query's first live draft: its synthesis is made, nothing of it read yet."""


class QueryEngine(Protocol):
    """What the I/O needs of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` (which imports
    this module, so the engine's class is not imported back, not even for annotations)."""

    def _synthesize(self, run: QueryRun, request: Generate, watch: Watch, query_bundle: QueryBundle) -> Synthesis: ...

    async def _asynthesize(self, run: QueryRun, request: Generate, watch: Watch, query_bundle: QueryBundle) -> Synthesis: ...

    def _answer(self, run: QueryRun, text: str) -> Answer: ...

    def _requery(self, run: QueryRun, request: Retrieve, query_bundle: QueryBundle) -> Retrieved: ...

    async def _arequery(self, run: QueryRun, request: Retrieve, query_bundle: QueryBundle) -> Retrieved: ...

    def _act(self, run: QueryRun, result: GuardResult) -> GuardResult: ...


@dataclass
class _Pieces:
    """The live draft of one answer: synthesised when iterated, its pieces, then :meth:`answer` (or
    the answer so far, once closed)."""

    io: EngineIO | AsyncEngineIO
    request: Generate
    watch: Watch
    text: str = ""
    done: bool = False
    synthesis: Synthesis | None = field(default=None, init=False)
    source: Any = field(default=None, init=False)

    def answer(self) -> Answer:
        if self.done:
            return self.io.engine._answer(self.io.run, self.text)
        generation = self.synthesis.capture.take() if self.synthesis is not None else None
        return Answer(generation)  # closed early: the generation so far, if any began

    def __iter__(self) -> Iterator[str]:
        io = self.io
        self.synthesis = io.engine._synthesize(io.run, self.request, self.watch, io.query_bundle)
        response = self.synthesis.response
        self.source = response.response_gen if isinstance(response, StreamingResponse) else iter([text_of(response)])
        yield SYNTHESISED if self.request.first else "\n\n"
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
        io = self.io
        self.synthesis = await io.engine._asynthesize(io.run, self.request, self.watch, io.query_bundle)
        self.source = apieces(self.synthesis.response)
        yield SYNTHESISED if self.request.first else "\n\n"
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
        synthesis = self.engine._synthesize(self.run, request, watch, self.query_bundle)
        return self.engine._answer(self.run, text_of(synthesis.response))

    def retrieve(self, request: Retrieve) -> Retrieved:
        return self.engine._requery(self.run, request, self.query_bundle)

    def draft(self, request: Generate, watch: Watch) -> _Pieces:
        return _Pieces(self, request, watch)


@dataclass(frozen=True)
class AsyncEngineIO:
    """:class:`EngineIO` for ``aquery``."""

    engine: QueryEngine
    run: QueryRun
    query_bundle: QueryBundle

    async def generate(self, request: Generate, watch: Watch) -> Answer:
        synthesis = await self.engine._asynthesize(self.run, request, watch, self.query_bundle)
        return self.engine._answer(self.run, await atext_of(synthesis.response))

    async def retrieve(self, request: Retrieve) -> Retrieved:
        return await self.engine._arequery(self.run, request, self.query_bundle)

    def draft(self, request: Generate, watch: Watch) -> _AsyncPieces:
        return _AsyncPieces(self, request, watch)


def streams(run: QueryRun) -> bool:
    """True when the answer being made is a stream (the engine streams its answers)."""
    return isinstance(run.answer.response, (StreamingResponse, AsyncStreamingResponse))


def _conclude(
    engine: QueryEngine, run: QueryRun, result: GuardResult, out: StreamingResponse | AsyncStreamingResponse
) -> list[str]:
    """Act on ``result``, fill the response's final nodes and metadata; the pieces still to stream."""
    result = engine._act(run, result)
    out.source_nodes[:] = run.nodes[-1]
    out.metadata = run.metadata
    return tail(run.texts[-1], result.answer)


def live(
    engine: QueryEngine, run: QueryRun, pieces: Generator[str, None, GuardResult], out: StreamingResponse
) -> Generator[str, None, None]:
    """A ``"live"`` stream (after :data:`SYNTHESISED`): every answer's pieces as they come, then the
    tail of the final answer. Closing it closes the driver's stream (which decides, records and ends
    the query's span)."""
    result = yield from pieces
    yield from _conclude(engine, run, result, out)


async def alive(
    engine: QueryEngine, run: QueryRun, driver: Driver, pieces: AsyncGenerator[str, None], out: AsyncStreamingResponse
) -> AsyncGenerator[str, None]:
    """:func:`live` for ``aquery`` (the result is ``driver.result`` once the driver's stream has ended)."""
    try:
        async for piece in pieces:
            yield piece
    except GeneratorExit:
        await pieces.aclose()
        raise
    for piece in _conclude(engine, run, driver.result, out):  # type: ignore[arg-type]  # concluded
        yield piece
