"""The guard's decision on the wire: a withheld answer as OpenAI's refusal, the decision in headers.

A withheld answer (:attr:`~logtoku_guard.decision.results.GuardResult.withheld`: abstain, human review;
raise is a 422) carries nothing of its draft. A chat answer goes on OpenAI's refusal channel, as a
model's own refusal: ``message.content`` null and ``message.refusal`` the guard's message (the
policy's abstain message, or the review notice with its id), ``finish_reason`` ``stop`` (what
OpenAI sends with a refusal; ``content_filter`` would make the openai SDK's ``.parse()`` raise before
it reads the refusal), and, when logprobs were asked, ``logprobs`` ``{"content": [], "refusal": []}``
(never null: no draft token, and no log-probability of a message the model did not generate);
streamed, the message comes as ``delta.refusal``. A legacy completion has no refusal channel: its
``text`` is the message, ``finish_reason`` ``content_filter``, its ``logprobs`` (when asked) empty
lists. Either way: no per-token or summary ``logtoku``, ``usage`` counting the tokens of the
message sent, and the decision as :class:`~logtoku_guard.wire.payloads.ServedDecisionPayload` in
the choice's ``logtoku_guard`` (no draft, no tokens; what every attempt generated is its
``generated_tokens``).

The decision also goes into response headers (:data:`DECISION_HEADERS`) of a whole guarded answer,
for clients that keep headers but drop unknown body fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from logtoku_guard.types import Generation
from logtoku_guard.wire import openai_protocol as proto

__all__ = [
    "DECISION_HEADERS",
    "chat_message",
    "completion_finish",
    "decision_headers",
    "finish_of",
    "tool_finish",
    "withheld",
    "withheld_logprobs",
]


def withheld(guard_result: Any) -> bool:
    """The guard kept the draft from the client (abstain, human review, raise)."""
    return guard_result is not None and bool(guard_result.withheld)


def finish_of(g: Generation) -> str:
    """The generation's finish reason as the wire says it (a cancelled one is vLLM's ``abort``)."""
    return "abort" if g.finish_reason == "cancelled" else g.finish_reason


def tool_finish(g: Generation, called: bool, guard_result: Any = None, held: bool = False) -> str:
    """A chat answer's finish reason: ``stop`` when the guard withheld the draft (a refusal, as OpenAI
    sends one) or ``held`` back a call (the answer is then the kept calls, or the note that says why
    none runs), ``tool_calls`` when the answer ended with a call, else the generation's."""
    if withheld(guard_result):
        return "stop"
    if held:
        return "tool_calls" if called else "stop"
    return "tool_calls" if called and g.finish_reason == "stop" else finish_of(g)


def completion_finish(g: Generation, guard_result: Any = None) -> str:
    """A legacy completion's finish reason: ``content_filter`` when the guard withheld the draft (that API
    has no refusal channel), else the generation's."""
    return "content_filter" if withheld(guard_result) else finish_of(g)


DECISION_HEADERS = (
    "x-logtoku-action",
    "x-logtoku-withheld",
    "x-logtoku-rule",
    "x-logtoku-guard-score",
    "x-logtoku-review-id",
    "x-logtoku-trace-id",
)
"""The response headers that carry the guard's decision on a whole (not streamed) guarded answer."""


def decision_headers(guard_result: Any) -> dict[str, str]:
    """The guard's decision as response headers (:data:`DECISION_HEADERS`; none without a policy), for
    clients that keep headers but drop unknown body fields (``ChatOpenAI(include_response_headers=True)``
    puts them in ``response_metadata["headers"]``). A streamed answer's headers are sent before the guard
    decides, so they carry none: its decision is the last chunk's ``logtoku_guard``. The rule name is
    percent-encoded (a policy's names are free text)."""
    if guard_result is None:
        return {}
    from urllib.parse import quote

    from logtoku_guard.wire.payloads import served_decision_payload

    d = served_decision_payload(guard_result)
    out = {"x-logtoku-action": str(d["action"]), "x-logtoku-withheld": "true" if d["withheld"] else "false"}
    if d["rule"] is not None:
        out["x-logtoku-rule"] = quote(str(d["rule"]), safe="")
    score = d["stats"].get("guard_score")
    if score is not None:
        out["x-logtoku-guard-score"] = repr(float(score))
    if d["review_id"] is not None:
        out["x-logtoku-review-id"] = str(d["review_id"])
    out["x-logtoku-trace-id"] = quote(str(d["trace_id"]), safe="")
    return out


def withheld_logprobs() -> proto.ChatLogprobs:
    """The ``logprobs`` of a withheld chat answer when the request asked for them: two empty lists, not null."""
    return proto.ChatLogprobs(content=[], refusal=[])


def chat_message(answer: str | None, guard_result: Any = None, tool_calls: Sequence[Any] = ()) -> proto.AssistantMessage:
    """The choice's ``message``: the answer (``refusal`` null), or, when the guard withheld the draft,
    ``content`` null and the guard's message as ``refusal``."""
    if withheld(guard_result):
        return proto.AssistantMessage(role="assistant", content=None, refusal=answer)
    if not tool_calls:  # no call: no tool_calls field, as OpenAI's
        return proto.AssistantMessage(role="assistant", content=answer, refusal=None)
    return proto.AssistantMessage(role="assistant", content=answer, refusal=None, tool_calls=list(tool_calls))
