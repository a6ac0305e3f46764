"""``LogTokUMiddleware``: the core guard as LangChain v1 agent middleware (``create_agent``).

::

    from langchain.agents import create_agent
    agent = create_agent(ChatLogTokU(), tools=[search], middleware=[LogTokUMiddleware(policy=policy)])

Every model call of the agent is scored with the core :class:`~logtoku_guard.guard.Guard`'s
steps (``decide``, ``next_step``, ``retrieve``, ``give_up``, ``conclude``: the same policy,
statistics, records and payloads as :class:`~langchain_logtoku.LogTokUGuard`; nothing here counts
attempts or applies a rule), and routed inside ``wrap_model_call``:

- ``pass`` / ``warn``: the AIMessage goes on (``warn`` appends the policy's disclaimer);
- ``retrieve``: the model is called again (``handler(request.override(messages=...))``) with
  the retrieved passages in the last human turn, as often as ``guard.next_step`` allows; only
  the final answer enters the agent state;
- ``abstain``: the AIMessage is replaced by the abstention message, without tool calls (the
  agent loop ends);
- ``human_review``: the answer is queued in the store and replaced by the policy's
  pending-review message; ``after_model`` then ``interrupt()``s with a :class:`ReviewRequest`
  (a resume re-runs only that node, never the model). Resume with a :class:`ReviewResponse`
  (``Command(resume={"type": "approve" | "edit" | "reject", ...})``): approve restores the
  draft (with its tool calls), edit puts the reviewer's answer, reject the abstention message;
  needs a checkpointer;
- ``raise``: :class:`~logtoku_guard.errors.GuardRejectedError` out of the agent.

The decision (:class:`~langchain_logtoku._convert.GuardPayload`) goes into the private state
field ``logtoku_guard``, the AIMessage's ``response_metadata["logtoku_guard"]``, the
``logtoku_flagged`` custom event (any route but a plain first-time pass) and the tags
``logtoku:<action>`` (one per action of the route) / metadata ``logtoku.*``
(:func:`logtoku_guard.payloads.decision_attributes`) of the enclosing run in attached tracers.

Tool calls (the policy's ``tool_calls`` rules, :mod:`langchain_logtoku.tool_gate`): ``after_model``
decides each call of the answer from its per-argument scores (re-asking the model at once);
``wrap_tool_call`` refuses a call or interrupts before it runs for review (resume with a
:class:`~logtoku_guard.tool_gate.review.ToolReviewResponse`); other calls run.

Streaming: the model calls made inside the hook carry LangGraph's ``nostream`` tag, so in
``stream_mode="messages"`` no draft is streamed token by token; the final AIMessage reaches the
consumer whole when the model node ends (a withdrawn draft never does).

Scores come from :class:`~langchain_logtoku.ChatLogTokU` through the core capture channel, or
from any chat model whose answers carry ``response_metadata["logtoku"]["tokens"]`` with each
token's raw ``top_logits`` (re-scored with :func:`logtoku_guard.uncertainty.rescore`); a model
without them is refused with :class:`~logtoku_guard.errors.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, TypedDict, cast

from langchain.agents.middleware import AgentMiddleware, ExtendedModelResponse, ModelRequest, ModelResponse
from langchain.agents.middleware.types import PrivateStateAttr, ToolCallRequest, hook_config
from langchain_core.callbacks import dispatch_custom_event
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config, var_child_runnable_config
from langgraph.constants import CONFIG_KEY_CHECKPOINTER, TAG_NOSTREAM
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_logtoku._convert import GuardPayload
from langchain_logtoku.callbacks import FLAGGED_EVENT, annotate_tracer_runs
from langchain_logtoku.tool_gate import ToolGate, ToolGateState, ToolResult
from logtoku_guard.calibration import ModelProfile, load_profile_for
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.generation_capture import GenerationCapture, capture_generations
from logtoku_guard.guard import Conclude, Guard, RetrieverLike
from logtoku_guard.payloads import AttributeValue, DecisionPayload, decision_attributes, decision_payload, result_payload
from logtoku_guard.policy import Decision, Policy, default_policy
from logtoku_guard.results import Attempt, GuardRejectedError, GuardResult, GuardTimings
from logtoku_guard.types import Generation, TokenScore
from logtoku_guard.uncertainty import EvidenceMode, rescore

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from logtoku_guard.audit import AuditStore
    from logtoku_guard.backends.base import TokenStream

__all__ = ["LogTokUMiddleware", "LogTokUState", "ReviewRequest", "ReviewResponse"]


class ReviewRequest(TypedDict):
    """The ``interrupt()`` value of a ``human_review`` answer: what the reviewer needs to decide."""

    review_id: int | None
    trace_id: str
    question: str
    draft: str
    tool_calls: list[ToolCall]
    decision: DecisionPayload


class ReviewResponse(BaseModel):
    """The value to resume with: ``Command(resume={"type": "approve"})``, ``{"type": "edit",
    "answer": "..."}`` or ``{"type": "reject", "note": "why"}`` (``reviewer`` defaults to ``"reviewer"``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["approve", "edit", "reject"]
    answer: str | None = None
    reviewer: str = Field(default="reviewer", min_length=1)
    note: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> ReviewResponse:
        if self.type == "edit" and not (self.answer or "").strip():
            msg = "an edit needs the edited answer: {'type': 'edit', 'answer': '...'}"
            raise ValueError(msg)
        if self.type == "reject" and not (self.note or "").strip():
            msg = "a rejection needs a note saying why: {'type': 'reject', 'note': '...'}"
            raise ValueError(msg)
        return self


class _PendingReview(TypedDict):
    request: ReviewRequest
    message_id: str | None
    tool_calls: list[ToolCall]


class LogTokUState(ToolGateState):
    """The agent state with the middleware's private fields (not in the agent's input or output)."""

    logtoku_guard: NotRequired[Annotated[GuardPayload | None, PrivateStateAttr]]
    logtoku_review: NotRequired[Annotated[_PendingReview | None, PrivateStateAttr]]


@dataclasses.dataclass(frozen=True)
class _ScoredModel:
    """What the core guard needs to know of the agent's model (it never generates through it)."""

    model_name: str
    k: int
    evidence: EvidenceMode
    top_n: int

    def _refuse(self) -> Any:
        msg = "LogTokUMiddleware scores the agent's own model calls; the core guard does not generate here"
        raise UsageError(msg)

    def generate(self, prompt: Any, options: Any = None) -> Generation:
        return cast(Generation, self._refuse())

    def stream(self, prompt: Any, options: Any = None) -> TokenStream:
        return cast("TokenStream", self._refuse())

    def batch(self, prompts: Sequence[Any], options: Any = None) -> list[Generation]:
        return cast("list[Generation]", self._refuse())


def generation_from_metadata(message: AIMessage) -> Generation:
    """Rebuild the core generation of an answer from its ``response_metadata["logtoku"]``.

    AU/EU are recomputed from each token's stored ``top_logits`` with
    :func:`~logtoku_guard.uncertainty.rescore` (K and evidence mode from the summary).
    Raises :class:`~logtoku_guard.errors.ConfigurationError` when the metadata is missing.
    """
    found = message.response_metadata.get("logtoku")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    tokens = meta.get("tokens")
    if not isinstance(tokens, list) or any(not isinstance(t, dict) or "top_logits" not in t for t in tokens):
        msg = (
            "LogTokUMiddleware needs token scores, but the model's answer has no response_metadata['logtoku']['tokens'] "
            "with raw 'top_logits': use ChatLogTokU, or a chat model that writes LogTokU metadata "
            f"(got response_metadata keys {sorted(message.response_metadata)})"
        )
        raise ConfigurationError(msg)
    k, evidence = int(meta.get("k", 2)), cast(EvidenceMode, meta.get("evidence", "clamped"))
    rows = [[math.nan if z is None else float(z) for z in t["top_logits"]] for t in tokens]
    scored = rescore(rows, k=k, evidence=evidence) if rows else None
    out = []
    for i, t in enumerate(tokens):
        au = float(scored.au[i]) if scored is not None else math.nan
        eu = float(scored.eu[i]) if scored is not None else math.nan
        lp, ent = t.get("logprob"), t.get("entropy")
        out.append(
            TokenScore(
                index=int(t.get("index", i)),
                id=int(t.get("id", -1)),
                text=str(t.get("token", "")),
                top_logits=tuple(rows[i]),
                top_ids=(),
                au=au,
                eu=eu,
                logprob=math.nan if lp is None else float(lp),
                entropy=math.nan if ent is None else float(ent),
            )
        )
    finish = meta.get("finish_reason")
    return Generation(
        model=str(meta.get("model") or message.response_metadata.get("model_name") or "unknown"),
        prompt="",
        text=message.text,
        tokens=tuple(out),
        finish_reason=finish if finish in ("stop", "length", "cancelled") else "stop",
        k=k,
        evidence=evidence,
        top_n=int(meta.get("top_n", 10)),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
    )


def _ai_message(response: ModelResponse) -> AIMessage:
    for m in response.result:
        if isinstance(m, AIMessage):
            return m
    msg = f"the model call returned no AIMessage ({[type(m).__name__ for m in response.result]})"
    raise UsageError(msg)


def _as_response(result: Any) -> ModelResponse:
    if isinstance(result, AIMessage):
        return ModelResponse(result=[result])
    if isinstance(result, ExtendedModelResponse):
        return result.model_response
    return cast(ModelResponse, result)


def _question(messages: Sequence[BaseMessage]) -> tuple[int, str]:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return i, messages[i].text
    msg = "LogTokUMiddleware needs a human message in the request (the question to score and retrieve for)"
    raise UsageError(msg)


@contextmanager
def _no_stream() -> Iterator[None]:
    """Model calls made in this block carry the ``nostream`` tag (drafts stay off ``stream_mode="messages"``)."""
    config = ensure_config()
    token = var_child_runnable_config.set({**config, "tags": [*config.get("tags", []), TAG_NOSTREAM]})
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)


