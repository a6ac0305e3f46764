"""A LangGraph node that pauses the graph for a human verdict on a flagged answer (needs ``langgraph``).

Put it after a node that appends the guard's answer to the ``messages`` state::

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.types import Command

    def answer(state):
        return {"messages": [guard.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_node("review", human_review_node(store=store))
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "review")
    graph = builder.compile(checkpointer=InMemorySaver())

    out = graph.invoke({"messages": [("user", "Who founded ...?")]}, {"configurable": {"thread_id": "1"}})
    out["__interrupt__"][0].value       # {"review_id", "question", "draft", "reason", ...}
    graph.invoke(Command(resume={"approved": True, "reviewer": "alice"}), {"configurable": {"thread_id": "1"}})

The node calls :func:`langgraph.types.interrupt` when the last message's decision
(``response_metadata["logtoku_guard"]``) is one of ``actions`` (default: ``human_review``).
LangGraph re-runs a node from its start on resume, so the node does its side effects (the
audit store's ``approve``/``reject``) only after the verdict has arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_logtoku._convert import GuardPayload
from logtoku_guard.errors import MissingDependencyError

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore


class ReviewVerdict(BaseModel):
    """A reviewer's verdict, the value to resume the graph with.

    ``approved``: keep the model's draft (or ``answer``, an edited one); otherwise the answer
    becomes ``rejected_message`` of the node and ``note`` (required) says why.
    """

    model_config = ConfigDict(extra="forbid")

    approved: bool
    reviewer: str = Field(min_length=1)
    answer: str | None = None
    note: str | None = None

    @model_validator(mode="after")
    def _note_on_reject(self) -> ReviewVerdict:
        if not self.approved and not (self.note or "").strip():
            msg = "a rejection needs a note saying why (note='...')"
            raise ValueError(msg)
        return self


def human_review_node(
    *,
    store: AuditStore | None = None,
    actions: Sequence[str] = ("human_review",),
    messages_key: str = "messages",
    rejected_message: str = "I don't know.",
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A graph node: ``interrupt()`` for a :class:`ReviewVerdict` on answers the guard routed to ``actions``.

    Args:
        store: the guard's :class:`~logtoku_guard.audit.AuditStore`; the verdict is written to
            the review item of the answer (``approve``/``reject``).
        actions: the guard actions that need a person.
        messages_key: the state key holding the message list (the last one is the guard's).
        rejected_message: the answer when the reviewer rejects.

    The node returns the last message replaced (same id) by the reviewed answer, with the
    verdict under ``response_metadata["logtoku_review"]``; other answers pass untouched.
    """
    try:
        from langgraph.types import interrupt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        msg = "human_review_node needs langgraph: pip install langgraph"
        raise MissingDependencyError(msg) from exc
    wanted = frozenset(actions)

    def review(state: Mapping[str, Any]) -> dict[str, Any]:
        messages = state[messages_key]
        last = messages[-1] if messages else None
        if not isinstance(last, AIMessage):
            return {}
        decision: GuardPayload | None = last.response_metadata.get("logtoku_guard")
        if not decision or decision["action"] not in wanted:
            return {}
        payload = {
            "review_id": decision["review_id"],
            "trace_id": decision["trace_id"],
            "question": decision["question"],
            "draft": decision["draft"],
            "action": decision["action"],
            "rule": decision["rule"],
            "reason": decision["reason"],
            "reliability": decision["reliability"],
        }
        verdict = ReviewVerdict.model_validate(interrupt(payload))
        review_id = decision["review_id"]
        if store is not None and review_id is not None:
            if verdict.approved:
                store.approve(review_id, verdict.reviewer, edited_answer=verdict.answer, note=verdict.note)
            else:
                store.reject(review_id, verdict.reviewer, note=verdict.note or "")
        draft = verdict.answer if verdict.answer is not None else decision["draft"]
        content = draft if verdict.approved else rejected_message
        reviewed = AIMessage(
            id=last.id,
            content=content,
            response_metadata={**last.response_metadata, "logtoku_review": verdict.model_dump()},
            usage_metadata=last.usage_metadata,
        )
        return {messages_key: [reviewed]}

    return review
