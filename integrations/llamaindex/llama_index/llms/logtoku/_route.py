"""How :class:`~llama_index.llms.logtoku.LogTokUQueryEngine` answers the core guard loop, without I/O.

The loop is the core's, :func:`~logtoku_guard.guard.guard_steps.guard_steps`, run by the core's one
driver (:mod:`logtoku_guard.guard.driver`): it decides each answer, counts the re-queries, falls back.
The engine's I/O (:mod:`._engine_io`) answers its requests the LlamaIndex way::

    Generate(1)  -> synthesise from the nodes of the engine's first retrieval (made before the
                    loop), the LLM reporting its tokens to the driver's watch; read it (a live
                    stream yields its pieces meanwhile); answer_of(...) (the scores, the nodes, the text)
    Retrieve     -> engine_for(request.number); none: Retrieved(why=NO_ENGINE). Else emit the
                    decision's non-final event; under its tags, in the re-query span, retrieve
                    with the engine: retrieved(run, nodes) (new context: kept for the next answer)
    Generate(n)  -> synthesise from those nodes with that engine, under the decision's tags;
                    read it: answer_of(...)

This module holds the answers' logic (the checks on a synthesised answer, the engine of each
re-query, the "no new context" rule); the I/O only calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import RESPONSE_TYPE
from llama_index.core.schema import NodeWithScore

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.generation_capture import GenerationCapture
from logtoku_guard.guard.guard_steps import Answer, Retrieved
from logtoku_guard.types import Generation

from ._responses import QueryRun

__all__ = ["NO_ENGINE", "NO_NEW_CONTEXT", "NO_NODES", "Synthesis", "answer_of", "engine_for", "retrieved"]

NO_ENGINE = "no re-query engine (the retriever has no similarity_top_k; pass retry_query_engines=...)"
NO_NEW_CONTEXT = "the re-query found no new context"
NO_NODES = "the retriever found no context to answer from"


@dataclass(frozen=True)
class Synthesis:
    """A synthesised answer, not read yet: the capture its LLM call reports to and the (maybe streaming) response."""

    capture: GenerationCapture
    response: RESPONSE_TYPE


def answer_of(model: str, run: QueryRun, nodes: Sequence[NodeWithScore], synthesis: Synthesis, text: str) -> Answer:
    """The loop's answer for ``synthesis`` (read as ``text``, made from ``nodes`` by ``model``); kept in ``run``.

    An answer synthesised from no node was made without the LLM: it is unanswerable (the
    fallback). Raises :class:`ConfigurationError` when an answer made from nodes has no LogTokU
    generation, or one from another model than the guard scores.
    """
    generation = synthesis.capture.last
    no_context = None
    if generation is None:
        if nodes:
            msg = (
                "the wrapped query engine answered without a LogTokU generation: build it with llm=LogTokULLM(...) "
                "(or set Settings.llm) so the guard can read the token scores"
            )
            raise ConfigurationError(msg)
        generation = Generation(model=model, prompt=run.query, text=text, tokens=(), finish_reason="stop")
        no_context = NO_NODES
    elif generation.model != model:
        msg = (
            f"the answer came from model {generation.model!r} but the guard scores {model!r}; "
            "give LogTokUQueryEngine the same LogTokULLM as the wrapped query engine"
        )
        raise ConfigurationError(msg)
    run.nodes.append(list(nodes))
    run.texts.append(text)
    run.metadata = dict(getattr(synthesis.response, "metadata", None) or {})
    passages = tuple(n.node.get_content() for n in nodes)
    return Answer(generation, passages, text=text, no_context=no_context)


def engine_for(retries: Sequence[BaseQueryEngine], number: int) -> BaseQueryEngine | None:
    """The engine of re-query ``number`` (1 = the first): item ``min(number, len) - 1``; None without any."""
    return retries[min(number, len(retries)) - 1] if retries else None


def retrieved(run: QueryRun, nodes: Sequence[NodeWithScore]) -> Retrieved:
    """The loop's answer for a re-query that found ``nodes``: their texts, or :data:`NO_NEW_CONTEXT`
    when every node was in an earlier attempt's context."""
    seen = {n.node.node_id for attempt in run.nodes for n in attempt}
    if any(n.node.node_id not in seen for n in nodes):
        return Retrieved(tuple(n.node.get_content() for n in nodes))
    return Retrieved(why=NO_NEW_CONTEXT)
