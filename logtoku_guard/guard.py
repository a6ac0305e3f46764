"""The one orchestrator: generate -> score -> decide -> act -> record.

``Guard(backend, policy, retriever=..., store=...)`` answers a question and decides, from the
answer's own token uncertainties, whether to pass it, pass it with a disclaimer, retrieve
context and regenerate, abstain, send it to a human, or raise. Framework-free: the LangChain
and LlamaIndex adapters are thin layers over this class.

The guard loop is written once, here, as public steps that every adapter drives::

    decision = guard.decide(generation, attempts)   # the policy on one attempt ("after retrieval: ...")
    step = guard.next_step(attempts)                # Conclude(decision) or Retrieve(decision, number)
    passages, why = guard.retrieve(question)        # the configured retriever, errors recorded
    decision = guard.give_up(step.decision, why)    # the retrieve fallback, with the reason
    result = guard.conclude(question, decision, attempts, timings)
    guard.early_stop(tokens_so_far)                 # while streaming: the early-stop rule that fired

How many retrievals are left is decided only by :meth:`Guard.next_step` (at most
``policy.retrieve.max_attempts``, then ``retrieve.fallback``).

Hardening: the retriever runs in a daemon worker thread and is given up after
``policy.retrieve.timeout_s`` (the stuck thread is abandoned, not killed: Python cannot stop
a thread); a retrieved context too long for the model's window is trimmed passage by passage
(then the fallback), and recorded; a :class:`GuardStream` closed or dropped before its end
records what was generated (``finish_reason`` ``"cancelled"``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, PromptTooLongError, UsageError
from logtoku_guard.guard_score import with_guard_score
from logtoku_guard.guard_stream import GuardStream
from logtoku_guard.policy import Decision, Policy, RetrieveSettings, default_policy
from logtoku_guard.results import Attempt, GuardRejectedError, GuardResult, GuardTimings
from logtoku_guard.retriever_calls import Retriever, RetrieverLike, call_retriever
from logtoku_guard.stats import ResponseStats
from logtoku_guard.telemetry import GuardTelemetry, RunSpan
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, Prompt, TokenScore, to_messages

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.calibration import ModelProfile

__all__ = [
    "Attempt",
    "Conclude",
    "Guard",
    "GuardRejectedError",
    "GuardResult",
    "GuardStream",
    "GuardTimings",
    "Retrieve",
    "Retriever",
    "RetrieverLike",
    "Step",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Conclude:
    """The loop is over: act on ``decision`` (pass it to :meth:`Guard.conclude`)."""

    decision: Decision


@dataclass(frozen=True)
class Retrieve:
    """Retrieve context and answer again; this is retrieval number ``number`` (1 = the first).

    ``decision``: the decision that asked for it (give it to :meth:`Guard.give_up` when the
    retrieval brings nothing). :meth:`prompt` builds the retrieval-augmented user turn.
    """

    decision: Decision
    number: int
    settings: RetrieveSettings

    def prompt(self, question: str, passages: Sequence[str]) -> str:
        """The augmented user turn: the policy's ``retrieve.context_template`` filled in."""
        return self.settings.prompt(question, passages)


Step = Conclude | Retrieve
"""What :meth:`Guard.next_step` says to do after the attempts so far."""


@dataclass
class _Clock:
    """Seconds spent per stage of one guarded question."""

    start: float = field(default_factory=time.perf_counter)
    generation_s: float = 0.0
    decision_s: float = 0.0
    retrieval_s: float = 0.0

    def timings(self) -> GuardTimings:
        return GuardTimings(time.perf_counter() - self.start, self.generation_s, self.decision_s, self.retrieval_s)