def _annotate_current_run(flat: dict[str, AttributeValue]) -> None:
    """Tag the enclosing run (the hook's, else the model node's) in every attached tracer."""
    from langchain_core.callbacks.base import BaseCallbackManager

    manager = ensure_config().get("callbacks")
    if not isinstance(manager, BaseCallbackManager) or manager.parent_run_id is None:
        return
    route = cast("list[str]", flat["logtoku.route"])
    annotate_tracer_runs(manager.handlers, manager.parent_run_id, [f"logtoku:{a}" for a in route], flat)


class _GuardedCall:
    """One guarded model call: each answer decided, then ``guard.next_step`` says what is next."""

    def __init__(self, middleware: LogTokUMiddleware, request: ModelRequest) -> None:
        self.mw = middleware
        self.request = request
        self.index, self.question = _question(request.messages)
        self.attempts: list[Attempt] = []
        self.responses: list[ModelResponse] = []
        self.guard: Guard | None = None
        self.decision: Decision | None = None
        self.passages: tuple[str, ...] = ()
        self.start = time.perf_counter()
        self.spent = {"generation": 0.0, "decision": 0.0, "retrieval": 0.0}

    @contextmanager
    def calling(self) -> Iterator[GenerationCapture]:
        t = time.perf_counter()
        with _no_stream(), capture_generations() as capture:
            yield capture
        self.spent["generation"] += time.perf_counter() - t

    def answered(self, result: Any, capture: GenerationCapture) -> ModelRequest | None:
        """Decide on one answer; the next request to make (a retrieval), or None when concluded."""
        t = time.perf_counter()
        response = _as_response(result)
        message = _ai_message(response)
        generation = capture.last or generation_from_metadata(message)
        guard = self.guard = self.guard or self.mw.core_guard(generation)
        self.responses.append(response)
        self.attempts.append(Attempt(generation, guard.decide(generation, self.attempts), self.passages))
        step = guard.next_step(self.attempts)
        self.spent["decision"] += time.perf_counter() - t
        if isinstance(step, Conclude):
            self.decision = step.decision
            return None
        t = time.perf_counter()
        passages, why = guard.retrieve(self.question)
        self.spent["retrieval"] += time.perf_counter() - t
        if why is not None:
            self.attempts[-1] = dataclasses.replace(self.attempts[-1], retrieval_error=why)
            self.decision = guard.give_up(step.decision, why)
            return None
        self.passages = tuple(passages)
        messages = list(self.request.messages)
        messages[self.index] = HumanMessage(content=step.prompt(self.question, passages))
        return self.request.override(messages=messages)

    def finish(self) -> ExtendedModelResponse:
        """Conclude with the core guard, record, report, and build the routed response."""
        guard, decision = self.guard, self.decision
        if guard is None or decision is None:
            msg = "internal error: a guarded model call finished before it was decided"
            raise UsageError(msg)
        if decision.action == "human_review":
            _require_checkpointer()
        s = self.spent
        timings = GuardTimings(time.perf_counter() - self.start, s["generation"], s["decision"], s["retrieval"])
        result = guard.conclude(self.question, decision, self.attempts, timings)
        payload = GuardPayload(
            **result_payload(result, guard.quadrants),
            question=self.question,
            passages=len(self.passages),
            recorded=guard.store is not None,
        )
        self.report(payload, decision_attributes(decision, self.attempts, result, guard.profile))
        if result.action == "raise":
            raise GuardRejectedError(result)
        response = self.responses[-1]
        draft = _ai_message(response)
        usage: UsageMetadata | None = None
        for r in self.responses:
            u = _ai_message(r).usage_metadata
            usage = u if usage is None else (add_usage(usage, u) if u is not None else usage)
        meta = {**draft.response_metadata, "logtoku_guard": payload}
        update: dict[str, Any] = {"logtoku_guard": payload, "logtoku_review": None}
        if result.action in ("pass", "warn"):
            message = draft.model_copy(update={"content": result.answer, "response_metadata": meta, "usage_metadata": usage})
            structured = response.structured_response
        else:  # abstain / human_review: no tool calls, the loop ends (or waits for the reviewer)
            message = AIMessage(content=result.answer, id=draft.id, response_metadata=meta, usage_metadata=usage)
            structured = None
            if result.action == "human_review":
                update["logtoku_review"] = _pending(result, self.question, draft)
        others = [m for m in response.result if m is not draft] if result.action in ("pass", "warn") else []
        routed = ModelResponse(result=[message, *others], structured_response=structured)
        return ExtendedModelResponse(model_response=routed, command=Command(update=update))

    def report(self, payload: GuardPayload, flat: dict[str, AttributeValue]) -> None:
        _annotate_current_run(flat)
        if payload["action"] == "pass" and payload["attempts"] == 1:
            return
        try:
            dispatch_custom_event(FLAGGED_EVENT, {**payload, **flat})
        except GraphBubbleUp:
            raise
        except RuntimeError as exc:  # no parent run (hook called outside a graph): nothing to attach to
            if "parent run" not in str(exc):
                raise


