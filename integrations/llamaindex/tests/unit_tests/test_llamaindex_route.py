"""The query engine's guard loop (``_route.route``) driven by hand: no engine, no retrieval, no LLM.

The test plays the driver: it answers each request the route yields (a text for ``Read``, nodes
for ``Requery``, a synthesis for ``Synthesize``) and checks what the route asks next. The
"engines" are plain markers: the route only hands them back in its requests.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import low, policy, sure, unsure
from llama_index.core.base.response.schema import Response
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index.llms.logtoku._responses import QueryRun
from llama_index.llms.logtoku._route import Act, Read, Requery, Synthesis, Synthesize, out_of_turn, route
from logtoku_guard import ConfigurationError, Guard, ScriptedAnswer, ScriptedBackend, UsageError
from logtoku_guard.generation_capture import GenerationCapture

WIDE: Any = "engine: top-k 6"  # markers standing for re-query engines
WIDER: Any = "engine: top-k 10"


def nodes(*ids: str) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=f"passage {i}"), score=1.0) for i in ids]


def synthesis(backend: ScriptedBackend) -> Synthesis:
    """An answer as the engine's synthesis leaves it: the capture holds the LLM's generation."""
    capture = GenerationCapture()
    generation = backend.generate("q")
    capture.finished(generation)
    return Synthesis(capture, Response(generation.text))


def guard_for(*answers: ScriptedAnswer, **retrieve: Any) -> tuple[Guard, ScriptedBackend]:
    backend = ScriptedBackend(list(answers))
    return Guard(backend, policy(low("retrieve"), retrieve=retrieve)), backend


def test_retrieve_retrieve_then_no_new_context_falls_back() -> None:
    guard, backend = guard_for(unsure("Maybe", " Lyon"), unsure("Maybe", " Rome"), max_attempts=3, fallback="abstain")
    run = QueryRun("q")
    first = synthesis(backend)
    steps = route(guard, [WIDE, WIDER], run, nodes("a", "b"), first)

    assert next(steps) == Read(first)
    request = steps.send("Maybe Lyon")
    assert isinstance(request, Requery) and request.engine is WIDE
    assert (request.decision.action, request.decision.rule) == ("retrieve", "low-reliability")
    assert len(run.attempts) == 1 and run.texts == ["Maybe Lyon"]

    wider = nodes("a", "b", "c")  # c is new: the route asks for a synthesis from these nodes
    assert steps.send(wider) == Synthesize(WIDE, wider)
    second = synthesis(backend)
    assert steps.send(second) == Read(second)
    request = steps.send("Maybe Rome")
    assert isinstance(request, Requery) and request.engine is WIDER and request.decision.action == "retrieve"
    assert [len(n) for n in run.nodes] == [2, 3]

    request = steps.send(nodes("c", "a"))  # nothing the attempts have not seen: fall back at once
    assert isinstance(request, Act)
    assert request.decision.action == "abstain" and request.decision.reason.endswith("; the re-query found no new context")
    assert run.attempts[-1].retrieval_error == "the re-query found no new context"
    assert len(run.attempts) == 2 and len(backend.calls) == 2  # no third answer was asked for
    assert [a.decision.action for a in run.attempts] == ["retrieve", "retrieve"]


def test_a_requery_that_helps_ends_with_its_decision() -> None:
    guard, backend = guard_for(unsure("Maybe", " Lyon"), sure("Paris"))
    run = QueryRun("q")
    first = synthesis(backend)
    steps = route(guard, [WIDE], run, nodes("a"), first)
    next(steps)
    assert isinstance(steps.send("Maybe Lyon"), Requery)
    assert isinstance(steps.send(nodes("a", "b")), Synthesize)
    second = synthesis(backend)
    steps.send(second)
    request = steps.send("Paris")
    assert isinstance(request, Act)
    assert (request.decision.action, request.decision.reason) == ("pass", "after retrieval: no rule fired")
    assert run.texts == ["Maybe Lyon", "Paris"] and run.metadata == {}


def test_the_policy_caps_the_requeries_and_every_requery_past_the_list_reuses_its_last_engine() -> None:
    guard, backend = guard_for(*[unsure("Maybe")] * 3, max_attempts=2, fallback="warn")
    run = QueryRun("q")
    steps = route(guard, [WIDE], run, nodes("a"), synthesis(backend))
    next(steps)
    engines = []
    for new in ("b", "c"):
        request = steps.send("Maybe")
        assert isinstance(request, Requery)
        engines.append(request.engine)
        assert isinstance(steps.send(nodes("a", new)), Synthesize)
        steps.send(synthesis(backend))
    request = steps.send("Maybe")
    assert engines == [WIDE, WIDE]
    assert isinstance(request, Act) and request.decision.action == "warn"
    assert request.decision.reason.startswith("still uncertain after 2 retrieval attempt(s)")


def test_no_requery_engine_falls_back_at_the_first_answer() -> None:
    guard, backend = guard_for(unsure("Maybe"), fallback="abstain")
    run = QueryRun("q")
    steps = route(guard, [], run, nodes("a"), synthesis(backend))
    next(steps)
    request = steps.send("Maybe")
    assert isinstance(request, Act) and request.decision.action == "abstain"
    assert "no re-query engine" in (run.attempts[-1].retrieval_error or "")


def test_no_context_is_unanswerable_and_a_missing_generation_with_context_is_an_error() -> None:
    guard, _ = guard_for(sure("Paris"), fallback="abstain")
    nothing = Synthesis(GenerationCapture(), Response("Empty Response"))
    steps = route(guard, [WIDE], QueryRun("q"), [], nothing)
    next(steps)
    request = steps.send("Empty Response")
    assert isinstance(request, Act)
    assert (request.decision.action, request.decision.reason) == ("abstain", "the retriever found no context to answer from")

    steps = route(guard, [WIDE], QueryRun("q"), nodes("a"), nothing)
    next(steps)
    with pytest.raises(ConfigurationError, match="answered without a LogTokU generation"):
        steps.send("Empty Response")


def test_a_synthesize_request_out_of_its_requery_is_named() -> None:
    error = out_of_turn(Synthesize(WIDE, []))
    assert isinstance(error, UsageError) and "Synthesize request reached the top of a driver's loop" in str(error)
