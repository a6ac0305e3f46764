"""Instrumentation: one typed event per guard decision.

:class:`LogTokUDecisionEvent` is dispatched through ``get_dispatcher(__name__)`` of the query
engine module, so any handler added to the root dispatcher receives it::

    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    class Decisions(BaseEventHandler):
        def handle(self, event, **kwargs):
            if isinstance(event, LogTokUDecisionEvent):
                print(event.action, event.reason)

    get_dispatcher().add_event_handler(Decisions())

Its ``tags`` (and those of the spans opened to act on it) hold ``logtoku.action``,
``logtoku.rule`` and ``logtoku.attempt``.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation.events import BaseEvent


class LogTokUDecisionEvent(BaseEvent):
    """The policy's decision on one attempt of a guarded query.

    A query that is answered at once sends one event (``final=True``). One that re-queries
    with more context sends one event per attempt: ``action == "retrieve"`` and
    ``final=False`` for each attempt that led to a re-query, then the final one, whose
    ``action`` is what was done (the retrieve fallback once attempts ran out).

    ``reliability``: the answer's LogTokU reliability, higher = more reliable (None when
    undefined). ``stats``: every response statistic the policy could read, by name.
    ``decision`` and ``result`` (final event only) are the typed core objects
    (:class:`~logtoku_guard.policy.Decision`, :class:`~logtoku_guard.guard.GuardResult`);
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
    decision: Any = Field(default=None, exclude=True)
    result: Any = Field(default=None, exclude=True)

    @classmethod
    def class_name(cls) -> str:
        return "LogTokUDecisionEvent"
