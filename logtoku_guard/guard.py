"""The one orchestrator: generate -> score -> decide -> act -> record.

``Guard(backend, policy, retriever=..., store=...)`` answers a question and decides, from the
answer's own token uncertainties, whether to pass it, pass it with a disclaimer, retrieve
context and regenerate, abstain, send it to a human, or raise. Framework-free: the LangChain
and LlamaIndex adapters are thin layers over this class.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, LogTokUError
from logtoku_guard.policy import ActionName, Decision, Policy, default_policy
from logtoku_guard.stats import ResponseStats
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, Prompt, TokenScore, to_messages
from logtoku_guard.uncertainty import DEFAULT_TOP_N, QuadrantThresholds

logger = logging.getLogger(__name__)


@runtime_checkable
class Retriever(Protocol):
    """Anything with ``retrieve(query) -> passages``; a plain callable works too."""

    def retrieve(self, query: str) -> Sequence[Any]: ...


RetrieverLike = Retriever | Callable[[str], Sequence[Any]]


class GuardRejectedError(LogTokUError):
    """Raised by the ``raise`` action; carries the full :class:`GuardResult`."""

    def __init__(self, result: GuardResult) -> None:
        self.result = result
        d = result.decision
        super().__init__(f"the guard rejected the answer (rule {d.rule!r}): {d.reason}")


@dataclass(frozen=True)
class Attempt:
    """One generation the guard made, with its decision and the context it was given."""

    generation: Generation
    decision: Decision
    passages: tuple[str, ...] = ()
    retrieval_error: str | None = None


@dataclass(frozen=True)
class GuardTimings:
    total_s: float
    generation_s: float
    decision_s: float
    retrieval_s: float


@dataclass(frozen=True)
class GuardResult:
    """The answer to return and everything that led to it."""

    answer: str
    action: ActionName
    decision: Decision
    attempts: tuple[Attempt, ...]
    trace_id: str
    timings: GuardTimings
    review_id: int | None = None
    stopped_early: bool = False
    policy_name: str = ""
    policy_version: str = ""

    @property
    def generation(self) -> Generation:
        """The generation the final decision was made on."""
        return self.attempts[-1].generation

    @property
    def reliability(self) -> float:
        return self.generation.score.reliability

    def to_dict(self, thresholds: QuadrantThresholds | None = None) -> dict[str, Any]:
        g = self.generation
        return {
            "answer": self.answer,
            "action": self.action,
            "reason": self.decision.reason,
            "rule": self.decision.rule,
            "reliability": g.to_dict()["reliability"],
            "attempts": len(self.attempts),
            "review_id": self.review_id,
            "trace_id": self.trace_id,
            "stopped_early": self.stopped_early,
            "model": g.model,
            "policy": {"name": self.policy_name, "version": self.policy_version},
            "checks": [c.__dict__ for c in self.decision.checks],
            "stats": self.decision.stats.as_dict(),
            "tokens": [t.to_dict(thresholds) for t in g.tokens],
            "timings": self.timings.__dict__,
        }


def _passage_text(p: Any) -> str:
    for attr in ("page_content", "text", "content"):
        value = getattr(p, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(p, str):
        return p
    msg = f"a retriever returned {type(p).__name__} ({p!r:.80}); return strings or objects with .text / .page_content"
    raise ConfigurationError(msg)


class Guard:
    """Answer, score, decide, act and record.

    Args:
        backend: any :class:`~logtoku_guard.backends.base.Backend`.
        policy: a :class:`Policy` (default: :func:`default_policy`, which needs a profile).
        retriever: for the ``retrieve`` action: ``retrieve(query)`` or a callable returning
            passages (strings, or objects with ``.text``/``.page_content``).
        store: an :class:`~logtoku_guard.audit.AuditStore`; every decision is recorded there,
            and ``human_review`` needs it.
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile`, needed for
            quantile thresholds and quadrant shares.
        options: decoding options for every generation.
        system: a system message for every generation.
    """

    def __init__(
        self,
        backend: Backend,
        policy: Policy | None = None,
        *,
        retriever: RetrieverLike | None = None,
        store: Any = None,
        profile: Any = None,
        options: DecodingOptions | None = None,
        system: str | None = None,
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
            profile.check_matches(backend.model_name, backend.k, getattr(backend, "evidence", "clamped"))
        if "human_review" in self.policy.actions() and store is None:
            msg = f"policy {self.policy.name!r} can send answers to human review, which needs store=AuditStore(...)"
            raise ConfigurationError(msg)
        self.quadrants = (
            profile.quadrant_thresholds(self.policy.quadrants.au_quantile, self.policy.quadrants.eu_quantile)
            if profile is not None
            else None
        )

    # -- public API ---------------------------------------------------------------------------
    def run(self, prompt: Prompt) -> GuardResult:
        """Answer ``prompt`` and apply the policy (raises :class:`GuardRejectedError` for ``raise``)."""
        messages = to_messages(prompt, self.system)
        start = time.perf_counter()
        t0 = time.perf_counter()
        generation = self.backend.generate(messages, self.options)
        return self._finish(messages, generation, start, time.perf_counter() - t0, stopped_early=False)

    async def arun(self, prompt: Prompt) -> GuardResult:
        """:meth:`run` in a worker thread (generation is CPU/GPU bound)."""
        return await asyncio.to_thread(self.run, prompt)

    def stream(self, prompt: Prompt) -> GuardStream:
        """Stream the first attempt's tokens while watching ``early_stop`` rules.

        When such a rule fires on the prefix, generation stops at once (the result says
        ``stopped_early``) and the policy acts on what was generated. The decision, any
        retrieval and the record are made when the stream ends: read ``.result``.
        """
        messages = to_messages(prompt, self.system)
        return GuardStream(self, messages)

    def backend_top_n(self) -> int:
        return int(getattr(self.backend, "top_n", DEFAULT_TOP_N))

    def decide(self, generation: Generation) -> Decision:
        """The policy's decision on one generation (no action, no record)."""
        stats = ResponseStats.from_generation(generation, self.quadrants, self.policy.first_tokens)
        return self.policy.decide(stats, self.profile)

    # -- internals ---------------------------------------------------------------------------
    def _finish(
        self, messages: list[ChatMessage], generation: Generation, start: float, gen_s: float, *, stopped_early: bool
    ) -> GuardResult:
        t = time.perf_counter()
        decision = self.decide(generation)
        decision_s = time.perf_counter() - t
        attempts = [Attempt(generation, decision)]
        retrieval_s = 0.0
        question = [m.content for m in messages if m.role == "user"][-1]
        retrieve = self.policy.retrieve
        while decision.action == "retrieve":
            if len(attempts) > retrieve.max_attempts:
                decision = replace(
                    decision,
                    action=retrieve.fallback,
                    reason=f"still uncertain after {retrieve.max_attempts} retrieval attempt(s): {decision.reason}",
                )
                break
            t = time.perf_counter()
            passages, error = self._retrieve(question)
            retrieval_s += time.perf_counter() - t
            if not passages:
                why = error or ("no retriever configured" if self.retriever is None else "the retriever returned nothing")
                decision = replace(decision, action=retrieve.fallback, reason=f"{decision.reason}; {why}")
                attempts[-1] = replace(attempts[-1], retrieval_error=why)
                break
            augmented = [*messages[:-1], ChatMessage("user", retrieve.prompt(question, passages))]
            t = time.perf_counter()
            generation = self.backend.generate(augmented, self.options)
            gen_s += time.perf_counter() - t
            t = time.perf_counter()
            decision = self.decide(generation)
            decision_s += time.perf_counter() - t
            if decision.action != "retrieve":
                decision = replace(decision, reason=f"after retrieval: {decision.reason}")
            attempts.append(Attempt(generation, decision, tuple(passages)))
        return self._act(messages, decision, attempts, start, gen_s, decision_s, retrieval_s, stopped_early)

    def _retrieve(self, question: str) -> tuple[list[str], str | None]:
        if self.retriever is None:
            return [], None
        try:
            fn = self.retriever.retrieve if isinstance(self.retriever, Retriever) else self.retriever
            found = list(fn(question))[: self.policy.retrieve.passages]
            return [_passage_text(p) for p in found], None
        except Exception as exc:  # recorded in the decision and the audit trail, and logged
            logger.warning("retriever failed for %r: %s", question, exc, exc_info=True)
            return [], f"the retriever failed: {exc.__class__.__name__}: {exc}"

    def _act(
        self,
        messages: list[ChatMessage],
        decision: Decision,
        attempts: list[Attempt],
        start: float,
        gen_s: float,
        decision_s: float,
        retrieval_s: float,
        stopped_early: bool,
    ) -> GuardResult:
        question = [m.content for m in messages if m.role == "user"][-1]
        timings = GuardTimings(time.perf_counter() - start, gen_s, decision_s, retrieval_s)
        result = self.conclude(question, decision, attempts, timings, stopped_early=stopped_early)
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
            result = self._record(question, draft, result)
        return result

    def _record(self, question: str, draft: str, result: GuardResult) -> GuardResult:
        from logtoku_guard.audit import AuditRecord

        g = result.generation
        record = AuditRecord(
            trace_id=result.trace_id,
            model=g.model,
            policy_name=result.policy_name,
            policy_version=result.policy_version,
            prompt=question,
            answer=draft,
            action=result.action,
            reason=result.decision.reason,
            rule=result.decision.rule,
            reliability=g.to_dict()["reliability"],
            attempts=len(result.attempts),
            tokens=[t.to_dict(self.quadrants) for t in g.tokens],
            stats=result.decision.stats.as_dict(),
            timings=dict(result.timings.__dict__),
        )
        if result.action == "human_review":
            item = self.store.record_for_review(record)
            return replace(result, review_id=item.id, answer=result.answer.format(review_id=item.id))
        self.store.record(record)
        return result


@dataclass
class GuardStream:
    """Iterate for tokens (each with its scores); ``.result`` once the stream has ended."""

    guard: Guard
    messages: list[ChatMessage]
    _result: GuardResult | None = None
    _stopped_early: bool = False
    _early: Decision | None = field(default=None, repr=False)

    def __iter__(self) -> Iterator[TokenScore]:
        guard = self.guard
        start = time.perf_counter()
        watch = any(r.early_stop for r in guard.policy.rules)
        seen: list[TokenScore] = []
        with guard.backend.stream(self.messages, guard.options) as stream:
            for token in stream:
                seen.append(token)
                yield token
                if watch:
                    stats = ResponseStats.from_tokens(seen, guard.backend_top_n(), guard.quadrants, guard.policy.first_tokens)
                    early = guard.policy.decide(stats, guard.profile, only_early_stop=True)
                    if early.rule is not None:
                        self._stopped_early = True
                        break
        generation = stream.generation
        self._result = guard._finish(
            self.messages, generation, start, time.perf_counter() - start, stopped_early=self._stopped_early
        )

    @property
    def result(self) -> GuardResult:
        if self._result is None:
            msg = "the guarded stream is not finished: iterate it to the end before reading .result"
            raise LogTokUError(msg)
        return self._result
