"""``stream_mode="live"`` of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine`.

The first answer's pieces pass through as they come (an ``early_stop`` rule may cut them
short); once the answer ends the guard judges it, re-queries while the policy allows, and the
tail of the final answer follows. A caller that closes the stream before it ends (``close()``,
``aclose()``, a ``break`` out of the loop) stops the generation being streamed; the answer so
far is decided and recorded as the core guard's and LangChain's closed streams are
(:meth:`~logtoku_guard.guard.Guard.abandon`: no retrieval is spent, the reason says the stream
was closed), and the query's GUARDRAIL span ends with that decision, with its open generation
span. Closed before any generation began: the span ends marked ``logtoku.abandoned``, nothing
to decide.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import TYPE_CHECKING, Any

from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse, StreamingResponse
from llama_index.core.schema import NodeWithScore, QueryBundle

from logtoku_guard.capture import GenerationCapture
from logtoku_guard.policy import Decision
from logtoku_guard.types import ChatMessage

from ._responses import QueryRun, apieces, tail, text_of

if TYPE_CHECKING:
    from .query_engine import LogTokUQueryEngine

__all__ = ["ABANDONED", "alive", "live"]

ABANDONED = "stream closed by the caller before the guard decided"


def _abandon(engine: LogTokUQueryEngine, run: QueryRun, capture: GenerationCapture, pieces: Any) -> None:
    """Stop the generation being streamed, decide and record the answer so far, end the open spans."""
    close = getattr(pieces, "close", None)
    if close is not None:
        close()
    generation = capture.take()
    run.generating.end_with(generation)
    if generation is None:
        run.span.abandon(ABANDONED)
        return
    messages = [ChatMessage("user", run.query)]
    result = engine.guard.abandon(messages, generation, started=run.start, generation_s=run.generation_s, attempts=run.attempts)
    run.span.end(result)


def _conclude(
    engine: LogTokUQueryEngine, run: QueryRun, decision: Decision, out: StreamingResponse | AsyncStreamingResponse
) -> list[str]:
    """Act on ``decision``, fill the response's final nodes and metadata; the pieces still to stream."""
    result = engine._act(run, decision)
    out.source_nodes[:] = run.nodes[-1]
    out.metadata = run.metadata
    return tail(run.texts[-1], result.answer)


def live(
    engine: LogTokUQueryEngine,
    run: QueryRun,
    query_bundle: QueryBundle,
    nodes: list[NodeWithScore],
    capture: GenerationCapture,
    response: RESPONSE_TYPE,
    out: StreamingResponse,
) -> Generator[str, None, None]:
    pieces: Any = None
    try:
        while True:
            text = ""
            pieces = response.response_gen if isinstance(response, StreamingResponse) else iter([text_of(response)])
            for piece in pieces:
                text += piece
                yield piece
                engine._watch(run, capture)
            decision = engine._judge(run, nodes, capture, text, response)
            step, decision = engine._plan(run, decision)
            if step is None:
                break
            found = engine._requery(run, decision, step, query_bundle)
            if isinstance(found, Decision):
                decision = found
                break
            nodes, capture, response = found
            yield "\n\n"
    except GeneratorExit:
        _abandon(engine, run, capture, pieces)
        raise
    yield from _conclude(engine, run, decision, out)


async def alive(
    engine: LogTokUQueryEngine,
    run: QueryRun,
    query_bundle: QueryBundle,
    nodes: list[NodeWithScore],
    capture: GenerationCapture,
    response: RESPONSE_TYPE,
    out: AsyncStreamingResponse,
) -> AsyncGenerator[str, None]:
    pieces: Any = None
    try:
        while True:
            text = ""
            pieces = apieces(response)
            async for piece in pieces:
                text += piece
                yield piece
                engine._watch(run, capture)
            decision = engine._judge(run, nodes, capture, text, response)
            step, decision = engine._plan(run, decision)
            if step is None:
                break
            found = await engine._arequery(run, decision, step, query_bundle)
            if isinstance(found, Decision):
                decision = found
                break
            nodes, capture, response = found
            yield "\n\n"
    except GeneratorExit:
        if pieces is not None:
            await pieces.aclose()  # ends the loop over the response's own stream, which is finalised with it
        _abandon(engine, run, capture, None)
        raise
    for piece in _conclude(engine, run, decision, out):
        yield piece