class Guard:
    """Answer, score, decide, act and record.

    Args:
        backend: any :class:`~logtoku_guard.backends.base.Backend`.
        policy: a :class:`Policy` (default: :func:`default_policy`, which needs a profile).
        retriever: for the ``retrieve`` action: ``retrieve(query)`` or a callable returning
            passages (strings, or objects with ``.text``/``.page_content``).
        store: an :class:`~logtoku_guard.audit.AuditStore` (any
            :class:`~logtoku_guard.audit.records.RecordSink`); every decision is recorded there,
            and ``human_review`` needs it.
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile`, needed for
            quantile thresholds and quadrant shares.
        options: decoding options for every generation.
        system: a system message for every generation.
        tracer_provider: OpenTelemetry spans of every decision go there (default: the global
            provider, when OpenTelemetry is installed); or pass ``telemetry=GuardTelemetry(...)``.
    """

    def __init__(
        self,
        backend: Backend,
        policy: Policy | None = None,
        *,
        retriever: RetrieverLike | None = None,
        store: RecordSink | None = None,
        profile: ModelProfile | None = None,
        options: DecodingOptions | None = None,
        system: str | None = None,
        tracer_provider: Any = None,
        telemetry: GuardTelemetry | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy or default_policy()
        self.retriever = retriever
        self.store = store
        self.profile = profile
        self.options = options or DecodingOptions(max_new_tokens=128)
        self.system = system
        if self.policy.uses_quantiles() and profile is None:
            msg = (
                f"policy {self.policy.name!r} uses quantile thresholds, which need the model's profile; "
                "pass profile=calibrate(...) or load one with load_profile_for(model)"
            )
            raise ConfigurationError(msg)
        if profile is not None:
            profile.check_matches(backend.model_name, backend.k, self.backend_evidence())
        self.policy.check_profile(profile)
        shares = sorted(self.policy.stats_used() & {"quadrant_i_share", "quadrant_ii_share", "unreliable_share"})
        if shares and profile is None:
            msg = (
                f"policy {self.policy.name!r} reads {shares}, which need quadrant thresholds from the model's profile; "
                "pass profile=calibrate(...) or load one with load_profile_for(model)"
            )
            raise ConfigurationError(msg)
        if "human_review" in self.policy.actions() and store is None:
            msg = f"policy {self.policy.name!r} can send answers to human review, which needs store=AuditStore(...)"
            raise ConfigurationError(msg)
        self.quadrants = (
            profile.quadrant_thresholds(self.policy.quadrants.au_quantile, self.policy.quadrants.eu_quantile)
            if profile is not None
            else None
        )
        self._watch = any(r.early_stop for r in self.policy.rules)
        self.telemetry = telemetry if telemetry is not None else GuardTelemetry(tracer_provider)

    # -- public API ---------------------------------------------------------------------------
    def run(self, prompt: Prompt) -> GuardResult:
        """Answer ``prompt`` and apply the policy (raises :class:`GuardRejectedError` for ``raise``)."""
        messages = to_messages(prompt, self.system)
        clock = _Clock()
        with self.telemetry.start_run(self, messages) as span:
            t = time.perf_counter()
            with span.generation(1, messages) as g:
                generation = g.record(self.backend.generate(messages, self.options))
            clock.generation_s += time.perf_counter() - t
            return self._finish(messages, generation, clock, stopped_early=False, span=span)

    async def arun(self, prompt: Prompt) -> GuardResult:
        """:meth:`run` in a worker thread (generation is CPU/GPU bound)."""
        return await asyncio.to_thread(self.run, prompt)

    def stream(self, prompt: Prompt) -> GuardStream:
        """Stream the first attempt's tokens while watching ``early_stop`` rules.

        When such a rule fires on the prefix, generation stops at once (the result says
        ``stopped_early``) and the policy acts on what was generated. The decision, any
        retrieval and the record are made when the stream ends: read ``.result``.
        """
        return GuardStream(self, to_messages(prompt, self.system))

    def finish(
        self,
        messages: Sequence[ChatMessage],
        generation: Generation,
        *,
        stopped_early: bool = False,
        started: float | None = None,
        generation_s: float = 0.0,
        span: RunSpan | None = None,
    ) -> GuardResult:
        """Apply the policy to a first answer already generated for ``messages``.

        Decides, retrieves and regenerates as the policy says, acts and records, as :meth:`run`
        does after its first generation (raises :class:`GuardRejectedError` for ``raise``).
        ``started``: when the question arrived (``time.perf_counter()``; default now);
        ``generation_s``: the seconds the first generation took; ``span``: the run's telemetry
        span, when the caller started it (:meth:`GuardTelemetry.start_run`; ended here).
        """
        clock = _Clock() if started is None else _Clock(start=started)
        clock.generation_s = generation_s
        with span if span is not None else self.telemetry.start_run(self, messages) as run_span:
            return self._finish(list(messages), generation, clock, stopped_early=stopped_early, span=run_span)

    def abandon(
        self,
        messages: Sequence[ChatMessage],
        generation: Generation,
        *,
        started: float,
        generation_s: float,
        attempts: Sequence[Attempt] = (),
    ) -> GuardResult:
        """Decide and record an answer whose stream the caller closed before it ended, after ``attempts``
        (no retrieval; the reason says the stream was closed; never raises for ``raise``)."""
        decision = self.decide(generation, attempts)
        why = f"stream closed by the caller before it ended ({len(generation.tokens)} token(s), {generation.finish_reason})"
        if decision.action == "retrieve":
            decision = self.give_up(decision, f"{why}: no retrieval")
        else:
            decision = replace(decision, reason=f"{why}; {decision.reason}")
        question = [m.content for m in messages if m.role == "user"][-1]
        timings = GuardTimings(time.perf_counter() - started, generation_s, 0.0, 0.0)
        return self.conclude(question, decision, [*attempts, Attempt(generation, decision)], timings, stopped_early=True)

    def backend_top_n(self) -> int:
        """The backend's ``top_n`` (tokens averaged into the response reliability)."""
        return self.backend.top_n

    def backend_evidence(self) -> str:
        """The backend's evidence mode (``"clamped"`` or ``"raw"``)."""
        return self.backend.evidence

    @property
    def retrievals_allowed(self) -> int:
        """How many retrievals the policy allows per question (adapters may prepare that many)."""
        return self.policy.retrieve.max_attempts

    @property
    def watches_early_stop(self) -> bool:
        """True when the policy has ``early_stop`` rules (streams are worth watching)."""
        return self._watch

    # -- the steps of the guard loop (every adapter drives these) -----------------------------
    def decide(self, generation: Generation, attempts: Sequence[Attempt] = ()) -> Decision:
        """The policy's decision on one generation (no action, no record).

        ``attempts``: the attempts made before this one; when there are any (this answer was
        made with retrieved context) a decision that does not ask for more retrieval says so:
        its reason starts with ``"after retrieval: "``.
        """
        stats = with_guard_score(
            ResponseStats.from_generation(generation, self.quadrants, self.policy.first_tokens), self.profile, generation
        )
        decision = self.policy.decide(stats, self.profile)
        if attempts and decision.action != "retrieve":
            decision = replace(decision, reason=f"after retrieval: {decision.reason}")
        return decision

    def next_step(self, attempts: Sequence[Attempt]) -> Step:
        """What to do after ``attempts`` (the first answer, then one per retrieval), the last decided.

        :class:`Conclude` when the last decision is not ``retrieve``, or when
        ``policy.retrieve.max_attempts`` retrievals were made already (then the decision is
        the ``retrieve.fallback`` action, "still uncertain after N retrieval attempt(s): ...");
        else :class:`Retrieve`, numbered from 1.
        """
        if not attempts:
            msg = "next_step needs at least the first attempt: decide on the first answer first"
            raise UsageError(msg)
        decision = attempts[-1].decision
        if decision.action != "retrieve":
            return Conclude(decision)
        settings = self.policy.retrieve
        done = len(attempts) - 1
        if done >= settings.max_attempts:
            why = f"still uncertain after {settings.max_attempts} retrieval attempt(s): {decision.reason}"
            return Conclude(replace(decision, action=settings.fallback, reason=why))
        return Retrieve(decision, done + 1, settings)

    def give_up(self, decision: Decision, why: str) -> Decision:
        """The ``retrieve.fallback`` decision when retrieval cannot help (``why``: no passages, an error...)."""
        return replace(decision, action=self.policy.retrieve.fallback, reason=f"{decision.reason}; {why}")

    def unanswerable(self, generation: Generation, why: str) -> Decision:
        """The ``retrieve.fallback`` decision, without a rule, for an answer made with nothing to answer from."""
        stats = with_guard_score(
            ResponseStats.from_generation(generation, self.quadrants, self.policy.first_tokens), self.profile, generation
        )
        base = self.policy.decide(stats, self.profile)
        return replace(base, action=self.policy.retrieve.fallback, rule=None, reason=why)

    def early_stop(self, tokens: Sequence[TokenScore]) -> Decision | None:
        """The decision of the ``early_stop`` rule that fires on this token prefix, or None.

        Such rules cannot un-fire as the answer grows, so a streaming caller may stop
        generating at once. None at once when the policy has no ``early_stop`` rule.
        """
        if not self._watch or not tokens:
            return None
        stats = ResponseStats.from_tokens(tokens, self.backend_top_n(), self.quadrants, self.policy.first_tokens)
        decision = self.policy.decide(stats, self.profile, only_early_stop=True)
        return decision if decision.rule is not None else None

    def retrieve(self, question: str) -> tuple[list[str], str | None]:
        """Passages for ``question`` from the configured retriever (at most ``retrieve.passages``).

        Returns ``(passages, None)``, or ``([], why)`` when there is nothing: no retriever, an
        empty result, or the retriever's exception (logged and recorded, never swallowed silently).
        """
        if self.retriever is None:
            return [], "no retriever configured"
        return call_retriever(self.retriever, question, self.policy.retrieve.timeout_s, self.policy.retrieve.passages)

    def answer_with_context(
        self, messages: Sequence[ChatMessage], step: Retrieve, question: str, passages: Sequence[str]
    ) -> tuple[Generation | None, tuple[str, ...], str | None]:
        """Generate with the retrieved ``passages``; when the prompt is too long for the model's
        window (:class:`PromptTooLongError`), drop the last passage and try again.

        Returns ``(generation, passages used, note)``: ``note`` says how the context was
        trimmed ("context too long for the model's window: ..."); ``generation`` is None when
        not even one passage fits (then ``note`` is the reason to give up).
        """
        kept = list(passages)
        error: PromptTooLongError | None = None
        while kept:
            augmented = [*messages[:-1], ChatMessage("user", step.prompt(question, kept))]
            try:
                generation = self.backend.generate(augmented, self.options)
            except PromptTooLongError as exc:
                error = exc
                kept.pop()
                continue
            note = None
            if error is not None:
                note = f"context too long for the model's window: kept {len(kept)} of {len(passages)} passage(s) ({error})"
            return generation, tuple(kept), note
        return None, (), f"context too long for the model's window: {error}"

    # -- the loop ------------------------------------------------------------------------------
    def _finish(
        self, messages: list[ChatMessage], generation: Generation, clock: _Clock, *, stopped_early: bool, span: RunSpan
    ) -> GuardResult:
        question = [m.content for m in messages if m.role == "user"][-1]
        t = time.perf_counter()
        attempts = [Attempt(generation, self.decide(generation))]
        clock.decision_s += time.perf_counter() - t
        while True:
            step = self.next_step(attempts)
            if isinstance(step, Conclude):
                decision = step.decision
                break
            t = time.perf_counter()
            with span.retrieval(step.number) as r:
                passages, why = self.retrieve(question)
                r.record(passages, why)
            clock.retrieval_s += time.perf_counter() - t
            if why is not None:
                attempts[-1] = replace(attempts[-1], retrieval_error=why)
                decision = self.give_up(step.decision, why)
                break
            t = time.perf_counter()
            with span.generation(len(attempts) + 1, messages) as g:
                generation_or_none, used, note = self.answer_with_context(messages, step, question, passages)
                if generation_or_none is not None:
                    g.record(generation_or_none)
            clock.generation_s += time.perf_counter() - t
            if generation_or_none is None:
                why = note or "context too long for the model's window"
                attempts[-1] = replace(attempts[-1], retrieval_error=why)
                decision = self.give_up(step.decision, why)
                break
            t = time.perf_counter()
            attempts.append(Attempt(generation_or_none, self.decide(generation_or_none, attempts), used, note))
            clock.decision_s += time.perf_counter() - t
        result = self.conclude(question, decision, attempts, clock.timings(), stopped_early=stopped_early)
        span.concluded(result)
        if result.action == "raise":
            raise GuardRejectedError(result)
        return result

    def conclude(
        self,
        question: str,
        decision: Decision,
        attempts: Sequence[Attempt],
        timings: GuardTimings,
        *,
        stopped_early: bool = False,
        text: str | None = None,
    ) -> GuardResult:
        """Turn a final decision into the answer to return, and record it in the store.

        The one place where actions become answers: adapters that run their own
        generate/retrieve loop (LlamaIndex query engines) call it too. ``text`` overrides the
        last generation's text as the draft answer. Never raises for the ``raise`` action:
        the caller does, once it has emitted its own events.
        """
        draft = attempts[-1].generation.text if text is None else text
        action = decision.action
        if action in ("pass", "raise"):
            answer = draft
        elif action == "warn":
            answer = f"{draft}\n\n{self.policy.warn.disclaimer}"
        elif action == "abstain":
            answer = self.policy.abstain.message
        else:  # human_review: message completed once the review id is known
            answer = self.policy.human_review.message
        result = GuardResult(
            answer=answer,
            action=action,
            decision=decision,
            attempts=tuple(attempts),
            trace_id=uuid.uuid4().hex,
            timings=timings,
            stopped_early=stopped_early,
            policy_name=self.policy.name,
            policy_version=self.policy.version,
        )
        if self.store is not None:
            result = self._record(self.store, question, draft, result)
        return result

    def _record(self, store: RecordSink, question: str, draft: str, result: GuardResult) -> GuardResult:
        from logtoku_guard.audit.records import AuditRecord  # no SQLAlchemy import

        record = AuditRecord.from_result(result, question=question, thresholds=self.quadrants, draft=draft)
        if result.action == "human_review":
            item = store.record_for_review(record)
            return replace(result, review_id=item.id, answer=result.answer.format(review_id=item.id))
        store.record(record)
        return result
