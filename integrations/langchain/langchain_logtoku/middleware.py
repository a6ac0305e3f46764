"""``LogTokUMiddleware``: the core guard as LangChain v1 agent middleware (``create_agent``).

::

    from langchain.agents import create_agent
    agent = create_agent(ChatLogTokU(), tools=[search], middleware=[LogTokUMiddleware(policy=policy)])

Every model call of the agent drives the core guard loop
(:func:`~logtoku_guard.guard.guard_steps.guard_steps` with a :class:`~logtoku_guard.decision.decider.Decider`:
the same policy, statistics, records and payloads as :class:`~langchain_logtoku.LogTokUGuard`;
nothing here counts attempts or applies a rule): the loop's ``Generate`` requests are answered
by the agent's own model call (``handler``), its ``Retrieve`` requests by the retriever. The
answer is routed inside ``wrap_model_call``:

- ``pass`` / ``warn``: the AIMessage goes on (``warn`` appends the policy's disclaimer);
- ``retrieve``: the model is called again (``handler(request.override(messages=...))``) with
  the retrieved passages in the last human turn, as often as the policy allows; only
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
(:func:`logtoku_guard.wire.payloads.decision_attributes`) of the enclosing run in attached tracers.

Tool calls (the policy's ``tool_calls`` rules, :mod:`langchain_logtoku.tool_gate`): ``after_model``
decides each call of the answer from its per-argument scores (re-asking the model at once);
``wrap_tool_call`` refuses a call or interrupts before it runs for review (resume with a
:class:`~logtoku_guard.decision.tool_gate.call_review.ToolReviewResponse`); other calls run.

Streaming: the model calls made inside the hook carry LangGraph's ``nostream`` tag, so in
``stream_mode="messages"`` no draft is streamed token by token; the final AIMessage reaches the
consumer whole when the model node ends (a withdrawn draft never does).

Scores come from :class:`~langchain_logtoku.ChatLogTokU` through the core capture channel, or
from any chat model whose answers carry ``response_metadata["logtoku"]["tokens"]`` with each
token's raw ``top_logits`` (re-scored with :func:`logtoku_guard.scoring.uncertainty.rescore`); a model
without them is refused with :class:`~logtoku_guard.errors.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
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

from langchain_logtoku._convert import GuardPayload, LangChainRetriever
from langchain_logtoku._metadata_scores import generation_from_metadata
from langchain_logtoku.callbacks import FLAGGED_EVENT, annotate_tracer_runs
from langchain_logtoku.chat_models import ChatLogTokU
from langchain_logtoku.tool_gate import ToolGate, ToolGateState, ToolResult
from logtoku_guard.calibration import ModelProfile, load_profile_for
from logtoku_guard.decision.decider import Decider, require_review_store
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.results import GuardResult
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.guard.driver import Driver, Watch, raise_for_action
from logtoku_guard.guard.generation_capture import GenerationCapture, capture_generations
from logtoku_guard.guard.guard_io import retrieve_passages
from logtoku_guard.guard.guard_steps import Answer, Generate, Retrieve, Retrieved
from logtoku_guard.guard.retriever_calls import RetrieverLike
from logtoku_guard.scoring.uncertainty import EvidenceMode
from logtoku_guard.types import Generation
from logtoku_guard.wire.payloads import AttributeValue, DecisionPayload, decision_attributes, decision_payload, result_payload

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from logtoku_guard.audit import AuditStore, ReviewItem
    from logtoku_guard.audit.records import AuditRecord

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
    """One guarded model call: the core guard loop, whose ``Generate`` requests the agent's model
    answers (the first with the request as it came, later ones with the retrieved context in
    the last human turn) and whose ``Retrieve`` requests the middleware's retriever answers."""

    def __init__(self, middleware: LogTokUMiddleware, request: ModelRequest) -> None:
        self.mw = middleware
        self.request = request
        self.index, self.question = _question(request.messages)
        self.responses: list[ModelResponse] = []
        self.decider: Decider | None = None

    def driver(self, known: tuple[Decider, int] | None) -> Driver:
        """The driver of this call: with the decider and top-N known before the model answers
        (:meth:`LogTokUMiddleware.decider_before`), else picking the decider of the first answer's
        model. No span: the agent traces its model calls."""
        if known is None:
            return Driver(self.pick)
        self.decider = known[0]
        return Driver(known[0], top_n=known[1])

    def pick(self, generation: Generation) -> Decider:
        """The decider of the model that made the first answer (built once per model by the middleware)."""
        self.decider = self.mw.decider_for(generation)
        return self.decider

    @contextmanager
    def calling(self, watch: Watch) -> Iterator[GenerationCapture]:
        with _no_stream(), capture_generations(GenerationCapture(watch=watch)) as capture:
            yield capture

    def request_for(self, step: Generate) -> ModelRequest:
        """The model request that answers ``step``."""
        if step.first:
            return self.request
        messages = list(self.request.messages)
        messages[self.index] = HumanMessage(content=step.prompt())
        return self.request.override(messages=messages)

    def answered(self, step: Generate, result: Any, capture: GenerationCapture) -> Answer:
        """The model's answer to ``step``, scored. The first answer's model has its decider built here
        (a profile may load: the async path runs this in a worker thread), before the driver picks it."""
        response = _as_response(result)
        generation = capture.last or generation_from_metadata(_ai_message(response))
        if self.decider is None:
            self.mw.decider_for(generation)
        self.responses.append(response)
        return Answer(generation, step.passages)

    def retrieve(self, step: Retrieve) -> Retrieved:
        return retrieve_passages(self.mw.retriever, step, self.mw.policy.retrieve)

    def finish(self, result: GuardResult) -> ExtendedModelResponse:
        """Report the concluded result and build the routed response."""
        decider = cast(Decider, self.decider)
        payload = GuardPayload(
            **result_payload(result, decider.quadrants),
            question=self.question,
            passages=len(result.attempts[-1].passages),
            recorded=self.mw.store is not None,
        )
        self.report(payload, decision_attributes(result.decision, result.attempts, result, decider.profile))
        raise_for_action(result)
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


