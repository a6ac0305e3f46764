"""``LogTokUGuard``: the core :class:`~logtoku_guard.guard.guard.Guard` as a LangChain Runnable.

The policy, the statistics and the actions are the core's; this module only feeds the core
guard from LangChain inputs and makes every step a traced run:

- each generation is made from the core messages by the :class:`~langchain_logtoku.ChatLogTokU`'s
  core backend and traced as a child chat-model run of that model (with the guard's callbacks,
  tags and metadata, tagged ``logtoku:draft``); a draft the guard may withdraw is never streamed
  to callbacks (``nostream``, no token reported: see :mod:`langchain_logtoku._traced`), except
  the first attempt's tokens in ``stream_mode="retract"``;
- the ``retrieve`` route calls the LangChain retriever with the child config (a child
  retriever run);
- the guard's own run gets the decision as its output (``response_metadata["logtoku_guard"]``)
  and, for every route other than a plain pass, the custom event ``logtoku_flagged``.

Tags and metadata of a run are fixed when it starts, before the decision exists. So the
decision travels in the output and in the custom event; in addition, tracers attached to the
run (LangSmith's ``LangChainTracer`` or any ``BaseTracer``) get a tag ``logtoku:<action>`` for
every action of the route (``logtoku:retrieve`` and ``logtoku:pass`` when retrieval rescued the
answer) and the flat ``logtoku.*`` metadata of :func:`logtoku_guard.wire.payloads.decision_attributes`
(``logtoku.action``, ``logtoku.rule``, ``logtoku.route``, ``logtoku.rules``, ...) added to the
guard's run before it ends, so the run can be filtered by them once it is posted. These are new
tag lists and dicts: the ones other handlers received when the run started are not changed.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from langchain_core.callbacks import CallbackManagerForChainRun, dispatch_custom_event
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, convert_to_messages
from langchain_core.messages.ai import UsageMetadata
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field, PrivateAttr, SkipValidation, model_validator

from langchain_logtoku import _convert
from langchain_logtoku._convert import GuardPayload, LangChainRetriever
from langchain_logtoku._traced import TracedBackend
from langchain_logtoku.callbacks import FLAGGED_EVENT, RETRACTED_EVENT, annotate_tracer_runs
from langchain_logtoku.chat_models import ChatLogTokU
from logtoku_guard.audit import RecordSink
from logtoku_guard.calibration import ModelProfile
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.decision.results import GuardRejectedError, GuardResult
from logtoku_guard.errors import ConfigurationError, InvalidPromptError
from logtoku_guard.guard.guard import Guard, GuardCall
from logtoku_guard.guard.retriever_calls import RetrieverLike
from logtoku_guard.scoring.quadrants import QuadrantThresholds
from logtoku_guard.types import ChatMessage as CoreMessage
from logtoku_guard.types import question_of
from logtoku_guard.wire.payloads import AttributeValue, decision_attributes, result_payload, token_payload

StreamMode = Literal["buffer", "retract"]


@dataclass(frozen=True)
class _Prompt:
    messages: list[CoreMessage]
    question: str | None  # the bare question, when the input named it (dict input)


def _passages(context: Any) -> list[str]:
    items = [context] if isinstance(context, (str, BaseMessage)) or not isinstance(context, Sequence) else list(context)
    out = []
    for item in items:
        for attr in ("page_content", "text", "content"):
            value = getattr(item, attr, None)
            if isinstance(value, str):
                out.append(value)
                break
        else:
            if not isinstance(item, str):
                msg = f"context items must be strings or Documents, got {type(item).__name__}: {item!r:.80}"
                raise InvalidPromptError(msg)
            out.append(item)
    return [p for p in out if p.strip()]


class LogTokUGuard(RunnableSerializable[Any, AIMessage]):
    """Answer with a :class:`ChatLogTokU`, then pass, warn, retrieve, abstain, ask a human or raise.

    ``LogTokUGuard(llm=ChatLogTokU(), policy=Policy.from_file("policy.yaml"), retriever=...,
    store=AuditStore("audit.db"))`` composes with ``|``: ``prompt | guard``,
    ``{"context": retriever, "question": RunnablePassthrough()} | prompt | guard``.

    Args:
        llm: the chat model (its backend, decoding fields and calibration are used).
        policy: a core :class:`~logtoku_guard.decision.policy.Policy` (default: the quantile
            :func:`~logtoku_guard.decision.policy.default_policy`, which needs a profile).
        retriever: for the ``retrieve`` route: any LangChain ``BaseRetriever`` (or Runnable
            from a query string to documents or strings), traced as a child run; or a core
            retriever (``.retrieve(query)`` or a callable).
        store: a core :class:`~logtoku_guard.audit.AuditStore`: every decision is recorded and
            ``human_review`` answers wait in its queue.
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile` for quantile
            thresholds; ``"auto"`` (default) loads the saved profile of the model, if any.
        stream_mode: ``"buffer"`` (default): ``stream()`` yields the answer once decided, as
            one chunk, and no event exposes a draft to stream consumers (``astream_events``
            has no ``on_chat_model_stream`` for it, LangGraph ``stream_mode="messages"`` never
            sends it); ``early_stop`` rules still stop generating as soon as they fire, with
            nothing shown. ``"retract"``: tokens are streamed as generated; when the decision
            withdraws them (abstain, review, a regenerated answer, raise) the custom event
            ``logtoku_retracted`` fires and the last chunk carries the replacement answer,
            so discard what was shown on that event (the aggregated stream then holds both;
            ``response_metadata["logtoku_guard"]["answer"]`` is always the final answer). The
            tokens shown before an ``early_stop`` abstention lands are retracted the same way;
            answers regenerated after retrieval are never streamed.
        system: a system message put before every prompt that has none.
        tracer_provider: an OpenTelemetry ``TracerProvider`` for the core guard's spans (default:
            the global one when OpenTelemetry is installed; see :mod:`logtoku_guard.guard.telemetry`).

    Input: a string, a list of messages, a ``PromptValue`` or a dict with ``"question"`` and
    optionally ``"context"`` (documents or strings, e.g. from a retriever step; they are put
    into the policy's ``retrieve.context_template``). With a dict the retrieval query is the
    bare question; otherwise it is the last human message. Output: an ``AIMessage`` whose
    ``response_metadata`` holds the final generation's ``logtoku`` scores and the decision
    under ``"logtoku_guard"``: a :class:`~langchain_logtoku._convert.GuardPayload`, the core
    :class:`~logtoku_guard.wire.payloads.ResultPayload` (action, route (each attempt's own decision),
    rule, reason, reliability, attempts, review_id, trace_id, checks, stats, stopped_early,
    policy ``{name, version}``, model, answer, draft (the model's last answer), tokens, timings)
    plus question, passages and recorded. Keyword arguments of
    ``invoke``/``stream`` (``max_tokens=``, ``temperature=``...) go to every chat-model call.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    llm: ChatLogTokU
    policy: Policy = Field(default_factory=default_policy)
    retriever: SkipValidation[LangChainRetriever | None] = None  # checked by _validate
    store: SkipValidation[RecordSink | None] = None  # an AuditStore (validating it would import sqlalchemy)
    profile: ModelProfile | Literal["auto"] | None = "auto"
    stream_mode: StreamMode = "buffer"
    system: str | None = None
    tracer_provider: Any = None

    _guard: Guard = PrivateAttr()

    @model_validator(mode="after")
    def _validate(self) -> LogTokUGuard:
        r = self.retriever
        if r is not None and not (isinstance(r, Runnable) or callable(r) or hasattr(r, "retrieve")):
            msg = (
                f"retriever must be a LangChain retriever/Runnable, an object with .retrieve(query) or a callable, got {r!r:.80}"
            )
            raise ConfigurationError(msg)
        # built and checked once (policy, profile, store, decider, telemetry); each call only binds its I/O
        self._guard = Guard(
            TracedBackend(self.llm, {}, {}),
            self.policy,
            store=self.store,
            profile=self.profile,  # "auto" is resolved there, once
            system=self.system,
            tracer_provider=self.tracer_provider,
            cache_dir=self.llm.cache_dir,
        )
        return self

    # -- building the core guard -------------------------------------------------------------
    def resolved_profile(self) -> ModelProfile | None:
        """The profile in use (``"auto"`` resolved once, when the guard was built: the saved profile of the model, or None)."""
        return self._guard.profile

    def _core_guard(self, backend: TracedBackend, config: RunnableConfig, question: str | None) -> GuardCall:
        """The guard built at validation, bound to this call's traced backend and retriever."""
        return self._guard.call(backend=backend, retriever=self._retriever(config, question))

    def _retriever(self, config: RunnableConfig, question: str | None) -> RetrieverLike | None:
        r = self.retriever
        if r is None:
            return None
        if isinstance(r, Runnable):
            return lambda query: r.invoke(question or query, config=config)
        if question is None:
            return r
        fn = r.retrieve if hasattr(r, "retrieve") else r
        return lambda _query: fn(question)

    def _prompt(self, value: Any) -> _Prompt:
        if isinstance(value, Mapping):
            question = value.get("question")
            if not isinstance(question, str):
                msg = f"a dict input needs a 'question' string (and optionally 'context'), got keys {sorted(value)}"
                raise InvalidPromptError(msg)
            passages = _passages(value["context"]) if value.get("context") is not None else []
            if not passages:
                return _Prompt([CoreMessage("user", question)], question)
            text = self.policy.retrieve.prompt(question, passages)
            return _Prompt([CoreMessage("user", text)], question)
        if isinstance(value, str):
            return _Prompt([CoreMessage("user", value)], None)
        if isinstance(value, PromptValue):
            messages = value.to_messages()
        elif isinstance(value, BaseMessage):
            messages = [value]
        elif isinstance(value, Sequence):
            messages = convert_to_messages(value)
        else:
            msg = (
                f"LogTokUGuard takes a string, a list of messages, a PromptValue or a dict with 'question', "
                f"got {type(value).__name__}"
            )
            raise InvalidPromptError(msg)
        return _Prompt(_convert.to_core_messages(messages), None)

    # -- the decision ----------------------------------------------------------------------------
    def _decision(self, result: GuardResult, prompt: _Prompt, thresholds: QuadrantThresholds | None) -> GuardPayload:
        question = prompt.question or question_of(prompt.messages)
        return GuardPayload(
            **result_payload(result, thresholds),
            question=question,
            passages=len(result.attempts[-1].passages),
            recorded=self.store is not None,
        )

    def _attributes(self, result: GuardResult) -> dict[str, AttributeValue]:
        return decision_attributes(result.decision, result.attempts, result, self.resolved_profile())

    def _report(
        self,
        result: GuardResult,
        prompt: _Prompt,
        backend: TracedBackend,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AIMessage:
        """Annotate the run, fire ``logtoku_flagged`` when not a plain pass, and build the answer."""
        decision = self._decision(result, prompt, self.llm.quadrant_thresholds())
        flat = self._attributes(result)
        route = cast("list[str]", flat["logtoku.route"])
        annotate_tracer_runs(run_manager.handlers, run_manager.run_id, [f"logtoku:{a}" for a in route], flat)
        if route != ["pass"]:
            dispatch_custom_event(FLAGGED_EVENT, {**decision, **flat}, config=config)
        n_in = sum(g.prompt_tokens for g in backend.generations)
        n_out = sum(len(g.tokens) for g in backend.generations)
        metadata = self.llm.response_metadata_for(result.generation, **backend.llm_kwargs)
        return AIMessage(
            content=result.answer,
            response_metadata={**metadata, "logtoku_guard": decision},
            usage_metadata=UsageMetadata(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out),
        )

    # -- Runnable --------------------------------------------------------------------------------
    @property
    def OutputType(self) -> type[AIMessage]:
        return AIMessage

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        return self._call_with_config(self._invoke, input, config, **kwargs)

    def _invoke(self, value: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig, **kwargs: Any) -> AIMessage:
        prompt = self._prompt(value)
        backend = TracedBackend(self.llm, config, kwargs)
        guard = self._core_guard(backend, config, prompt.question)
        try:
            result = self._held(guard, prompt)
        except GuardRejectedError as exc:
            self._report(exc.result, prompt, backend, run_manager, config)
            raise
        return self._report(result, prompt, backend, run_manager, config)

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        chunks = self._transform_stream_with_config(iter([input]), self._stream, config, **kwargs)
        yield from cast("Iterator[AIMessageChunk]", chunks)  # closing this stream closes the run's

    def transform(self, input: Iterator[Any], config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        chunks = self._transform_stream_with_config(input, self._stream, config, **kwargs)
        yield from cast("Iterator[AIMessageChunk]", chunks)  # closing this stream closes the run's

    async def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """:meth:`stream` in worker threads (generation is CPU/GPU bound and synchronous)."""
        iterator: Any = self.stream(input, config, **kwargs)
        done = object()
        try:
            while True:
                chunk = await run_in_executor(config, next, iterator, done)
                if chunk is done:
                    break
                yield cast("AIMessageChunk", chunk)
        finally:
            iterator.close()

    async def atransform(
        self,
        input: AsyncIterator[Any],
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        items = [item async for item in input]
        async for chunk in self.astream(_join(items), config, **kwargs):
            yield chunk

    def _stream(
        self,
        values: Iterator[Any],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        prompt = self._prompt(_join(list(values)))
        retract = self.stream_mode == "retract"
        backend = TracedBackend(self.llm, config, kwargs, live=retract)
        guard = self._core_guard(backend, config, prompt.question)
        thresholds = self.llm.quadrant_thresholds() if retract else None
        streamed: list[str] = []
        try:
            if retract:
                guarded = guard.stream(prompt.messages)
                for token in guarded:
                    streamed.append(token.text)
                    item = token_payload(token, thresholds)
                    yield AIMessageChunk(content=token.text, response_metadata={"logtoku": {"tokens": [item]}})
                result = guarded.result
            else:
                result = self._held(guard, prompt)
        except GuardRejectedError as exc:
            message = self._report(exc.result, prompt, backend, run_manager, config)
            if retract and streamed:
                self._retracted(message, self._attributes(exc.result), "".join(streamed), config)
            raise
        message = self._report(result, prompt, backend, run_manager, config)
        if not retract:
            yield AIMessageChunk(
                content=message.content,
                response_metadata=message.response_metadata,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
            return
        text = "".join(streamed)
        answer = str(message.content)
        if answer.startswith(text):  # passed (or a disclaimer appended): nothing to withdraw
            tail, retracted = answer[len(text) :], False
        else:
            tail, retracted = answer, True
            self._retracted(message, self._attributes(result), text, config)
        meta = dict(message.response_metadata)
        meta["logtoku"] = {k: v for k, v in meta["logtoku"].items() if k != "tokens"}  # tokens came per chunk
        meta.pop("logprobs", None)
        decided: GuardPayload = meta["logtoku_guard"]
        meta["logtoku_guard"] = GuardPayload(**decided, retracted=retracted)
        yield AIMessageChunk(content=tail, response_metadata=meta, usage_metadata=message.usage_metadata, chunk_position="last")

    @staticmethod
    def _held(guard: GuardCall, prompt: _Prompt) -> GuardResult:
        """``invoke`` and buffer mode: the core guard's run over a held :class:`TracedBackend` (drafts never
        streamed to callbacks; an ``early_stop`` rule still stops a generation as soon as it fires)."""
        return guard.run(prompt.messages)

    @staticmethod
    def _retracted(message: AIMessage, flat: Mapping[str, AttributeValue], text: str, config: RunnableConfig) -> None:
        decision: GuardPayload = message.response_metadata["logtoku_guard"]
        dispatch_custom_event(RETRACTED_EVENT, {**decision, **flat, "retracted_text": text}, config=config)


def _join(items: list[Any]) -> Any:
    """The whole input of a transform: the chunks added up (the last one when they cannot be)."""
    if not items:
        msg = "LogTokUGuard got no input"
        raise InvalidPromptError(msg)
    try:
        return functools.reduce(operator.add, items)
    except TypeError:
        return items[-1]
