"""The tool-call loop, written once and without I/O: :func:`tool_steps` yields requests, a driver answers.

The calls of a guarded answer are decided by the policy's ``tool_calls`` rules
(:class:`~logtoku_guard.decision.tool_gate.ToolCallPolicy`) before any tool runs: each call is
run, sent to human review or refused; or the answer is re-asked (its calls do not run, the model
is told why and answers again, at most ``reask.max_attempts`` times in a row, then
``reask.fallback``). :func:`tool_steps` owns every decision of that loop: the scores read from
the answer, when to re-ask, what the model is told in place of each call's result, the
fallback, the audit record of a stopped call and the number of the answer each decision belongs
to. It never generates or writes by itself: it yields a request and is sent the answer::

    steps = tool_steps(policy, ToolTurn(calls, metadata, model), question=...)
    request = next(steps)
    while not isinstance(request, ToolsDecided):
        Reask(calls, results, number) -> send the model's next answer as a ToolTurn, made from the
                                         conversation, the answer's calls and, as call i's result,
                                         results[i] (ToolTurn() when it called no tool this time)
        Record(stopped)               -> send one ReviewItem or None per stopped call: the item a
                                         human_review call was queued as; None for a refusal (or a
                                         store that keeps no refusals)
    request.calls                      # the last answer's calls, each with its decision

One driver answers it (:mod:`logtoku_guard.guard.tool_driver`, sync and async); the server
(:mod:`logtoku_guard.server.gate`) and LangChain's tool gate hand that driver only their I/O:
how they make the next answer, how they write a record, and what their client gets.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from logtoku_guard.decision.tool_gate.call_review import tool_call_record
from logtoku_guard.decision.tool_gate.scores import parse_tool_call_scores
from logtoku_guard.errors import UsageError, short_repr

if TYPE_CHECKING:
    from logtoku_guard.audit.records import AuditRecord, ReviewItem
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.decision.tool_gate.call_policy import ToolAction, ToolCallPolicy, ToolDecision
    from logtoku_guard.decision.tool_gate.scores import ScoredToolCall
    from logtoku_guard.scoring.quadrants import QuadrantThresholds

__all__ = [
    "DecidedCall",
    "Reask",
    "Record",
    "Stopped",
    "ToolRequest",
    "ToolSteps",
    "ToolTurn",
    "ToolsDecided",
    "tool_steps",
]

NOT_RUN = "The call to {tool} was not run: another call of this answer was re-asked; call it again if it is still needed."
"""What the model is told of a call that was not re-asked itself, in an answer that was."""


# -- what the loop reads -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolTurn:
    """One answer's tool calls, as plain data (the entry point's wire form read once).

    ``calls``: ``{"id", "name", "args"}`` per call (``AIMessage.tool_calls``' form; none: the
    model answered without a tool). ``metadata``: where the per-argument scores are, under
    ``["logtoku"]["tool_calls"]`` (:func:`~logtoku_guard.decision.tool_gate.scores.parse_tool_call_scores`).
    ``model``: the model that answered (recorded with a stopped call).
    """

    calls: Sequence[Mapping[str, Any]] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    model: str = "unknown"


@dataclass(frozen=True)
class DecidedCall:
    """One call and what the rules decided for it. ``attempt``: the answer that made it (1 = the
    first answer this loop read, counted across re-asks); ``review``: the review item a
    ``human_review`` call was queued as (None until it is, or when the store keeps none)."""

    call: ScoredToolCall
    decision: ToolDecision
    attempt: int
    review: ReviewItem | None = None

    @property
    def action(self) -> ToolAction:
        return self.decision.action

    @property
    def review_id(self) -> int | None:
        return self.review.id if self.review is not None else None


# -- requests ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reask:
    """None of the answer's ``calls`` runs: tell the model why and let it answer again. ``results``:
    per call, what the model is told in place of the tool's result (the policy's re-ask message for
    a re-asked call, :data:`NOT_RUN` for the others). ``number``: this re-ask's number in a row (1 =
    the first). Send back the next answer's :class:`ToolTurn`."""

    calls: tuple[DecidedCall, ...]
    results: tuple[str, ...]
    number: int


@dataclass(frozen=True)
class Stopped:
    """A call that does not run as made: sent to human review (:attr:`review`) or refused; ``record``
    is its audit record (the arguments as the answer, the per-argument scores, the decision)."""

    call: DecidedCall
    record: AuditRecord

    @property
    def review(self) -> bool:
        return self.call.action == "human_review"


