"""``LogTokUQueryEngine``: a retrieval query engine that knows when to say "I don't know".

It wraps a retriever query engine (``index.as_query_engine(...)``) and runs the core
:class:`~logtoku_guard.decision.policy.Policy` on the LogTokU scores of the answer it synthesised::

    retrieve -> synthesise (LogTokULLM, scores captured) -> decide -> act -> record -> event

Actions (from the policy): ``pass``; ``warn`` (adds the disclaimer); ``retrieve`` (re-query with
more context: a copy of the retriever with a larger ``similarity_top_k``, or the
``retry_query_engines`` you give, as many times as the policy allows,
then the ``retrieve.fallback`` action; a re-query that brings no new node falls back at once);
``abstain``; ``human_review`` (queued in the :class:`~logtoku_guard.audit.AuditStore`); ``raise``
(:class:`~logtoku_guard.decision.results.GuardRejectedError`).

The loop itself (how many re-queries, the fallback and its reason, the record, the ``early_stop``
watch and ``stopped_early``, live or held drafts, the spans of every answer and re-query) is the
core's: its one driver (:class:`logtoku_guard.guard.driver.Driver`, built by the guard's call with
the query's GUARDRAIL span) runs :func:`~logtoku_guard.guard.guard_steps.guard_steps`, and this engine
only retrieves the first answer's context, then hands the driver its generate and retrieve
(:mod:`._engine_io`: every synthesis, the first included, at the driver's ``Generate`` request;
re-query engines, events). What those answers are (the checks on a synthesised answer, the
engine of each re-query, "no new context") is written once, without I/O, in :mod:`._route`.

The scores come through :func:`logtoku_guard.guard.generation_capture.capture_generations`, because the
synthesiser calls ``llm.predict()``/``llm.stream()``, which return plain strings.

Every decision is dispatched as a :class:`~llama_index.llms.logtoku.events.LogTokUDecisionEvent`
(with the route: each attempt's action and rule) and the spans opened to act on it are tagged
with the flat decision attributes of :func:`logtoku_guard.wire.payloads.decision_attributes`
(``logtoku.action``, ``logtoku.rule``, ``logtoku.attempts``, ``logtoku.route``, ...).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Generator, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal, cast

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.dispatcher import active_instrument_tags, instrument_tags
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle

from logtoku_guard.decision.policy import Decision, Policy
from logtoku_guard.decision.results import GuardResult
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.driver import Driver, Watch, raise_for_action
from logtoku_guard.guard.generation_capture import GenerationCapture, capture_generations, captured_aiter, captured_iter
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.guard_steps import Answer, Generate, Retrieve, Retrieved
from logtoku_guard.wire.payloads import decision_attributes

from ._engine_io import AsyncEngineIO, EngineIO, alive, live, streams
from ._responses import (
    QueryRun as _Run,
)
from ._responses import (
    async_iter,
    empty_async,
    policy_uses_quantiles,
    resolve_llm,
    sync_iter,
    traced_query,
    wider_engines,
)
from ._route import NO_ENGINE, Synthesis, answer_of, engine_for, retrieved
from .base import LogTokULLM
from .events import LogTokUDecisionEvent, query_payload
from .withheld import WithheldCapture

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.calibration import ModelProfile

dispatcher = get_dispatcher(__name__)

StreamMode = Literal["live", "after_decision"]


class LogTokUQueryEngine(BaseQueryEngine):
    """Guard a retrieval query engine with LogTokU uncertainty and a core policy.

    Args:
        query_engine: a retriever query engine (what ``index.as_query_engine(llm=LogTokULLM(...))``
            returns): it must offer ``retrieve()`` and ``synthesize()``. Or pass ``retriever``.
        retriever: build ``RetrieverQueryEngine.from_args(retriever, llm=llm, streaming=streaming)``.
        llm: the :class:`LogTokULLM` the engine's synthesiser uses (default ``Settings.llm``);
            its backend names the model the profile must match.
        policy, profile, store: as for :class:`~logtoku_guard.guard.guard.Guard` (default policy:
            quantiles of the model's profile; when ``profile`` is None and the policy needs one,
            the saved profile of the model is loaded, as ``logtoku-guard ask`` does).
        retry_query_engines: the engines used for re-queries (attempt ``i`` uses item
            ``min(i, len) - 1``). Default: copies of the engine whose retriever's
            ``similarity_top_k`` grows by ``retry_top_k_step`` (default
            ``policy.retrieve.passages``) per attempt; none when the retriever has no
            ``similarity_top_k`` (then ``retrieve`` falls back at once).
        stream_mode: for a streaming engine: ``"live"`` streams the first answer's tokens as
            they are generated (an ``early_stop`` rule can cut generation short); when the
            decision changes the answer, the stream goes on with ``"\\n\\n"`` and the change
            (the disclaimer, the re-queried answer, or the abstain/review message).
            ``"after_decision"`` streams nothing until the decision is made, then the final
            answer; the LLM is not asked to stream meanwhile, so no stream or instrumentation
            event (``LLMChatInProgressEvent``...) shows a draft the guard withdraws (an
            ``early_stop`` rule still stops its generation). ``"live"`` shows the first draft by
            design. Either way ``metadata["logtoku"]["answer"]`` is the guarded answer; in
            ``"live"`` mode the metadata and final ``source_nodes`` are filled in once the stream
            has been read to the end; a ``"live"`` stream closed before its end has its answer
            so far decided and recorded (no retrieval), as the core guard's streams do.
        tracer_provider: OpenTelemetry ``TracerProvider`` for the guard's spans (default: the global one).

    The returned response's ``metadata["logtoku"]`` holds the decision (action, rule, reason,
    checks, statistics, per-token scores, trace and review ids, attempts with their source
    nodes); ``metadata["logtoku_result"]`` the typed :class:`~logtoku_guard.guard.guard.GuardResult`;
    ``source_nodes`` the nodes of the final attempt.
    """

    def __init__(
        self,
        query_engine: BaseQueryEngine | None = None,
        *,
        retriever: BaseRetriever | None = None,
        llm: LogTokULLM | None = None,
        policy: Policy | None = None,
        profile: ModelProfile | None = None,
        store: AuditStore | None = None,
        retry_query_engines: Sequence[BaseQueryEngine] | None = None,
        retry_top_k_step: int | None = None,
        streaming: bool = False,
        stream_mode: StreamMode = "live",
        callback_manager: CallbackManager | None = None,
        tracer_provider: Any = None,
    ) -> None:
        llm = resolve_llm(llm)
        if (query_engine is None) == (retriever is None):
            msg = "pass either query_engine=index.as_query_engine(...) or retriever=index.as_retriever(...), not both or neither"
            raise ConfigurationError(msg)
        if query_engine is None:
            from llama_index.core.query_engine import RetrieverQueryEngine

            query_engine = RetrieverQueryEngine.from_args(cast(BaseRetriever, retriever), llm=llm, streaming=streaming)
        if type(query_engine).retrieve is BaseQueryEngine.retrieve or type(query_engine).synthesize is BaseQueryEngine.synthesize:
            msg = (
                f"{type(query_engine).__name__} has no retrieve()/synthesize(), which the guard needs to re-query and score; "
                "wrap index.as_query_engine(...) (a RetrieverQueryEngine) or pass retriever=..."
            )
            raise ConfigurationError(msg)
        if stream_mode not in ("live", "after_decision"):
            msg = f"stream_mode must be 'live' or 'after_decision', got {stream_mode!r}"
            raise ConfigurationError(msg)
        if retry_top_k_step is not None and (
            isinstance(retry_top_k_step, bool) or not isinstance(retry_top_k_step, int) or retry_top_k_step < 1
        ):
            msg = f"retry_top_k_step must be a positive integer, got {retry_top_k_step!r}"
            raise ConfigurationError(msg)
        self._llm = llm
        wanted: ModelProfile | Literal["auto"] | None = "auto" if profile is None and policy_uses_quantiles(policy) else profile
        self._guard = Guard(
            llm.backend, policy, store=store, profile=wanted, tracer_provider=tracer_provider, cache_dir=llm.cache_dir
        )
        self._engine = query_engine
        step, count = retry_top_k_step or self.policy.retrieve.passages, self._guard.decider.retrievals_allowed
        self._retries = list(retry_query_engines) if retry_query_engines is not None else wider_engines(query_engine, step, count)
        self._stream_mode: StreamMode = stream_mode
        super().__init__(callback_manager=callback_manager or getattr(query_engine, "callback_manager", None))

    @classmethod
    def from_index(
        cls,
        index: Any,
        *,
        llm: LogTokULLM | None = None,
        similarity_top_k: int = 2,
        streaming: bool = False,
        **kwargs: Any,
    ) -> LogTokUQueryEngine:
        """Guard ``index.as_query_engine(llm=llm, similarity_top_k=..., streaming=...)``."""
        llm = resolve_llm(llm)
        engine = index.as_query_engine(llm=llm, similarity_top_k=similarity_top_k, streaming=streaming)
        return cls(engine, llm=llm, **kwargs)

    # -- public properties ----------------------------------------------------------------
    @property
    def guard(self) -> Guard:
        """The core guard whose policy, profile and store this engine uses."""
        return self._guard

    @property
    def policy(self) -> Policy:
        return self._guard.policy

    @property
    def query_engine(self) -> BaseQueryEngine:
        return self._engine

    @property
    def retry_query_engines(self) -> list[BaseQueryEngine]:
        return list(self._retries)

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self._engine}

    # -- query ----------------------------------------------------------------------------
    def _start(self, query_bundle: QueryBundle) -> tuple[_Run, Driver]:
        """The query's run state and its driver (the guard's decider and top-N, the query's GUARDRAIL span)."""
        run = _Run(query_bundle.query_str)
        return run, self._guard.call().driver(run.span, query_bundle.query_str)

    def _retrieved_first(self, run: _Run, nodes: list[NodeWithScore]) -> None:
        """The engine's first retrieval, made before the loop (the first answer is synthesised from
        ``nodes``): retrieval 0 of the query's span, its seconds counted as retrieval."""
        run.progress.spent_before("retrieval", time.perf_counter() - run.progress.started)
        run.answer_nodes = nodes

    def _answer(self, run: _Run, text: str) -> Answer:
        """The loop's answer for the answer being made (``run.answer``), read as ``text``."""
        return answer_of(self._guard.backend.model_name, run, run.answer_nodes, run.answer, text)

    @dispatcher.span
    @traced_query
    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        run, driver = self._start(query_bundle)
        with run.span.retrieval(0) as r:
            nodes = list(self._engine.retrieve(query_bundle))
            r.record(nodes)
        self._retrieved_first(run, nodes)
        io = EngineIO(self, run, query_bundle)
        if self._stream_mode == "after_decision":
            return self._whole(run, self._act(run, driver.drive(run.progress, io)), asynchronous=False)
        pieces: Generator[str, None, GuardResult] = driver.drive_live(run.progress, io, live="all")
        next(pieces)  # SYNTHESISED: the first answer's synthesis is made, nothing of it read yet
        if streams(run):
            out = StreamingResponse(response_gen=sync_iter([]), source_nodes=list(nodes), metadata={})
            out.response_gen = live(self, run, pieces, out)
            return out
        for _ in pieces:  # the whole answers: nothing streams
            pass
        return self._whole(run, self._act(run, cast(GuardResult, driver.result)), asynchronous=False)

    @dispatcher.span
    @traced_query
    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        run, driver = self._start(query_bundle)
        with run.span.retrieval(0) as r:
            nodes = list(await self._engine.aretrieve(query_bundle))  # type: ignore[attr-defined]
            r.record(nodes)
        self._retrieved_first(run, nodes)
        io = AsyncEngineIO(self, run, query_bundle)
        if self._stream_mode == "after_decision":
            return self._whole(run, self._act(run, await driver.adrive(run.progress, io)), asynchronous=True)
        pieces: AsyncGenerator[str, None] = driver.adrive_live(run.progress, io, live="all")
        await pieces.__anext__()  # SYNTHESISED
        if streams(run):
            out = AsyncStreamingResponse(response_gen=empty_async(), source_nodes=list(nodes), metadata={})
            out.response_gen = alive(self, run, driver, pieces, out)
            return out
        async for _ in pieces:
            pass
        return self._whole(run, self._act(run, cast(GuardResult, driver.result)), asynchronous=True)

    @staticmethod
    def _whole(run: _Run, result: GuardResult, *, asynchronous: bool) -> RESPONSE_TYPE:
        """The final answer whole: a :class:`Response`, or one piece of a stream when the engine streams
        (``stream_mode="after_decision"``)."""
        if not streams(run):
            return Response(result.answer, source_nodes=run.nodes[-1], metadata=run.metadata)
        nodes, metadata = run.nodes[-1], run.metadata
        if asynchronous:
            return AsyncStreamingResponse(response_gen=async_iter([result.answer]), source_nodes=nodes, metadata=metadata)
        return StreamingResponse(response_gen=sync_iter([result.answer]), source_nodes=nodes, metadata=metadata)

    # -- the I/O the loop asks for (see _route.py) -----------------------------------------
    def _source(self, run: _Run, request: Generate) -> tuple[BaseQueryEngine, ContextManager[Any]]:
        """The engine that synthesises ``request``'s answer (the re-query's for a later one) and the
        instrumentation tags it runs under (a re-queried answer: those of the decision that asked for it)."""
        if request.first:
            return self._engine, nullcontext()
        engine = engine_for(self._retries, request.attempt - 1)
        if engine is None:  # pragma: no cover - the loop asks for a later answer only after a re-query found context
            msg = f"internal error: no re-query engine for attempt {request.attempt}"
            raise ConfigurationError(msg)
        return engine, instrument_tags(self._tags(run, run.attempts[-1].decision))

    def _synthesize(self, run: _Run, request: Generate, watch: Watch, query_bundle: QueryBundle) -> Synthesis:
        """The answer ``request`` asks for, synthesised from ``run.answer_nodes``, its LLM call reporting
        to the driver's ``watch`` (read later; a streaming one lazily)."""
        engine, tags = self._source(run, request)
        with tags, capture_generations(self._new_capture(watch)) as capture:  # read by the LLM when called
            response = engine.synthesize(query_bundle, run.answer_nodes)
        if isinstance(response, StreamingResponse) and response.response_gen is not None:
            response.response_gen = captured_iter(response.response_gen, capture)  # the LLM stream starts lazily
        run.answer = Synthesis(capture, response)
        return run.answer

    async def _asynthesize(self, run: _Run, request: Generate, watch: Watch, query_bundle: QueryBundle) -> Synthesis:
        engine, tags = self._source(run, request)
        with tags, capture_generations(self._new_capture(watch)) as capture:
            response = await engine.asynthesize(query_bundle, run.answer_nodes)
        if isinstance(response, AsyncStreamingResponse) and response.response_gen is not None:
            response.response_gen = captured_aiter(response.response_gen, capture)
        elif isinstance(response, StreamingResponse) and response.response_gen is not None:
            response.response_gen = captured_iter(response.response_gen, capture)
        run.answer = Synthesis(capture, response)
        return run.answer

    def _new_capture(self, watch: Watch) -> GenerationCapture:
        """The capture of one synthesis, reporting to the driver's ``early_stop`` ``watch``; after_decision:
        a :class:`WithheldCapture` (the LLM answers whole, no in-progress events)."""
        return WithheldCapture(watch=watch) if self._stream_mode == "after_decision" else GenerationCapture(watch=watch)

    def _tags(self, run: _Run, decision: Decision) -> dict[str, Any]:
        return {**active_instrument_tags.get(), **decision_attributes(decision, run.attempts, profile=self._guard.profile)}

    def _requery(self, run: _Run, request: Retrieve, query_bundle: QueryBundle) -> Retrieved:
        """Announce the re-query's decision and run it under its tags; what it found."""
        engine = engine_for(self._retries, request.number)
        if engine is None:
            return Retrieved(why=NO_ENGINE)
        with instrument_tags(self._tags(run, request.decision)):
            self._emit(run, request.decision, final=False)
            return self._retry(run, engine, query_bundle)

    @dispatcher.span
    def _retry(self, run: _Run, engine: BaseQueryEngine, query_bundle: QueryBundle) -> Retrieved:
        """The re-query span: the wider engine's retrieval (the loop then asks for the answer from what it found)."""
        return self._found(run, list(engine.retrieve(query_bundle)))

    async def _arequery(self, run: _Run, request: Retrieve, query_bundle: QueryBundle) -> Retrieved:
        engine = engine_for(self._retries, request.number)
        if engine is None:
            return Retrieved(why=NO_ENGINE)
        with instrument_tags(self._tags(run, request.decision)):
            self._emit(run, request.decision, final=False)
            return await self._aretry(run, engine, query_bundle)

    @dispatcher.span
    async def _aretry(self, run: _Run, engine: BaseQueryEngine, query_bundle: QueryBundle) -> Retrieved:
        return self._found(run, list(await engine.aretrieve(query_bundle)))  # type: ignore[attr-defined]

    @staticmethod
    def _found(run: _Run, nodes: list[NodeWithScore]) -> Retrieved:
        found = retrieved(run, nodes)
        if found.why is None:
            run.answer_nodes = nodes  # the next answer is synthesised from them
        return found

    def _act(self, run: _Run, result: GuardResult) -> GuardResult:
        with instrument_tags(self._tags(run, result.decision)):
            return self._apply(run, result)

    @dispatcher.span
    def _apply(self, run: _Run, result: GuardResult) -> GuardResult:
        """Announce the concluded (and recorded) result in a span tagged with its decision."""
        run.span.end()  # the driver put the decision on it
        payload = query_payload(result, self._guard.quadrants, run.nodes)
        run.metadata = {**run.metadata, "logtoku": payload, "logtoku_result": result}
        self._emit(run, result.decision, final=True, result=result)
        return raise_for_action(result)

    def _emit(self, run: _Run, decision: Decision, *, final: bool, result: GuardResult | None = None) -> None:
        nodes, early = run.nodes[-1], run.progress.stopped_early
        event = LogTokUDecisionEvent.of(
            run.query, decision, run.attempts, nodes, self.policy, final=final, stopped_early=early, result=result
        )
        dispatcher.event(event)
