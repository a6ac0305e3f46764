"""``Decider``: the one place where an answer's scores become a decision, and a decision a result.

Backend-free: a :class:`Decider` holds the policy, the model's profile (quantile thresholds,
quadrant thresholds, the learned guard score) and the audit store, and nothing that generates
or retrieves. :class:`~logtoku_guard.guard.guard.Guard` builds one over its backend; adapters that
generate through their framework (LangChain's agent middleware, LlamaIndex's query engine) use
one through :func:`~logtoku_guard.guard.guard_steps.guard_steps`, the one guard loop::

    decider = Decider(policy, profile, store=store)
    decision = decider.decide(generation)                 # the policy on one answer
    result = decider.conclude(question, decision, [Attempt(generation, decision)], timings)

``decide`` judges one attempt; ``settle`` says what the attempts so far come to (the last
decision, or the ``retrieve.fallback`` once ``retrieve.max_attempts`` retrievals were made);
``give_up`` and ``unanswerable`` are the fallback when retrieval cannot help; ``early_stop``
watches a streamed prefix; ``conclude`` turns the final decision into the answer and records
it; ``abandon`` does both for a stream its reader closed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from logtoku_guard.decision.policy import Decision, Policy, default_policy
from logtoku_guard.decision.results import Attempt, GuardResult, GuardTimings
from logtoku_guard.errors import ConfigurationError, UsageError
from logtoku_guard.scoring.guard_score import with_guard_score
from logtoku_guard.scoring.second_look import Look, LookedStats, Measurement, SecondLooks
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N

if TYPE_CHECKING:
    from logtoku_guard.audit.records import RecordSink
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.types import Generation, TokenScore

__all__ = ["Decider", "require_review_store"]


def require_review_store(
    policy: Policy,
    store: object | None,
    *,
    answers: bool = True,
    tool_calls: bool = False,
    needs: str = "store=AuditStore(...)",
) -> None:
    """The one check that a policy able to send answers (``answers``) or tool calls (``tool_calls``)
    to human review has a ``store`` to queue them in (:class:`Decider`, the server's settings and
    the integrations ask it): :class:`ConfigurationError` naming the policy and what it ``needs``."""
    if store is not None:
        return
    reviewed = [
        what
        for what, checked, actions in (
            ("answers", answers, policy.actions),
            ("tool calls", tool_calls, policy.tool_calls.actions),
        )
        if checked and "human_review" in actions()
    ]
    if reviewed:  # named by what the policy really sends to review
        msg = f"policy {policy.name!r} can send {' and '.join(reviewed)} to human review, which needs {needs}"
        raise ConfigurationError(msg)


class Decider:
    """Decide on answers with ``policy`` and the model's ``profile``; record results in ``store``.

    Args:
        policy: a :class:`~logtoku_guard.decision.policy.Policy` (default: :func:`default_policy`,
            which needs a profile).
        profile: the model's :class:`~logtoku_guard.calibration.ModelProfile`, needed for
            quantile thresholds, quadrant shares and the guard score.
        store: any :class:`~logtoku_guard.audit.records.RecordSink` (an
            :class:`~logtoku_guard.audit.AuditStore`): every concluded result is recorded
            there; ``human_review`` needs it.

    Raises :class:`ConfigurationError` when the policy needs what is missing (a profile for
    quantiles or quadrant shares, a store for ``human_review``) or the profile lacks what the
    policy reads. The profile is not checked against a model here: that is the caller's, who
    knows the model (:meth:`ModelProfile.check_matches`).
    """

    def __init__(
        self, policy: Policy | None = None, profile: ModelProfile | None = None, *, store: RecordSink | None = None
    ) -> None:
        self.policy = policy = policy or default_policy()
        self.profile = profile
        self.store = store
        if policy.uses_quantiles() and profile is None:
            msg = (
                f"policy {policy.name!r} uses quantile thresholds, which need the model's profile; "
                "pass profile=calibrate(...) or load one with load_profile_for(model)"
            )
            raise ConfigurationError(msg)
        policy.check_profile(profile)
        shares = sorted(policy.stats_used() & {"quadrant_i_share", "quadrant_ii_share", "unreliable_share"})
        if shares and profile is None:
            msg = (
                f"policy {policy.name!r} reads {shares}, which need quadrant thresholds from the model's profile; "
                "pass profile=calibrate(...) or load one with load_profile_for(model)"
            )
            raise ConfigurationError(msg)
        require_review_store(policy, store)
        self.quadrants = (
            profile.quadrant_thresholds(policy.quadrants.au_quantile, policy.quadrants.eu_quantile)
            if profile is not None
            else None
        )
        """The AU/EU quadrant thresholds the statistics use (None without a profile)."""
        self.watches_early_stop = any(r.early_stop for r in policy.rules)
        """True when the policy has ``early_stop`` rules (streams are worth watching)."""

    @property
    def retrievals_allowed(self) -> int:
        """How many retrievals the policy allows per question (adapters may prepare that many)."""
        return self.policy.retrieve.max_attempts

    # -- one answer -------------------------------------------------------------------------------
    def _stats(self, generation: Generation, looks: SecondLooks = SecondLooks()) -> ResponseStats:  # noqa: B008 - frozen
        stats = ResponseStats.from_generation(generation, self.quadrants, self.policy.first_tokens)
        stats = with_guard_score(stats, self.profile, generation)
        return LookedStats.of(stats, looks) if self.policy.second_look_stats() else stats

    def looks_needed(self, generation: Generation, looks: SecondLooks = SecondLooks()) -> tuple[Look, ...]:  # noqa: B008
        """The second looks the decision on ``generation`` needs now, given the ``looks`` taken so far
        (:meth:`Policy.looks_needed`); empty once the decision is settled. Never any for a policy
        whose rules read no second-look statistic."""
        if not self.policy.second_look_stats():
            return ()
        return self.policy.looks_needed(self._stats(generation, looks), self.profile)

    def decide(
        self,
        generation: Generation,
        attempts: Sequence[Attempt] = (),
        looks: SecondLooks = SecondLooks(),  # noqa: B008 - frozen
    ) -> Decision:
        """The policy's decision on one generation (no action, no record).

        ``attempts``: the attempts made before this one; when there are any (this answer was
        made with retrieved context) a decision that does not ask for more retrieval says so:
        its reason starts with ``"after retrieval: "``. ``looks``: the second looks taken for it
        (a second-look statistic not measured is undefined).
        """
        decision = self.policy.decide(self._stats(generation, looks), self.profile)
        if attempts and decision.action != "retrieve":
            decision = replace(decision, reason=f"after retrieval: {decision.reason}")
        return decision

    def early_stop(self, tokens: Sequence[TokenScore], top_n: int = DEFAULT_TOP_N) -> Decision | None:
        """The decision of the ``early_stop`` rule that fires on this token prefix, or None.

        Such rules cannot un-fire as the answer grows, so a streaming caller may stop
        generating at once. ``top_n``: the backend's (tokens averaged into the reliability).
        None at once when the policy has no ``early_stop`` rule.
        """
        if not self.watches_early_stop or not tokens:
            return None
        stats = ResponseStats.from_tokens(tokens, top_n, self.quadrants, self.policy.first_tokens)
        decision = self.policy.decide(stats, self.profile, only_early_stop=True)
        return decision if decision.rule is not None else None

    # -- the attempts so far ---------------------------------------------------------------------
    def settle(self, attempts: Sequence[Attempt]) -> Decision:
        """What ``attempts`` (the first answer, then one per retrieval, each decided) come to.

        The last attempt's decision; a ``retrieve`` decision asks for retrieval number
        ``len(attempts)``. Once ``policy.retrieve.max_attempts`` retrievals were made, a
        ``retrieve`` decision becomes the ``retrieve.fallback`` action ("still uncertain after
        N retrieval attempt(s): ...").
        """
        if not attempts:
            msg = "settle needs at least the first attempt: decide on the first answer first"
            raise UsageError(msg)
        decision = attempts[-1].decision
        settings = self.policy.retrieve
        if decision.action == "retrieve" and len(attempts) - 1 >= settings.max_attempts:
            why = f"still uncertain after {settings.max_attempts} retrieval attempt(s): {decision.reason}"
            return replace(decision, action=settings.fallback, reason=why)
        return decision

    def give_up(self, decision: Decision, why: str) -> Decision:
        """The ``retrieve.fallback`` decision when retrieval cannot help (``why``: no passages, an error...)."""
        return replace(decision, action=self.policy.retrieve.fallback, reason=f"{decision.reason}; {why}")

    def unanswerable(self, generation: Generation, why: str) -> Decision:
        """The ``retrieve.fallback`` decision, without a rule, for an answer made with nothing to answer from."""
        base = self.policy.decide(self._stats(generation), self.profile)
        return replace(base, action=self.policy.retrieve.fallback, rule=None, reason=why)

    # -- the result -------------------------------------------------------------------------------
    def conclude(
        self,
        question: str,
        decision: Decision,
        attempts: Sequence[Attempt],
        timings: GuardTimings,
        *,
        stopped_early: bool = False,
        text: str | None = None,
        second_looks: Sequence[Measurement] = (),
    ) -> GuardResult:
        """Turn a final decision into the answer to return, and record it in the store.

        The one place where actions become answers. ``text`` overrides the last generation's
        text as the draft answer. Never raises for the ``raise`` action: the caller does, once
        it has reported the result its own way.
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
            second_looks=tuple(second_looks),
        )
        if self.store is not None:
            result = self._record(self.store, question, draft, result)
        return result

    def abandon(self, question: str, generation: Generation, attempts: Sequence[Attempt], timings: GuardTimings) -> GuardResult:
        """Decide and record an answer whose stream the reader closed before it ended, after ``attempts``
        (no retrieval; the reason says the stream was closed; never raises for ``raise``)."""
        decision = self.decide(generation, attempts)
        why = f"stream closed by the caller before it ended ({len(generation.tokens)} token(s), {generation.finish_reason})"
        if decision.action == "retrieve":
            decision = self.give_up(decision, f"{why}: no retrieval")
        else:
            decision = replace(decision, reason=f"{why}; {decision.reason}")
        return self.conclude(question, decision, [*attempts, Attempt(generation, decision)], timings, stopped_early=True)

    def _record(self, store: RecordSink, question: str, draft: str, result: GuardResult) -> GuardResult:
        from logtoku_guard.audit.records import AuditRecord  # no SQLAlchemy import

        record = AuditRecord.from_result(result, question=question, thresholds=self.quadrants, draft=draft)
        if result.action == "human_review":
            item = store.record_for_review(record)
            return replace(result, review_id=item.id, answer=result.answer.format(review_id=item.id))
        store.record(record)
        return result
