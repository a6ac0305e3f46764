"""The query engine's answers to the core guard loop (``_route``), driven by hand: no engine, no retrieval, no LLM.

The test plays the engine's driver: it answers each request of the core loop
(:func:`~logtoku_guard.guard.guard_steps.guard_steps`) with ``_route``'s answers (``answer_of`` for a
``Generate``, ``engine_for`` and ``retrieved`` for a ``Retrieve``) and checks what the loop asks
next. The "engines" are plain markers: only ``engine_for`` hands them back.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import low, policy, sure, unsure
from llama_index.core.base.response.schema import Response
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index.llms.logtoku._responses import QueryRun
from llama_index.llms.logtoku._route import NO_ENGINE, Synthesis, answer_of, engine_for, retrieved
from logtoku_guard import ConfigurationError, Guard, ScriptedAnswer, ScriptedBackend
from logtoku_guard.guard.generation_capture import GenerationCapture
from logtoku_guard.guard.guard_steps import Conclude, Generate, Retrieve, Retrieved, Steps, guard_steps

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


def start(guard: Guard, run: QueryRun) -> Steps:
    steps = guard_steps(guard.decider, run.progress)
    assert next(steps) == Generate(1, run.query)
    return steps


def read(guard: Guard, run: QueryRun, found: list[NodeWithScore], answer: Synthesis, text: str) -> Any:
    return answer_of(guard.backend.model_name, run, found, answer, text)


def test_retrieve_retrieve_then_no_new_context_falls_back() -> None:
    guard, backend = guard_for(unsure("Maybe", " Lyon"), unsure("Maybe", " Rome"), max_attempts=3, fallback="abstain")
    run = QueryRun("q")
    steps = start(guard, run)
    request = steps.send(read(guard, run, nodes("a", "b"), synthesis(backend), "Maybe Lyon"))
    assert isinstance(request, Retrieve) and engine_for([WIDE, WIDER], request.number) is WIDE
    assert (request.decision.action, request.decision.rule) == ("retrieve", "low-reliability")
    assert len(run.attempts) == 1 and run.texts == ["Maybe Lyon"]

    wider = nodes("a", "b", "c")  # c is new: the loop asks for an answer from these nodes
    request = steps.send(retrieved(run, wider))
    assert isinstance(request, Generate) and request.attempt == 2 and request.passages == ("passage a", "passage b", "passage c")
    request = steps.send(read(guard, run, wider, synthesis(backend), "Maybe Rome"))
    assert isinstance(request, Retrieve) and engine_for([WIDE, WIDER], request.number) is WIDER
    assert request.decision.action == "retrieve"
    assert [len(n) for n in run.nodes] == [2, 3]

    request = steps.send(retrieved(run, nodes("c", "a")))  # nothing the attempts have not seen: fall back at once
    assert isinstance(request, Conclude)
    decision = request.result.decision
    assert decision.action == "abstain" and decision.reason.endswith("; the re-query found no new context")
    assert run.attempts[-1].retrieval_error == "the re-query found no new context"
    assert len(run.attempts) == 2 and len(backend.calls) == 2  # no third answer was asked for
    assert [a.decision.action for a in run.attempts] == ["retrieve", "retrieve"]


def test_a_requery_that_helps_ends_with_its_decision() -> None:
    guard, backend = guard_for(unsure("Maybe", " Lyon"), sure("Paris"))
    run = QueryRun("q")
    steps = start(guard, run)
    assert isinstance(steps.send(read(guard, run, nodes("a"), synthesis(backend), "Maybe Lyon")), Retrieve)
    assert isinstance(steps.send(retrieved(run, nodes("a", "b"))), Generate)
    request = steps.send(read(guard, run, nodes("a", "b"), synthesis(backend), "Paris"))
    assert isinstance(request, Conclude)
    assert (request.result.action, request.result.decision.reason) == ("pass", "after retrieval: no rule fired")
    assert request.result.answer == "Paris" and run.texts == ["Maybe Lyon", "Paris"] and run.metadata == {}


def test_the_policy_caps_the_requeries_and_every_requery_past_the_list_reuses_its_last_engine() -> None:
    guard, backend = guard_for(*[unsure("Maybe")] * 3, max_attempts=2, fallback="warn")
    run = QueryRun("q")
    steps = start(guard, run)
    request = steps.send(read(guard, run, nodes("a"), synthesis(backend), "Maybe"))
    engines = []
    for new in ("b", "c"):
        assert isinstance(request, Retrieve)
        engines.append(engine_for([WIDE], request.number))
        assert isinstance(steps.send(retrieved(run, nodes("a", new))), Generate)
        request = steps.send(read(guard, run, nodes("a", new), synthesis(backend), "Maybe"))
    assert engines == [WIDE, WIDE]
    assert isinstance(request, Conclude) and request.result.action == "warn"
    assert request.result.decision.reason.startswith("still uncertain after 2 retrieval attempt(s)")


def test_no_requery_engine_falls_back_at_the_first_answer() -> None:
    guard, backend = guard_for(unsure("Maybe"), fallback="abstain")
    run = QueryRun("q")
    steps = start(guard, run)
    request = steps.send(read(guard, run, nodes("a"), synthesis(backend), "Maybe"))
    assert isinstance(request, Retrieve) and engine_for([], request.number) is None
    request = steps.send(Retrieved(why=NO_ENGINE))
    assert isinstance(request, Conclude) and request.result.action == "abstain"
    assert "no re-query engine" in (run.attempts[-1].retrieval_error or "")


def test_no_context_is_unanswerable_and_a_missing_generation_with_context_is_an_error() -> None:
    guard, _ = guard_for(sure("Paris"), fallback="abstain")
    nothing = Synthesis(GenerationCapture(), Response("Empty Response"))
    run = QueryRun("q")
    steps = start(guard, run)
    request = steps.send(read(guard, run, [], nothing, "Empty Response"))
    assert isinstance(request, Conclude)
    result = request.result
    assert (result.action, result.decision.reason) == ("abstain", "the retriever found no context to answer from")
    assert result.decision.rule is None

    with pytest.raises(ConfigurationError, match="answered without a LogTokU generation"):
        read(guard, QueryRun("q"), nodes("a"), nothing, "Empty Response")


def test_an_answer_from_another_model_is_refused() -> None:
    guard, _ = guard_for(sure("Paris"))
    other = ScriptedBackend([sure("Paris")], model_name="another-model")
    with pytest.raises(ConfigurationError, match="another-model"):
        read(guard, QueryRun("q"), nodes("a"), synthesis(other), "Paris")