@dataclasses.dataclass(frozen=True)
class _ModelCalls:
    """The loop's requests answered by the agent's model (``handler``) and the retriever."""

    call: _GuardedCall
    handler: Callable[[ModelRequest], ModelResponse]

    def generate(self, step: Generate, watch: Watch) -> Answer:
        with self.call.calling(watch) as capture:
            result = self.handler(self.call.request_for(step))
        return self.call.answered(step, result, capture)

    def retrieve(self, step: Retrieve) -> Retrieved:
        return self.call.retrieve(step)


@dataclasses.dataclass(frozen=True)
class _AsyncModelCalls:
    """:class:`_ModelCalls` for ``awrap_model_call`` (scoring and retrieval in worker threads: they may block)."""

    call: _GuardedCall
    handler: Callable[[ModelRequest], Awaitable[ModelResponse]]

    async def generate(self, step: Generate, watch: Watch) -> Answer:
        with self.call.calling(watch) as capture:
            result = await self.handler(self.call.request_for(step))
        return await asyncio.to_thread(self.call.answered, step, result, capture)  # may load a profile

    async def retrieve(self, step: Retrieve) -> Retrieved:
        return await asyncio.to_thread(self.call.retrieve, step)


@dataclasses.dataclass(frozen=True)
class _CheckpointedStore:
    """The store, refusing to queue a review the agent cannot pause for (no checkpointer): checked
    before anything is written."""

    store: AuditStore

    def record(self, rec: AuditRecord) -> str:
        return self.store.record(rec)

    def record_for_review(self, rec: AuditRecord) -> ReviewItem:
        _require_checkpointer()
        return self.store.record_for_review(rec)


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
        policy: a core :class:`~logtoku_guard.decision.policy.Policy` (default: the quantile
            :func:`~logtoku_guard.decision.policy.default_policy`, which needs the model's profile).
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
        retriever: LangChainRetriever | None = None,
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
        require_review_store(self.policy, store)
        self._deciders: dict[tuple[str, int, str], Decider] = {}
        self._lock = threading.Lock()
        q = self.policy.quadrants
        self.tool_gate = ToolGate(
            self.policy, store, profile.quadrant_thresholds(q.au_quantile, q.eu_quantile) if profile else None
        )

    def decider_for(self, generation: Generation) -> Decider:
        """The decider for the model that made ``generation``."""
        return self.decider_of(generation.model, generation.k, generation.evidence)

    def decider_of(self, model: str, k: int, evidence: EvidenceMode) -> Decider:
        """The decider for ``model`` scored with top-``k`` ``evidence`` (the profile, given or the
        model's saved one, checked against the model name, K and evidence): built once per model
        and kept, every later call of that model reuses it."""
        key = (model, k, evidence)
        with self._lock:
            decider = self._deciders.get(key)
            if decider is None:
                decider = self._deciders[key] = self._build_decider(model, k, evidence)
            return decider

    def _build_decider(self, model: str, k: int, evidence: EvidenceMode) -> Decider:
        profile = self.profile
        if profile is None and self.policy.uses_quantiles():
            profile = load_profile_for(model, k, evidence)
        if profile is not None:
            profile.check_matches(model, k, evidence)
        store = _CheckpointedStore(self.store) if self.store is not None else None
        return Decider(self.policy, profile, store=store)

    def decider_before(self, request: ModelRequest) -> tuple[Decider, int] | None:
        """The decider and top-N for the request's model before it answers, when the policy has
        ``early_stop`` rules and the model says which it is (a :class:`ChatLogTokU`): then the
        first answer is watched too. Otherwise None: the first answer's model makes the decider
        (a model that reports scores only with its finished message cannot be stopped early)."""
        model = request.model
        if not any(r.early_stop for r in self.policy.rules) or not isinstance(model, ChatLogTokU):
            return None
        evidence = cast("EvidenceMode", model.scoring_evidence)
        return self.decider_of(model.model_name, model.scoring_k, evidence), model.core_backend.top_n

    # -- wrap_model_call: score, retrieve, route -------------------------------------------------
    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ExtendedModelResponse:
        call = _GuardedCall(self, request)
        driver = call.driver(self.decider_before(request))
        return call.finish(driver.drive(call.question, _ModelCalls(call, handler)))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ExtendedModelResponse:
        call = _GuardedCall(self, request)
        driver = call.driver(await asyncio.to_thread(self.decider_before, request))  # may load a profile or the model
        return call.finish(await driver.adrive(call.question, _AsyncModelCalls(call, handler)))

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
