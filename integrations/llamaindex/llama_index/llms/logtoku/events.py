"""Instrumentation: one typed event per guard decision, and the query engine's ``metadata["logtoku"]``.

:class:`LogTokUDecisionEvent` is dispatched through ``get_dispatcher(__name__)`` of the query
engine module, so any handler added to the root dispatcher receives it::

    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    class Decisions(BaseEventHandler):
        def handle(self, event, **kwargs):
            if isinstance(event, LogTokUDecisionEvent):
                print(event.action, event.reason)

    get_dispatcher().add_event_handler(Decisions())

Its ``route`` holds every attempt's own action and rule. The spans opened to act on a decision
are tagged ``logtoku.action``, ``logtoku.rule``, ``logtoku.attempt`` and ``logtoku.route`` (the
actions of the attempts so far). Every value in it comes from the core payload builders
(:mod:`logtoku_guard.wire.payloads`), as does :class:`QueryPayload`, the ``metadata["logtoku"]`` of a
guarded response.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.schema import NodeWithScore

from logtoku_guard.wire.payloads import AttemptPayload, ResultPayload, attempt_payload, json_float, result_payload, stats_payload

if TYPE_CHECKING:
    from logtoku_guard.decision.policy import Decision, Policy
    from logtoku_guard.decision.results import Attempt, GuardResult
    from logtoku_guard.scoring.quadrants import QuadrantThresholds


class SourceNodePayload(TypedDict):
    node_id: str
    score: float | None


class AttemptLogPayload(AttemptPayload):
    """One attempt (:class:`~logtoku_guard.wire.payloads.AttemptPayload`) with the ids of its source nodes."""

    source_node_ids: list[str]


class QueryPayload(ResultPayload):
    """``metadata["logtoku"]``: the core :class:`~logtoku_guard.wire.payloads.ResultPayload`, the final
    attempt's ``source_nodes`` and every attempt with its node ids (``attempt_log``)."""

    source_nodes: list[SourceNodePayload]
    attempt_log: list[AttemptLogPayload]


def query_payload(
    result: GuardResult, thresholds: QuadrantThresholds | None, nodes: Sequence[Sequence[NodeWithScore]]
) -> QueryPayload:
    """The ``metadata["logtoku"]`` of a guarded response (``nodes``: the source nodes of each attempt)."""
    return QueryPayload(
        **result_payload(result, thresholds),
        source_nodes=[SourceNodePayload(node_id=n.node.node_id, score=n.score) for n in nodes[-1]],
        attempt_log=[
            AttemptLogPayload(**attempt_payload(i, a), source_node_ids=[n.node.node_id for n in found])
            for i, (a, found) in enumerate(zip(result.attempts, nodes), 1)
        ],
    )


class LogTokUDecisionEvent(BaseEvent):
    """The policy's decision on one attempt of a guarded query.

    A query that is answered at once sends one event (``final=True``). One that re-queries
    with more context sends one event per attempt: ``action == "retrieve"`` and
    ``final=False`` for each attempt that led to a re-query, then the final one, whose
    ``action`` is what was done (the retrieve fallback once attempts ran out).

    ``route``: every attempt so far with its own action and rule (``retrieve`` with the rule that
    asked for it, then ``pass``...), so a retrieval that rescued the answer stays visible.
    ``reliability``: the answer's LogTokU reliability, higher = more reliable (None when
    undefined). ``stats``: every response statistic the policy could read, by name.
    ``decision`` and ``result`` (final event only) are the typed core objects
    (:class:`~logtoku_guard.decision.policy.Decision`, :class:`~logtoku_guard.guard.guard.GuardResult`);
    they are left out of ``model_dump()``.
    """

    query: str
    action: str
    rule: str | None = None
    reason: str
    attempt: int = Field(ge=1, description="1 for the first answer, 2 for the first re-query, ...")
    final: bool
    reliability: float | None = None
    model: str
    policy_name: str
    policy_version: str
    source_node_ids: list[str] = Field(default_factory=list)
    stats: dict[str, float | None] = Field(default_factory=dict)
    answer: str | None = Field(default=None, description="The answer returned (final event only).")
    trace_id: str | None = Field(default=None, description="Audit trace id (final event only).")
    review_id: int | None = Field(default=None, description="Human-review item id (human_review only).")
    stopped_early: bool = False
    route: list[dict[str, Any]] = Field(
        default_factory=list, description="Every attempt so far with its own action and rule (payloads.AttemptPayload)."
    )
    decision: Any = Field(default=None, exclude=True)
    result: Any = Field(default=None, exclude=True)

    @classmethod
    def class_name(cls) -> str:
        return "LogTokUDecisionEvent"

    @classmethod
    def of(
        cls,
        query: str,
        decision: Decision,
        attempts: Sequence[Attempt],
        nodes: Sequence[NodeWithScore],
        policy: Policy,
        *,
        final: bool,
        stopped_early: bool,
        result: GuardResult | None = None,
    ) -> LogTokUDecisionEvent:
        """The event for ``decision`` on the last of ``attempts`` (``nodes``: its source nodes)."""
        generation = attempts[-1].generation
        return cls(
            query=query,
            action=decision.action,
            rule=decision.rule,
            reason=decision.reason,
            attempt=len(attempts),
            final=final,
            reliability=json_float(generation.score.reliability),
            model=generation.model,
            policy_name=policy.name,
            policy_version=policy.version,
            source_node_ids=[n.node.node_id for n in nodes],
            stats=stats_payload(decision.stats),
            answer=result.answer if result is not None else None,
            trace_id=result.trace_id if result is not None else None,
            review_id=result.review_id if result is not None else None,
            stopped_early=stopped_early,
            route=[dict(attempt_payload(i, a)) for i, a in enumerate(attempts, 1)],
            decision=decision,
            result=result,
        )
