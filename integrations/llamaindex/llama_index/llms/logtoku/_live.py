"""``stream_mode="live"`` of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine`.

The first answer's pieces pass through as they come (an ``early_stop`` rule may cut them
short); once the answer ends the guard judges it, re-queries while the policy allows, and the
tail of the final answer follows. A caller that closes the stream before it ends (``close()``,
``aclose()``, a ``break`` out of the loop) stops the generation being streamed; the answer so
far is decided and recorded as the core guard's and LangChain's closed streams are
(:meth:`~logtoku_guard.guard_steps.Progress.abandon`: no retrieval is spent, the reason says the
stream was closed), and the query's GUARDRAIL span ends with that decision, with its open generation
span. Closed before any generation began: the span ends marked ``logtoku.abandoned``, nothing
to decide.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import Any, Protocol

from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.schema import QueryBundle

from logtoku_guard.generation_capture import GenerationCapture
from logtoku_guard.guard import Guard
from logtoku_guard.guard_steps import Answer, Conclude, Generate, Request, Retrieve, Steps
from logtoku_guard.results import GuardResult

from ._responses import QueryRun, apieces, tail, text_of

__all__ = ["ABANDONED", "LiveEngine", "alive", "live"]

ABANDONED = "stream closed by the caller before the guard decided"


class LiveEngine(Protocol):
    """What a live stream needs of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` (which
    imports this module, so the engine's class is not imported back, not even for annotations)."""

    @property
    def guard(self) -> Guard: ...

    def _answer(self, run: QueryRun, text: str) -> Answer: ...

    def _watch(self, run: QueryRun, capture: GenerationCapture) -> None: ...

    def _requery(self, run: QueryRun, steps: Steps, request: Retrieve, query_bundle: QueryBundle) -> Request: ...

    async def _arequery(self, run: QueryRun, steps: Steps, request: Retrieve, query_bundle: QueryBundle) -> Request: ...

    def _act(self, run: QueryRun, result: GuardResult) -> GuardResult: ...


def _abandon(engine: LiveEngine, run: QueryRun, capture: GenerationCapture | None, pieces: Any) -> None:
    """Stop the generation being streamed, decide and record the answer so far, end the open spans."""
    close = getattr(pieces, "close", None)
    if close is not None:
        close()
    generation = capture.take() if capture is not None else None
    run.generating.end_with(generation)
    if generation is None:
        run.span.abandon(ABANDONED)
        return
    run.span.end(run.progress.abandon(engine.guard.decider, generation))


def _conclude(
    engine: LiveEngine, run: QueryRun, result: GuardResult, out: StreamingResponse | AsyncStreamingResponse
) -> list[str]:
    """Act on ``result``, fill the response's final nodes and metadata; the pieces still to stream."""
    result = engine._act(run, result)
    out.source_nodes[:] = run.nodes[-1]
    out.metadata = run.metadata
    return tail(run.texts[-1], result.answer)


def live(
    engine: LiveEngine, run: QueryRun, query_bundle: QueryBundle, steps: Steps, out: StreamingResponse
) -> Generator[str, None, None]:
    """The sync driver of a live stream: answers the loop's requests, passing each answer's pieces on."""
    capture: GenerationCapture | None = None  # the answer being streamed reports to it
    pieces: Any = None
    try:
        request = next(steps)
        while not isinstance(request, Conclude):
            if isinstance(request, Generate):
                capture, response = run.answer.capture, run.answer.response
                if run.attempts:  # a re-queried answer goes on after the one already streamed
                    yield "\n\n"
                text = ""
                pieces = response.response_gen if isinstance(response, StreamingResponse) else iter([text_of(response)])
                for piece in pieces:
                    text += piece
                    yield piece
                    engine._watch(run, capture)
                request = steps.send(engine._answer(run, text))
            else:
                request = engine._requery(run, steps, request, query_bundle)
    except GeneratorExit:
        _abandon(engine, run, capture, pieces)
        raise
    yield from _conclude(engine, run, request.result, out)


async def alive(
    engine: LiveEngine, run: QueryRun, query_bundle: QueryBundle, steps: Steps, out: AsyncStreamingResponse
) -> AsyncGenerator[str, None]:
    """The async driver of a live stream (:func:`live` for ``aquery``)."""
    capture: GenerationCapture | None = None
    pieces: AsyncGenerator[str, None] | None = None
    try:
        request = next(steps)
        while not isinstance(request, Conclude):
            if isinstance(request, Generate):
                capture = run.answer.capture
                if run.attempts:
                    yield "\n\n"
                text = ""
                pieces = apieces(run.answer.response)
                async for piece in pieces:
                    text += piece
                    yield piece
                    engine._watch(run, capture)
                request = steps.send(engine._answer(run, text))
            else:
                request = await engine._arequery(run, steps, request, query_bundle)
    except GeneratorExit:
        if pieces is not None:
            await pieces.aclose()  # ends the loop over the response's own stream, which is finalised with it
        _abandon(engine, run, capture, None)
        raise
    for piece in _conclude(engine, run, request.result, out):
        yield piece