def _pending(result: GuardResult, question: str, draft: AIMessage) -> _PendingReview:
    request = ReviewRequest(
        review_id=result.review_id,
        trace_id=result.trace_id,
        question=question,
        draft=draft.text,
        tool_calls=list(draft.tool_calls),
        decision=decision_payload(result.decision),
    )
    return _PendingReview(request=request, message_id=draft.id, tool_calls=list(draft.tool_calls))


def _require_checkpointer() -> None:
    if ensure_config().get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER) is None:
        msg = (
            "the policy sent an answer to human review, which pauses the agent with interrupt(): "
            "create the agent with a checkpointer, e.g. create_agent(..., checkpointer=InMemorySaver()), "
            "and invoke it with config={'configurable': {'thread_id': ...}}"
        )
        raise ConfigurationError(msg)


class LogTokUMiddleware(AgentMiddleware[LogTokUState, Any]):
    """Score every model call of a LangChain agent with LogTokU and route it by the policy.

    Args:
        policy: a core :class:`~logtoku_guard.policy.Policy` (default: the quantile
            :func:`~logtoku_guard.policy.default_policy`, which needs the model's profile).
        retriever: for the ``retrieve`` route: a LangChain retriever (any Runnable from a query
            string to documents or strings), an object with ``.retrieve(query)`` or a callable.
            The query is the last human message.
        store: an :class:`~logtoku_guard.audit.AuditStore`: every decision is recorded, and
            ``human_review`` queues the answer there (required by a policy that can review).
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile`; when omitted and
            the policy has quantile thresholds, the saved profile of the model is loaded.
    """

    state_schema = LogTokUState

    def __init__(
        self,
        policy: Policy | None = None,
        retriever: Any = None,
        store: AuditStore | None = None,
        profile: ModelProfile | None = None,
    ) -> None:
        super().__init__()
        self.policy = policy or default_policy()
        r = retriever
        if r is not None and not (isinstance(r, Runnable) or callable(r) or hasattr(r, "retrieve")):
            msg = (
                f"retriever must be a LangChain retriever/Runnable, an object with .retrieve(query) or a callable, got {r!r:.80}"
            )
            raise ConfigurationError(msg)
        self.retriever: RetrieverLike | None = r.invoke if isinstance(r, Runnable) else r
        self.store = store
        self.profile = profile
        if "human_review" in self.policy.actions() and store is None:
            msg = f"policy {self.policy.name!r} can send answers to human review, which needs store=AuditStore(...)"
            raise ConfigurationError(msg)
        self._profiles: dict[tuple[str, int, str], ModelProfile | None] = {}
        q = self.policy.quadrants
        self.tool_gate = ToolGate(
            self.policy, store, profile.quadrant_thresholds(q.au_quantile, q.eu_quantile) if profile else None
        )

    def core_guard(self, generation: Generation) -> Guard:
        """The core guard for the model that made ``generation`` (its name, K, evidence and top-N)."""
        model = _ScoredModel(generation.model, generation.k, generation.evidence, generation.top_n)
        profile = self.profile
        if profile is None and self.policy.uses_quantiles():
            key = (model.model_name, model.k, model.evidence)
            if key not in self._profiles:
                self._profiles[key] = load_profile_for(*key)
            profile = self._profiles[key]
        return Guard(model, self.policy, retriever=self.retriever, store=self.store, profile=profile)

    # -- wrap_model_call: score, retrieve, route -------------------------------------------------
    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ExtendedModelResponse:
        call = _GuardedCall(self, request)
        next_request: ModelRequest | None = request
        while next_request is not None:
            with call.calling() as capture:
                result = handler(next_request)
            next_request = call.answered(result, capture)
        return call.finish()

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ExtendedModelResponse:
        call = _GuardedCall(self, request)
        next_request: ModelRequest | None = request
        while next_request is not None:
            with call.calling() as capture:
                result = await handler(next_request)
            next_request = await asyncio.to_thread(call.answered, result, capture)  # a retriever may block
        return call.finish()

    # -- after_model: the human-review interrupt, else the tool-call gate ----------------------------
    @hook_config(can_jump_to=["model"])
    def after_model(self, state: LogTokUState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        pending = state.get("logtoku_review")
        if not pending:
            return self.tool_gate.after_model(cast("dict[str, Any]", state))
        # the reviewer saw the answer's tool calls (ReviewRequest.tool_calls): they are not gated again
        verdict = ReviewResponse.model_validate(interrupt(pending["request"]))
        return self._reviewed(state, pending, verdict)

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: LogTokUState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.after_model(state, runtime)

    # -- wrap_tool_call: the policy's tool_calls rules, before each tool runs ------------------------
    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        return self.tool_gate.wrap_tool_call(request, handler)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        return await self.tool_gate.awrap_tool_call(request, handler)

    def _reviewed(self, state: LogTokUState, pending: _PendingReview, verdict: ReviewResponse) -> dict[str, Any]:
        request = pending["request"]
        review_id = request["review_id"]
        if self.store is not None and review_id is not None:
            if verdict.type == "reject":
                self.store.reject(review_id, verdict.reviewer, note=verdict.note or "")
            else:
                self.store.approve(review_id, verdict.reviewer, edited_answer=verdict.answer, note=verdict.note)
        last = next((m for m in reversed(state["messages"]) if m.id == pending["message_id"]), None)
        meta = {**(last.response_metadata if last is not None else {}), "logtoku_review": verdict.model_dump()}
        tool_calls: list[ToolCall] = []
        if verdict.type == "approve":
            content, tool_calls = request["draft"], pending["tool_calls"]
        elif verdict.type == "edit":
            content = verdict.answer or ""
        else:
            content = self.policy.abstain.message
        reviewed = AIMessage(id=pending["message_id"], content=content, tool_calls=tool_calls, response_metadata=meta)
        return {"messages": [reviewed], "logtoku_review": None}
