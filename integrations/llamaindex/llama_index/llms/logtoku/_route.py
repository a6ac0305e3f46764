"""The guard loop of :class:`~llama_index.llms.logtoku.LogTokUQueryEngine`, written once, without I/O.

:func:`route` is a plain generator that owns the loop's decisions: judge the attempt, ask the
core guard for the next step, re-query or stop, fall back when a re-query brings no new
context. It never retrieves, synthesises or reads a response itself: it yields a request and
is sent back the result. Four thin drivers do the I/O (sync and async queries, sync and async
``"live"`` streams)::

    request = next(steps)                   # Read(first answer)
    while not isinstance(request, Act):
        Read(answer)        -> send the answer's full text (a live stream yields its pieces meanwhile)
        Requery(engine, d)  -> emit d's non-final event; under its tags, in the re-query span,
                               retrieve with engine and send the nodes; the route answers
                               Synthesize (still in the span) or Act (the fallback)
        Synthesize(e, n)    -> synthesise from n with e, send the Synthesis
    act on request.decision

A route is one query's: it records the attempts in its :class:`~._responses.QueryRun`.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import RESPONSE_TYPE
from llama_index.core.schema import NodeWithScore

from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.generation_capture import GenerationCapture
from logtoku_guard.guard import Conclude, Guard
from logtoku_guard.policy import Decision
from logtoku_guard.results import Attempt
from logtoku_guard.types import Generation

from ._responses import QueryRun

__all__ = ["Act", "Read", "Requery", "Request", "Steps", "Synthesis", "Synthesize", "out_of_turn", "route"]


@dataclass(frozen=True)
class Synthesis:
    """A synthesised answer, not read yet: the capture its LLM call reports to and the (maybe streaming) response."""

    capture: GenerationCapture
    response: RESPONSE_TYPE


@dataclass(frozen=True)
class Read:
    """Read ``answer`` to its end (a ``"live"`` stream passes its pieces on meanwhile); send back its full text."""

    answer: Synthesis


@dataclass(frozen=True)
class Requery:
    """Announce ``decision`` (the non-final event), then, under its tags and in the re-query span,
    retrieve with ``engine``; send back the nodes (a list of ``NodeWithScore``)."""

    engine: BaseQueryEngine
    decision: Decision


@dataclass(frozen=True)
class Synthesize:
    """Still in the re-query span: synthesise an answer from ``nodes`` with ``engine``; send back the :class:`Synthesis`."""

    engine: BaseQueryEngine
    nodes: list[NodeWithScore]


@dataclass(frozen=True)
class Act:
    """The loop is over: act on ``decision`` (the route has nothing more to ask)."""

    decision: Decision


Request = Read | Requery | Synthesize | Act
Steps = Generator[Request, Any, None]  # what route() returns


def route(
    guard: Guard, retries: Sequence[BaseQueryEngine], run: QueryRun, nodes: list[NodeWithScore], answer: Synthesis
) -> Steps:
    """The requests of one guarded query, from its first answer (synthesised from ``nodes``) to :class:`Act`.

    ``retries``: the re-query engines (re-query ``i`` uses item ``min(i, len) - 1``; none: a
    ``retrieve`` decision falls back at once). What each request expects back: see its class.
    """
    while True:
        text: str = yield Read(answer)
        judge(guard, run, nodes, answer, text)  # recorded in run.attempts, where plan reads it
        engine, decision = plan(guard, retries, run)
        if engine is None:
            break
        nodes = yield Requery(engine, decision)
        fallback = fresh(guard, run, decision, nodes)
        if fallback is not None:
            decision = fallback
            break
        answer = yield Synthesize(engine, nodes)
    yield Act(decision)


def out_of_turn(request: Request) -> UsageError:
    """The error for a driver that meets ``request`` where it cannot answer it (a bug of the driver)."""
    msg = (
        f"a route's {type(request).__name__} request reached the top of a driver's loop; "
        "a Synthesize is answered inside the re-query span that sent the Requery's nodes"
    )
    return UsageError(msg)


def judge(guard: Guard, run: QueryRun, nodes: list[NodeWithScore], answer: Synthesis, text: str) -> Decision:
    """Score the attempt just made (``answer``, read as ``text``, from ``nodes``) and record it in ``run``."""
    generation = answer.capture.last
    run.generating.end_with(generation)
    t = time.perf_counter()
    if generation is None:
        if nodes:
            msg = (
                "the wrapped query engine answered without a LogTokU generation: build it with llm=LogTokULLM(...) "
                "(or set Settings.llm) so the guard can read the token scores"
            )
            raise ConfigurationError(msg)
        generation = Generation(model=guard.backend.model_name, prompt=run.query, text=text, tokens=(), finish_reason="stop")
        decision = guard.unanswerable(generation, "the retriever found no context to answer from")
    else:
        if generation.model != guard.backend.model_name:
            msg = (
                f"the answer came from model {generation.model!r} but the guard scores {guard.backend.model_name!r}; "
                "give LogTokUQueryEngine the same LogTokULLM as the wrapped query engine"
            )
            raise ConfigurationError(msg)
        decision = guard.decide(generation, run.attempts)
    run.decision_s += time.perf_counter() - t
    run.attempts.append(Attempt(generation, decision, tuple(n.node.get_content() for n in nodes)))
    run.nodes.append(list(nodes))
    run.texts.append(text)
    run.metadata = dict(getattr(answer.response, "metadata", None) or {})
    return decision


def plan(guard: Guard, retries: Sequence[BaseQueryEngine], run: QueryRun) -> tuple[BaseQueryEngine | None, Decision]:
    """After the last attempt of ``run``: the engine to re-query with and the decision asking for it,
    or None and the decision to act on."""
    step = guard.next_step(run.attempts)
    if isinstance(step, Conclude):
        return None, step.decision
    if not retries:
        why = "no re-query engine (the retriever has no similarity_top_k; pass retry_query_engines=...)"
        run.attempts[-1] = replace(run.attempts[-1], retrieval_error=why)
        return None, guard.give_up(step.decision, why)
    return retries[min(step.number, len(retries)) - 1], step.decision


def fresh(guard: Guard, run: QueryRun, decision: Decision, nodes: list[NodeWithScore]) -> Decision | None:
    """None when ``nodes`` bring new context; else the fallback decision."""
    seen = {n.node.node_id for attempt in run.nodes for n in attempt}
    if any(n.node.node_id not in seen for n in nodes):
        return None
    why = "the re-query found no new context"
    run.attempts[-1] = replace(run.attempts[-1], retrieval_error=why)
    return guard.give_up(decision, why)