@dataclass(frozen=True)
class Record:
    """Write the audit records of the answer's ``stopped`` calls (queue the reviews). Send back one
    ``ReviewItem | None`` per stopped call, in order."""

    stopped: tuple[Stopped, ...]


@dataclass(frozen=True)
class ToolsDecided:
    """The loop is over. ``calls``: the last answer's calls, each decided (run, human_review or
    refuse; none when that answer made no call or the policy stops none). ``history``: every
    decided call of every answer in order, the re-asked ones first."""

    calls: tuple[DecidedCall, ...]
    history: tuple[DecidedCall, ...]

    @property
    def withheld(self) -> bool:
        """True when a call of the last answer does not run as made."""
        return any(c.action != "run" for c in self.calls)


ToolRequest = Reask | Record | ToolsDecided
ToolSteps = Generator[ToolRequest, Any, None]
"""What :func:`tool_steps` returns: send a :class:`ToolTurn` to a :class:`Reask`, the review
items to a :class:`Record`."""


# -- the loop -----------------------------------------------------------------------------------------------
def tool_steps(
    policy: Policy,
    turn: ToolTurn,
    *,
    question: str,
    reasks: int = 0,
    quadrants: QuadrantThresholds | None = None,
) -> ToolSteps:
    """The requests of one answer's tool calls, from ``turn`` to :class:`ToolsDecided`.

    ``question``: what the user asked (recorded with a stopped call). ``reasks``: re-asks already
    made in a row before ``turn`` (an agent that makes the re-asked answer in its own loop starts
    a new one on it with the :class:`Reask`'s ``number``). ``quadrants``: to record each
    argument's AU/EU quadrant. Malformed scores or calls raise
    :class:`~logtoku_guard.errors.ConfigurationError` naming the bad value.
    """
    rules = policy.tool_calls
    history: list[DecidedCall] = []
    while True:
        if not rules.gates or not turn.calls:
            yield ToolsDecided((), tuple(history))
            return
        scored = parse_tool_call_scores(turn.metadata, turn.calls)
        decisions = rules.decide_turn(scored, reasks, policy.undefined)
        decided = tuple(DecidedCall(c, d, reasks + 1) for c, d in zip(scored, decisions, strict=True))
        if any(d.action == "reask" for d in decisions):
            history.extend(decided)
            reasks += 1
            reply = yield Reask(decided, tuple(_told(rules, d) for d in decided), reasks)
            if not isinstance(reply, ToolTurn):
                msg = f"answer a Reask with the next answer's ToolTurn (ToolTurn() when it made no call), got {short_repr(reply)}"
                raise UsageError(msg)
            turn = reply
            continue
        stopped = tuple(Stopped(d, _record(d, policy, question, turn.model, quadrants)) for d in decided if d.action != "run")
        if stopped:
            items = yield Record(stopped)
            decided = _reviewed(decided, stopped, items)
        history.extend(decided)
        yield ToolsDecided(decided, tuple(history))
        return


def _told(rules: ToolCallPolicy, call: DecidedCall) -> str:
    """What the model is told in place of ``call``'s result when its answer is re-asked."""
    if call.action == "reask":
        return rules.reask_message(call.call.name, call.decision.reason)
    return NOT_RUN.format(tool=call.call.name)


def _record(call: DecidedCall, policy: Policy, question: str, model: str, quadrants: QuadrantThresholds | None) -> AuditRecord:
    return tool_call_record(
        call.call,
        call.decision,
        question=question,
        model=model,
        policy_name=policy.name,
        policy_version=policy.version,
        quadrants=quadrants,
    )


def _reviewed(decided: tuple[DecidedCall, ...], stopped: tuple[Stopped, ...], items: Any) -> tuple[DecidedCall, ...]:
    """``decided`` with each human_review call's review item (``items``: the reply to a :class:`Record`)."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or len(items) != len(stopped):
        msg = f"answer a Record with one ReviewItem or None per stopped call ({len(stopped)}), got {short_repr(items)}"
        raise UsageError(msg)
    queued: dict[int, ReviewItem] = {}
    for s, item in zip(stopped, items, strict=True):
        if item is None:
            continue
        if not s.review or not isinstance(getattr(item, "id", None), int):
            msg = f"only a human_review call is queued as a ReviewItem; got {short_repr(item)} for a {s.call.action} call"
            raise UsageError(msg)
        queued[id(s.call)] = item
    return tuple(replace(d, review=queued[id(d)]) if id(d) in queued else d for d in decided)
